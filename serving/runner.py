"""Running the HTTP API (`kpack serve`): uvicorn with the guarded connections, and the Host names
the server answers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from serving.connections import HEADER_TIMEOUT_S, default_max_connections, guarded_protocol
from serving.http import create_app
from serving.middleware import served_hosts


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
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Run the API with uvicorn until interrupted (what `kpack serve` does). A connection
    must send its request headers within ``header_timeout`` seconds (default HEADER_TIMEOUT_S);
    at most ``max_connections`` are open at once (default: default_max_connections()). Requests
    must name the server by a loopback name, the address it is bound to, or one of
    ``allowed_hosts`` (see serving.middleware.served_hosts)."""
    import uvicorn

    protocol = guarded_protocol(
        HEADER_TIMEOUT_S if header_timeout is None else header_timeout,
        default_max_connections() if max_connections is None else max_connections,
    )
    app = create_app(
        packs_dir, token=token, warmup=warmup, allowed_hosts=served_hosts(host, allowed_hosts)
    )
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
