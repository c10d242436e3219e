"""The deadline of one fetch: a watchdog that shuts the fetch's sockets when it passes, so a
server that trickles its answer a byte at a time cannot hold a build.

One watchdog thread serves every deadline of the process (:class:`_Watchdog`): a crawl makes
thousands of fetches, and a timer thread started and stopped for each took a tenth of the
client's time in a no-change rebuild of 11,000 pages, where 8 fetch threads share one core
under the GIL.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time

from kpack.ingest.fetch_errors import FetchError


class Deadline:
    """The end of one fetch, ``seconds`` after it starts (its first request, once the host's
    turn came): when it passes, the sockets the fetch reads are shut down, which wakes a read
    blocked on a server that trickles its answer. The watchdog learns of it with the first
    socket watched, so a fetch that opens none (a file: URL) costs it nothing."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends_at: float | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._watched = False
        self._cancelled = False
        self._fired = False  # the watchdog may wake a hair before ends_at

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
        self.start()
        with self._lock:
            self._sockets.append(sock)
            first, self._watched = not self._watched, True
        if first:
            _WATCHDOG.add(self)

    def cancel(self) -> None:
        """The fetch is over: its sockets are no longer the watchdog's to shut."""
        with self._lock:
            self._cancelled = True
            self._sockets = []

    def expire(self) -> None:
        """The deadline passed (called by the watchdog): shut the sockets still watched."""
        with self._lock:
            if self._cancelled:
                return
            self._fired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)


class _Watchdog:
    """One daemon thread expiring every watched deadline of the process when its time comes:
    a heap of (end, deadline), the earliest first; a cancelled deadline is dropped when it
    comes up (its expire does nothing), never searched for."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()  # ties broken by arrival, never by comparing deadlines
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, deadline: Deadline) -> None:
        assert deadline.ends_at is not None, "a deadline is watched once started"
        with self._wake:
            heapq.heappush(self._due, (deadline.ends_at, next(self._order), deadline))
            # Not alive: never started, or this is a forked child (a Celery worker), which
            # has no thread of its parent's.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="kpack-fetch-deadlines", daemon=True
                )
                self._thread.start()
            elif self._due[0][2] is deadline:
                self._wake.notify()  # an earlier end than the one it sleeps until

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, deadline = heapq.heappop(self._due)
            deadline.expire()


_WATCHDOG = _Watchdog()


def _shut(sock: socket.socket) -> None:
    # OSError: already closed, or handed back to the pool and closed since.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
