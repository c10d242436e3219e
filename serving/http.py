"""The HTTP API over published packs (`kpack serve`): FastAPI on uvicorn.

    GET  /healthz                   liveness (never needs the token)
    GET  /packs                     every pack with its published version and figures
    GET  /packs/{name}              one pack: figures, the whole manifest, skill.md
    POST /packs/{name}/query        {"question": ...} -> the `kpack query --json` response;
                                    with "stream": true, server-sent events (see _events)
    POST /packs/{name}/search       {"question": ..., "k": 5} -> ranked passages
    (a name such as "pandas,python" asks several packs: retrieval.multipack)
    GET  /openapi.json, /docs       the schema and its browsable page (Swagger UI, served
                                    offline: no CDN)

Errors are JSON ``{"detail": "..."}`` with the CLI's messages: 404 unknown pack, 422 a bad
request (empty or too long question, wrong field), 409 a pack that cannot answer (never built,
damaged, bad kg_config.json), 401 a missing or wrong bearer token, 413 a body over the limit,
500 anything else (logged with its traceback on the server, never sent to the client).

Retrieval is CPU-bound (embedding the question, vector and BM25 search) and runs in a pool of
one thread per core (retrieval_pool_size), never on the event loop; the response's JSON is
encoded in the same thread. A question that Claude answers waits seconds on the network: those
run in a pool of their own (LLM_THREADS), so they never hold a core's turn. Every response says where its time went in a ``Server-Timing`` header
(``queue``, ``retrieval``, ``encode`` and ``app``, in ms), which bench/serve_bench.py reads.
Each request resolves the pack's ``current`` version again, so a build that publishes is
picked up by the next request without a restart, and a request that started on the previous
version finishes on it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

import retrieval
from kpack.llm import API_KEY_ENV
from kpack.packs import PackError
from retrieval.query import MAX_QUESTION_CHARS, MAX_SERVED_K, QuestionError, clean_question
from retrieval.reader import open_versions_in_background
from serving import catalog
from serving.catalog import ProfileName
from serving.connections import HEADER_TIMEOUT_S, default_max_connections, guarded_protocol

log = logging.getLogger("kpack.serve")

MAX_BODY_BYTES = 64 * 1024  # a question of MAX_QUESTION_CHARS is at most 32 KiB of UTF-8
LLM_THREADS = 16  # questions Claude answers at once; each mostly waits on the network
VERSION_HEADER = "X-Kpack-Version"
SERVER_TIMING = "Server-Timing"
# numpy scalars and arrays natively; dict keys that are not strings as json.dumps writes them
ENCODING_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
# Module level: annotations are strings here (postponed), and FastAPI resolves them from the
# module's globals, never from a function's locals.
BEARER = HTTPBearer(auto_error=False, description="the server's --token / KPACK_API_TOKEN")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(description=f"the question, 1 to {MAX_QUESTION_CHARS:,} characters")
    profile: ProfileName | None = Field(
        None, description="query profile; the pack's default if unset"
    )
    use_llm: bool = Field(
        True, description="let Claude write the answer when the server has ANTHROPIC_API_KEY"
    )
    k: int = Field(5, ge=1, le=MAX_SERVED_K, description="passages to retrieve (max_results)")
    stream: bool = Field(
        False,
        description="answer as server-sent events (also chosen by Accept: text/event-stream)",
    )


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(description=f"the question, 1 to {MAX_QUESTION_CHARS:,} characters")
    k: int = Field(5, ge=1, le=MAX_SERVED_K, description="how many passages")
    profile: ProfileName | None = Field(
        None, description="query profile; the pack's default if unset"
    )


def create_app(
    packs_dir: Path | None = None,
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    warmup: bool = False,
    retrieval_threads: int | None = None,
) -> FastAPI:
    """The API over the packs in ``packs_dir`` (KPACK_PACKS_DIR or ./packs by default).

    ``token``: when set, every route but /healthz and the docs needs ``Authorization: Bearer
    <token>``. ``warmup``: load each published pack and its embedding model before the server
    accepts connections, so the first query does not pay for it. ``retrieval_threads``: how
    many questions are worked on at once without Claude (see retrieval_pool_size); the others
    wait their turn.
    """
    root = catalog.packs_root(packs_dir)
    pool = ThreadPoolExecutor(
        max_workers=retrieval_threads or retrieval_pool_size(), thread_name_prefix="retrieval"
    )
    llm_pool = ThreadPoolExecutor(max_workers=LLM_THREADS, thread_name_prefix="claude")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A publish never makes a request wait for the new version's open (retrieval.reader).
        was = open_versions_in_background(True)
        if warmup:
            await asyncio.get_running_loop().run_in_executor(pool, _warm_up, root)
        yield
        open_versions_in_background(was)
        for executor in (pool, llm_pool):
            executor.shutdown(wait=False, cancel_futures=True)

    # /docs is Swagger UI with its script and stylesheet served from the fastapi-offline
    # package (under /static-offline-docs), not from a CDN: the page works offline.
    app = FastAPIOffline(
        title="Knowledge Packs",
        summary="Answers with citations from published knowledge packs.",
        version="1",
        lifespan=lifespan,
        redoc_url=None,
    )
    app.state.packs_dir = root
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(ServerTiming)
    _install_error_handlers(app)

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    # Without a token there is nothing to check, and no dependency to solve for each request.
    guard = [Depends(_bearer_check(token))] if token is not None else []
    # On the app itself, not an included APIRouter: each router level is another dispatch and
    # route match on the event loop for every request.
    protected: dict[str, Any] = {"dependencies": guard, "tags": ["packs"]}

    # Plain `def` handlers: FastAPI runs them in the threadpool (they read files).
    @app.get("/packs", **protected)
    def packs() -> dict[str, Any]:
        return {"packs": catalog.all_summaries(root)}

    @app.get("/packs/{name}", **protected)
    def pack(name: str) -> dict[str, Any]:
        _known(name, root)
        return catalog.info(name, root)

    @app.post("/packs/{name}/search", **protected)
    async def search(name: str, body: SearchRequest) -> Response:
        def hits(folder: Path | list[Path], question: str) -> dict[str, Any]:
            found = retrieval.search(folder, question, k=body.k, profile=body.profile)
            return {"pack": name, "version": found.version, "results": found}

        return await _answer(pool, root, name, body.question, hits)

    @app.post(
        "/packs/{name}/query",
        responses={200: {"content": {"text/event-stream": {}}}},
        **protected,
    )
    async def query(name: str, body: QueryRequest, request: Request) -> Response:
        def answer(
            source: Path | list[Path] | retrieval.PackReader, question: str, **streaming: Any
        ) -> dict:
            return retrieval.query(
                source,
                question,
                profile=body.profile,
                use_llm=body.use_llm,
                max_results=body.k,
                **streaming,
            )

        # Read per request: a key set for the server is seen without a restart, like a new version.
        workers = llm_pool if body.use_llm and os.environ.get(API_KEY_ENV) else pool
        if body.stream or "text/event-stream" in request.headers.get("accept", ""):
            folder, question = _checked(root, name, body.question)
            return await _streamed(workers, folder, partial(answer, question=question))
        return await _answer(workers, root, name, body.question, answer)

    return app


def retrieval_pool_size() -> int:
    """Questions worked on at once without Claude: one per core this process may use.

    More only contend for the cores and the interpreter lock. bench/serve_bench.py, 4 clients
    on 2 cores, Python docs pack, searches: with 4 threads (two per core) the server answered
    41.3/s at p50 94.3 ms against 44.9/s and 87.2 ms in-process from 4 threads; with 2, 46.7/s
    at 84.2 ms against 44.4/s and 86.5 ms (runs of the same hour). The bound also keeps a crowd
    of clients from starting a thread each: the others wait their turn, in order.
    """
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None  # Linux
    return len(usable) if usable else os.cpu_count() or 1


def _known(name: str, root: Path) -> Path | list[Path]:
    try:
        return catalog.pack_folders(name, root)
    except PackError as exc:
        raise HTTPException(404, str(exc)) from exc


def _checked(root: Path, name: str, question: str) -> tuple[Path | list[Path], str]:
    """The pack's folder and the question, or the error to answer with, in the CLI's order: an
    unknown pack (404), a bad question (422); retrieval then raises for a pack that was never
    built or cannot answer (409)."""
    return _known(name, root), clean_question(question)


async def _answer(
    pool: ThreadPoolExecutor,
    root: Path,
    name: str,
    question: str,
    respond: Callable[[Path | list[Path], str], dict[str, Any]],
) -> Response:
    """``respond(folder, question)``'s JSON, worked out in a thread of the pool; its
    ``version`` (the version whose reader answered) is the response's X-Kpack-Version.

    Everything but parsing the request happens in that one thread: the file checks, the
    retrieval and the JSON encoding. Each step taken on the event loop instead would cost a
    thread switch, and under load a thread waits for the interpreter lock behind the running
    retrievals at every switch (up to sys.getswitchinterval(), 5 ms, each time). The encoded
    bytes are the response as they are: FastAPI's encoder would walk every candidate of the
    trace again, for nothing (the data is plain JSON already).
    """
    submitted = time.perf_counter()

    def work() -> tuple[bytes, int, str]:
        started = time.perf_counter()
        folder, cleaned = _checked(root, name, question)
        data = respond(folder, cleaned)
        version = data["version"]
        answered = time.perf_counter()
        body = _dumps(data)
        timing = _server_timing(
            queue=started - submitted,
            retrieval=answered - started,
            encode=time.perf_counter() - answered,
        )
        return body, version, timing

    body, version, timing = await asyncio.get_running_loop().run_in_executor(pool, work)
    return Response(
        body,
        media_type="application/json",
        headers={**_version(version), SERVER_TIMING: timing},
    )


def _server_timing(**seconds: float) -> str:
    return ", ".join(f"{name};dur={value * 1000:.2f}" for name, value in seconds.items())


def _version(version: int | dict[str, int] | None) -> dict[str, str]:
    """The header of the version that answered; several packs' versions are in the body."""
    return {VERSION_HEADER: str(version)} if isinstance(version, int) else {}


