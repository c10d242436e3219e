"""The HTTP API over published packs (`kpack serve`): FastAPI on uvicorn.

    GET  /healthz                   liveness (never needs the token)
    GET  /packs                     every pack with its published version and figures
    GET  /packs/{name}              one pack: figures, the whole manifest, skill.md
    POST /packs/{name}/query        {"question": ...} -> the `kpack query --json` response;
                                    with "stream": true, server-sent events (see _events)
    POST /packs/{name}/search       {"question": ..., "k": 5} -> ranked passages
    GET  /openapi.json, /docs       the schema and its browsable page

Errors are JSON ``{"detail": "..."}`` with the CLI's messages: 404 unknown pack, 422 a bad
request (empty or too long question, wrong field), 409 a pack that cannot answer (never built,
damaged, bad kg_config.json), 401 a missing or wrong bearer token, 413 a body over the limit,
500 anything else (logged with its traceback on the server, never sent to the client).

Retrieval is CPU-bound (embedding the question, vector and BM25 search) and runs in the
threadpool, never on the event loop. Each request resolves the pack's ``current`` version
again, so a build that publishes is picked up by the next request without a restart, and a
request that started on the previous version finishes on it.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

import retrieval
from kpack.packs import PackError
from serving import catalog

log = logging.getLogger("kpack.serve")

MAX_BODY_BYTES = 64 * 1024  # a question of 8,000 characters is at most 32 KiB of UTF-8
VERSION_HEADER = "X-Kpack-Version"
Profile = Literal["baseline", "balanced", "max"]
# Module level: annotations are strings here (postponed), and FastAPI resolves them from the
# module's globals, never from a function's locals.
BEARER = HTTPBearer(auto_error=False, description="the server's --token / KPACK_API_TOKEN")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(description=f"the question, 1 to {catalog.MAX_QUESTION_CHARS} characters")
    profile: Profile | None = Field(None, description="query profile; the pack's default if unset")
    use_llm: bool = Field(
        True, description="let Claude write the answer when the server has ANTHROPIC_API_KEY"
    )
    k: int = Field(5, ge=1, le=catalog.MAX_K, description="passages to retrieve (max_results)")
    stream: bool = Field(
        False,
        description="answer as server-sent events (also chosen by Accept: text/event-stream)",
    )


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(description=f"the question, 1 to {catalog.MAX_QUESTION_CHARS} characters")
    k: int = Field(5, ge=1, le=catalog.MAX_K, description="how many passages")
    profile: Profile | None = Field(None, description="query profile; the pack's default if unset")


def create_app(
    packs_dir: Path | None = None,
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    warmup: bool = False,
) -> FastAPI:
    """The API over the packs in ``packs_dir`` (KPACK_PACKS_DIR or ./packs by default).

    ``token``: when set, every route but /healthz and the docs needs ``Authorization: Bearer
    <token>``. ``warmup``: load each published pack and its embedding model before the server
    accepts connections, so the first query does not pay for it.
    """
    root = catalog.packs_root(packs_dir)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if warmup:
            await anyio.to_thread.run_sync(partial(_warm_up, root))
        yield

    app = FastAPI(
        title="Knowledge Packs",
        summary="Answers with citations from published knowledge packs.",
        version="1",
        lifespan=lifespan,
    )
    app.state.packs_dir = root
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    _install_error_handlers(app)

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    router = APIRouter(dependencies=[Depends(_bearer_check(token))], tags=["packs"])

    # Plain `def` handlers: FastAPI runs them in the threadpool (they read files).
    @router.get("/packs")
    def packs() -> dict[str, Any]:
        return {"packs": catalog.all_summaries(root)}

    @router.get("/packs/{name}")
    def pack(name: str) -> dict[str, Any]:
        _known(name, root)
        return catalog.info(name, root)

    @router.post("/packs/{name}/search")
    async def search(name: str, body: SearchRequest) -> Response:
        folder = _known(name, root)
        question = catalog.clean_question(body.question)
        version = catalog.version_of(folder)
        hits = await anyio.to_thread.run_sync(
            partial(retrieval.search, folder, question, k=body.k, profile=body.profile)
        )
        return _json({"pack": name, "version": version, "results": hits}, headers=_version(version))

    @router.post(
        "/packs/{name}/query",
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def query(name: str, body: QueryRequest, request: Request) -> Response:
        folder = _known(name, root)
        question = catalog.clean_question(body.question)
        version = catalog.version_of(folder)
        if version is None:
            raise PackError(f"pack {name!r} has not been built yet: run `kpack build {name}`")
        answer = partial(
            retrieval.query,
            folder,
            question,
            profile=body.profile,
            use_llm=body.use_llm,
            max_results=body.k,
        )
        if body.stream or "text/event-stream" in request.headers.get("accept", ""):
            return StreamingResponse(
                _events(answer),
                media_type="text/event-stream",
                headers={**_version(version), "Cache-Control": "no-cache"},
            )
        result = await anyio.to_thread.run_sync(answer)
        return _json(result, headers=_version(version))

    app.include_router(router)
    return app


def _known(name: str, root: Path) -> Path:
    try:
        return catalog.pack_folder(name, root)
    except PackError as exc:
        raise HTTPException(404, str(exc)) from exc


def _version(version: int | None) -> dict[str, str]:
    return {VERSION_HEADER: str(version)} if version is not None else {}


class _ClientGone(Exception):
    """Raised in the answering thread when the client has closed its event stream."""


async def _events(answer: Callable[..., dict]) -> AsyncIterator[str]:
    """Server-sent events of one answer: ``delta`` events ({"text": ...}) as Claude writes
    the answer (an offline answer is one delta), then ``result`` with the whole response
    (the JSON of a request without streaming), or one ``error`` event.

    If Claude fails part-way, the answer is the offline one with the failure note, as
    without streaming: a ``reset`` event tells the client to drop the text so far, and one
    delta with the whole answer follows. So the deltas after the last reset always join to
    the result's answer.

    The answer is worked out in a thread that posts each piece to the event loop. When the
    client hangs up, the response is cancelled and the thread's next piece raises, which
    closes the request to Claude: no tokens are paid for a reader who left.
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
            post("result", answer(on_text=on_text))
        except _ClientGone:
            pass
        except PackError as exc:
            post("error", {"status": 409, "detail": str(exc)})
        except Exception:
            log.exception("query failed")
            post("error", {"status": 500, "detail": "internal error; see the server log"})

    # A thread started beside this generator, not awaited in a task group: an anyio task
    # group must not stay open across a generator's yields.
    loop.run_in_executor(None, work)
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
    return f"event: {event}\ndata: {_dumps(data)}\n\n"


