"""Fetched pages as articles, titled sections and the links between them.

Sections start at h2/h3 (## / ### in Markdown) and keep their heading path and level; text
before the first of them is the article's introduction. Code blocks stay as fenced text.
Links between articles come from in-content links that point at another article of the same
pack. A page the parser cannot read is one failed page, never a failed build.

The documentation graph (issue 23) comes from the same pass: every section keeps the anchors
that fall in it (an id, a Markdown heading's slug), the links written in it and the API
identifiers it defines (kpack.ingest.html's marks); a link resolves to the section of the
pack holding its anchor (a link without one, to the page's first section), which makes the
section_links rows: the tutorial paragraph that links to the reference entry of the function
it uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import NamedTuple
from urllib.parse import unquote, urljoin, urlsplit

from kpack.contracts import CRAWL_COLUMNS, content_hash, passage_text, section_id
from kpack.ingest.html import MARKS, Block, page_blocks, page_links
from kpack.packs import page_key

MARK_FIELDS = dict(zip(MARKS, ("anchors", "links", "defines"), strict=True))


def _heading_level(level: int) -> int:
    """h4-h6 stay inside their section as emphasised text."""
    return level if level <= 3 else 0


@dataclass
class SectionDraft:
    title: str
    level: int
    path: list[str]
    parts: list[str] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)  # the ids a link can point at in it
    links: list[str] = field(default_factory=list)  # the hrefs written in it
    defines: list[str] = field(default_factory=list)  # the API identifiers it defines
    # Where a link to it lands (its deep link's fragment): the id that opens it, else the one
    # of the nearest section before it ("" when none: the page's top).
    anchor: str = ""

    @property
    def content(self) -> str:
        return "\n\n".join(self.parts).strip()

    def take(self, marks: SectionDraft) -> None:
        """Receive the marks held for the next section (``marks`` is left empty)."""
        self.anchors += marks.anchors
        marks.anchors = []
        self.take_references(marks)

    def take_references(self, marks: SectionDraft) -> None:
        """Receive the links and definitions held; anchors stay for what follows them (a
        link in a heading must not carry the heading's own id off to the section above)."""
        self.links += marks.links
        self.defines += marks.defines
        marks.links, marks.defines = [], []


def split_sections(
    blocks: Iterator[Block], title_hint: str | None, url_name: str
) -> tuple[str, list[SectionDraft]]:
    """The article title and its non-empty sections, split at h2/h3.

    The title is the first h1, else the page's <title>, else its first heading, else a name
    made from its URL. Marks (kpack.ingest.html) go to the section they fall in: an anchor to
    the section of what follows it (a wrapper's id comes before the heading it names), a link
    or a definition to the current section; the marks of an empty section pass to the next.
    A section's ``anchor`` is the first id held when it opens (its wrapper's or its heading's),
    else the anchor of the section before it: an id further down a section lands below its
    start.
    """
    title: str | None = None
    first_heading: str | None = None
    drafts: list[SectionDraft] = []
    current: SectionDraft | None = None
    h2: str | None = None
    held = SectionDraft("", 0, [])  # marks waiting for the section they belong to
    last_anchor = ""
    for kind, level, text in blocks:
        if kind in MARKS:
            getattr(held, MARK_FIELDS[kind]).append(text)
            if kind != "anchor" and current is not None:
                current.take_references(held)
            continue
        if kind == "heading" and first_heading is None:
            first_heading = text
        level = _heading_level(level) if kind == "heading" else 0
        if kind == "heading" and level == 1 and title is None:
            title = text
            continue
        if kind == "heading" and level:
            h2 = text if level <= 2 else h2
            current = SectionDraft(text, level, [h2, text] if level == 3 and h2 else [text])
            drafts.append(current)
            current.take(held)
            current.anchor = last_anchor = next(iter(current.anchors), last_anchor)
            continue
        if current is None:  # the introduction, before any h2/h3
            current = SectionDraft("", 1, [])
            drafts.append(current)
            current.take(held)
            current.anchor = last_anchor = next(iter(current.anchors), "")
        current.take(held)
        if kind == "code":
            current.parts.append(f"```\n{text}\n```")
        elif kind == "heading":
            current.parts.append(f"**{text}**")
        else:
            current.parts.append(text)
    title = title or title_hint or first_heading or url_name
    kept: list[SectionDraft] = []
    for draft in drafts:
        draft.path = [title, *draft.path]
        draft.title = draft.title or title
        if draft.content:
            draft.take(held)
            kept.append(draft)
        else:  # its marks point at what follows it
            held.take(draft)
    if kept:
        kept[-1].take(held)
    return title, kept


def category_of(url: str) -> str:
    """The folder a page sits in (library, tutorial, wiki...), else its host."""
    parts = urlsplit(url)
    folder = PurePosixPath(unquote(parts.path)).parent.name
    return folder or parts.hostname or "root"


def url_name(url: str) -> str:
    """A readable name for a page that has no title of its own."""
    name = PurePosixPath(unquote(urlsplit(url).path)).stem
    return name.replace("-", " ").replace("_", " ").strip() or url


@dataclass
class ParsedPages:
    """The rows of the articles, sections, links and section_links tables, and the pages
    that failed."""

    articles: list[dict] = field(default_factory=list)
    sections: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    section_links: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # {"url", "error"}


class ParsedPage(NamedTuple):
    article: dict
    sections: list[dict]
    links: list[tuple[str, str]]  # (href, anchor text) of every link of the page
    anchors: dict[str, str]  # anchor -> the id of the section holding it
    hrefs: list[tuple[str, str]]  # (section id, href) of every link, by the section it is in


def parse_page(page: dict) -> ParsedPage:
    """One fetched page (a fetched_pages row without error): its article row, its section
    rows, its links, and where its anchors and links are (see :class:`ParsedPage`)."""
    fmt, body = page["format"], page["body"]
    title, drafts = split_sections(
        page_blocks(fmt, body, marks=True), page["title_hint"], url_name(page["final_url"])
    )
    url = page["url"]
    sections = []
    anchors: dict[str, str] = {}
    hrefs: list[tuple[str, str]] = []
    for index, draft in enumerate(drafts):
        heading_path = " > ".join(draft.path)
        content = draft.content
        this = section_id(url, index)
        for anchor in draft.anchors:
            anchors.setdefault(anchor, this)
        hrefs += [(this, href) for href in dict.fromkeys(draft.links)]
        sections.append(
            {
                "section_id": this,
                "article_url": url,
                "article_title": title,
                "section_index": index,
                "title": draft.title,
                "heading_path": heading_path,
                "level": draft.level,
                "content": content,
                "word_count": len(content.split()),
                "content_hash": content_hash(passage_text(heading_path, content)),
                "defines": list(dict.fromkeys(draft.defines)),
                "anchor": draft.anchor,
            }
        )
    article = {
        "url": url,
        "final_url": page["final_url"],
        "title": title,
        "category": category_of(page["final_url"]),
        "word_count": sum(s["word_count"] for s in sections),
        "section_count": len(sections),
        "content_hash": page["content_hash"],
        # How the page came into the pack (kpack.ingest.crawl); absent on hand-made rows.
        **{name: page.get(name) for name, _ in CRAWL_COLUMNS},
    }
    return ParsedPage(article, sections, page_links(fmt, body), anchors, hrefs)


def parse_pages(pages: Iterable[dict]) -> ParsedPages:
    """Every fetched page parsed; a page that cannot be parsed is a failure, not an abort."""
    parsed = ParsedPages()
    raw_links: list[tuple[str, str, str, str]] = []
    places: dict[tuple[str, str], str] = {}  # (article url, anchor) -> section id
    refs: list[tuple[str, str, str]] = []  # (section id, base url, href)
    for page in pages:
        try:
            one = parse_page(page)
        except Exception as exc:  # a page is untrusted input: whatever it trips fails it alone
            parsed.failures.append({"url": page["url"], "error": f"{type(exc).__name__}: {exc}"})
            continue
        parsed.articles.append(one.article)
        parsed.sections.extend(one.sections)
        raw_links.extend((page["url"], page["final_url"], href, text) for href, text in one.links)
        places.update(((page["url"], anchor), at) for anchor, at in one.anchors.items())
        refs.extend((at, page["final_url"], href) for at, href in one.hrefs)
    parsed.links = internal_links(parsed.articles, raw_links)
    parsed.section_links = section_links(parsed.articles, parsed.sections, places, refs)
    return parsed


def _article_keys(articles: list[dict]) -> dict[str, str]:
    """page_key of every article's URL and final URL -> its URL."""
    by_url: dict[str, str] = {}
    for article in articles:
        by_url[page_key(article["url"])] = article["url"]
        by_url[page_key(article["final_url"])] = article["url"]
    return by_url


def section_links(
    articles: list[dict],
    sections: list[dict],
    places: dict[tuple[str, str], str],
    refs: list[tuple[str, str, str]],
) -> list[dict]:
    """section_links rows: each (section id, base url, href) of ``refs`` resolved to the
    section of the pack holding the href's anchor (``places``: (article url, anchor) ->
    section id), or to the first section of the page it names when it has no anchor; once per
    (source, target, anchor), never a section to itself. An anchor the page does not hold
    resolves to nothing."""
    by_url = _article_keys(articles)
    first: dict[str, str] = {}
    for section in sections:
        first.setdefault(section["article_url"], section["section_id"])
    seen: set[tuple[str, str, str]] = set()
    rows = []
    for source, base, href in refs:
        if href.startswith(("mailto:", "javascript:")):
            continue
        absolute = urljoin(base, href)
        article = by_url.get(page_key(absolute))
        if article is None:
            continue
        anchor = unquote(urlsplit(absolute).fragment)
        target = places.get((article, anchor)) if anchor else first.get(article)
        if target is None or target == source or (source, target, anchor) in seen:
            continue
        seen.add((source, target, anchor))
        rows.append({"source_section_id": source, "target_section_id": target, "anchor": anchor})
    return rows


def internal_links(articles: list[dict], raw_links: list[tuple[str, str, str, str]]) -> list[dict]:
    """LINKS_TO rows: (source url, base url, href, anchor text) resolved to another article of
    the pack, once per (source, target) pair."""
    by_url = _article_keys(articles)
    seen: set[tuple[str, str]] = set()
    links = []
    for source, base, href, text in raw_links:
        if not href or href.startswith(("#", "mailto:", "javascript:")):
            continue
        target = by_url.get(page_key(urljoin(base, href)))
        if target is None or target == source or (source, target) in seen:
            continue
        seen.add((source, target))
        links.append(
            {
                "source_url": source,
                "target_url": target,
                "anchor_text": text,
                "link_type": "internal",
            }
        )
    return links
