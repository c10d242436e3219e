"""The errors a user can act on: shown as one clear line, never as a traceback."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager


class PackError(ValueError):
    """A problem the user can fix (bad name, unknown pack, malformed config)."""


class PackNotReady(PackError):
    """The pack exists but cannot be read: never built, or its files are damaged."""


@contextmanager
def disk_errors(what: str) -> Iterator[None]:
    """An OSError in the block (a full disk, a folder that cannot be written) as one PackError
    line that starts with ``what``."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno == errno.ENOSPC:
            raise PackError(
                f"{what}: no space left on the device{where}; free some space and try again"
            ) from None
        raise PackError(f"{what}: {exc.strerror or exc}{where}") from None
