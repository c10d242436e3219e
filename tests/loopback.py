"""Loopback servers the tests talk to: a documentation site and a fake Anthropic Messages API.

Both are real HTTP servers on 127.0.0.1 with an ephemeral port, so the code under test goes
through requests and the real anthropic SDK exactly as it would in production.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path

SITE = Path(__file__).parent / "site"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".md": "text/markdown; charset=utf-8"}


class QuietServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that lets a client leave: a fetcher that gives up on a slow
    answer (/slow.html, after its timeout) is what the tests want, and socketserver would print
    the handler's BrokenPipeError traceback on stderr, seconds later, into whatever runs then
    (a passing `make test` showed it). Any other error of a handler is still printed."""

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1 running in a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = QuietServer(("127.0.0.1", 0), handler)
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


# The fake's tokenizer, an approximation of a BPE tokenizer that is independent of kpack's own
# estimate (characters / 3.5): a run of up to 6 letters, of up to 3 digits, or one other visible
# character is a token. English prose comes to about 4 characters a token, code and JSON to
# fewer, as with Claude's tokenizer (which is not public).
FAKE_TOKEN = re.compile(r"[A-Za-z]{1,6}|\d{1,3}|[^\sA-Za-z\d]")
# A section containing this marker is never extracted: its batch requests error every time and
# its requests answer 500.
UNEXTRACTABLE = "UNEXTRACTABLE"
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
# The system prompt the API adds to a request with tools, as input tokens (Anthropic's tool-use
# docs: 313 with tool_choice "tool" on Claude 4 models); part of the cached prefix.
TOOL_USE_SYSTEM_TOKENS = 313


def fake_token_count(text: str) -> int:
    return len(FAKE_TOKEN.findall(text))


def prompt_tokens(request: dict) -> int:
    """The tokens of a request's tools and system prompt, with the API's tool-use prompt."""
    tool_prompt = TOOL_USE_SYSTEM_TOKENS if request.get("tools") else 0
    return fake_token_count(_prompt_text(request)[0]) + tool_prompt


def _prompt_text(request: dict) -> tuple[str, bool]:
    """The tools and system prompt of a request as the fake reads them, and whether the system
    prompt carries a cache_control breakpoint (which covers the tools and the system)."""
    system = request.get("system") or ""
    blocks = [{"text": system}] if isinstance(system, str) else system
    tools = [
        f"{t['name']} {t.get('description', '')} {json.dumps(t.get('input_schema', {}))}"
        for t in request.get("tools", [])
    ]
    marked = any("cache_control" in block for block in blocks)
    return " ".join([*tools, *(block["text"] for block in blocks)]), marked


def _message_text(request: dict) -> str:
    parts = []
    for message in request["messages"]:
        content = message["content"]
        if isinstance(content, str):
            parts.append(content)
        else:
            parts += [part.get("text", "") for part in content]
    return " ".join(parts)