class _ClientGone(Exception):
    """Raised in the answering thread when the client has closed its event stream."""


async def _streamed(
    pool: ThreadPoolExecutor, folder: Path | list[Path], answer: Callable[..., dict]
) -> Response:
    """The answer of ``answer(reader, on_text=...)`` as server-sent events (see _events).

    A thread of the pool checks the pack's current version out and holds it until the answer
    is finished (it is released in that thread, whatever happens to the stream); the response
    starts once the version is known, so its X-Kpack-Version is the version that answers. A
    pack that cannot answer is a plain 409 before any event.

    The thread posts each piece to the event loop. When the client hangs up, the response is
    cancelled and the thread's next piece raises, which closes the request to Claude: no
    tokens are paid for a reader who left.
    """
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    gone = threading.Event()

    def post(event: str, data: Any) -> None:
        if not gone.is_set():
            loop.call_soon_threadsafe(events.put_nowait, (event, data))

    def on_text(text: str) -> None:
        if gone.is_set():
            raise _ClientGone
        post("delta", {"text": text})

    def work() -> None:
        try:
            if isinstance(folder, list):  # several packs: the versions are in the result
                post("version", None)
                post("result", answer(folder, on_text=on_text))
                return
            with retrieval.reading(folder) as reader:
                post("version", reader.version)
                post("result", answer(reader, on_text=on_text))
        except _ClientGone:
            pass
        except PackError as exc:
            post("error", {"status": 409, "detail": str(exc)})
        except Exception:
            log.exception("query failed")
            post("error", {"status": 500, "detail": "internal error; see the server log"})

    # A thread started beside the response, not awaited in a task group: an anyio task group
    # must not stay open across a generator's yields.
    loop.run_in_executor(pool, work)
    event, data = await events.get()
    if event == "error":
        return _error(data["status"], data["detail"])
    return StreamingResponse(
        _events(events, gone),
        media_type="text/event-stream",
        headers={**_version(data), "Cache-Control": "no-cache"},
    )


