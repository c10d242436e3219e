"""An answer as server-sent events: the bridge between the thread that answers and the event
loop that streams (``POST /packs/{name}/query`` with ``"stream": true``)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi.responses import Response, StreamingResponse

import retrieval
from kpack.packs import PackError
from serving.responses import dumps, error_response, version_headers

log = logging.getLogger("kpack.serve")


class _ClientGone(Exception):
    """Raised in the answering thread when the client has closed its event stream."""


async def streamed(
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
        return error_response(data["status"], data["detail"])
    return StreamingResponse(
        _events(events, gone),
        media_type="text/event-stream",
        headers={**version_headers(data), "Cache-Control": "no-cache"},
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
    return f"event: {event}\ndata: {dumps(data).decode()}\n\n"
