"""The HTTP API's ASGI middlewares: the Host names it answers (checked by Starlette's
TrustedHostMiddleware), the body limit and the Server-Timing header. Each wraps the
application and answers or annotates a request before a route runs."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable

from fastapi import HTTPException

from kpack.errors import PackError
from serving.responses import dumps, server_timing

# The names of this machine's loopback interface as a Host header carries them (an IPv6
# address in brackets): what a token-less server on 127.0.0.1 is reached as.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ANY_HOST = "*"
# Addresses that mean "every interface": no client names the server by them.
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def served_hosts(bind_host: str, allowed: Iterable[str] = ()) -> list[str]:
    """The Host names a server bound to ``bind_host`` answers: the loopback names, the address
    it is bound to (unless that is every interface), and ``allowed`` (names or ``*.domain``
    patterns; ``*`` for any). Any other Host is refused, so a web page whose name was rebound
    to this machine's address (DNS rebinding) cannot read the packs through the browser."""
    hosts = [*LOOPBACK_HOSTS]
    if bind_host not in WILDCARD_ADDRESSES:
        hosts.append(_as_host_header(bind_host))
    for name in (name.strip().lower() for name in allowed):
        if "*" in name[1:] or (name.startswith("*") and name != ANY_HOST and name[1] != "."):
            raise PackError(f"invalid host name {name!r}: use a name, '*.domain' or '*'")
        hosts.append(name)
    return list(dict.fromkeys(hosts))


def _as_host_header(host: str) -> str:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower()
    return f"[{address}]" if address.version == 6 else str(address)


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
        body = dumps({"detail": self._message()})
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
                timing = server_timing(app=time.perf_counter() - began).encode()
                message = {
                    **message,
                    "headers": [*message.get("headers", ()), (b"server-timing", timing)],
                }
            await send(message)

        await self.app(scope, receive, timed_send)
