"""A loopback site that misbehaves on purpose: trickled answers, pathological and odd pages.

Routes:
- ``/trickle-body.html``: headers at once, then the body one byte every 0.1 s (for a minute).
- ``/trickle-headers.html``: the status line, then one header byte every 0.1 s.
- ``/deep.html``: a page whose text sits 5,000 elements deep.
- ``/empty.html``: a page with a title and an empty body.
- ``/utf16-bom.html``: UTF-16 with a byte-order mark, no charset declared.
- ``/utf16-charset.html``: UTF-16LE without a mark, declared by ``charset=utf-16le``.
- ``/ascii-declared-utf16.html``: an ASCII page declared ``charset=utf-16`` (a lie).
- ``/page-N.html``: an ordinary small article.
"""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler

from tests.loopback import LoopbackServer

DEPTH = 5000
TRICKLE_INTERVAL_S = 0.1
TRICKLE_FOR_S = 60.0


def article(title: str, sentence: str) -> str:
    return (
        f"<html><head><title>{title}</title></head><body><main><h1>{title}</h1>"
        f"<p>{sentence}</p><h2>Details</h2><p>The {title} article describes how sprockets, "
        "gaskets and flanges fit together in the widget toolkit.</p></main></body></html>"
    )


def deep_page() -> str:
    return (
        "<html><body><main><h1>Deep Page</h1>"
        + "<div>" * DEPTH
        + "<p>The deepest paragraph explains the flange calibration of the deep widget.</p>"
        + "</div>" * DEPTH
        + "</main></body></html>"
    )


UTF16_TEXT = article(
    "Wide Page", "Wide pages are written in UTF-16 and still name the Zürich gasket."
)


class HostileHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _trickle(self, data: bytes) -> None:
        """Write ``data`` a byte at a time until it is sent, the client leaves or time is up."""
        stop = time.monotonic() + TRICKLE_FOR_S
        try:
            for byte in data:
                if time.monotonic() > stop:
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(TRICKLE_INTERVAL_S)
        except OSError:  # the client gave up: what a deadline is for
            return

    def do_GET(self) -> None:
        server: LoopbackServer = self.server.owner  # type: ignore[attr-defined]
        path = self.path.split("?")[0]
        server.count(path)
        if path == "/trickle-body.html":
            body = article("Trickle", "x" * 2000).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
            self._trickle(body)
        elif path == "/trickle-headers.html":
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self.wfile.flush()
            self._trickle(b"X-Slow: " + b"a" * 2000 + b"\r\n\r\n")
        elif path == "/deep.html":
            self._send(deep_page().encode(), "text/html; charset=utf-8")
        elif path == "/empty.html":
            self._send(b"<html><head><title>Empty</title></head><body></body></html>", "text/html")
        elif path == "/utf16-bom.html":
            self._send(UTF16_TEXT.encode("utf-16"), "text/html")
        elif path == "/utf16-charset.html":
            self._send(UTF16_TEXT.encode("utf-16-le"), "text/html; charset=utf-16le")
        elif path == "/ascii-declared-utf16.html":
            text = article("Declared", "The gasket table lists every flange size.")
            self._send(text.encode("ascii"), "text/html; charset=utf-16")
        elif path.startswith("/page-"):
            name = path.removeprefix("/page-").removesuffix(".html")
            text = article(f"Page {name}", f"Page {name} explains the widget gasket number {name}.")
            self._send(text.encode(), "text/html; charset=utf-8")
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
