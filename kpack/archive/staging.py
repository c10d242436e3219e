"""Where an install, validate or pull writes before anything is published, and its cleanup.

Everything such an operation writes first (a download, the unpacked members of an archive, a
new pack being assembled) lives in a folder of its own under ``<packs>/.kpack-staging``
(hidden: never listed as a pack), removed when the operation ends, however it ends. A killed
operation cannot remove its folder, so each operation first removes the folders of those no
longer running: while it runs, an operation holds a shared flock on
``.kpack-staging/.lock``, and the cleanup needs the exclusive one, which the kernel hands over
only when no operation holds the lock (the lock of a killed process is released with it).

A version installed over an existing pack is staged in the pack's own ``.versions`` folder
instead, as a build stages it, and removed the way a killed build's staging is (see
kpack.archive.install).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kpack.errors import disk_errors
from kpack.file_locks import FileLock

STAGING_FOLDER = ".kpack-staging"
LOCK_FILE = ".lock"


@contextmanager
def staging_area(packs_root: Path) -> Iterator[Path]:
    """A new empty folder under ``packs_root/.kpack-staging``, removed when the block ends."""
    base = Path(packs_root) / STAGING_FOLDER
    with disk_errors(f"cannot write to {base}"):
        base.mkdir(parents=True, exist_ok=True)
        lock = FileLock(base / LOCK_FILE)
    try:
        # Not taken: another operation runs, so the folders left are not all a killed one's.
        if lock.take(wait=False):
            for leftover in base.iterdir():
                if leftover.name != LOCK_FILE:
                    _remove(leftover)
        # Turns the exclusive lock into a shared one, or waits for a cleanup to finish.
        lock.take(shared=True)
        folder = base / uuid.uuid4().hex
        with disk_errors(f"cannot write to {base}"):
            folder.mkdir()
        try:
            yield folder
        finally:
            _remove(folder)
    finally:
        lock.release()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
