"""Stage 2, articles / sections / links: each fetched page split into titled sections.

Sections start at h2/h3 (## / ### in Markdown) and keep their heading path and level; text
before the first of them is the article's introduction. Code blocks stay as fenced text.
LINKS_TO edges come from in-content links that point at another article of the same pack.
"""

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import unquote, urljoin, urlsplit

import pyarrow as pa
from dagster import AssetExecutionContext, AssetOut, MetadataValue, Output, multi_asset
from selectolax.lexbor import LexborHTMLParser, LexborNode

from assets.partitions import follow_upstream, packs_partitions
from kpack.contracts import content_hash, passage_text, stable_id
from kpack.packs import normalize_url

HEADING_LEVELS = {"h1": 1, "h2": 2, "h3": 3}
# Elements whose whole text is one paragraph (no block structure worth walking into).
LEAF_BLOCKS = {"p", "h4", "h5", "h6", "dt", "caption", "figcaption", "summary", "address", "label"}
INLINE = {
    "a",
    "abbr",
    "b",
    "bdi",
    "bdo",
    "cite",
    "code",
    "data",
    "dfn",
    "em",
    "i",
    "kbd",
    "mark",
    "q",
    "s",
    "samp",
    "small",
    "span",
    "strong",
    "sub",
    "sup",
    "time",
    "u",
    "var",
    "wbr",
    "tt",
}
# An inline element wrapping any of these (a card link around a heading) is walked as a block.
BLOCK_SELECTOR = "p, div, section, h1, h2, h3, h4, h5, h6, ul, ol, dl, pre, table, blockquote"
SKIP = {"img", "picture", "video", "audio", "canvas", "button", "input", "select", "iframe"}
WS = re.compile(r"\s+")

Block = tuple[str, int, str]  # (kind: heading|text|code, heading level or 0, text)


def squash(text: str) -> str:
    return WS.sub(" ", text).strip()


def html_blocks(html: str) -> Iterator[Block]:
    """Headings, paragraphs and code blocks of cleaned HTML, in document order."""
    root = LexborHTMLParser(html).body
    if root is not None:
        yield from _walk(root)


def _walk(node: LexborNode) -> Iterator[Block]:
    inline: list[str] = []

    def flush() -> Iterator[Block]:
        text = squash("".join(inline))
        inline.clear()
        if text:
            yield ("text", 0, text)

    for child in node.iter(include_text=True):
        tag = child.tag
        if tag == "-text":
            inline.append(child.text_content or "")
        elif tag in INLINE and child.css_first(BLOCK_SELECTOR) is None:
            inline.append(child.text(deep=True))
        elif tag == "br":
            inline.append(" ")
        elif tag in SKIP or tag == "-comment":
            continue
        else:
            yield from flush()
            if tag in HEADING_LEVELS:
                yield from _heading(child, HEADING_LEVELS[tag])
            elif tag == "pre":
                code = (child.text(deep=True) or "").strip("\n")
                if code.strip():
                    yield ("code", 0, code)
            elif tag in LEAF_BLOCKS:
                text = squash(child.text(deep=True))
                if text:
                    yield ("text", 0, text)
            elif tag == "tr":
                cells = [squash(c.text(deep=True)) for c in child.css("th, td")]
                if any(cells):
                    yield ("text", 0, " | ".join(cells))
            elif tag == "li":
                for kind, level, text in _walk(child):
                    yield (kind, level, f"- {text}" if kind == "text" else text)
            else:
                yield from _walk(child)
    yield from flush()


def _heading(node: LexborNode, level: int) -> Iterator[Block]:
    """A heading; in malformed HTML (an unclosed <h1>) the blocks it swallowed follow it."""
    parts = list(node.iter(include_text=True))
    first_block = next(
        (i for i, n in enumerate(parts) if n.tag not in INLINE and n.tag not in ("-text", "br")),
        len(parts),
    )
    text = squash(
        "".join(
            (n.text_content or "") if n.tag == "-text" else n.text(deep=True)
            for n in parts[:first_block]
        )
    )
    yield ("heading", level, text[:300])
    for rest in parts[first_block:]:
        if rest.tag == "-text":
            if squash(rest.text_content or ""):
                yield ("text", 0, squash(rest.text_content or ""))
        elif rest.tag in INLINE:
            yield ("text", 0, squash(rest.text(deep=True)))
        else:
            yield from _walk_one(rest)


def _walk_one(node: LexborNode) -> Iterator[Block]:
    """The blocks of one element, as if it were the only child of a container."""
    wrapper = LexborHTMLParser(f"<body>{node.html}</body>").body
    if wrapper is not None:
        yield from _walk(wrapper)


MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
MD_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
MD_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
HTML_HREF = re.compile(r"""<a\s[^>]*href=["']([^"']+)["']""", re.IGNORECASE)


