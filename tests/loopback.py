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
        # State of the /live/ routes, set by tests between builds (paths are per test).
        self.revisions: dict[str, int] = {}  # /live/changing/...: the page's revision
        self.gone: set[str] = set()  # /live/vanishing/...: answers 404 once listed here
        self.conditional: dict[str, list[dict]] = {}  # conditional headers each path received
        self.not_modified: dict[str, int] = {}  # 304s each path answered

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


def live_page(kind: str, name: str, revision: int) -> bytes:
    """A small article: an introduction, a stable section and a section that has a revision."""
    title = f"Live {name.title()}"
    return f"""<html><head><title>{title}</title></head><body><main>
<h1>{title}</h1>
<p>The {name} page of the widget toolkit explains how the {kind} gadget fits sprockets,
gaskets and flanges together so that a widget can be assembled in one afternoon.</p>
<h2>Stable assembly notes</h2>
<p>The {name.title()} Calibration Rig holds every flange of the {name} gadget in place while the
gasket sealant sets; it never changes between revisions of this page and keeps the same text.</p>
<h2>Revision notes</h2>
<p>This is revision {revision} of the {name} page. Revision {revision} documents calibration
step number {revision} of the {kind} gadget, which tightens the sprocket by {revision} turns.</p>
<p><a href="/docs/index.html">Back to the index</a></p>
</main></body></html>""".encode()


class SiteHandler(BaseHTTPRequestHandler):
    """Static pages from tests/site plus routes that misbehave in the ways the web does.

    Static pages carry an ETag and answer a matching If-None-Match with 304. The ``/live/``
    routes serve generated pages whose state a test controls through the server:
    ``/live/changing/NAME.html`` serves revision ``server.revisions[path]`` (1 by default),
    ``/live/vanishing/NAME.html`` answers 404 once its path is in ``server.gone``, and
    ``/live/conditional/NAME.html`` never changes and answers If-None-Match and
    If-Modified-Since with 304. Conditional headers received are kept in
    ``server.conditional[path]`` and 304s counted in ``server.not_modified[path]``.
    """

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
        elif path.startswith("/live/"):
            self._live(server, path)
        else:
            file = (SITE / path.lstrip("/")).resolve()
            if file.is_file() and file.is_relative_to(SITE):
                content_type = CONTENT_TYPES.get(file.suffix, "text/plain; charset=utf-8")
                etag = f'"{file.stat().st_mtime_ns}"'
                if self._not_modified(server, path, etag, None):
                    return
                self._send(200, file.read_bytes(), content_type, {"ETag": etag})
            else:
                self._send(404, b"not found", "text/plain")

    LIVE_MODIFIED = "Mon, 02 Nov 2026 10:00:00 GMT"

    def _live(self, server: LoopbackServer, path: str) -> None:
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[1] not in ("changing", "vanishing", "conditional"):
            return self._send(404, b"not found", "text/plain")
        kind, name = parts[1], parts[2].removesuffix(".html")
        if kind == "vanishing" and path in server.gone:
            return self._send(404, b"gone", "text/plain")
        revision = server.revisions.get(path, 1) if kind == "changing" else 1
        etag = f'"{kind}-{name}-r{revision}"'
        modified = self.LIVE_MODIFIED if kind == "conditional" else None
        if self._not_modified(server, path, etag, modified):
            return
        headers = {"ETag": etag, **({"Last-Modified": modified} if modified else {})}
        self._send(200, live_page(kind, name, revision), "text/html; charset=utf-8", headers)

    def _not_modified(
        self, server: LoopbackServer, path: str, etag: str, modified: str | None
    ) -> bool:
        """Answer 304 when the request's validators match; record what was asked."""
        if_none_match = self.headers.get("If-None-Match")
        if_modified_since = self.headers.get("If-Modified-Since")
        if if_none_match or if_modified_since:
            with server.lock:
                server.conditional.setdefault(path, []).append(
                    {"If-None-Match": if_none_match, "If-Modified-Since": if_modified_since}
                )
        fresh = (if_none_match is not None and if_none_match == etag) or (
            if_none_match is None
            and modified is not None
            and if_modified_since is not None
            and if_modified_since == modified
        )
        if not fresh:
            return False
        with server.lock:
            server.not_modified[path] = server.not_modified.get(path, 0) + 1
        self.send_response(HTTPStatus.NOT_MODIFIED)
        self.send_header("ETag", etag)
        self.end_headers()
        return True


