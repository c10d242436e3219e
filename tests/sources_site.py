"""A small documentation site served on 127.0.0.1 whose sources a test breaks between builds.

``/docs/`` links to ``/docs/article-N.html`` (N from 1 to ``articles``); ``/docs/sitemap.xml``
lists the same articles (``/docs/sitemap.xml.gz`` gzipped); ``/robots.txt`` serves
``site.robots``. A test replaces any path's answer with ``site.answers[path] = Answer(...)``:
a 503 for an outage, a slow or held answer, an oversized or unreadable sitemap, another
robots.txt, a PDF. Every request is counted in ``site.hits`` and its start time kept in
``site.started``.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.docsite import prose
from tests.loopback import LoopbackServer

HTML = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Answer:
    status: int = 200
    content_type: str = HTML
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0  # waited before answering
    hold: threading.Event | None = None  # answered once set (a page held back for a while)


OUTAGE = Answer(503, "text/plain", b"down for maintenance")


def article_html(n: int) -> str:
    return (
        f"<html><head><title>Article {n}</title></head><body><main><h1>Article {n}</h1>"
        f"<p>{prose(f'article-{n}', 40)}</p><h2>Details of article {n}</h2>"
        f"<p>{prose(f'details-{n}', 60)}</p></main></body></html>"
    )


def urlset(base: str, paths: list[str]) -> str:
    urls = "".join(f"<url><loc>{base}{path}</loc></url>" for path in paths)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
    )


@dataclass
class SourcesSite:
    articles: int = 4
    robots: str = "User-agent: *\nAllow: /\n"
    answers: dict[str, Answer] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    started: dict[str, list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    base: str = ""

    def article_paths(self) -> list[str]:
        return [f"/docs/article-{n}.html" for n in range(1, self.articles + 1)]

    def url(self, path: str) -> str:
        return self.base + path

    def answer(self, path: str) -> Answer:
        if path in self.answers:
            return self.answers[path]
        if path == "/robots.txt":
            return Answer(content_type="text/plain", body=self.robots.encode())
        if path == "/docs/sitemap.xml":
            return Answer(content_type="application/xml", body=self.sitemap().encode())
        if path == "/docs/sitemap.xml.gz":
            return Answer(
                content_type="application/gzip", body=gzip.compress(self.sitemap().encode())
            )
        if path in ("/docs/", "/docs/index.html"):
            links = "".join(f'<li><a href="{p}">{p}</a></li>' for p in self.article_paths())
            page = f"<html><body><main><h1>Docs</h1><p>{prose('index', 30)}</p><ul>{links}</ul></main></body></html>"
            return Answer(body=page.encode())
        if path in self.article_paths():
            return Answer(body=article_html(int(path.split("-")[1].split(".")[0])).encode())
        return Answer(404, "text/plain", b"not found")

    def sitemap(self) -> str:
        return urlset(self.base, self.article_paths())


def handler_for(site: SourcesSite) -> type[BaseHTTPRequestHandler]:
    class SourcesHandler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            with site.lock:
                site.hits[path] = site.hits.get(path, 0) + 1
                site.started.setdefault(path, []).append(time.monotonic())
            answer = site.answer(path)
            time.sleep(answer.delay_s)
            if answer.hold is not None:
                answer.hold.wait(timeout=600)
            try:
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                for name, value in answer.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer.body)
            except (BrokenPipeError, ConnectionResetError):
                # The fetcher gave up on a slow answer or stopped at its size cap, as the tests
                # want; socketserver would print the traceback into the next test's stderr.
                pass

    return SourcesHandler


@contextmanager
def serve(site: SourcesSite) -> Iterator[SourcesSite]:
    with LoopbackServer(handler_for(site)) as server:
        site.base = server.base
        yield site
