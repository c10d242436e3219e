"""HTML and Markdown as blocks: a page's main content, its headings, paragraphs, code and links.

``main_content`` keeps what a reader would read (main, [role=main] or article; scripts, styles,
navigation, headers, footers and asides dropped). ``html_blocks`` and ``markdown_blocks`` turn
a page into (kind, level, text) blocks in document order, which kpack.ingest.sections groups
into titled sections. Code blocks stay as code.

Asked for ``marks``, they also say where the page's places and references are (the
documentation graph, issue 23): an ``anchor`` (an id a link can point at: a Sphinx section or
signature, a Markdown heading's slug), a ``link`` (an href) and ``defines`` (the API identifier
a signature defines: a ``<dt>`` of a definition list, or a heading written as code). Marks sit
beside the text: they never end a paragraph, and kpack.ingest.sections gives each to the
section it falls in.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

from selectolax.lexbor import LexborHTMLParser, LexborNode

from kpack.text import DOTTED_NAME, SIGNATURE_KINDS, fence_roles

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
# The most seconds one page's blocks may take to walk: a real page takes milliseconds (the
# walk is linear in its elements), so only a page built to be pathological reaches it, and it
# fails alone instead of holding the build.
PARSE_BUDGET_S = 20.0
BUDGET_CHECK_EVERY = 1024  # elements walked between two looks at the clock
WS = re.compile(r"\s+")
# What reads as an answer's citation ([Source: title], retrieval.citations) inside page text.
CITATION_LOOKALIKE = re.compile(r"\[\s*(sources?\s*:[^\]]*)\]", re.IGNORECASE)

MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
MD_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
HTML_HREF = re.compile(r"""<a\s[^>]*href=["']([^"']+)["']""", re.IGNORECASE)

# (kind: heading|text|code, or a mark: anchor|link|defines; heading level or 0; text)
Block = tuple[str, int, str]
MARKS = ("anchor", "link", "defines")
# A definition's anchor as documentation generators write it (Sphinx, pdoc, mkdocstrings,
# rustdoc): the qualified name, "json.dump", "pathlib.PurePath.suffix".
QUALIFIED_NAME = re.compile(DOTTED_NAME)
# A signature: an optional keyword, a name, and its parameters right after it
# ("class json.JSONEncoder(*, skipkeys=False)", "print(*objects, sep=' ')"); a space before
# the parenthesis is prose ("Example (advanced)").
SIGNATURE = re.compile(rf"(?:(?:{SIGNATURE_KINDS})\s+)*(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\(")
# A Markdown heading's anchor as GitHub and most renderers make it: what is not a word
# character, a space or a hyphen dropped, spaces as hyphens.
SLUG_DROP = re.compile(r"[^\w\- ]")


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


def defined_identifier(anchor: str | None, text: str) -> str | None:
    """The API identifier a signature line or a heading defines: its anchor when that is a
    qualified name, else the name its text opens a call signature with (backticks ignored);
    None for prose."""
    if anchor and QUALIFIED_NAME.fullmatch(anchor):
        return anchor
    match = SIGNATURE.match(text.replace("`", "").strip())
    return match.group("name") if match else None


def heading_slug(text: str) -> str:
    """The anchor a Markdown renderer gives a heading ("Stage 5: embeddings" ->
    "stage-5-embeddings")."""
    return SLUG_DROP.sub("", text.replace("`", "").strip().lower()).replace(" ", "-")


def _marks(node: LexborNode, inside: bool) -> Iterator[Block]:
    """The anchors and links of an element: its own, and with ``inside`` those of every
    element within it (a paragraph or an inline element, whose children are not walked)."""
    for element in node.css("[id], a[href]") if inside else (node,):
        anchor = element.attributes.get("id")
        if anchor:
            yield ("anchor", 0, anchor)
        href = element.attributes.get("href") if element.tag == "a" else None
        if href:
            yield ("link", 0, href)


def _definition(node: LexborNode, text: str) -> Iterator[Block]:
    identifier = defined_identifier(node.attributes.get("id"), text)
    if identifier:
        yield ("defines", 0, identifier)


class ParseBudgetExceeded(Exception):
    """A page whose blocks took longer than PARSE_BUDGET_S to walk."""


def html_blocks(html: str, marks: bool = False) -> Iterator[Block]:
    """Headings, paragraphs and code blocks of cleaned HTML, in document order; with
    ``marks``, its anchors, links and definitions too (see the module docstring)."""
    root = LexborHTMLParser(html).body
    if root is not None:
        yield from _walk(root, marks)


def _walk(root: LexborNode, marks: bool = False) -> Iterator[Block]:
    """The blocks under ``root``, walked with an explicit stack, not recursion: a page nested
    thousands of elements deep must not exhaust Python's recursion limit.

    Each stack frame is (the children still to visit, the prefix of its text blocks: "- " per
    enclosing list item). Inline text gathers until the next block element or the end of
    its container, then becomes one paragraph. The walk is linear in the page's elements
    (which inline elements hold a block is found once, see _holding_blocks) and raises
    ParseBudgetExceeded past PARSE_BUDGET_S.
    """
    inline: list[str] = []
    stack: list[tuple[Iterator[LexborNode], str]] = [(root.iter(include_text=True), "")]
    holding = _holding_blocks(root)
    deadline = time.monotonic() + PARSE_BUDGET_S
    walked = 0

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
        walked += 1
        if walked % BUDGET_CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise ParseBudgetExceeded(
                f"the page took more than {PARSE_BUDGET_S:g} s to parse ({walked:,} elements "
                f"walked, nested up to {len(stack):,} deep); it is skipped"
            )
        tag = child.tag
        if tag == "-text":
            inline.append(child.text_content or "")
        elif tag in INLINE and child.mem_id not in holding:
            inline.append(child.text(deep=True))
            if marks:  # its own only: a link inside one is rare, and looking costs a query
                yield from _marks(child, inside=False)
        elif tag == "br":
            inline.append(" ")
        elif tag in SKIP or tag == "-comment":
            continue
        else:
            yield from flush(prefix)
            if marks:
                # A walked element's children are marked as they are visited.
                walked = tag not in HEADING_LEVELS and tag not in LEAF_BLOCKS and tag != "tr"
                yield from _marks(child, inside=not walked)
            if tag in HEADING_LEVELS:
                text, swallowed = _heading(child)
                yield ("heading", HEADING_LEVELS[tag], text)
                if marks:
                    yield from _definition(child, text)
                if swallowed:
                    stack.append((iter(swallowed), prefix))
            elif tag == "pre":
                code = (child.text(deep=True) or "").strip("\n")
                if code.strip():
                    yield ("code", 0, code)
            elif tag in LEAF_BLOCKS:
                text = squash(child.text(deep=True))
                if marks and tag == "dt":
                    yield from _definition(child, text)
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


def _holding_blocks(root: LexborNode) -> set[int]:
    """The ids (mem_id) of the elements that hold a block element (BLOCK_SELECTOR) somewhere
    inside: each block marks its ancestors up to the first already marked, so every element is
    marked once. Asking each inline element with css_first instead scanned its whole subtree,
    quadratic in the depth of nested inline elements (40,000 nested <b>: 71 s)."""
    holding: set[int] = set()
    for block in root.css(BLOCK_SELECTOR):
        parent = block.parent
        while parent is not None and parent.mem_id not in holding:
            holding.add(parent.mem_id)
            parent = parent.parent
    return holding


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


def markdown_blocks(text: str, marks: bool = False) -> Iterator[Block]:
    """Headings, paragraphs and code blocks of Markdown; with ``marks``, each heading's anchor
    (its slug) and definition, and the links of the text."""
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
            setext = len(paragraph) == 1 and len(stripped) >= 3 and set(stripped) in ({"="}, {"-"})
            if heading or setext:
                # Setext heading: one line of text underlined with === (h1) or --- (h2).
                level = len(heading.group(1)) if heading else 1 if stripped[0] == "=" else 2
                title = heading.group(2).strip() if heading else paragraph.pop().strip()
                yield from flush()
                yield from _markdown_heading(level, title, marks)
            elif not stripped:
                yield from flush()
            else:
                paragraph.append(line.rstrip())
                if marks:
                    yield from (("link", 0, href) for href in _markdown_hrefs(line))
    if code:  # a fence left open runs to the end of the page
        yield ("code", 0, "\n".join(code))
    yield from flush()


def _markdown_heading(level: int, title: str, marks: bool) -> Iterator[Block]:
    """A heading block; with ``marks``, its anchor first (it names the section the heading
    starts) and the identifier it defines after."""
    if marks:
        yield ("anchor", 0, heading_slug(title))
    yield ("heading", level, title)
    if marks:
        identifier = defined_identifier(None, title)
        if identifier:
            yield ("defines", 0, identifier)


def _markdown_hrefs(text: str) -> list[str]:
    return [m.group(1) for m in MD_LINK.finditer(text)] + [
        m.group(1) for m in HTML_HREF.finditer(text)
    ]


def page_blocks(fmt: str, body: str, marks: bool = False) -> Iterator[Block]:
    """The blocks of a fetched page: HTML, or Markdown (plain text reads as Markdown), each
    text's citation lookalikes defused (see defuse_citations)."""
    blocks = html_blocks(body, marks) if fmt in HTML_FORMATS else markdown_blocks(body, marks)
    for kind, level, text in blocks:
        yield kind, level, text if kind in MARKS else defuse_citations(text)


