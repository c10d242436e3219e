"""Crawling from seeds: urls.txt lines that name more than one page, expanded into pages.

Three kinds of line (kpack.packs.parse_urls):

* ``https://docs.example.com/api.html``: this page only (state ``listed``).
* ``https://docs.example.com/guide/ depth=2``: a seed. The page and every page its in-content
  links reach within two hops, inside the seed's scope.
* ``https://docs.example.com/sitemap.xml`` (any ``sitemap*.xml``; a sitemap index is followed
  to its sitemaps): the pages it lists, in scope; ``depth=N`` follows their links N hops too.

Scope: by default the seed's host and folder (``https://docs.example.com/guide/`` for a seed
``.../guide/intro.html``); ``crawl.include`` patterns replace that rule, ``crawl.exclude``
patterns refuse pages whatever the rule (kpack.config.CrawlConfig). A discovered page is
fetched only when the host's robots.txt allows it (``crawl.respect_robots``); the lines the
user wrote are fetched regardless. Requests go through the pack's one Fetcher, so the per-host
delay spaces them and, on a rebuild, each carries the validators of the page's previous fetch:
an unchanged page answers 304 and its stored copy (with its links) is reused, so the crawl
reaches the same pages at the cost of conditional requests only.

URLs are deduplicated by ``kpack.packs.page_key``: fragment dropped, host lower-cased, default
port, trailing slash and ``index.html`` ignored; a page whose ``<link rel=canonical>`` names another
in-scope URL is an alias: the canonical URL is fetched in its place, once. ``crawl.max_pages``
caps the pages of the pack. Every row records the seed it came from, its link depth from the
seed and its state: ``listed``, ``expanded`` (its links were followed), ``discovered`` (fetched
at the depth limit, or past the cap: its links were not followed) or ``failed``. Pages come out
in breadth-first order, which is the same on every crawl of the same site.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from pathlib import PurePosixPath
from urllib.parse import urljoin, urlsplit, urlunsplit
from urllib.robotparser import RobotFileParser

from selectolax.lexbor import LexborHTMLParser

from kpack.config import CrawlConfig
from kpack.ingest.fetch import Fetcher, FetchResponse, page_format
from kpack.ingest.html import page_links
from kpack.ingest.pages import page_row, validators
from kpack.packs import Source, normalize_url, page_key

SITEMAP_NAME = re.compile(r"^sitemap[\w.-]*\.xml$", re.IGNORECASE)
SITEMAP_LOC = re.compile(r"<loc>\s*([^<]+?)\s*</loc>", re.IGNORECASE)
MAX_SITEMAPS = 50  # sitemaps read per sitemap line, index files included
# Links to these are never pages; skipping them saves a request each.
NOT_PAGES = re.compile(
    r"\.(png|jpe?g|gif|svg|webp|ico|bmp|pdf|zip|t?gz|bz2|xz|tar|whl|egg|exe|dmg|css|m?js|map"
    r"|json|woff2?|ttf|eot|mp[34]|webm|avi|mov)$"
)


def is_sitemap(url: str) -> bool:
    return bool(SITEMAP_NAME.match(PurePosixPath(urlsplit(url).path).name))


def canonical_link(page_html: str, base: str) -> str | None:
    """The absolute URL of a page's ``<link rel="canonical">``, if it has one."""
    node = LexborHTMLParser(page_html).css_first('link[rel~="canonical"][href]')
    href = (node.attributes.get("href") or "").strip() if node is not None else ""
    return normalize_url(urljoin(base, href)) if href else None


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

    def allows(self, url: str) -> bool:
        if any(fnmatchcase(url, pattern) for pattern in self.exclude):
            return False
        if self.include:
            return any(fnmatchcase(url, pattern) for pattern in self.include)
        return url.startswith(self.prefix) or url == self.prefix.rstrip("/")


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
    off_scope: int = 0  # distinct links outside their seed's scope
    aliases: int = 0  # pages dropped as another URL of a page already crawled
    not_text: int = 0  # crawled links whose target is no text page
    capped: int = 0  # in-scope pages left out by crawl.max_pages
    problems: list[str] = field(default_factory=list)  # sitemaps that could not be read

    def metadata(self) -> dict:
        return {
            "crawl_pages": self.pages,
            "crawl_max_depth": self.max_depth,
            "crawl_requests": self.requests,
            "crawl_sitemaps": self.sitemaps,
            "crawl_robots_refused": len(self.robots_refused),
            "crawl_off_scope_links": self.off_scope,
            "crawl_aliases": self.aliases,
            "crawl_not_text": self.not_text,
            "crawl_capped": self.capped,
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
        self.queued = 0  # crawled pages waiting to be fetched (for the cap)
        self.robots: dict[str, RobotFileParser | None] = {}

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
        self.report.pages = len(self.rows)
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
        """The page to queue for a discovered URL, or None (seen, off scope, refused, capped)."""
        if not scope.allows(url):
            if self._claim(url):
                self.report.off_scope += 1
            return None
        if not self._claim(url):
            return None
        if self.config.respect_robots and not self._robots_allow(url):
            self.report.robots_refused.append(url)
            return None
        if len(self.rows) + self.queued >= self.config.max_pages:
            self.report.capped += 1
            return None
        self.queued += 1
        limit = parent.depth if isinstance(parent, Source) else parent.limit
        seed = parent.url if isinstance(parent, Source) else parent.seed
        return Page(url, parent.line_no, seed, depth, limit or 0, scope)

    def _links(self, page: Page, row: dict) -> list[str]:
        """The crawlable URLs a fetched page links to, in document order, fragments dropped."""
        urls = []
        for href, _text in page_links(row["format"], row["body"]):
            href = href.strip()
            if not href or href.startswith(("#", "mailto:", "javascript:", "data:", "tel:")):
                continue
            url = normalize_url(urljoin(row["final_url"], href))
            scheme = urlsplit(url).scheme
            if scheme not in ("http", "https", "file") or self._not_a_page(url):
                continue
            urls.append(url)
        return urls

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
        canonical = self._canonical(page, response) if crawled else None
        if canonical is not None:
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
        expands = row["error"] is None and page.limit is not None and page.depth < page.limit
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
        found = (self._admit(url, page, page.depth + 1, scope) for url in self._links(page, row))
        return [p for p in found if p is not None]

    def _canonical(self, page: Page, response: FetchResponse) -> str | None:
        """The in-scope canonical URL of a crawled page fetched under another URL, else None."""
        if response.text is None or response.format != "html" or page.scope is None:
            return None
        canonical = canonical_link(response.text, response.final_url)
        if canonical is None or not page.scope.allows(canonical):
            return None
        if page_key(canonical) in (page_key(page.url), page_key(response.final_url)):
            return None
        return canonical

    # Sitemaps and robots.txt -----------------------------------------------------------

    def _sitemap_pages(self, source: Source) -> list[Page]:
        """The in-scope pages a sitemap (or sitemap index) lists, in its order."""
        scope = Scope.of(source.url, self.config)
        pages: list[Page] = []
        to_read, read = [source.url], 0
        while to_read and read < MAX_SITEMAPS:
            url = to_read.pop(0)
            read += 1
            response = self.fetcher.fetch(url, xml=True)
            self.report.requests += 1
            if response.text is None:
                self.report.problems.append(f"sitemap {url}: {response.error or 'no text'}")
                continue
            self.report.sitemaps += 1
            locations = [html.unescape(m) for m in SITEMAP_LOC.findall(response.text)]
            if "<sitemapindex" in response.text[:2000].lower():
                to_read += [urljoin(url, loc) for loc in locations]
                continue
            for loc in locations:
                page = self._admit(normalize_url(urljoin(url, loc)), source, 0, scope)
                if page is not None:
                    pages.append(page)
        return pages

    def _robots_allow(self, url: str) -> bool:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            return True
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin not in self.robots:
            self.robots[origin] = self._read_robots(origin)
        rules = self.robots[origin]
        if rules is None:
            return False
        return rules.can_fetch(self.fetcher.session.headers["User-Agent"], url)

    def _read_robots(self, origin: str) -> RobotFileParser | None:
        """The host's robots.txt rules; allow-all when it has none (4xx), None (refuse every
        crawled page) when it cannot be read (5xx, unreachable), as RFC 9309 asks."""
        response = self.fetcher.fetch(f"{origin}/robots.txt")
        self.report.requests += 1
        rules = RobotFileParser()
        if response.text is not None:
            rules.parse(response.text.splitlines())
        elif response.status is None or response.status >= 500:
            self.report.problems.append(f"{origin}/robots.txt: {response.error}")
            return None
        else:
            rules.parse([])
        return rules


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
