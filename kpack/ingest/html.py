"""HTML and Markdown as blocks: a page's main content, its headings, paragraphs, code and links.

``main_content`` keeps what a reader would read (main, [role=main] or article; scripts, styles,
navigation, headers, footers and asides dropped). ``html_blocks`` and ``markdown_blocks`` turn
a page into (kind, level, text) blocks in document order, which kpack.ingest.sections groups
into titled sections. Code blocks stay as code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from selectolax.lexbor import LexborHTMLParser, LexborNode

from kpack.text import fence_roles

NOISE_TAGS = ["script", "style", "noscript", "template", "svg", "nav", "aside", "footer", "form"]
MAIN_SELECTORS = ("main", "[role=main]", "article")
# Permalink anchors (Sphinx, MkDocs) add a pilcrow to every heading.
PERMALINK_SELECTORS = ("a.headerlink", "a.anchor", "a.header-anchor")

# Formats whose body is HTML: a PDF is kept as the HTML kpack.ingest.pdf writes of it.
HTML_FORMATS = ("html", "pdf")
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
MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
MD_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
HTML_HREF = re.compile(r"""<a\s[^>]*href=["']([^"']+)["']""", re.IGNORECASE)

Block = tuple[str, int, str]  # (kind: heading|text|code, heading level or 0, text)


def squash(text: str) -> str:
    return WS.sub(" ", text).strip()


def main_content(html: str) -> tuple[str | None, str]:
    """The page title hint and the cleaned HTML of its main content ("" when it has no text)."""
    tree = LexborHTMLParser(html)
    title_node = tree.css_first("title")
    title = title_node.text(strip=True) if title_node else None
    tree.strip_tags(NOISE_TAGS)
    root = next((n for s in MAIN_SELECTORS if (n := tree.css_first(s)) is not None), None)
    if root is None:
        # No main landmark: the page header is site chrome, not content.
        tree.strip_tags(["header"])
        root = tree.body
    if root is None or not root.text(strip=True):
        return title, ""
    for selector in PERMALINK_SELECTORS:
        for node in root.css(selector):
            node.decompose()
    return title, root.html or ""


def html_blocks(html: str) -> Iterator[Block]:
    """Headings, paragraphs and code blocks of cleaned HTML, in document order."""
    root = LexborHTMLParser(html).body
    if root is not None:
        yield from _walk(root)


def _walk(root: LexborNode) -> Iterator[Block]:
    """The blocks under ``root``, walked with an explicit stack, not recursion: a page nested
    thousands of elements deep must not exhaust Python's recursion limit.

    Each stack frame is (the children still to visit, the prefix of its text blocks: "- " per
    enclosing list item). Inline text gathers until the next block element or the end of
    its container, then becomes one paragraph.
    """
    inline: list[str] = []
    stack: list[tuple[Iterator[LexborNode], str]] = [(root.iter(include_text=True), "")]

    def flush(prefix: str) -> Iterator[Block]:
        text = squash("".join(inline))
        inline.clear()
        if text:
            yield ("text", 0, prefix + text)

    while stack:
        children, prefix = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            yield from flush(prefix)
            continue
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
            yield from flush(prefix)
            if tag in HEADING_LEVELS:
                text, swallowed = _heading(child)
                yield ("heading", HEADING_LEVELS[tag], text)
                if swallowed:
                    stack.append((iter(swallowed), prefix))
            elif tag == "pre":
                code = (child.text(deep=True) or "").strip("\n")
                if code.strip():
                    yield ("code", 0, code)
            elif tag in LEAF_BLOCKS:
                text = squash(child.text(deep=True))
                if text:
                    yield ("text", 0, prefix + text)
            elif tag == "tr":
                cells = [squash(c.text(deep=True)) for c in child.css("th, td")]
                if any(cells):
                    yield ("text", 0, prefix + " | ".join(cells))
            elif tag == "li":
                stack.append((child.iter(include_text=True), prefix + "- "))
            else:
                stack.append((child.iter(include_text=True), prefix))


def _heading(node: LexborNode) -> tuple[str, list[LexborNode]]:
    """A heading's text, and the nodes it swallowed in malformed HTML (an unclosed <h1>), which
    are walked as if they followed it."""
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
    return text[:300], parts[first_block:]


def markdown_blocks(text: str) -> Iterator[Block]:
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # YAML front matter
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
        if end is not None:
            lines = lines[end + 1 :]
    paragraph: list[str] = []
    code: list[str] = []

    def flush() -> Iterator[Block]:
        if paragraph:
            yield ("text", 0, "\n".join(paragraph).strip())
            paragraph.clear()

    for line, role in fence_roles(lines):
        if role == "open":
            yield from flush()
        elif role == "code":
            code.append(line)
        elif role == "close":
            yield ("code", 0, "\n".join(code))
            code = []
        else:
            stripped = line.strip()
            heading = MD_HEADING.match(line)
            if heading:
                yield from flush()
                yield ("heading", len(heading.group(1)), heading.group(2).strip())
            elif len(paragraph) == 1 and len(stripped) >= 3 and set(stripped) in ({"="}, {"-"}):
                # Setext heading: one line of text underlined with === (h1) or --- (h2).
                yield ("heading", 1 if stripped[0] == "=" else 2, paragraph.pop().strip())
            elif not stripped:
                yield from flush()
            else:
                paragraph.append(line.rstrip())
    if code:  # a fence left open runs to the end of the page
        yield ("code", 0, "\n".join(code))
    yield from flush()


def page_blocks(fmt: str, body: str) -> Iterator[Block]:
    """The blocks of a fetched page: HTML, or Markdown (plain text reads as Markdown)."""
    return html_blocks(body) if fmt in HTML_FORMATS else markdown_blocks(body)


def page_links(fmt: str, body: str) -> list[tuple[str, str]]:
    """(href, anchor text) of every link in the content."""
    if fmt in HTML_FORMATS:
        tree = LexborHTMLParser(body)
        return [
            (a.attributes.get("href") or "", squash(a.text(deep=True))) for a in tree.css("a[href]")
        ]
    return [(m.group(1), "") for m in MD_LINK.finditer(body)] + [
        (m.group(1), "") for m in HTML_HREF.finditer(body)
    ]
