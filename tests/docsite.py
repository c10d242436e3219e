"""A generated documentation site for crawl tests and the crawl benchmark, served on 127.0.0.1.

``DocSite(chapters, pages_per_chapter)`` lays out ``/docs/index.html`` -> one index page per
chapter -> its pages, and serves them with what real sites have: ETags (304 on a match), a
``robots.txt`` that disallows ``/docs/private/``, ``/docs/sitemap_index.xml`` pointing at one
sitemap per chapter, a canonical link on every page, an alias page whose canonical link names
another page, a redirect out of scope, links in every form (relative, absolute, ``./``, ``index.html`` and directory
forms, fragments), loops (every page links back to its chapter and its neighbours), links out
of scope (``/blog/``, another host) and links to files that are no pages.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.loopback import LoopbackServer

VOCABULARY = (
    "widget sprocket gasket flange bearing spindle rotor valve manifold coupling bracket "
    "lever piston chamber gear ratchet pulley cam shaft seal spring clamp hinge axle "
    "calibrate assemble tighten measure inspect lubricate align balance mount adjust "
    "configure install replace verify torque pressure tolerance clearance thread pitch "
    "diameter alloy polymer coating finish batch cycle schedule inventory supplier"
)
WORDS = VOCABULARY.split()


def prose(seed: str, words: int) -> str:
    """Deterministic filler text: the same seed always gives the same sentences."""
    out: list[str] = []
    counter = 0
    while len(out) < words:
        digest = hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
        sentence = [WORDS[b % len(WORDS)] for b in digest[:12]]
        out += [sentence[0].capitalize(), *sentence[1:-1], sentence[-1] + "."]
    return " ".join(out[:words])


@dataclass
class DocSite:
    chapters: int = 3
    pages_per_chapter: int = 3
    sections_per_page: int = 2
    words_per_section: int = 60
    revisions: dict[str, int] = field(default_factory=dict)  # path -> revision (default 1)
    hits: dict[str, int] = field(default_factory=dict)
    full_answers: int = 0  # 200s with a body (not 304s) for pages
    lock: threading.Lock = field(default_factory=threading.Lock)
    base: str = ""  # set once the server listens

    # The layout --------------------------------------------------------------------------

    def chapter_path(self, c: int) -> str:
        return f"/docs/chapter-{c:02d}/index.html"

    def page_path(self, c: int, p: int) -> str:
        return f"/docs/chapter-{c:02d}/page-{p:03d}.html"

    def page_paths(self) -> list[str]:
        """Every page a crawl of /docs/ should keep, in the canonical form of each."""
        paths = ["/docs/index.html"]
        for c in range(self.chapters):
            paths.append(self.chapter_path(c))
            paths += [self.page_path(c, p) for p in range(self.pages_per_chapter)]
        return paths

    def page_urls(self) -> list[str]:
        return [self.base + path for path in self.page_paths()]

    # Rendering ---------------------------------------------------------------------------

    def _page(self, path: str, title: str, links: list[str], canonical: str | None = None) -> str:
        revision = self.revisions.get(path, 1)
        sections = "\n".join(
            f"<h2>{title} part {s + 1}</h2>\n<p>{prose(f'{path}:{s}:{revision}', self.words_per_section)}</p>"
            for s in range(self.sections_per_page)
        )
        anchors = "\n".join(
            f'<li><a href="{href}">link {i}</a></li>' for i, href in enumerate(links)
        )
        canonical = canonical or path
        return f"""<!doctype html><html><head><title>{title}</title>