async def _events(
    events: asyncio.Queue[tuple[str, Any]], gone: threading.Event
) -> AsyncIterator[str]:
    """Server-sent events of one answer: ``delta`` events ({"text": ...}) as Claude writes
    the answer (an offline answer is one delta), then ``result`` with the whole response
    (the JSON of a request without streaming), or one ``error`` event.

    If Claude fails part-way, the answer is the offline one with the failure note, as
    without streaming: a ``reset`` event tells the client to drop the text so far, and one
    delta with the whole answer follows. So the deltas after the last reset always join to
    the result's answer. ``gone`` is set when the client leaves (the stream ends).
    """
    written: list[str] = []
    try:
        while True:
            event, data = await events.get()
            if event == "delta":
                written.append(data["text"])
            elif event == "result" and data["answer"] != "".join(written):
                yield _sse("reset", {"detail": data["trace"].get("llm_error", "")})
                yield _sse("delta", {"text": data["answer"]})
            yield _sse(event, data)
            if event != "delta":
                return
    finally:
        gone.set()


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {_dumps(data).decode()}\n\n"


def _dumps(data: Any) -> bytes:
    """JSON as UTF-8 bytes. orjson: a query's response (about 19 KB) encodes in 0.02 ms, where
    the standard library takes 0.36 ms of the retrieval thread's time."""
    return orjson.dumps(data, default=_plain, option=ENCODING_OPTIONS)


