"""The registry of open readers: one per pack, the reader of its current version.

The process keeps at most one reader (retrieval.reader.PackReader) per pack: the reader of
its current version. When a newer version is published, the next :func:`checkout` of that pack
opens it, warms it (the functions in ``WARMERS`` run on it: retrieval registers a one-passage
search, so the first query's lazy work is done before any query uses it), and only then makes
it current and retires the old reader. A pack's first version in a process is not warmed: no
query waits on an older one, and its first query does that lazy work itself (warming first
made a fresh process's first search run two searches). A reader is reference counted
(:meth:`PackReader.acquire` / :meth:`PackReader.release`, or :func:`reading`): a retired one
is closed when its last user releases it, never while a query holds it, so a long-lived
process does not keep superseded or pruned versions open and never pulls one from under a
query.

Each pack has its own lock, held only to look at or swap its reader, never while a version
opens: a pack whose new version is opening keeps answering from its old version meanwhile
(the first caller to see the new version opens it and waits for it; callers that come while
it opens get the old reader), and other packs are never touched.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from kpack import settings as kpack_settings
from kpack.errors import PackError, PackNotReady
from kpack.packs import current_version, pack_dir
from retrieval.reader import PackReader, start_in_background

log = logging.getLogger(__name__)


def pack_folder_of(pack: str | Path) -> str | Path:
    """Accept a pack name, a pack folder, or the path of its pack.db (as the seed's examples do)."""
    path = Path(pack)
    if path.name == "pack.db":
        path = path.parent
        while path.name != ".versions" and path.parent != path and not (path / "urls.txt").exists():
            path = path.parent
        return path.parent if path.name == ".versions" else path
    return pack


def resolve_folder(pack: str | Path) -> Path:
    """The folder of a pack given by name, folder path, or pack.db path."""
    pack = pack_folder_of(pack)
    text = str(pack)
    if isinstance(pack, Path) or "/" in text:
        folder = Path(pack)
        if not (folder / "urls.txt").is_file():
            raise PackError(f"{folder} is not a pack folder (it has no urls.txt)")
        return folder.resolve()
    # A pack published only in the shared store (KPACK_STORAGE) is pulled here first. Imported
    # here: the store's client costs a third of a second that `import retrieval` need not pay.
    from kpack.remote import ensure_local

    ensure_local(text, kpack_settings.packs_dir())
    return pack_dir(text, kpack_settings.packs_dir())


# Run on every newly opened reader before it serves (in order; an exception fails the open):
# the lazy work of a first query is done here, not in the first request after a publish.
# retrieval registers a one-passage search; a server or a test may add its own.
WARMERS: list[Callable[[PackReader], object]] = []


@dataclass
class _PackSlot:
    """One pack's current reader; ``changed`` (with its lock) guards it and the open under way."""

    changed: threading.Condition = field(default_factory=threading.Condition)
    reader: PackReader | None = None
    opening: Path | None = None  # the version a thread is opening now, outside the lock
    failed: Path | None = None  # a version whose open failed (not tried again in the background)


# Servers set this (open_versions_in_background): a new version is then opened and warmed by a
# thread of its own, at a lower CPU priority, while the old version answers every request, so
# no request pays for an open and the other packs' requests keep the cores. Elsewhere (a
# notebook, the CLI) the first caller opens it and waits, so a query right after a build
# answers from the new version.
_background_opens = False

_slots: dict[Path, _PackSlot] = {}
_slots_lock = threading.Lock()  # only to find or add a pack's slot; never held while opening


def _slot(folder: Path) -> _PackSlot:
    with _slots_lock:
        return _slots.setdefault(folder, _PackSlot())


def open_reader(folder: Path, version: Path, warm: bool) -> PackReader:
    """A new reader of ``version``; with ``warm``, every warmer run on it (closed again if one
    fails)."""
    reader = PackReader(folder, version)
    try:
        for warmer in WARMERS if warm else ():
            warmer(reader)
    except BaseException:
        reader.close()
        raise
    return reader


def open_versions_in_background(enabled: bool = True) -> bool:
    """Whether this process opens new versions in the background (see ``_background_opens``);
    returns what it was."""
    global _background_opens
    was, _background_opens = _background_opens, enabled
    return was


def checkout(pack: str | Path | PackReader) -> PackReader:
    """The reader of the pack's current version, marked in use: pair it with ``release()``.

    A reader that is passed in is used as it is (a caller pinning one version). A version not
    open yet is opened and warmed by the first caller that asks for it, holding no lock: callers
    of the same pack that come meanwhile get the previous version's reader (when there is one),
    callers of other packs never wait for it. In a server (:func:`open_versions_in_background`)
    a thread of its own opens it, and the previous version answers every caller until it is
    warm; a version whose open failed there is not tried again (the log says why).
    """
    if isinstance(pack, PackReader):
        pack.acquire()
        return pack
    folder = resolve_folder(pack)
    version = current_version(folder)
    if version is None:
        raise PackNotReady(
            f"pack {folder.name!r} has not been built yet: run `kpack build {folder.name}`"
        )
    slot = _slot(folder)
    with slot.changed:
        while True:
            reader = slot.reader
            if reader is not None and reader.version_dir == version and not reader.closed:
                reader.acquire()
                return reader
            serving = reader is not None and not reader.closed
            if _background_opens and serving:
                if slot.opening is None and slot.failed != version:
                    slot.opening = version
                    start_in_background(
                        f"open {folder.name}", partial(_open_in_background, slot, folder, version)
                    )
                reader.acquire()
                return reader
            if slot.opening is None:
                slot.opening = version
                break
            if serving:
                reader.acquire()  # another thread opens the new version: answer from this one
                return reader
            slot.changed.wait()
    fresh = _open_into(slot, folder, version, warm=serving)
    fresh.acquire()
    return fresh


def _open_into(slot: _PackSlot, folder: Path, version: Path, warm: bool = True) -> PackReader:
    """Open ``version`` (and warm it, when it replaces a version that answers meanwhile), make
    it the slot's reader and retire the one it replaces."""
    try:
        fresh = open_reader(folder, version, warm)
    except BaseException:
        with slot.changed:
            slot.opening, slot.failed = None, version
            slot.changed.notify_all()
        raise
    with slot.changed:
        previous, slot.reader, slot.opening, slot.failed = slot.reader, fresh, None, None
        slot.changed.notify_all()
    if previous is not None:
        previous.retire()
    return fresh


def _open_in_background(slot: _PackSlot, folder: Path, version: Path) -> None:
    try:
        _open_into(slot, folder, version)
    except Exception as exc:  # the old version keeps answering; the log says why
        log.error("pack %r version %s could not be opened: %s", folder.name, version.name, exc)


@contextmanager
def reading(pack: str | Path | PackReader) -> Iterator[PackReader]:
    """``with reading("demo") as reader:`` the current version, held open for the block."""
    reader = checkout(pack)
    try:
        yield reader
    finally:
        reader.release()


def open_pack(pack: str | Path) -> PackReader:
    """The reader of the pack's current version (opened, or replaced by a newer one, as
    needed). It stays open while it is current; use :func:`reading` to hold a version open
    across a publish."""
    reader = checkout(pack)
    reader.release()
    return reader


def close_all() -> None:
    """Retire every reader (at exit, or to make the next query read from disk afresh): those
    not in use close now, those in use when their last user releases them."""
    with _slots_lock:
        slots = list(_slots.values())
        _slots.clear()
    for slot in slots:
        with slot.changed:
            reader, slot.reader = slot.reader, None
        if reader is not None:
            reader.retire()


atexit.register(close_all)