def markdown_blocks(text: str) -> Iterator[Block]:
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # YAML front matter
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
        if end is not None:
            lines = lines[end + 1 :]
    paragraph: list[str] = []
    fence: str | None = None
    code: list[str] = []

    def flush() -> Iterator[Block]:
        if paragraph:
            yield ("text", 0, "\n".join(paragraph).strip())
            paragraph.clear()

    for line in lines:
        fence_match = MD_FENCE.match(line)
        if fence is not None:
            closing = fence_match and fence_match.group(1).startswith(fence)
            if closing:
                yield ("code", 0, "\n".join(code))
                fence, code = None, []
            else:
                code.append(line)
            continue
        stripped = line.strip()
        heading = MD_HEADING.match(line)
        if fence_match:
            yield from flush()
            fence = fence_match.group(1)
        elif heading:
            yield from flush()
            yield ("heading", len(heading.group(1)), heading.group(2).strip())
        elif len(paragraph) == 1 and len(stripped) >= 3 and set(stripped) in ({"="}, {"-"}):
            # Setext heading: one line of text underlined with === (h1) or --- (h2).
            yield ("heading", 1 if stripped[0] == "=" else 2, paragraph.pop().strip())
        elif not stripped:
            yield from flush()
        else:
            paragraph.append(line.rstrip())
    if fence is not None and code:
        yield ("code", 0, "\n".join(code))
    yield from flush()


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


def page_links(fmt: str, body: str) -> list[tuple[str, str]]:
    """(href, anchor text) of every link in the content."""
    if fmt == "html":
        tree = LexborHTMLParser(body)
        return [
            (a.attributes.get("href") or "", squash(a.text(deep=True))) for a in tree.css("a[href]")
        ]
    return [(m.group(1), "") for m in MD_LINK.finditer(body)] + [
        (m.group(1), "") for m in HTML_HREF.finditer(body)
    ]


def url_name(url: str) -> str:
    """A readable name for a page that has no title of its own."""
    name = PurePosixPath(unquote(urlsplit(url).path)).stem
    return name.replace("-", " ").replace("_", " ").strip() or url


@multi_asset(
    outs={
        "articles": AssetOut(
            description="One row per fetched URL.", automation_condition=follow_upstream
        ),
        "sections": AssetOut(
            description="Articles split at h2/h3.", automation_condition=follow_upstream
        ),
        "links": AssetOut(
            description="Links between articles of the pack.", automation_condition=follow_upstream
        ),
    },
    partitions_def=packs_partitions,
    group_name="parse",
    compute_kind="selectolax",
)
def parsed_pages(context: AssetExecutionContext, fetched_pages: pa.Table):
    started = time.perf_counter()
    pages = [r for r in fetched_pages.to_pylist() if r["error"] is None]
    articles, sections, raw_links = [], [], []
    for page in pages:
        blocks = (
            html_blocks(page["body"]) if page["format"] == "html" else markdown_blocks(page["body"])
        )
        title, drafts = split_sections(blocks, page["title_hint"], url_name(page["final_url"]))
        url = page["url"]
        article_key = stable_id(url)
        for index, draft in enumerate(drafts):
            heading_path = " > ".join(draft.path)
            content = draft.content
            sections.append(
                {
                    "section_id": f"{article_key}-{index:04d}",
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
        articles.append(
            {
                "url": url,
                "final_url": page["final_url"],
                "title": title,
                "category": category_of(page["final_url"]),
                "word_count": sum(len(d.content.split()) for d in drafts),
                "section_count": len(drafts),
                "content_hash": page["content_hash"],
            }
        )
        raw_links.extend(
            (url, page["final_url"], href, text)
            for href, text in page_links(page["format"], page["body"])
        )
    links = _internal_links(articles, raw_links)
    duration = round(time.perf_counter() - started, 3)
    yield Output(
        articles,
        output_name="articles",
        metadata={
            "articles": len(articles),
            "preview": MetadataValue.md(
                "\n".join(
                    ["| title | sections | words |", "|---|---|---|"]
                    + [
                        f"| {a['title']} | {a['section_count']} | {a['word_count']} |"
                        for a in articles[:20]
                    ]
                )
            ),
            "duration_s": duration,
        },
    )
    yield Output(
        sections,
        output_name="sections",
        metadata={
            "sections": len(sections),
            "mean_words": round(sum(s["word_count"] for s in sections) / max(len(sections), 1), 1),
            "duration_s": duration,
        },
    )
    yield Output(links, output_name="links", metadata={"links": len(links), "duration_s": duration})


def _internal_links(articles: list[dict], raw_links: list[tuple[str, str, str, str]]) -> list[dict]:
    by_url: dict[str, str] = {}
    for article in articles:
        by_url[normalize_url(article["url"])] = article["url"]
        by_url[normalize_url(article["final_url"])] = article["url"]
    seen: set[tuple[str, str]] = set()
    links = []
    for source, base, href, text in raw_links:
        if not href or href.startswith(("#", "mailto:", "javascript:")):
            continue
        target = by_url.get(normalize_url(urljoin(base, href)))
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
