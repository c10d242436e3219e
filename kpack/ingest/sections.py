"""Fetched pages as articles, titled sections and the links between them.

Sections start at h2/h3 (## / ### in Markdown) and keep their heading path and level; text
before the first of them is the article's introduction. Code blocks stay as fenced text.
Links between articles come from in-content links that point at another article of the same
pack. A page the parser cannot read is one failed page, never a failed build.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import unquote, urljoin, urlsplit

from kpack.contracts import CRAWL_COLUMNS, content_hash, passage_text, section_id
from kpack.ingest.html import Block, page_blocks, page_links
from kpack.packs import page_key


def _heading_level(level: int) -> int:
    """h4-h6 stay inside their section as emphasised text."""
    return level if level <= 3 else 0


@dataclass
class SectionDraft:
    title: str
    level: int
    path: list[str]
    parts: list[str] = field(default_factory=list)

    @property
    def content(self) -> str:
        return "\n\n".join(self.parts).strip()


def split_sections(
    blocks: Iterator[Block], title_hint: str | None, url_name: str
) -> tuple[str, list[SectionDraft]]:
    """The article title and its non-empty sections, split at h2/h3.

    The title is the first h1, else the page's <title>, else its first heading, else a name
    made from its URL.
    """
    title: str | None = None
    first_heading: str | None = None
    drafts: list[SectionDraft] = []
    current: SectionDraft | None = None
    h2: str | None = None
    for kind, level, text in blocks:
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
            continue
        if current is None:  # the introduction, before any h2/h3
            current = SectionDraft("", 1, [])
            drafts.append(current)
        if kind == "code":
            current.parts.append(f"```\n{text}\n```")
        elif kind == "heading":
            current.parts.append(f"**{text}**")
        else:
            current.parts.append(text)
    title = title or title_hint or first_heading or url_name
    for draft in drafts:
        draft.path = [title, *draft.path]
        draft.title = draft.title or title
    return title, [d for d in drafts if d.content]


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
    """The rows of the articles, sections and links tables, and the pages that failed."""

    articles: list[dict] = field(default_factory=list)
    sections: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # {"url", "error"}


def parse_page(page: dict) -> tuple[dict, list[dict], list[tuple[str, str]]]:
    """One fetched page (a fetched_pages row without error): its article row, its section
    rows, and the (href, anchor text) of its links."""
    fmt, body = page["format"], page["body"]
    title, drafts = split_sections(
        page_blocks(fmt, body), page["title_hint"], url_name(page["final_url"])
    )
    url = page["url"]
    sections = []
    for index, draft in enumerate(drafts):
        heading_path = " > ".join(draft.path)
        content = draft.content
        sections.append(
            {
                "section_id": section_id(url, index),
                "article_url": url,
                "article_title": title,
                "section_index": index,
                "title": draft.title,
                "heading_path": heading_path,
                "level": draft.level,
                "content": content,
                "word_count": len(content.split()),
                "content_hash": content_hash(passage_text(heading_path, content)),
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
    return article, sections, page_links(fmt, body)


def parse_pages(pages: Iterable[dict]) -> ParsedPages:
    """Every fetched page parsed; a page that cannot be parsed is a failure, not an abort."""
    parsed = ParsedPages()
    raw_links: list[tuple[str, str, str, str]] = []
    for page in pages:
        try:
            article, sections, links = parse_page(page)
        except Exception as exc:  # a page is untrusted input: whatever it trips fails it alone
            parsed.failures.append({"url": page["url"], "error": f"{type(exc).__name__}: {exc}"})
            continue
        parsed.articles.append(article)
        parsed.sections.extend(sections)
        raw_links.extend((page["url"], page["final_url"], href, text) for href, text in links)
    parsed.links = internal_links(parsed.articles, raw_links)
    return parsed


def internal_links(articles: list[dict], raw_links: list[tuple[str, str, str, str]]) -> list[dict]:
    """LINKS_TO rows: (source url, base url, href, anchor text) resolved to another article of
    the pack, once per (source, target) pair."""
    by_url: dict[str, str] = {}
    for article in articles:
        by_url[page_key(article["url"])] = article["url"]
        by_url[page_key(article["final_url"])] = article["url"]
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
