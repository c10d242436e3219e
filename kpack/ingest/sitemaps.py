"""Sitemaps (sitemaps.org) read with an XML parser: a ``<urlset>`` of pages or a
``<sitemapindex>`` of sitemaps.

defusedxml refuses entity expansion and external references (the billion-laughs and XXE
documents), so a hostile sitemap is an unreadable one, never a memory blow-up. Namespaces,
CDATA sections, character references and an XML declaration naming another encoding are the
parser's business. Fetching, gzip and the size cap are the fetcher's (kpack.ingest.fetch); which
locations are followed is the crawl's (kpack.ingest.crawl).
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

# The root element of each kind of sitemap, and the element that holds one <loc>.
ENTRIES = {"urlset": "url", "sitemapindex": "sitemap"}


class SitemapError(Exception):
    """A document that is no readable sitemap."""


@dataclass(frozen=True)
class Sitemap:
    index: bool  # a sitemap index: its locations are sitemaps, not pages
    locations: list[str]  # as written (relative ones are resolved by the caller), in order


def _name(element: Element) -> str:
    """An element's name without its namespace."""
    return element.tag.rpartition("}")[2] if isinstance(element.tag, str) else ""


def parse_sitemap(text: str) -> Sitemap:
    """The locations a sitemap lists; SitemapError when ``text`` is no sitemap."""
    try:
        root = fromstring(text.lstrip())
    except (ParseError, DefusedXmlException) as exc:
        raise SitemapError(f"not a readable sitemap ({type(exc).__name__}: {exc})") from None
    kind = _name(root)
    if kind not in ENTRIES:
        raise SitemapError(f"not a sitemap: its root element is <{kind}>, not <urlset>")
    locations = [
        (loc.text or "").strip()
        for entry in root
        if _name(entry) == ENTRIES[kind]
        for loc in entry
        if _name(loc) == "loc"
    ]
    return Sitemap(kind == "sitemapindex", [location for location in locations if location])