def _plain(value: Any) -> Any:
    """What orjson does not encode itself (a non-contiguous array, a path), as JSON knows it."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _error(status: int, detail: str) -> Response:
    return Response(_dumps({"detail": detail}), status_code=status, media_type="application/json")


# --- errors --------------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI) -> None:
    async def question_error(request: Request, exc: Exception) -> Response:
        return _error(422, str(exc))

    async def pack_error(request: Request, exc: Exception) -> Response:
        # Unknown packs are 404 before retrieval runs; what retrieval raises is about the
        # pack's state: never built, damaged, or a kg_config.json it cannot use.
        return _error(409, str(exc))

    async def validation_error(request: Request, exc: Exception) -> Response:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        messages = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in errors
        ]
        return _error(422, "; ".join(messages) or "invalid request")

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal error; see the server log")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        # FastAPI answers any body it cannot parse with "There was an error parsing the body";
        # the two causes a client can fix get their own message.
        if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
            return _error(400, "the request body is not UTF-8 text (send JSON in UTF-8)")
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            return _error(400, "the request body's JSON is nested too deeply")
        return await http_exception_handler(request, exc)

    # Starlette's class: FastAPI raises it for a body it cannot parse (and for 404s, 405s).
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(QuestionError, question_error)
    app.add_exception_handler(PackError, pack_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)


def _bearer_check(token: str) -> Callable[..., Awaitable[None]]:
    async def check(credentials: Credentials) -> None:
        # compare_digest: the time taken must not tell how much of a guess was right.
        if credentials is None or not hmac.compare_digest(
            credentials.credentials.encode(), token.encode()
        ):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    return check


class BodyLimit:
    """Refuses request bodies over ``max_bytes`` with 413, by Content-Length when there is one
    and by counting otherwise (chunked uploads), before the application reads them whole."""

    def __init__(self, app: Callable, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(send)
            return
        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # An HTTPException passes through FastAPI's body parsing unchanged.
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, limited_receive, send)

    def _message(self) -> str:
        return f"request body too large (the limit is {self.max_bytes:,} bytes)"

    async def _refuse(self, send: Callable) -> None:
        body = _dumps({"detail": self._message()})
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class ServerTiming:
    """Adds ``Server-Timing: app;dur=MS`` to every response: the milliseconds from the request
    reaching the application to its response starting. With the ``queue``, ``retrieval`` and
    ``encode`` entries of a query or search, it tells a client where its wait went."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()

        async def timed_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                timing = _server_timing(app=time.perf_counter() - began).encode()
                message = {
                    **message,
                    "headers": [*message.get("headers", ()), (b"server-timing", timing)],
                }
            await send(message)

        await self.app(scope, receive, timed_send)


# --- running -------------------------------------------------------------------------------


def _warm_up(root: Path) -> None:
    """Open every published pack and load its model: the first real query is then fast."""
    for row in catalog.all_summaries(root):
        if not row.get("published"):
            continue
        try:
            retrieval.search(root / row["name"], "warm up", k=1)
        except PackError as exc:
            log.warning("pack %s cannot answer yet: %s", row["name"], exc)


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    packs_dir: Path | None = None,
    warmup: bool = True,
    access_log: bool = False,
    log_level: str = "info",
    header_timeout: float | None = None,
    max_connections: int | None = None,
) -> None:
    """Run the API with uvicorn until interrupted (what `kpack serve` does). A connection
    must send its request headers within ``header_timeout`` seconds (default HEADER_TIMEOUT_S);
    at most ``max_connections`` are open at once (default: default_max_connections())."""
    import uvicorn

    protocol = guarded_protocol(
        HEADER_TIMEOUT_S if header_timeout is None else header_timeout,
        default_max_connections() if max_connections is None else max_connections,
    )
    app = create_app(packs_dir, token=token, warmup=warmup)
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=protocol,
        log_level=log_level,
        access_log=access_log,
        # One process: a pack's vectors and model are loaded once and shared by the threads.
        workers=None,
    )