class FakeAnthropic(BaseHTTPRequestHandler):
    """The Messages API, answering tool calls with an extraction built from the request text.

    Entities are the capitalised words of the section, so a test can tell a Claude extraction
    from an offline one. ``fail_with`` makes every call answer with that HTTP status;
    ``echo_key`` puts the API key the request carried into that error message, as a careless
    server might, to test that the client never lets it through.

    A request with ``"stream": true`` and a text answer is answered with the Messages API's
    server-sent events (message_start, content_block_start, content_block_delta text_delta
    x ``stream_pieces``, content_block_stop, message_delta with usage, message_stop), one
    piece every ``delta_delay_s``; ``fail_after_deltas`` sends an ``overloaded_error`` event
    after that many pieces instead of the rest. Each stream is logged in ``server.streams``:
    when its first and last piece were sent (time.monotonic) and whether the reader hung up.
    """

    fail_with: int | None = None
    echo_key: bool = False
    stream_pieces: int = 8
    delta_delay_s: float = 0.0
    fail_after_deltas: int | None = None
    reply: str | None = None  # the text answer to give instead of the default one

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
            message = "fake failure"
            if self.echo_key:
                sent = self.headers.get("x-api-key") or self.headers.get("authorization")
                message += f" for key {sent}"
            body = {"type": "error", "error": {"type": "api_error", "message": message}}
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
        elif "write evaluation questions" in str(request.get("system", "")):
            content = [
                {
                    "type": "text",
                    "text": '{"question": "Which variable points at the cache?", "ground_truth": "WIDGET_HOME"}',
                }
            ]
        elif "grade answers" in str(request.get("system", "")):
            content = [{"type": "text", "text": "8"}]
        elif "alternative phrasings" in text:
            content = [
                {
                    "type": "text",
                    "text": "1. Where is the sprocket cache kept?\n2. Which folder holds cached sprockets?",
                }
            ]
        else:
            content = [
                {
                    "type": "text",
                    "text": self.reply or f"Fake answer [Source: fake]. Prompt tail: {text[-200:]}",
                }
            ]
        if request.get("stream") and content[0]["type"] == "text":
            return self._stream(server, request["model"], content[0]["text"])
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

    def _stream(self, server: LoopbackServer, model: str, text: str) -> None:
        words = re.findall(r"\s*\S+", text)
        cuts = [len(words) * i // self.stream_pieces for i in range(self.stream_pieces + 1)]
        pieces = ["".join(words[a:b]) for a, b in pairwise(cuts) if a < b]
        log = {"first_sent": None, "last_sent": None, "aborted": False}
        with server.lock:
            server.streams.append(log)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        message = {
            "id": "msg_fake_stream",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 1},
        }
        delta_events = [
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
            for piece in pieces
        ]
        if self.fail_after_deltas is not None:
            error = {"type": "overloaded_error", "message": "Overloaded"}
            delta_events = [*delta_events[: self.fail_after_deltas], ("error", {"error": error})]
        events = [
            ("message_start", {"message": message}),
            ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            ("ping", {}),
            *delta_events,
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 20},
                },
            ),
            ("message_stop", {}),
        ]
        for name, data in events:
            if name == "content_block_delta" and log["first_sent"] is not None:
                time.sleep(self.delta_delay_s)
            try:
                self.wfile.write(
                    f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()
                )
                self.wfile.flush()
            except OSError:  # the client hung up: what a closed SDK stream looks like here
                log["aborted"] = True
                return
            if name == "content_block_delta":
                log["first_sent"] = log["first_sent"] or time.monotonic()
                log["last_sent"] = time.monotonic()
            if name == "error":
                return

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def fake_anthropic_server(
    fail_with: int | None = None, echo_key: bool = False, **stream_options: object
) -> LoopbackServer:
    """The fake Messages API; ``stream_options`` set FakeAnthropic's stream_pieces,
    delta_delay_s, fail_after_deltas and reply (the text answer)."""
    handler = type(
        "FakeAnthropicHandler",
        (FakeAnthropic,),
        {"fail_with": fail_with, "echo_key": echo_key, **stream_options},
    )
    server = LoopbackServer(handler)
    server.requests = []  # type: ignore[attr-defined]
    server.streams = []  # type: ignore[attr-defined]
    return server
