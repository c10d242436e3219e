"""The errors a user can act on: shown as one clear line, never as a traceback."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# What a writer of a large file (an archive unpacked or downloaded) leaves free on its disk: room
# for the manifest and skill.md written afterwards, and for what other writers need meanwhile.
SPACE_MARGIN_BYTES = 16 << 20


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


def room_on_disk(folder: Path) -> int:
    """The bytes a writer may put on the disk of ``folder``: its free space less the margin."""
    return shutil.disk_usage(folder).free - SPACE_MARGIN_BYTES


def check_space(folder: Path, needed: int, what: str) -> None:
    """Refuse before writing ``needed`` bytes into ``folder`` when its disk has not the room;
    ``what`` starts the message ("x.kpack unpacks to")."""
    free = shutil.disk_usage(folder).free
    if needed > free - SPACE_MARGIN_BYTES:
        raise PackError(
            f"{what} {needed:,} bytes, but the disk of {folder} has {free:,} free (and "
            f"{SPACE_MARGIN_BYTES >> 20} MiB are kept free): free some space and try again"
        )