def defuse_citations(text: str) -> str:
    """Page text is data, never a citation: ``[Source: X]`` written in a page (in any case or
    spacing) becomes ``(Source: X)``, so an answer that quotes the page never shows it as the
    ``[Source: title]`` an answer cites its passages with."""
    return CITATION_LOOKALIKE.sub(r"(\1)", text) if "[" in text else text


# Where a page's navigation links are: its <nav> elements (a book's table of contents, as
# mdBook and rustdoc write it in every page's sidebar) and its next and previous pages.
NAVIGATION_LINKS = "nav a[href], a[rel~=next][href], a[rel~=prev][href], link[rel~=next][href]"


def navigation_hrefs(html: str) -> list[str]:
    """The hrefs of a whole HTML page's navigation (NAVIGATION_LINKS), in document order.
    main_content leaves navigation out of the body, yet on some sites (mdBook's books) it is
    the only way from one page to the next."""
    return [
        href
        for node in LexborHTMLParser(html).css(NAVIGATION_LINKS)
        if (href := (node.attributes.get("href") or "").strip())
    ]


def page_links(fmt: str, body: str) -> list[tuple[str, str]]:
    """(href, anchor text) of every link in the content."""
    if fmt in HTML_FORMATS:
        tree = LexborHTMLParser(body)
        return [
            (a.attributes.get("href") or "", squash(a.text(deep=True))) for a in tree.css("a[href]")
        ]
    return [(href, "") for href in _markdown_hrefs(body)]
