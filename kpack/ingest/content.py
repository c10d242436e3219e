"""What a fetched body is and how it reads as text: its format (by content type and URL
suffix), its charset, a gzipped document unpacked.

Text: a page's charset comes from its byte-order mark, its Content-Type, its ``<meta charset>``
/ ``<meta http-equiv>`` or XML declaration (w3lib, as browsers read them), else UTF-8 when it
is, else windows-1252. A page that declares UTF-16 or UTF-32 but holds no NUL byte is not
such text (markup and newlines in those encodings are full of NUL bytes): the declaration is
wrong, the page is read as undeclared, and the fetch says so (a warning).
"""

from __future__ import annotations

import codecs
import zlib
from dataclasses import dataclass
from urllib.parse import urlsplit

from w3lib.encoding import html_to_unicode

from kpack.ingest.fetch_errors import FetchError

TEXT_TYPES = {
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/plain": "text",
    "text/x-rst": "text",
}
# Documents read into text: a PDF becomes HTML (kpack.ingest.pdf), its row's format "pdf".
DOCUMENT_TYPES = {"application/pdf": "pdf"}
MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdown")
HTML_SUFFIXES = (".html", ".htm", ".xhtml")
# A type that says nothing: the URL's suffix decides (raw file hosts serve PDFs this way).
UNTYPED = ("", "application/octet-stream")
GZIP_MAGIC = b"\x1f\x8b"
FILE_TYPES = {
    "html": "text/html",
    "markdown": "text/markdown",
    "pdf": "application/pdf",
    "xml": "application/xml",
}


def page_format(content_type: str | None, url: str) -> str | None:
    """html, markdown, text or pdf; None for content that is no page."""
    path = urlsplit(url).path.lower()
    if path.endswith(MARKDOWN_SUFFIXES):
        return "markdown"
    mime = (content_type or "").split(";")[0].strip().lower()
    if mime in TEXT_TYPES:
        return TEXT_TYPES[mime]
    if mime in DOCUMENT_TYPES:
        return DOCUMENT_TYPES[mime]
    if not mime and path.endswith(HTML_SUFFIXES):
        return "html"
    if not mime and path.endswith((".txt", ".rst")):
        return "text"
    if mime in UNTYPED and path.endswith(".pdf"):
        return "pdf"
    return None


# Encodings whose text is full of NUL bytes: declared, they are text, not binary.
WIDE_ENCODINGS = ("utf-16", "utf-32")


def _undeclared_encoding(body: bytes) -> str:
    """A page that declares no charset: UTF-8 when it is, else windows-1252 (what browsers
    assume for an undeclared Western page)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return "cp1252"
    return "utf-8"


@dataclass(frozen=True)
class Decoded:
    """A body's text, and what was wrong with its declared charset (None when nothing)."""

    text: str
    warning: str | None = None


def decode(body: bytes, content_type: str | None) -> Decoded:
    """The text of a page: by its byte-order mark, else the charset its Content-Type, its
    ``<meta charset>`` / ``<meta http-equiv>`` or its XML declaration names (w3lib), else
    UTF-8, else windows-1252. NUL bytes in a page that is not UTF-16/32 mean binary content;
    a page declared UTF-16/32 without one is read as undeclared (see the module docstring)."""
    encoding, text = html_to_unicode(content_type, body, auto_detect_fun=_undeclared_encoding)
    wide = codecs.lookup(encoding).name.startswith(WIDE_ENCODINGS)
    head = body[:4096]
    if not wide and b"\x00" in head:
        raise FetchError("binary content (NUL bytes), not text")
    if wide and head and b"\x00" not in head:
        actual = _undeclared_encoding(body)
        family = codecs.lookup(encoding).name[:6].upper()  # UTF-16 or UTF-32, either order
        return Decoded(
            body.decode(actual),
            f"declared {family} but has no NUL byte, which no {family} page lacks: read as "
            f"{actual} instead",
        )
    return Decoded(text)


def gunzip(body: bytes, max_bytes: int) -> bytes:
    """A gzipped document unpacked; FetchError when it is damaged or unpacks past
    ``max_bytes`` (never more than that is held in memory)."""
    unpacker = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = unpacker.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise FetchError(f"not a readable gzip file ({exc})") from None
    if len(data) > max_bytes:
        raise FetchError(f"unpacked, the file exceeds the size cap of {max_bytes} bytes")
    return data
