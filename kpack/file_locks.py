"""Advisory file locks between processes (``flock``): the one lock helper of kpack.

A lock is held on an open file, so a process that dies releases it: a killed build or export
leaves no stale lock. Used for the pack's build lock (kpack.store), the archive staging area
(kpack.archive.staging) and the model export (kpack.quantized).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


class FileLock:
    """An flock on ``path`` (created when missing), taken by :meth:`take` and held until
    :meth:`release` (or until the process exits)."""

    def __init__(self, path: Path) -> None:
        self._handle: IO[str] = open(path, "a")  # noqa: SIM115 (held until release)

    def take(self, shared: bool = False, wait: bool = True) -> bool:
        """Take the lock, exclusive or ``shared`` (a holder of the other kind converts it);
        without ``wait``, False at once when another process holds it."""
        flags = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(self._handle, flags if wait else flags | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        """Release the lock and close the file (idempotent)."""
        if not self._handle.closed:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` around a block, waited for."""
    lock = FileLock(path)
    try:
        lock.take()
        yield
    finally:
        lock.release()


def held_elsewhere(path: Path) -> bool:
    """Whether another process holds an exclusive lock on ``path`` now (probed, never
    waited for; a missing file is held by no one)."""
    if not path.exists():
        return False
    probe = FileLock(path)
    try:
        return not probe.take(shared=True, wait=False)
    finally:
        probe.release()