class FakeAnthropic(BaseHTTPRequestHandler):
    """The Messages API, answering tool calls with an extraction built from the request text.

    Entities are the capitalised words of the section, so a test can tell a Claude extraction
    from an offline one. ``fail_with`` makes every call answer with that HTTP status;
    ``echo_key`` puts the API key the request carried into that error message, as a careless
    server might, to test that the client never lets it through.

    Usage: every answer reports 100 input and 20 output tokens, unless ``token_counting`` is
    set: then the input is counted with fake_token_count over the request's tools, system
    prompt and messages, plus the API's tool-use system prompt (TOOL_USE_SYSTEM_TOKENS), as
    ``POST /v1/messages/count_tokens`` counts it. A system prompt marked
    with cache_control whose prefix (tools and system) reaches ``cache_min_tokens`` is written
    to the server's prompt cache by the first request and read by the next ones, and reported
    as cache_creation_input_tokens / cache_read_input_tokens (not in input_tokens), as the API
    does. Every answered message's usage is logged in ``server.billed``, with ``batch``.

    Message Batches: ``POST /v1/messages/batches`` creates a batch (logged in
    ``server.batches``); ``GET /v1/messages/batches/ID`` answers in_progress for
    ``server.batch_polls`` polls (a test may change it between builds), then ends it: each
    request is answered then, and its result served by ``GET .../results`` as JSON lines, in
    reverse order. In the first batch, the first ``failing_batch_items`` requests end errored
    and expired in turn; in every batch, a request for a section containing UNEXTRACTABLE
    errors.

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
    # Text answers by request: the first phrase found in the system prompt or the messages
    # picks its reply (a decomposition request, a repair request), before ``reply``.
    replies: dict[str, str] | None = None
    token_counting: bool = False
    cache_min_tokens: int = 1024
    failing_batch_items: int = 0

    def log_message(self, *args) -> None:
        pass

    def _error(self, status: int, message: str) -> None:
        error = {"type": ERROR_TYPES.get(status, "api_error"), "message": message}
        self._json(status, {"type": "error", "error": error})

    def do_GET(self) -> None:
        server: LoopbackServer = self.server.owner  # type: ignore[attr-defined]
        path = self.path.split("?")[0]
        server.count(path)
        if self.fail_with:
            return self._error(self.fail_with, "fake failure")
        parts = path.removeprefix("/v1/messages/batches/").split("/")
        batch = server.batches.get(parts[0])  # type: ignore[attr-defined]
        if not path.startswith("/v1/messages/batches/") or batch is None:
            return self._error(404, f"no such batch: {parts[0]}")
        if parts[1:] == ["results"]:
            if batch["results"] is None:
                return self._error(400, "the batch has not ended")
            lines = "".join(json.dumps(line) + "\n" for line in reversed(batch["results"]))
            return self._send_bytes(200, lines.encode(), "application/binary")
        with server.lock:
            batch["polls"] += 1
            ending = batch["results"] is None and batch["polls"] > server.batch_polls  # type: ignore[attr-defined]
        if ending:
            self._end_batch(server, batch)
        self._json(200, self._batch_json(server, parts[0]))

    def do_POST(self) -> None:
        server: LoopbackServer = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("content-length", 0))
        request = json.loads(self.rfile.read(length))
        path = self.path.split("?")[0]
        server.count(path)
        if path == "/v1/messages":
            with server.lock:
                server.requests.append(
                    {"headers": {k.lower(): v for k, v in self.headers.items()}, "body": request}
                )  # type: ignore[attr-defined]
        if self.fail_with:
            message = "fake failure"
            if self.echo_key:
                sent = self.headers.get("x-api-key") or self.headers.get("authorization")
                message += f" for key {sent}"
            return self._error(self.fail_with, message)
        if path == "/v1/messages/count_tokens":
            counted = prompt_tokens(request) + fake_token_count(_message_text(request))
            return self._json(200, {"input_tokens": counted})
        if path == "/v1/messages/batches":
            with server.lock:
                batch_id = f"msgbatch_fake{len(server.batches) + 1:04d}"  # type: ignore[attr-defined]
                server.batches[batch_id] = {  # type: ignore[attr-defined]
                    "requests": request["requests"],
                    "first": not server.batches,  # type: ignore[attr-defined]
                    "polls": 0,
                    "results": None,
                    "created_at": time.time(),
                }
            return self._json(200, self._batch_json(server, batch_id))
        if UNEXTRACTABLE in _message_text(request):
            return self._error(500, "fake failure for an unextractable section")
        content = self._content(request)
        if request.get("stream") and content[0]["type"] == "text":
            return self._stream(server, request["model"], content[0]["text"])
        self._json(200, self._message(server, request, content, batch=False))

    def _end_batch(self, server: LoopbackServer, batch: dict) -> None:
        """Answer every request of the batch (once), as the API does when a batch ends."""
        results = []
        for index, item in enumerate(batch["requests"]):
            params, failing = item["params"], batch["first"] and index < self.failing_batch_items
            if UNEXTRACTABLE in _message_text(params) or (failing and index % 2 == 0):
                error = {"type": "api_error", "message": "fake batch failure"}
                result = {"type": "errored", "error": {"type": "error", "error": error}}
            elif failing:
                result = {"type": "expired"}
            else:
                message = self._message(server, params, self._content(params), batch=True)
                result = {"type": "succeeded", "message": message}
            results.append({"custom_id": item["custom_id"], "result": result})
        with server.lock:
            batch["results"], batch["ended_at"] = results, time.time()

    def _batch_json(self, server: LoopbackServer, batch_id: str) -> dict:
        batch = server.batches[batch_id]  # type: ignore[attr-defined]
        results = batch["results"]
        counts = dict.fromkeys(("canceled", "errored", "expired", "processing", "succeeded"), 0)
        if results is None:
            counts["processing"] = len(batch["requests"])
        for line in results or []:
            counts[line["result"]["type"]] += 1
        stamp = lambda t: datetime.fromtimestamp(t, UTC).isoformat()  # noqa: E731
        return {
            "id": batch_id,
            "type": "message_batch",
            "processing_status": "in_progress" if results is None else "ended",
            "request_counts": counts,
            "created_at": stamp(batch["created_at"]),
            "expires_at": stamp(batch["created_at"] + 86_400),
            "ended_at": None if results is None else stamp(batch["ended_at"]),
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": None
            if results is None
            else f"{server.base}/v1/messages/batches/{batch_id}/results",
        }

    def _usage(self, server: LoopbackServer, request: dict) -> dict:
        if not self.token_counting:
            return {"input_tokens": 100, "output_tokens": 20}
        prompt, marked = _prompt_text(request)
        prefix = prompt_tokens(request)
        usage = {
            "input_tokens": prefix + fake_token_count(_message_text(request)),
            "output_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if marked and prefix >= self.cache_min_tokens:
            with server.lock:
                cached = prompt in server.prompt_cache  # type: ignore[attr-defined]
                server.prompt_cache.add(prompt)  # type: ignore[attr-defined]
            usage["cache_read_input_tokens" if cached else "cache_creation_input_tokens"] = prefix
            usage["input_tokens"] -= prefix
        return usage

    def _message(self, server: LoopbackServer, request: dict, content: list, batch: bool) -> dict:
        usage = self._usage(server, request)
        with server.lock:
            server.billed.append({**usage, "batch": batch})  # type: ignore[attr-defined]
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": request["model"],
            "content": content,
            "stop_reason": "tool_use" if request.get("tools") else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }

    def _content(self, request: dict) -> list[dict]:
        text = _message_text(request)
        words = sorted(set(re.findall(r"\b[A-Z][a-z]{3,}\b", text)))[:5]
        if request.get("tools"):
            return [
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
        if "write evaluation questions" in str(request.get("system", "")):
            return [
                {
                    "type": "text",
                    "text": '{"question": "Which variable points at the cache?", "ground_truth": "WIDGET_HOME"}',
                }
            ]
        if "grade answers" in str(request.get("system", "")):
            return [{"type": "text", "text": "8"}]
        if "alternative phrasings" in text:
            return [
                {
                    "type": "text",
                    "text": "1. Where is the sprocket cache kept?\n2. Which folder holds cached sprockets?",
                }
            ]
        asked = f"{request.get('system', '')} {text}"
        chosen = next((r for phrase, r in (self.replies or {}).items() if phrase in asked), None)
        return [
            {
                "type": "text",
                "text": chosen
                or self.reply
                or f"Fake answer [Source: fake]. Prompt tail: {text[-200:]}",
            }
        ]

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
        self._send_bytes(status, json.dumps(body).encode(), "application/json")

    def _send_bytes(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def fake_anthropic_server(
    fail_with: int | None = None,
    echo_key: bool = False,
    batch_polls: int = 2,
    **options: object,
) -> LoopbackServer:
    """The fake Messages API; ``options`` set FakeAnthropic's stream_pieces, delta_delay_s,
    fail_after_deltas, reply (the text answer), replies (answers by phrase), token_counting, cache_min_tokens and
    failing_batch_items; ``batch_polls`` is the server's (see FakeAnthropic)."""
    handler = type(
        "FakeAnthropicHandler",
        (FakeAnthropic,),
        {"fail_with": fail_with, "echo_key": echo_key, **options},
    )
    server = LoopbackServer(handler)
    server.requests = []  # type: ignore[attr-defined]
    server.streams = []  # type: ignore[attr-defined]
    server.batches = {}  # type: ignore[attr-defined]
    server.batch_polls = batch_polls  # type: ignore[attr-defined]
    server.billed = []  # type: ignore[attr-defined]
    server.prompt_cache = set()  # type: ignore[attr-defined]
    return server


def wait_until_serving(process, url: str, timeout_s: float) -> None:
    """Wait for a ``kpack serve`` child to answer /healthz; fail if it exits or never does."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, process.communicate()
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "kpack serve did not start"
        time.sleep(0.2)
