"""Crawling from seeds: urls.txt lines that name more than one page, expanded into pages.

Three kinds of line (kpack.packs.parse_urls):

* ``https://docs.example.com/api.html``: this page only (state ``listed``).
* ``https://docs.example.com/guide/ depth=2``: a seed. The page and every page its in-content
  links reach within two hops, inside the seed's scope.
* ``https://docs.example.com/sitemap.xml`` (any ``sitemap*.xml`` or ``sitemap*.xml.gz``; a
  sitemap index is followed to its sitemaps inside the line's host and folder): the pages it
  lists, in scope; ``depth=N`` follows their links N hops too. Sitemaps are read with an XML
  parser (kpack.ingest.sitemaps); the fetcher unpacks gzipped ones under the size cap.

Scope: by default the seed's host and folder (``https://docs.example.com/guide/`` for a seed
``.../guide/intro.html``); ``crawl.include`` patterns replace that rule, ``crawl.exclude``
patterns refuse pages whatever the rule (kpack.config.CrawlConfig).

robots.txt (``crawl.respect_robots``), read with Protego as RFC 9309 has it (``*`` and ``$``
wildcards, the longest matching rule wins): a discovered page is fetched only when its host's
robots.txt allows it for our product token; the lines the user wrote are fetched regardless. A
``Crawl-delay`` spaces the requests to its host (at most MAX_CRAWL_DELAY_S), and the sitemaps its
``Sitemap:`` lines name add their in-scope pages to a seed's crawl at depth 1, so pages no link
reaches are found too. Requests go through the pack's one Fetcher, so the per-host delay spaces
them and, on a rebuild, each carries the validators of the page's previous fetch: an unchanged
page answers 304 and its stored copy (with its links) is reused, so the crawl reaches the same
pages at the cost of conditional requests only.

URLs are deduplicated by ``kpack.packs.page_key``: w3lib's canonical form (percent-encoding,
dot segments, IDNA host, sorted query arguments), fragment dropped, default port, trailing
slash and ``index.html`` ignored; a page whose ``<link rel=canonical>`` names another in-scope
URL is an alias: the canonical URL is fetched in its place, once, and so is the page a redirect
stub leads to (a page whose ``<meta http-equiv="refresh">`` sends the reader on at once, as
Sphinx leaves for a moved page). ``crawl.max_pages`` caps the
pages of the pack. Every row records the seed it came from, its link depth from the seed and
its state: ``listed``, ``expanded`` (its links were followed), ``discovered`` (fetched at the
depth limit, or past the cap: its links were not followed), ``failed`` or ``kept`` (below).
Pages come out in breadth-first order, which is the same on every crawl of the same site.

Outages: a sitemap or robots.txt that cannot be read is a failed row of its own, which counts
toward ``max_failed_fraction`` like a failed page. When such a source, or a page whose links the
crawl follows, fails for a reason that says nothing about what it leads to (is_outage: no
answer, a 5xx, 408/429, over the size cap, unreadable), the crawl of its seed is incomplete: the
seed's pages of the previous fetch that this crawl did not get are carried over from it (state
``kept``) instead of leaving the pack. A robots.txt that cannot be read means "disallow
everything" (RFC 9309): no page of its host is crawled, and the previous ones are kept. A 4xx
answer says the source is gone: nothing is kept for it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from fnmatch import fnmatchcase
from pathlib import PurePosixPath
from urllib.parse import urljoin, urlsplit, urlunsplit

from protego import Protego
from selectolax.lexbor import LexborHTMLParser

from kpack.config import CrawlConfig
from kpack.ingest.content import page_format
from kpack.ingest.fetch import Fetcher, FetchResponse
from kpack.ingest.pages import page_row, validators
from kpack.ingest.sitemaps import SitemapError, parse_sitemap
from kpack.packs import Source, normalize_url, page_key

SITEMAP_NAME = re.compile(r"^sitemap[\w.-]*\.xml(\.gz)?$", re.IGNORECASE)
MAX_SITEMAPS = 50  # sitemaps read per sitemap line, index files included
MAX_CRAWL_DELAY_S = 30.0  # a longer Crawl-delay of a robots.txt is taken as this
WEB_SCHEMES = ("http", "https")
# Links to these are never pages; skipping them saves a request each.
NOT_PAGES = re.compile(
    r"\.(png|jpe?g|gif|svg|webp|ico|bmp|zip|t?gz|bz2|xz|tar|whl|egg|exe|dmg|css|m?js|map"
    r"|json|woff2?|ttf|eot|mp[34]|webm|avi|mov)$"
)
# 4xx answers that say the server is busy, not that the source is gone.
BUSY_STATUSES = (408, 429)


def is_sitemap(url: str) -> bool:
    return bool(SITEMAP_NAME.match(PurePosixPath(urlsplit(url).path).name))


def is_outage(status: int | None, error: str | None) -> bool:
    """Whether a failed fetch says nothing about its source: no answer (a connection error, a
    timeout), a server error, 408/429, or an answer that could not be used (over the size cap,
    unreadable). Any other 4xx says the source is gone."""
    if error is None:
        return False
    return status is None or status >= 500 or status in BUSY_STATUSES or status < 400


def absolute_url(base: str, href: str) -> str | None:
    """``href`` resolved against ``base`` and normalised (normalize_url); None when it cannot
    be parsed (``http://[::1``): a broken link is no reason to stop a crawl."""
    try:
        return normalize_url(urljoin(base, href))
    except ValueError:
        return None


# A resolved link that depends on the page, not only its folder (see has_path).
PAGE_OWN = ""


def has_path(href: str) -> bool:
    """Whether a reference has a path, so that it resolves the same against any page of a
    folder; one without ("?page=2", "http://") resolves against the page itself."""
    try:
        return bool(urlsplit(href).path)
    except ValueError:  # unparseable: absolute_url refuses it whatever the base
        return True


def product_token(user_agent: str) -> str:
    """The name robots.txt groups are matched against (RFC 9309): ``knowledge-packs`` for
    ``knowledge-packs/0.1 (...)``."""
    return user_agent.split("/")[0].strip()


# A refresh's content: "0; url=target" (the delay, then the page to go to).
REFRESH = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*[;,]\s*(?:url\s*=\s*)?['\"]?([^'\"]+)", re.IGNORECASE)
STUB_DELAY_S = 5
GONE = (
    404,
    410,
)  # the answers that say a page is not there  # a refresh this soon or sooner sends the reader on: the page is a stub


# A page that may hold a refresh: only those are parsed for one (a crawl parses each page once
# more for its canonical link; a second parse of every page would cost as much again).
MAY_REFRESH = re.compile(r"http-equiv\s*=\s*[\"']?refresh", re.IGNORECASE)


def refresh_target(page_html: str, base: str) -> str | None:
    """The absolute URL a redirect stub sends its reader to (``<meta http-equiv="refresh"
    content="0; url=...">`` within STUB_DELAY_S seconds), else None."""
    if not MAY_REFRESH.search(page_html):
        return None
    for node in LexborHTMLParser(page_html).css("meta[http-equiv][content]"):
        if (node.attributes.get("http-equiv") or "").strip().lower() != "refresh":
            continue
        found = REFRESH.match(node.attributes.get("content") or "")
        if found and float(found.group(1)) <= STUB_DELAY_S:
            return absolute_url(base, found.group(2).strip())
    return None


def canonical_link(page_html: str, base: str) -> str | None:
    """The absolute URL of a page's ``<link rel="canonical">``, if it has one."""
    node = LexborHTMLParser(page_html).css_first('link[rel~="canonical"][href]')
    href = (node.attributes.get("href") or "").strip() if node is not None else ""
    return absolute_url(base, href) if href else None


@dataclass(frozen=True)
class Scope:
    """Which URLs a seed's crawl may reach."""

    prefix: str  # scheme://host/folder/ of the seed
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def of(cls, seed: str, config: CrawlConfig) -> Scope:
        parts = urlsplit(normalize_url(seed))
        folder = parts.path[: parts.path.rfind("/") + 1] or "/"
        prefix = urlunsplit((parts.scheme, parts.netloc, folder, "", ""))
        return cls(prefix, config.include, config.exclude)

    def excludes(self, url: str) -> bool:
        """Whether a ``crawl.exclude`` pattern refuses the URL."""
        return any(fnmatchcase(url, pattern) for pattern in self.exclude)

    def within(self, url: str) -> bool:
        """Whether the URL is inside the scope's rule (the include patterns, else the seed's
        host and folder), exclusions aside."""
        if self.include:
            return any(fnmatchcase(url, pattern) for pattern in self.include)
        return url.startswith(self.prefix) or url == self.prefix.rstrip("/")

    def allows(self, url: str) -> bool:
        return self.within(url) and not self.excludes(url)


@dataclass(frozen=True)
class Page:
    """A URL to fetch, and how the crawl reached it."""

    url: str
    line_no: int
    seed: str
    depth: int
    limit: int | None  # the seed's depth; None: a listed page, whose links are not followed
    scope: Scope | None = None  # None: a line the user wrote (no robots or scope check)


@dataclass
class CrawlReport:
    """What a crawl did, for the fetch stage's metadata and the benchmark."""

    pages: int = 0
    max_depth: int = 0
    requests: int = 0  # every request: pages, sitemaps and robots.txt files
    not_modified: int = 0
    sitemaps: int = 0
    robots_refused: list[str] = field(default_factory=list)
    off_scope: int = 0  # distinct links (and sitemaps) outside their seed's scope
    excluded: int = 0  # distinct in-scope links a crawl.exclude pattern refused
    aliases: int = 0  # pages dropped as another URL of a page already crawled
    redirect_stubs: int = 0  # pages that only send the reader on (a meta refresh)
    not_text: int = 0  # crawled links whose target is no text page
    capped: int = 0  # in-scope pages left out by crawl.max_pages
    failed_sources: int = 0  # sitemaps and robots.txt files that could not be read
    kept: int = 0  # pages carried over from the previous fetch after an outage
    problems: list[str] = field(default_factory=list)  # for the build log

    def page_counts(self, rows: list[dict]) -> dict:
        """The build summary's pages: found, kept, skipped by reason and capped. Found is
        every page the sources led to: those kept, those skipped and those past the cap."""
        failed = [row for row in rows if row["error"] is not None]
        not_found = sum(row["status"] in GONE for row in failed)
        skipped = {
            "not_found": not_found,  # 404 or 410
            "failed": len(failed) - not_found,  # any other failure (kpack.ingest.fetch)
            "excluded": self.excluded,
            "redirect_stubs": self.redirect_stubs,
            "duplicates": self.aliases,
            "not_text": self.not_text,
            "robots_refused": len(self.robots_refused),
        }
        kept = len(rows) - len(failed)
        return {
            "found": kept + sum(skipped.values()) + self.capped,
            "kept": kept,
            "skipped": skipped,
            "capped": self.capped,
        }

    def metadata(self) -> dict:
        return {
            "crawl_pages": self.pages,
            "crawl_max_depth": self.max_depth,
            "crawl_requests": self.requests,
            "crawl_sitemaps": self.sitemaps,
            "crawl_robots_refused": len(self.robots_refused),
            "crawl_off_scope_links": self.off_scope,
            "crawl_excluded": self.excluded,
            "crawl_aliases": self.aliases,
            "crawl_redirect_stubs": self.redirect_stubs,
            "crawl_not_text": self.not_text,
            "crawl_capped": self.capped,
            "crawl_failed_sources": self.failed_sources,
            "crawl_kept": self.kept,
        }


class Crawl:
    """One expansion of a pack's sources into fetched_pages rows (see the module docstring)."""

    def __init__(
        self,
        fetcher: Fetcher,
        config: CrawlConfig,
        stored: dict[str, dict],
        fetched_at: datetime,
    ) -> None:
        self.fetcher = fetcher
        self.config = config
        self.stored = stored
        self.previous = validators(stored)
        self.fetched_at = fetched_at
        self.report = CrawlReport()
        self.rows: list[dict] = []
        self.claimed: set[str] = set()  # page keys fetched, queued or refused
        # Page keys outside the scope of a seed that linked to them, counted once; another
        # seed whose scope holds one may still take it.
        self.out_of_scope: set[str] = set()
        self.queued = 0  # crawled pages waiting to be fetched (for the cap)
        self.robots: dict[str, Protego | None] = {}  # by origin; None: could not be read
        self.agent = product_token(fetcher.session.headers["User-Agent"])
        self.incomplete: set[str] = set()  # seeds whose crawl an outage cut short
        # Sphinx pages link to ~190 URLs each, mostly the same sidebar: a link already seen
        # within a scope cannot add a page, and an href means the same from every page of a
        # folder. Both are decided once (a no-change crawl of 11,000 pages follows 2 million).
        self.decided: dict[Scope, set[str]] = {}  # the URLs decided, by scope
        self.resolved: dict[tuple[str, str], str | None] = {}  # (folder, href): URL

    def run(self, sources: Iterable[Source]) -> list[dict]:
        sources = list(sources)
        # The lines the user wrote come first: a sitemap or a crawl never takes them over.
        listed = [s for s in sources if not is_sitemap(s.url)]
        for source in listed:
            self._claim(source.url)
        level: list[Page] = []
        for source in sources:
            if is_sitemap(source.url):
                level += self._sitemap_pages(source)
            else:
                level.append(Page(source.url, source.line_no, source.url, 0, source.depth))
        depth = 0
        while level:
            self.report.max_depth = depth
            level = self._fetch_level(level)
            depth += 1
        self._keep_previous(sources)
        self.report.pages = len(self.rows) - self.report.failed_sources
        return self.rows

    # Frontier bookkeeping --------------------------------------------------------------

    def _claim(self, url: str) -> bool:
        """Mark a page as taken; False when it already was (under this or another URL)."""
        key = page_key(url)
        if key in self.claimed:
            return False
        self.claimed.add(key)
        return True

    def _admit(self, url: str, parent: Page | Source, depth: int, scope: Scope) -> Page | None:
        """The page to queue for a discovered URL, or None (seen, off scope, refused, capped).
        A second call with the same URL and scope changes nothing and returns None."""
        decided = self.decided.setdefault(scope, set())
        if url in decided:
            return None
        decided.add(url)
        if not scope.allows(url):
            key = page_key(url)
            if key not in self.out_of_scope:
                self.out_of_scope.add(key)
                if scope.excludes(url) and scope.within(url):
                    self.report.excluded += 1
                else:
                    self.report.off_scope += 1
            return None
        if not self._claim(url):
            return None
        seed = parent.url if isinstance(parent, Source) else parent.seed
        if self.config.respect_robots and urlsplit(url).scheme in WEB_SCHEMES:
            rules = self._robots(url, parent.line_no, seed)
            if rules is None:  # its robots.txt could not be read: nothing of the host is crawled
                return None
            if not rules.can_fetch(url, self.agent):
                self.report.robots_refused.append(url)
                return None
        if len(self.rows) + self.queued >= self.config.max_pages:
            self.report.capped += 1
            return None
        self.queued += 1
        limit = parent.depth if isinstance(parent, Source) else parent.limit
        return Page(url, parent.line_no, seed, depth, limit or 0, scope)

    def _links(self, page: Page, row: dict) -> list[str]:
        """The crawlable URLs a fetched page links to (its content, then its navigation),
        fragments dropped: before resolving, so ``api.html#a`` and ``api.html#b`` are one
        reference (an API page's links are mostly anchors of a few pages)."""
        base = row["final_url"]
        parts = urlsplit(base)
        folder = urlunsplit(
            (parts.scheme, parts.netloc, parts.path[: parts.path.rfind("/") + 1], "", "")
        )
        urls = []
        for href in dict.fromkeys(row["page_links"]):  # a sidebar repeats the page's links
            href = href.strip().partition("#")[0]
            if not href or href.startswith(("mailto:", "javascript:", "data:", "tel:")):
                continue
            key = (folder, href)
            if key not in self.resolved:
                own_page = not has_path(href)  # "?page=2", "http://": against the page itself
                self.resolved[key] = (
                    PAGE_OWN if own_page else self._crawlable(absolute_url(folder, href))
                )
            url = self.resolved[key]
            if url == PAGE_OWN:
                url = self._crawlable(absolute_url(base, href))
            if url is not None:
                urls.append(url)
        return urls

    def _crawlable(self, url: str | None) -> str | None:
        """The URL when a crawl may fetch it as a page (a web or file URL, not an image or a
        download), else None."""
        if url is None or urlsplit(url).scheme not in (*WEB_SCHEMES, "file"):
            return None
        return None if self._not_a_page(url) else url

    def _not_a_page(self, url: str) -> bool:
        path = urlsplit(url).path.lower()
        if urlsplit(url).scheme == "file":  # a local file is read by its name alone
            return page_format(None, url) is None
        return NOT_PAGES.search(path) is not None

    # Fetching --------------------------------------------------------------------------

    def _fetch_level(self, level: list[Page]) -> list[Page]:
        """Fetch one depth of the crawl; the pages of the next one."""
        following: list[Page] = []
        while level:
            responses = self.fetcher.fetch_all([p.url for p in level], self.previous)
            self.report.requests += len(responses)
            replacements: list[Page] = []
            for page, response in zip(level, responses, strict=True):
                if page.scope is not None:
                    self.queued -= 1
                following += self._take(page, response, replacements)
            level = replacements  # canonical URLs of aliases, fetched at the same depth
        return following

    def _take(self, page: Page, response: FetchResponse, replacements: list[Page]) -> list[Page]:
        """Record one fetched page; the pages its links add to the next depth."""
        if response.warning:
            self.report.problems.append(f"{page.url}: {response.warning}")
        crawled = page.scope is not None
        if crawled and response.format is None and (response.status or 0) in range(200, 300):
            self.report.not_text += 1  # an image or a download behind a page-like URL
            return []
        redirected = page_key(response.final_url) != page_key(page.url)
        if crawled and redirected and not page.scope.allows(normalize_url(response.final_url)):
            self.report.off_scope += 1  # redirected out of the seed's scope
            return []
        if crawled and redirected and not self._claim(response.final_url):
            self.report.aliases += 1  # redirected to a page already crawled
            return []
        stub = self._other_page(page, response, refresh_target) if crawled else None
        canonical = stub or (self._other_page(page, response, canonical_link) if crawled else None)
        if canonical is not None:
            if stub is not None:
                self.report.redirect_stubs += 1
            else:
                self.report.aliases += 1
            if self._claim(canonical):
                self.queued += 1
                replacements.append(
                    Page(canonical, page.line_no, page.seed, page.depth, page.limit, page.scope)
                )
            return []
        row = page_row(
            Source(page.line_no, page.url), response, self.stored.get(page.url), self.fetched_at
        )
        self.report.not_modified += response.not_modified
        follows = page.limit is not None and page.depth < page.limit
        expands = row["error"] is None and follows
        if follows and is_outage(row["status"], row["error"]):
            self.incomplete.add(page.seed)  # the pages it led to last time are kept
        if row["error"] is not None:
            state = "failed"
        elif expands:
            state = "expanded"
        else:
            state = "discovered" if crawled else "listed"
        row.update(seed=page.seed, expansion_depth=page.depth, expansion_state=state)
        self.rows.append(row)
        if not expands:
            return []
        scope = page.scope or Scope.of(page.url, self.config)
        decided = self.decided.get(scope, set())  # a page's links are mostly decided already
        links = [url for url in dict.fromkeys(self._links(page, row)) if url not in decided]
        found = [self._admit(url, page, page.depth + 1, scope) for url in links]
        if page.scope is None:  # a seed line: its host's sitemaps may name pages no link reaches
            found += [self._admit(url, page, 1, scope) for url in self._robots_sitemap_urls(page)]
        return [p for p in found if p is not None]

    def _other_page(
        self,
        page: Page,
        response: FetchResponse,
        named_by: Callable[[str, str], str | None],
    ) -> str | None:
        """The in-scope page, other than this one, that ``named_by`` (a redirect stub's
        target, a canonical link) finds in a crawled HTML page's text; else None."""
        if response.text is None or response.format != "html" or page.scope is None:
            return None
        target = named_by(response.text, response.final_url)
        if target is None or not page.scope.allows(target):
            return None
        if page_key(target) in (page_key(page.url), page_key(response.final_url)):
            return None
        return target

    # Sitemaps, robots.txt and outages --------------------------------------------------

    def _sitemap_pages(self, source: Source) -> list[Page]:
        """The in-scope pages a sitemap line lists, in its order."""
        scope = Scope.of(source.url, self.config)
        urls = self._sitemap_urls(source.url, Scope(scope.prefix), source.line_no, source.url)
        found = [self._admit(url, source, 0, scope) for url in urls]
        return [p for p in found if p is not None]

    def _sitemap_urls(self, top: str, within: Scope, line_no: int, seed: str) -> list[str]:
        """The page URLs the sitemap ``top`` lists; a sitemap index is followed to the sitemaps
        it names ``within`` scope, MAX_SITEMAPS in all. A sitemap that cannot be read is a
        failed source of ``seed``."""
        urls: list[str] = []
        to_read, seen, read = [top], {top}, 0
        while to_read and read < MAX_SITEMAPS:
            url = to_read.pop(0)
            read += 1
            response = self.fetcher.fetch(url, xml=True)
            self.report.requests += 1
            try:
                sitemap = parse_sitemap(response.text) if response.text is not None else None
            except SitemapError as exc:
                response, sitemap = replace(response, text=None, error=str(exc)), None
            if sitemap is None:
                self._source_failed(response, "sitemap", line_no, seed)
                continue
            self.report.sitemaps += 1
            targets = [absolute_url(url, location) for location in sitemap.locations]
            if not sitemap.index:
                urls += [target for target in targets if target is not None]
                continue
            for target in targets:
                if target is None or not within.allows(target):
                    self.report.off_scope += 1
                    self.report.problems.append(
                        f"sitemap {url}: {target} is outside {within.prefix}, not read"
                    )
                elif target not in seen:
                    seen.add(target)
                    to_read.append(target)
        if to_read:
            self.report.problems.append(
                f"sitemap {top}: {len(to_read)} sitemaps past the first {MAX_SITEMAPS} not read"
            )
        return urls

    def _robots_sitemap_urls(self, seed: Page) -> list[str]:
        """The page URLs of the sitemaps that the ``Sitemap:`` lines of a seed's robots.txt
        name (on the seed's host only)."""
        if not self.config.respect_robots or urlsplit(seed.url).scheme not in WEB_SCHEMES:
            return []
        rules = self._robots(seed.url, seed.line_no, seed.seed)
        if rules is None:
            return []
        parts = urlsplit(normalize_url(seed.url))
        site = Scope(urlunsplit((parts.scheme, parts.netloc, "/", "", "")))
        urls: list[str] = []
        for location in rules.sitemaps:
            sitemap = absolute_url(site.prefix, location)
            if sitemap is not None and site.allows(sitemap):
                urls += self._sitemap_urls(sitemap, site, seed.line_no, seed.seed)
            else:
                self.report.off_scope += 1
        return urls

    def _robots(self, url: str, line_no: int, seed: str) -> Protego | None:
        """The robots.txt rules of ``url``'s host, read once per crawl; None when they could not
        be read, which leaves ``seed``'s crawl incomplete."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin not in self.robots:
            self.robots[origin] = self._read_robots(origin, line_no, seed)
        rules = self.robots[origin]
        if rules is None:
            self.incomplete.add(seed)
        return rules

    def _read_robots(self, origin: str, line_no: int, seed: str) -> Protego | None:
        """The host's rules: allow-all when it has none (a 4xx answer); None, "complete
        disallow" as RFC 9309 asks, when an outage hides them (a failed source)."""
        response = self.fetcher.fetch(f"{origin}/robots.txt")
        self.report.requests += 1
        if response.text is not None:
            rules = Protego.parse(response.text)
        elif not is_outage(response.status, response.error):
            rules = Protego.parse("")
        else:
            self._source_failed(response, "robots.txt", line_no, seed)
            return None
        delay = rules.crawl_delay(self.agent)
        if delay:
            host = urlsplit(origin).hostname or ""
            self.fetcher.throttle.set_delay(host, min(delay, MAX_CRAWL_DELAY_S))
        return rules

    def _source_failed(self, response: FetchResponse, kind: str, line_no: int, seed: str) -> None:
        """A sitemap or robots.txt that could not be read, as a failed row of ``seed``; an
        outage leaves the seed's crawl incomplete."""
        failed = replace(response, error=f"{kind}: {response.error}")
        row = page_row(Source(line_no, response.url), failed, None, self.fetched_at)
        row.update(seed=seed, expansion_depth=0, expansion_state="failed")
        self.rows.append(row)
        self.report.failed_sources += 1
        if is_outage(response.status, response.error):
            self.incomplete.add(seed)

    def _keep_previous(self, sources: list[Source]) -> None:
        """Carry over from the previous fetch the pages of each incomplete seed that this crawl
        did not get (not reached, or failed by an outage), as ``kept`` rows."""
        lines = {source.url: source.line_no for source in sources}
        now = {page_key(row["url"]): row for row in self.rows}
        kept: Counter[str] = Counter()
        for url, previous in self.stored.items():
            seed = previous["seed"]
            if seed not in self.incomplete or seed not in lines:
                continue
            row = now.get(page_key(url))
            if row is not None and not is_outage(row["status"], row["error"]):
                continue
            if len(self.rows) >= self.config.max_pages:
                self.report.capped += 1
                continue
            self.rows.append(
                {
                    **previous,
                    "line_no": lines[seed],
                    "change": "unchanged",
                    "fetched_at": self.fetched_at,
                    "expansion_state": "kept",
                }
            )
            kept[seed] += 1
        self.report.kept = kept.total()
        for seed, count in kept.items():
            self.report.problems.append(
                f"urls.txt line {lines[seed]}: {seed}: a source of its pages failed; "
                f"kept {count} pages from the last good fetch"
            )


def crawl(
    sources: Iterable[Source],
    fetcher: Fetcher,
    config: CrawlConfig,
    stored: dict[str, dict],
    fetched_at: datetime,
) -> tuple[list[dict], CrawlReport]:
    """The fetched_pages rows of every page the sources name or reach, and what it took."""
    run = Crawl(fetcher, config, stored, fetched_at)
    rows = run.run(sources)
    return rows, run.report