<link rel="canonical" href="{self.base}{canonical}"></head><body>
<nav><a href="/docs/index.html">Home</a> <a href="/nav-only.html">Not content</a></nav>
<main><h1>{title}</h1>
<p>{prose(f"{path}:intro:{revision}", self.words_per_section // 2)}</p>
{sections}
<ul>{anchors}</ul></main></body></html>"""

    def render(self, path: str) -> tuple[int, str, str]:
        """(status, content type, body) of a path."""
        html = "text/html; charset=utf-8"
        if path == "/robots.txt":
            return 200, "text/plain", "User-agent: *\nDisallow: /docs/private/\n"
        if path == "/docs/sitemap_index.xml":
            maps = "".join(
                f"<sitemap><loc>{self.base}/docs/sitemap-{c:02d}.xml</loc></sitemap>"
                for c in range(self.chapters)
            )
            return (
                200,
                "application/xml",
                f'<?xml version="1.0"?><sitemapindex>{maps}</sitemapindex>',
            )
        if path.startswith("/docs/sitemap-"):
            c = int(path.removeprefix("/docs/sitemap-").removesuffix(".xml"))
            paths = [self.chapter_path(c)] + [
                self.page_path(c, p) for p in range(self.pages_per_chapter)
            ]
            if c == 0:
                paths.insert(0, "/docs/index.html")
            urls = "".join(f"<url><loc>{self.base}{p}</loc></url>" for p in paths)
            return 200, "application/xml", f'<?xml version="1.0"?><urlset>{urls}</urlset>'
        if path in ("/docs/", "/docs/index.html"):
            links = [f"chapter-{c:02d}/" for c in range(self.chapters)]
            links += [
                "private/secret.html",  # refused by robots.txt
                "alias.html",  # a canonical alias of the first page
                "/blog/post.html",  # same host, out of the seed's folder
                "moved.html",  # redirects out of the seed's folder
                "http://elsewhere.invalid/docs/page.html",  # another host
                "logo.png",  # no page
                "download",  # no page, and only the answer says so
                "#top",
                "mailto:docs@example.org",
            ]
            return 200, html, self._page("/docs/index.html", "Widget documentation", links)
        if path == "/docs/alias.html":
            target = self.page_path(0, 0)
            return 200, html, self._page(target, "Chapter 0 page 0", [], canonical=target)
        if path == "/docs/moved.html":
            return 301, "text/plain", "/blog/post.html"  # the body is the Location
        if path == "/docs/download":
            return 200, "application/octet-stream", "\x00binary"
        if path == "/docs/private/secret.html":
            return 200, html, self._page(path, "Secret", [])
        for c in range(self.chapters):
            if path in (self.chapter_path(c), self.chapter_path(c).removesuffix("index.html")):
                links = [f"page-{p:03d}.html" for p in range(self.pages_per_chapter)]
                links += ["../index.html", f"./index.html#chapter-{c}"]  # loops
                return 200, html, self._page(self.chapter_path(c), f"Chapter {c}", links)
            for p in range(self.pages_per_chapter):
                if path == self.page_path(c, p):
                    neighbours = [
                        f"page-{q:03d}.html#section"
                        for q in (p - 1, p + 1)
                        if 0 <= q < self.pages_per_chapter
                    ]
                    links = [*neighbours, "./", f"/docs/chapter-{(c + 1) % self.chapters:02d}/"]
                    return 200, html, self._page(path, f"Chapter {c} page {p}", links)
        return 404, "text/plain", "not found"


def handler_for(site: DocSite) -> type[BaseHTTPRequestHandler]:
    """A request handler class serving ``site`` (with ETags and 304s)."""

    class DocSiteHandler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            with site.lock:
                site.hits[path] = site.hits.get(path, 0) + 1
            status, content_type, text = site.render(path)
            if status == 301:
                self.send_response(status)
                self.send_header("Location", text)
                self.end_headers()
                return
            body = text.encode()
            etag = '"' + hashlib.sha1(body).hexdigest() + '"'
            if status == 200 and self.headers.get("If-None-Match") == etag:
                self.send_response(304)
                self.send_header("ETag", etag)
                self.end_headers()
                return
            if status == 200 and content_type.startswith("text/html"):
                with site.lock:
                    site.full_answers += 1
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(body)

    return DocSiteHandler


@contextmanager
def serve(site: DocSite) -> Iterator[DocSite]:
    """``site`` served on 127.0.0.1 (its ``base`` set) until the block ends."""
    with LoopbackServer(handler_for(site)) as server:
        site.base = server.base
        yield site


def bench_site(chapters: int, pages_per_chapter: int) -> DocSite:
    """The site of the benchmarks: pages of four sections of 110 words, about 500 words."""
    return DocSite(chapters, pages_per_chapter, sections_per_page=4, words_per_section=110)
