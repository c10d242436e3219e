"""The deadline of one fetch: a watchdog that shuts the fetch's sockets when it passes, so a
server that trickles its answer a byte at a time cannot hold a build."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from kpack.ingest.fetch_errors import FetchError


class Deadline:
    """The end of one fetch, ``seconds`` after it starts (its first request, once the host's
    turn came): when it passes, the sockets the fetch reads are shut down, which wakes a read
    blocked on a server that trickles its answer. The timer starts with the first socket
    watched, so a fetch that opens none (a file: URL) costs no thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends_at: float | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer: threading.Timer | None = None
        self._fired = False  # the timer may wake a hair before ends_at

    @property
    def message(self) -> str:
        return f"timed out: no complete answer within the fetch deadline of {self.seconds:g} s"

    @property
    def expired(self) -> bool:
        return self._fired or self.remaining() <= 0

    def start(self) -> None:
        """Start the clock; later calls change nothing."""
        if self.ends_at is None:
            self.ends_at = time.monotonic() + self.seconds

    def remaining(self) -> float:
        if self.ends_at is None:
            return self.seconds
        return max(0.0, self.ends_at - time.monotonic())

    def check(self) -> None:
        if self.expired:
            raise FetchError(self.message)

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            if self._timer is None:
                self._timer = threading.Timer(self.remaining(), self._expire)
                self._timer.daemon = True
                self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self._fired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # OSError: already closed, or handed back to the pool and closed since.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
