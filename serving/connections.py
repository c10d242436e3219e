"""Slow and excess connections to `kpack serve`: a header deadline and a connection cap.

uvicorn reads a request's line and headers with no deadline and accepts connections until the
process runs out of file descriptors. A client that sends one header line every few seconds
then holds a descriptor for as long as it likes, and a few hundred such clients (under a limit
of 256 open files) leave none for anyone else: every normal request was reset. Two bounds, on
uvicorn's own HTTP protocol (httptools):

- **header timeout** (``header_timeout``, `kpack serve --header-timeout`, default
  HEADER_TIMEOUT_S): a connection must deliver a request's line and headers within that many
  seconds of connecting (or of its previous response, on a kept-alive connection); otherwise
  it is answered 408 and closed. The body is bounded by BodyLimit (serving.http), the answer
  by the retrieval pool.
- **connection cap** (``max_connections``, `kpack serve --max-connections`, default
  :func:`default_max_connections`): at the cap, a new connection displaces the connection that
  has waited longest for its request headers (answered 503 and closed): a client that sends
  its request promptly is served, and a crowd of slow ones only displaces each other. When no
  connection is waiting (every one has a request in progress) the new one is answered 503
  with ``Retry-After: 1`` and closed at once, instead of queueing unseen.
"""

from __future__ import annotations

import asyncio
import resource
from http import HTTPStatus

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kpack.errors import PackError

HEADER_TIMEOUT_S = 10.0
MOST_CONNECTIONS = 1024  # the default cap's ceiling, on a machine with many descriptors
UNLIMITED_FILES = 4096  # what an unlimited RLIMIT_NOFILE counts as for the default cap


def default_max_connections() -> int:
    """Half the process's open-file limit (at most MOST_CONNECTIONS): the other half stays for
    what the server itself opens (pack databases, models, log files, sockets to Claude)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = UNLIMITED_FILES if soft == resource.RLIM_INFINITY else soft
    return max(8, min(MOST_CONNECTIONS, files // 2))


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline and the connection cap."""

    header_timeout: float = HEADER_TIMEOUT_S
    max_connections: int = MOST_CONNECTIONS

    waiting_since: float | None = None  # loop time since which request headers are awaited
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        idle = not self.pipeline  # no request read ahead: the next one's headers are awaited
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            self._await_headers()

    def _await_headers(self) -> None:
        self._headers_arrived()
        self.waiting_since = self.loop.time()
        self._deadline = self.loop.call_later(self.header_timeout, self._headers_late)

    def _headers_arrived(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.waiting_since = None

    def _headers_late(self) -> None:
        self._refuse(
            HTTPStatus.REQUEST_TIMEOUT,
            f"request headers not received within {self.header_timeout:g} s",
        )

    def _make_room(self) -> None:
        """Over the cap: close the connection waiting longest for headers, or this one."""
        waiting = [
            c
            for c in self.connections
            if isinstance(c, GuardedHttpTools) and c is not self and c.waiting_since is not None
        ]
        busy = f"the server is at its limit of {self.max_connections:,} connections"
        if waiting:
            oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
            oldest._refuse(HTTPStatus.SERVICE_UNAVAILABLE, f"{busy}; this one sent no request")
        else:
            self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, f"{busy}; retry shortly")

    def _refuse(self, status: HTTPStatus, detail: str) -> None:
        """Answer ``status`` with ``{"detail": ...}`` and close the connection."""
        self._headers_arrived()
        self.connections.discard(self)  # no longer counts against the cap while it closes
        if self.transport.is_closing():
            return
        body = orjson.dumps({"detail": detail})
        retry = b"retry-after: 1\r\n" if status == HTTPStatus.SERVICE_UNAVAILABLE else b""
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"%sconnection: close\r\n\r\n%s"
            % (status.value, status.phrase.encode(), len(body), retry, body)
        )
        self.transport.close()


def guarded_protocol(header_timeout: float, max_connections: int) -> type[GuardedHttpTools]:
    """The protocol class to give uvicorn (its ``http`` setting) with these bounds."""
    if header_timeout <= 0:
        raise PackError(f"--header-timeout must be more than 0 seconds; got {header_timeout:g}")
    if max_connections < 1:
        raise PackError(f"--max-connections must be at least 1; got {max_connections}")
    return type(
        "GuardedHttpTools",
        (GuardedHttpTools,),
        {"header_timeout": header_timeout, "max_connections": max_connections},
    )