def _dumps(data: Any) -> str:
    return json.dumps(data, default=_plain, ensure_ascii=False)


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (scores, vectors) and paths, as JSON knows them."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # Serialized here, not by FastAPI's encoder: the response dict is plain data already, and
    # the encoder's walk over every candidate of the trace costs more than the rest of HTTP.
    return Response(
        _dumps(data), status_code=status, media_type="application/json", headers=headers
    )


# --- errors --------------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI) -> None:
    async def question_error(request: Request, exc: Exception) -> Response:
        return _json({"detail": str(exc)}, status=422)

    async def pack_error(request: Request, exc: Exception) -> Response:
        # Unknown packs are 404 before retrieval runs; what retrieval raises is about the
        # pack's state: never built, damaged, or a kg_config.json it cannot use.
        return _json({"detail": str(exc)}, status=409)

    async def validation_error(request: Request, exc: Exception) -> Response:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        messages = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in errors
        ]
        return _json({"detail": "; ".join(messages) or "invalid request"}, status=422)

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _json({"detail": "internal error; see the server log"}, status=500)

    app.add_exception_handler(catalog.QuestionError, question_error)
    app.add_exception_handler(PackError, pack_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)


def _bearer_check(token: str | None) -> Callable[..., Awaitable[None]]:
    async def check(credentials: Credentials) -> None:
        if token is None:
            return
        # compare_digest: the time taken must not tell how much of a guess was right.
        if credentials is None or not hmac.compare_digest(
            credentials.credentials.encode(), token.encode()
        ):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    return check


class _BodyTooLarge(Exception):
    pass


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
        body = _dumps({"detail": self._message()}).encode()
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    packs_dir: Path | None = None,
    warmup: bool = True,
    access_log: bool = False,
    log_level: str = "info",
) -> None:
    """Run the API with uvicorn until interrupted (what `kpack serve` does)."""
    import uvicorn

    app = create_app(packs_dir, token=token, warmup=warmup)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        # One process: a pack's vectors and model are loaded once and shared by the threads.
        workers=None,
    )
