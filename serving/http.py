"""The HTTP API's routes over published packs (`kpack serve`, run by serving.runner): FastAPI.

    GET  /healthz                   liveness (never needs the token)
    GET  /packs                     every pack with its published version and figures
    GET  /packs/{name}              one pack: figures, the whole manifest, skill.md
    POST /packs/{name}/query        {"question": ...} -> the `kpack query --json` response;
                                    with "stream": true, server-sent events (serving.streaming)
    POST /packs/{name}/search       {"question": ..., "k": 5, "tokens": 2000} -> ranked passages
                                    (deep links, confidence, the gate's verdict)
    GET  /packs/{name}/search?q=... the same search as a link
    (a name such as "pandas,python" asks several packs: retrieval.multipack)
    GET  /openapi.json, /docs       the schema and its browsable page (Swagger UI, served
                                    offline: no CDN)

Errors are JSON ``{"detail": "..."}`` with the CLI's messages (serving.errors): 404 unknown
pack (the message names neither the packs folder nor the other packs), 422 a bad request
(empty or too long question, wrong field), 409 a pack that cannot answer (never built, or a
version that failed to open: serving.health), 401 a missing or wrong bearer token
(serving.auth), 413 a body over the limit, 400 a Host header the server is not served as
(serving.middleware), 500 anything else (logged with its traceback on the server, never sent
to the client).

Retrieval is CPU-bound (embedding the question, vector and BM25 search) and runs in a pool of
one thread per core (serving.pools), never on the event loop; the response's JSON is
encoded in the same thread. A question that Claude answers waits seconds on the network: those
run in a pool of their own (LLM_THREADS), so they never hold a core's turn. Every response says where its time went in a ``Server-Timing`` header
(``queue``, ``retrieval``, ``encode`` and ``app``, in ms), which bench/serve_bench.py reads.
Each request resolves the pack's ``current`` version again, so a build that publishes is
picked up by the next request without a restart, and a request that started on the previous
version finishes on it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import Response
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field
from starlette.middleware.trustedhost import TrustedHostMiddleware

import retrieval
from kpack.llm import API_KEY_ENV
from kpack.packs import PackError
from retrieval.query import MAX_QUESTION_CHARS, MAX_SERVED_K, MAX_TOKENS, clean_question
from retrieval.registry import open_versions_in_background
from serving import catalog
from serving.auth import bearer_check
from serving.catalog import ProfileName, served_k
from serving.errors import install_error_handlers
from serving.health import PackHealth
from serving.middleware import LOOPBACK_HOSTS, BodyLimit, ServerTiming
from serving.pools import LLM_THREADS, retrieval_pool_size
from serving.responses import SERVER_TIMING, dumps, server_timing, version_headers
from serving.streaming import streamed

MAX_BODY_BYTES = 64 * 1024  # a question of MAX_QUESTION_CHARS is at most 32 KiB of UTF-8


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
    k: int | None = Field(
        None, ge=1, le=MAX_SERVED_K, description="how many passages (5; 20 with tokens)"
    )
    profile: ProfileName | None = Field(
        None, description="query profile; the pack's default if unset"
    )
    tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="whole passages, best first, up to this budget"
    )


def create_app(
    packs_dir: Path | None = None,
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    warmup: bool = False,
    retrieval_threads: int | None = None,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
) -> FastAPI:
    """The API over the packs in ``packs_dir`` (KPACK_PACKS_DIR or ./packs by default).

    ``token``: when set, every route but /healthz and the docs needs ``Authorization: Bearer
    <token>``. ``warmup``: load each published pack and its embedding model before the server
    accepts connections, so the first query does not pay for it. ``retrieval_threads``: how
    many questions are worked on at once without Claude (see retrieval_pool_size); the others
    wait their turn. ``allowed_hosts``: the Host names requests may carry (``*`` for any; see
    serving.middleware.served_hosts). A pack that fails to open, at warm-up or later, is
    reported in /packs and /healthz (serving.health) and the others keep answering.
    """
    root = catalog.packs_root(packs_dir)
    pool = ThreadPoolExecutor(
        max_workers=retrieval_threads or retrieval_pool_size(), thread_name_prefix="retrieval"
    )
    llm_pool = ThreadPoolExecutor(max_workers=LLM_THREADS, thread_name_prefix="claude")
    health = PackHealth()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A publish never makes a request wait for the new version's open (retrieval.reader).
        was = open_versions_in_background(True)
        if warmup:
            await asyncio.get_running_loop().run_in_executor(pool, health.warm_up, root)
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
    # Added last, so it runs first: a request naming another host is refused before anything.
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts), www_redirect=False)
    install_error_handlers(app)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, Any]:
        # Alive either way; "degraded" names the packs that cannot answer (no detail: the
        # route needs no token).
        failing = sorted(health.failing(root))
        return {"status": "degraded", "failing_packs": failing} if failing else {"status": "ok"}

    # Without a token there is nothing to check, and no dependency to solve for each request.
    guard = [Depends(bearer_check(token))] if token is not None else []
    # On the app itself, not an included APIRouter: each router level is another dispatch and
    # route match on the event loop for every request.
    protected: dict[str, Any] = {"dependencies": guard, "tags": ["packs"]}

    # Plain `def` handlers: FastAPI runs them in the threadpool (they read files).
    @app.get("/packs", **protected)
    def packs() -> dict[str, Any]:
        return {"packs": health.summaries(root)}

    @app.get("/packs/{name}", **protected)
    def pack(name: str) -> dict[str, Any]:
        _known(name, root)
        return catalog.info(name, root)

    @app.post("/packs/{name}/search", **protected)
    async def search(name: str, body: SearchRequest) -> Response:
        def hits(folder: Path | list[Path], question: str) -> dict[str, Any]:
            k = served_k(body.k, body.tokens)
            found = retrieval.search(
                folder, question, k=k, profile=body.profile, tokens=body.tokens
            )
            return {"pack": name, "version": found.version, "gate": found.gate, "results": found}

        return await _answer(pool, root, health, name, body.question, hits)

    @app.get("/packs/{name}/search", **protected)
    async def search_by_link(
        name: str,
        q: Annotated[str, Query(description="the question")] = "",
        k: Annotated[int | None, Query(ge=1, le=MAX_SERVED_K)] = None,
        profile: ProfileName | None = None,
        tokens: Annotated[int | None, Query(ge=1, le=MAX_TOKENS)] = None,
    ) -> Response:
        """The POST search as a link: ``?q=...&k=...&tokens=...``."""
        return await search(name, SearchRequest(question=q, k=k, profile=profile, tokens=tokens))

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
            return await streamed(workers, folder, partial(answer, question=question))
        return await _answer(workers, root, health, name, body.question, answer)

    return app


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
    health: PackHealth,
    name: str,
    question: str,
    respond: Callable[[Path | list[Path], str], dict[str, Any]],
) -> Response:
    """``respond(folder, question)``'s JSON, worked out in a thread of the pool; its
    ``version`` (the version whose reader answered) is the response's X-Kpack-Version. A
    failure other than PackError is the pack's (serving.health): a 409 naming it.

    Everything but parsing the request happens in that one thread: the file checks, the
    retrieval and the JSON encoding. Each step taken on the event loop instead would cost a
    thread switch, and under load a thread waits for the interpreter lock behind the running
    retrievals at every switch (up to sys.getswitchinterval(), 5 ms, each time). The encoded
    bytes are the response as they are: FastAPI's encoder would walk every candidate of the
    trace again, for nothing (the data is plain JSON already).
    """
    submitted = time.perf_counter()

    def work() -> tuple[bytes, int | dict[str, int] | None, str]:
        started = time.perf_counter()
        folder, cleaned = _checked(root, name, question)
        with health.failures_of(name, folder):
            data = respond(folder, cleaned)
        version = data["version"]
        answered = time.perf_counter()
        body = dumps(data)
        timing = server_timing(
            queue=started - submitted,
            retrieval=answered - started,
            encode=time.perf_counter() - answered,
        )
        return body, version, timing

    body, version, timing = await asyncio.get_running_loop().run_in_executor(pool, work)
    return Response(
        body,
        media_type="application/json",
        headers={**version_headers(version), SERVER_TIMING: timing},
    )
