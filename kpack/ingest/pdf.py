"""PDF documents as pages: their text under their outline's headings, written as HTML.

pypdf (pure Python) reads the text of each page. The entries of the document's outline (its
bookmarks) become headings at the start of the page each points to: h2 for the top level, h3
for the next (a section each, kpack.ingest.sections), h4 below (bold text inside the section).
A PDF without an outline gets one heading per page ("Page 3"). The document's Title metadata
is the title, else the name of its file. Written as HTML with every text escaped, the result is parsed like any page, and
no text of the PDF can pose as a heading or a link.

Bounds: the fetcher's size cap applies to the PDF file itself, ``max_pages`` to its pages and
``max_chars`` to its text; ``check`` runs before each page (the fetch's deadline). pypdf caps
what one compressed stream may unpack to. A PDF pypdf cannot read, one locked by a password and
one without text (a scan) are each a PdfError.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from html import escape
from io import BytesIO
from typing import Any, TypeVar

from pypdf import PdfReader
from pypdf.generic import Destination

from kpack.ingest.sections import url_name

OUTLINE_TOP_LEVEL = 2  # the outline's first level is an h2 heading
T = TypeVar("T")


class PdfError(Exception):
    """A PDF that cannot be read into text, for a reason worth telling the user."""


def pdf_html(
    data: bytes, url: str, max_pages: int, max_chars: int, check: Callable[[], None]
) -> str:
    """The text of the PDF at ``url`` as HTML: its title, then per page its headings and
    paragraphs."""
    reader = _pypdf(PdfReader, BytesIO(data))
    if _pypdf(_locked, reader):
        raise PdfError("the PDF is locked with a password")
    pages = _pypdf(len, reader.pages)
    if pages > max_pages:
        raise PdfError(
            f"the PDF has {pages} pages, over the cap of {max_pages} (fetch.max_pdf_pages)"
        )
    title = str(_pypdf(_title, reader) or "").strip() or url_name(url)
    headings = _pypdf(_outline_headings, reader, pages)
    parts = [f"<title>{escape(title)}</title><main><h1>{escape(title)}</h1>"]
    chars = 0
    for index in range(pages):
        check()
        for level, heading in headings.get(index) or _page_heading(headings, index):
            parts.append(f"<h{level}>{escape(heading)}</h{level}>")
        text = _pypdf(_page_text, reader, index)
        chars += len(text.strip())
        if chars > max_chars:
            raise PdfError(f"the PDF's text exceeds the size cap of {max_chars} characters")
        parts += [f"<p>{escape(p)}</p>" for p in text.split("\n\n") if p.strip()]
    if not chars:
        raise PdfError("the PDF has no text (a scanned document without a text layer?)")
    parts.append("</main>")
    return "\n".join(parts)


def _pypdf(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``; whatever pypdf trips on in a damaged or hostile PDF is a PdfError."""
    try:
        return call(*args)
    except Exception as exc:  # a PDF is untrusted input
        raise PdfError(f"not a readable PDF ({type(exc).__name__}: {exc})") from None


def _locked(reader: PdfReader) -> bool:
    """Encrypted with a password to open it (not only an owner password, as many are)."""
    return reader.is_encrypted and not reader.decrypt("")


def _title(reader: PdfReader) -> str | None:
    return reader.metadata.title if reader.metadata else None


def _page_text(reader: PdfReader, index: int) -> str:
    return reader.pages[index].extract_text() or ""


def _page_heading(outline: dict[int, list], index: int) -> list[tuple[int, str]]:
    """The heading of a page the outline names nothing on: "Page N" when there is no outline."""
    return [] if outline else [(OUTLINE_TOP_LEVEL, f"Page {index + 1}")]


def _outline_headings(reader: PdfReader, pages: int) -> dict[int, list[tuple[int, str]]]:
    """The outline's entries by the page they point to: (heading level, title), in order."""
    headings: dict[int, list[tuple[int, str]]] = defaultdict(list)

    def walk(items: list, level: int) -> None:
        for item in items:
            if isinstance(item, list):  # the entries under the one before
                walk(item, level + 1)
            elif isinstance(item, Destination) and str(item.title or "").strip():
                page = reader.get_destination_page_number(item)
                if page is not None and 0 <= page < pages:
                    headings[page].append((min(level, 4), str(item.title).strip()))

    walk(reader.outline, OUTLINE_TOP_LEVEL)
    return headings
