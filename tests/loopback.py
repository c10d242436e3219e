"""Loopback servers the tests talk to: a documentation site and a fake Anthropic Messages API.

Both are real HTTP servers on 127.0.0.1 with an ephemeral port, so the code under test goes
through requests and the real anthropic SDK exactly as it would in production.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path

SITE = Path(__file__).parent / "site"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".md": "text/markdown; charset=utf-8"}


class LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1 running in a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()

    @property
    def base(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def count(self, path: str) -> int:
        with self.lock:
            self.hits[path] = self.hits.get(path, 0) + 1
            return self.hits[path]

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class SiteHandler(BaseHTTPRequestHandler):
    """Static pages from tests/site plus routes that misbehave in the ways the web does."""

    slow_seconds = 3.0
    oversized_bytes = 400_000

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        server: LoopbackServer = self.server.owner  # type: ignore[attr-defined]
        path = self.path.split("?")[0]
        hits = server.count(path)
        if path == "/old-guide":
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            self.send_header("Location", "/docs/guide.html")
            self.end_headers()
        elif path == "/flaky.html":
            if hits == 1:
                self._send(500, b"try again", "text/plain")
            else:
                page = b"<html><body><h1>Flaky</h1><p>This page failed once with a server error and then worked on the retry.</p></body></html>"
                self._send(200, page, "text/html")
        elif path == "/slow.html":
            time.sleep(self.slow_seconds)
            self._send(200, b"<h1>Slow</h1><p>too late</p>", "text/html")
        elif path == "/logo.png":
            self._send(200, b"\x89PNG\r\n\x1a\n\x00\x00\x00binary", "image/png")
        elif path == "/huge.html":
            paragraph = b"<p>" + b"lorem ipsum " * 100 + b"</p>"
            body = (
                b"<html><body>"
                + paragraph * (self.oversized_bytes // len(paragraph) + 1)
                + b"</body></html>"
            )
            self._send(200, body, "text/html")
        elif path.startswith("/acme/widget/blob/"):
            self._send(200, b"<html><body>GitHub chrome around the file</body></html>", "text/html")
        else:
            file = (SITE / path.lstrip("/")).resolve()
            if file.is_file() and file.is_relative_to(SITE):
                content_type = CONTENT_TYPES.get(file.suffix, "text/plain; charset=utf-8")
                self._send(
                    200, file.read_bytes(), content_type, {"ETag": f'"{file.stat().st_mtime_ns}"'}
                )
            else:
                self._send(404, b"not found", "text/plain")


class FakeAnthropic(BaseHTTPRequestHandler):
    """The Messages API, answering tool calls with an extraction built from the request text.

    Entities are the capitalised words of the section, so a test can tell a Claude extraction
    from an offline one. ``fail_with`` makes every call answer with that HTTP status.
    """

    fail_with: int | None = None

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        server: LoopbackServer = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("content-length", 0))
        request = json.loads(self.rfile.read(length))
        server.count(self.path)
        with server.lock:
            server.requests.append(
                {"headers": {k.lower(): v for k, v in self.headers.items()}, "body": request}
            )  # type: ignore[attr-defined]
        if self.fail_with:
            body = {"type": "error", "error": {"type": "api_error", "message": "fake failure"}}
            return self._json(self.fail_with, body)
        text = request["messages"][0]["content"]
        if isinstance(text, list):
            text = " ".join(part.get("text", "") for part in text)
        words = sorted(set(re.findall(r"\b[A-Z][a-z]{3,}\b", text)))[:5]
        if request.get("tools"):
            content = [
                {
                    "type": "tool_use",
                    "id": "toolu_fake",
                    "name": request["tools"][0]["name"],
                    "input": {
                        "entities": [
                            {
                                "name": f"LLM {w}",
                                "type": "concept",
                                "description": f"{w} per Claude",
                            }
                            for w in words
                        ],
                        "relations": [
                            {
                                "source": f"LLM {a}",
                                "relation": "PRECEDES",
                                "target": f"LLM {b}",
                                "context": "fake",
                            }
                            for a, b in pairwise(words)
                        ],
                        "facts": [
                            {
                                "content": f"Claude says the section mentions {', '.join(words)}.",
                                "entity": "",
                            }
                        ],
                    },
                }
            ]
        elif "alternative phrasings" in text:
            content = [
                {
                    "type": "text",
                    "text": "1. Where is the sprocket cache kept?\n2. Which folder holds cached sprockets?",
                }
            ]
        else:
            content = [
                {"type": "text", "text": f"Fake answer [Source: fake]. Prompt tail: {text[-200:]}"}
            ]
        self._json(
            200,
            {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": request["model"],
                "content": content,
                "stop_reason": "tool_use" if request.get("tools") else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 100, "output_tokens": 20},
            },
        )

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def fake_anthropic_server(fail_with: int | None = None) -> LoopbackServer:
    handler = type("FakeAnthropicHandler", (FakeAnthropic,), {"fail_with": fail_with})
    server = LoopbackServer(handler)
    server.requests = []  # type: ignore[attr-defined]
    return server
