"""The packs folder: pack sources in, published Kuzu graph versions out.

One writer builds a staged database; readers only ever see published ones.

Layout of a pack folder::

    .build.lock                    held (flock) by the one build, rollback or install running
    .versions/staging-<run id>/    a build in progress (removed when its run ends unpublished)
    .versions/v0007/               a published version: pack.db, manifest.json, skill.md,
                                   articles.json (url -> content hash) and .verified.json
    .versions/current -> v0007
    pack.db -> .versions/current/pack.db      (and manifest.json, skill.md)

Publishing renames the finished staging folder to the next version and flips ``current`` with
an atomic rename of a symlink, so a reader resolves one whole version or the previous one, and
a build that fails or is killed anywhere before that leaves the published pack untouched.
The version that was current before a publish is kept (and older ones removed), so
``rollback`` can flip ``current`` back to it the same atomic way.

A published version carries the size and SHA-256 of its pack.db in its manifest
(``database``), and of each retrieval index file (kpack.index_files, under ``indexes/``) in
``indexes``, stamped by publish. Kuzu crashes the process (SIGSEGV) on a database whose
bytes were damaged, so nothing opens a published database before :func:`verify_version`
passed: it compares the size on every call, and the full hash once per file state (inode,
mtime, size), remembered in ``.verified.json``. A build reads what it needs of the published
version from ``articles.json`` (the article hashes) and its manifest (the sources fingerprint),
never from the database.

``.versions/last_build.json`` records the outcome of the latest build (published, unchanged or
failed) for ``kpack status``; it is written atomically and never read by queries or builds.

A version's manifest records the sources fingerprint it was built from
(kpack.changes.sources_fingerprint). That is the one record of "nothing changed": a build whose
fetch comes to the fingerprint of the current version, which verifies, stops after the fetch
(:meth:`PackStoreOps.built_from`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from kpack.config import PackConfig, load_config
from kpack.errors import PackError, PackNotReady
from kpack.file_locks import FileLock, held_elsewhere
from kpack.packs import (
    INDEX_DIR,
    PUBLISHED_FILES,
    LineProblem,
    Source,
    current_version,
    pack_dir,
    read_urls,
    versions_dir,
)

KEEP_PREVIOUS_VERSIONS = 1
LAST_BUILD = "last_build.json"
ROLLBACK = "rollback.json"
LOCK_FILE = ".build.lock"
STAGING_PREFIX = "staging"
DATABASE = "pack.db"
ARTICLES = "articles.json"
VERIFIED = ".verified.json"
HASH_CHUNK_BYTES = 1 << 20


def version_number(path: Path) -> int:
    return int(path.name[1:])


class PackStoreOps:
    """Reads pack definitions and stages/publishes pack databases under ``packs_dir``.

    A mixin over one attribute, ``packs_dir``, so the Dagster resource (resources.pack_store)
    and plain Python (the CLI, tests) share every method: see :class:`PackStore`.
    """

    packs_dir: str

    def folder(self, pack: str) -> Path:
        return pack_dir(pack, Path(self.packs_dir))

    def config(self, pack: str) -> PackConfig:
        return load_config(self.folder(pack))

    def sources(self, pack: str) -> tuple[list[Source], list[LineProblem]]:
        folder = self.folder(pack)
        return read_urls(folder)

    def file_roots(self, pack: str) -> list[Path]:
        folder = self.folder(pack)
        return [(folder / root).resolve() for root in self.config(pack).fetch.file_roots]

    def begin_build(self, pack: str) -> BuildLock:
        """Take the pack's build lock, then drop the staging folders of runs that died; the
        caller hands the lock back to :meth:`end_build`.

        Holding the lock means no other build of the pack runs, so every staging folder left
        is a killed run's (or a pre-``staging-<run id>`` build's) and only fills the disk.
        """
        folder = self.folder(pack)
        lock = BuildLock(folder)
        root = versions_dir(folder)
        if root.is_dir():
            for stale in root.glob(f"{STAGING_PREFIX}*"):
                shutil.rmtree(stale, ignore_errors=True)
        return lock

    def end_build(self, pack: str, run_id: str, lock: BuildLock) -> None:
        """Remove the run's staging folder if it was not published, and release the lock."""
        shutil.rmtree(self.staging(pack, run_id), ignore_errors=True)
        lock.release()

    def refuse_if_building(self, pack: str) -> None:
        """Raise the lock's "already being built" error while a build, rollback or install of
        the pack holds it. A probe that takes nothing: a build's run takes the lock itself."""
        folder = self.folder(pack)
        if build_running(folder):
            raise already_building(folder.name)

    def staging(self, pack: str, run_id: str) -> Path:
        return versions_dir(self.folder(pack)) / f"{STAGING_PREFIX}-{run_id}"

    def new_staging(self, pack: str, run_id: str) -> Path:
        """An empty staging folder of this run (leftovers of an earlier attempt discarded)."""
        staging = self.staging(pack, run_id)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def published_versions(self, pack: str) -> list[Path]:
        root = versions_dir(self.folder(pack))
        if not root.is_dir():
            return []
        found = [p for p in root.glob("v[0-9]*") if p.is_dir() and p.name[1:].isdigit()]
        return sorted(found, key=version_number)

    def next_version(self, pack: str) -> int:
        versions = self.published_versions(pack)
        return version_number(versions[-1]) + 1 if versions else 1

    def current(self, pack: str) -> Path | None:
        return current_version(self.folder(pack))

    def publish(self, pack: str, version: int, staging: Path) -> Path:
        """Make the finished ``staging`` folder version ``version`` and flip ``current`` to it.

        Stamps the database checksum into its manifest first (see :func:`seal_version`).
        """
        folder = self.folder(pack)
        root = versions_dir(folder)
        target = root / f"v{version:04d}"
        previous = self.current(pack)
        seal_version(staging)
        os.rename(staging, target)
        _atomic_symlink(target.name, root / "current")
        for name in PUBLISHED_FILES:
            link = folder / name
            wanted = f"{root.name}/current/{name}"
            if not (link.is_symlink() and os.readlink(link) == wanted):
                _atomic_symlink(wanted, link)
        (root / ROLLBACK).unlink(missing_ok=True)  # a publish supersedes any rollback
        _fsync_dir(root)
        _fsync_dir(folder)
        self._prune(pack, keep=target, previous=previous)
        return target

    def _prune(self, pack: str, keep: Path, previous: Path | None) -> None:
        """Remove all versions but ``keep`` and the ones before it that are kept.

        The version that was current before this publish is kept first (after a rollback it
        is not the highest-numbered one), then the newest others, up to
        KEEP_PREVIOUS_VERSIONS.
        """
        others = [v for v in self.published_versions(pack) if v != keep]
        ranked = sorted(others, key=lambda v: (v != previous, -version_number(v)))
        for stale in ranked[KEEP_PREVIOUS_VERSIONS:]:
            shutil.rmtree(stale, ignore_errors=True)

    def previous_version(self, pack: str) -> Path | None:
        """The newest kept version older than the current one (what rollback restores)."""
        current = self.current(pack)
        if current is None:
            return None
        older = [
            v for v in self.published_versions(pack) if version_number(v) < version_number(current)
        ]
        return older[-1] if older else None

    def rollback(self, pack: str) -> tuple[Path, Path]:
        """Flip ``current`` back to the previous kept version; returns (from, to).

        Atomic like publish (a symlink renamed over ``current``). The version rolled back from
        stays on disk until the next publish prunes it, so a mistaken rollback can be undone
        by hand; ``.versions/rollback.json`` says which one it is. It holds the build lock,
        so no build publishes meanwhile, and opens no database, so it works when the current
        version is damaged.
        """
        with build_lock(self.folder(pack)):
            current = self.current(pack)
            if current is None:
                raise PackError(f"pack {pack!r} has no published version to roll back from")
            target = self.previous_version(pack)
            if target is None:
                raise PackError(
                    f"pack {pack!r} has no previous version to roll back to "
                    f"(only {current.name} is kept)"
                )
            root = versions_dir(self.folder(pack))
            record = {"from": current.name, "to": target.name, "at": _now()}
            _write_json_atomically(root / ROLLBACK, record)
            _atomic_symlink(target.name, root / "current")
            _fsync_dir(root)
            return current, target

    def rolled_back_from(self, pack: str) -> Path | None:
        """The version the last rollback left, while it is still on disk and not current."""
        root = versions_dir(self.folder(pack))
        record = _read_json(root / ROLLBACK)
        current = self.current(pack)
        if record is None or current is None or record.get("to") != current.name:
            return None
        left = root / str(record.get("from"))
        return left if left in self.published_versions(pack) else None

    def unpublished_versions(self, pack: str) -> list[Path]:
        """Versions newer than the current one that no rollback left: a publish was killed
        between renaming its staging folder and flipping ``current``. The next publish prunes
        them."""
        current = self.current(pack)
        left = self.rolled_back_from(pack)
        return [
            v
            for v in self.published_versions(pack)
            if v != left and (current is None or version_number(v) > version_number(current))
        ]

    def published_articles(self, pack: str) -> dict[str, str] | None:
        """url -> content hash of the current version's articles; None without one.

        Read from the version's articles.json, never from its database (see the module
        docstring); a version without a readable one compares as no version at all.
        """
        current = self.current(pack)
        articles = _read_json(current / ARTICLES) if current else None
        return articles if isinstance(articles, dict) else None

    def record_build(self, pack: str, record: dict) -> None:
        """Write .versions/last_build.json atomically (the outcome of the latest build)."""
        root = versions_dir(self.folder(pack))
        root.mkdir(parents=True, exist_ok=True)
        _write_json_atomically(root / LAST_BUILD, record)

    def last_build(self, pack: str) -> dict | None:
        return _read_json(versions_dir(self.folder(pack)) / LAST_BUILD)

    def built_from(self, pack: str, sources_fingerprint: str) -> int | None:
        """The current version's number when its manifest records this sources fingerprint
        (kpack.changes.sources_fingerprint): it holds what a build from these sources would
        publish. None when there is no current version or it was built from other sources.

        Raises PackNotReady when it was built from these sources but its database is damaged:
        the build has to replace it.
        """
        current = self.current(pack)
        manifest = _read_json(current / "manifest.json") if current else None
        if manifest is None or manifest.get("sources_fingerprint") != sources_fingerprint:
            return None
        verify_version(current)
        return version_number(current)


class PackStore(PackStoreOps):
    """The pack store outside Dagster."""

    def __init__(self, packs_dir: str | Path) -> None:
        self.packs_dir = str(packs_dir)


def write_articles(staging: Path, articles: dict[str, str]) -> None:
    """Store url -> content hash beside the staged database, for the next build's diff."""
    (staging / ARTICLES).write_text(json.dumps(articles, sort_keys=True))


def seal_version(staging: Path) -> dict:
    """Stamp the size and SHA-256 of the staged pack.db, and of every retrieval index file
    (kpack.index_files), into its manifest; returns the database's.

    Also writes ``.verified.json`` for the files as they are now, so a reader of the published
    version (the rename keeps inodes and mtimes) skips the full hashes. A file that
    ``.verified.json`` records in its present state (sealed before, unchanged since) keeps its
    digest instead of being hashed again: publishing a version sealed ahead (a server's
    staged versions, an installed archive) costs no CPU beside the requests it serves.
    """
    known = _read_json(staging / VERIFIED) or {}
    verified = {}
    seals = {}
    for name in (DATABASE, *sealed_index_files(staging)):
        path = staging / name
        stat = path.stat()
        digest = _verified_digest(known, name, stat) or file_sha256(path)
        seals[name] = {"bytes": stat.st_size, "sha256": digest}
        verified[name] = {**_file_state(stat), "sha256": digest}
    manifest_path = staging / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["database"] = {"file": DATABASE, **seals.pop(DATABASE)}
    manifest["indexes"] = seals
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    _write_json_atomically(staging / VERIFIED, verified)
    return manifest["database"]


def sealed_index_files(version_dir: Path) -> list[str]:
    """The index files of a staged version, as paths relative to it, sorted."""
    folder = version_dir / INDEX_DIR
    if not folder.is_dir():
        return []
    return sorted(f"{INDEX_DIR}/{path.name}" for path in folder.iterdir() if path.is_file())


def verify_version(version_dir: Path) -> None:
    """Raise PackNotReady unless the version's pack.db and index files are the ones its
    manifest describes.

    Call it before opening the database or mapping an index: Kuzu crashes the process on some
    damaged files instead of raising, and a damaged index would answer wrongly. See
    :func:`database_problem` and :func:`indexes_problem` for what is checked.
    """
    version_dir = version_dir.resolve()
    problem = database_problem(version_dir) or indexes_problem(version_dir)
    if problem is not None:
        pack = version_dir.parent.parent.name
        raise PackNotReady(
            f"pack {pack!r} version {version_dir.name} {problem}; "
            f"rebuild it with `kpack build {pack}` or `kpack rollback {pack}`"
        )


def database_problem(version_dir: Path) -> str | None:
    """What keeps a version's pack.db from being the one its manifest was sealed with, worded
    to follow "version vN" ("is damaged (checksum mismatch)"), or None when it is that file.

    Cheap on every call: the size is compared each time (a truncated file fails here) and the
    full SHA-256 only when the file changed since the last verification (new inode, mtime or
    size than ``.verified.json`` records).
    """
    manifest = _read_json(version_dir / "manifest.json")
    if manifest is None:
        return "has no readable manifest.json"
    seal = manifest.get("database")
    if not isinstance(seal, dict) or not {"bytes", "sha256"} <= seal.keys():
        return "has no database checksum (it was published by an older kpack)"
    return _file_problem(version_dir, DATABASE, seal)


def indexes_problem(version_dir: Path) -> str | None:
    """What keeps a version's retrieval index files (kpack.index_files) from being the ones its
    manifest was sealed with, checked as :func:`database_problem` checks pack.db; None when
    every one is."""
    manifest = _read_json(version_dir / "manifest.json")
    seals = manifest.get("indexes") if manifest else None
    if not isinstance(seals, dict) or not seals:
        return "has no retrieval indexes (it was published by an older kpack)"
    for name, seal in sorted(seals.items()):
        if not isinstance(seal, dict) or not {"bytes", "sha256"} <= seal.keys():
            return f"has no checksum for {name}"
        problem = _file_problem(version_dir, name, seal)
        if problem is not None:
            return problem
    return None


def _file_problem(version_dir: Path, name: str, seal: dict) -> str | None:
    path = version_dir / name
    try:
        stat = path.stat()
    except OSError:
        return f"has no {name}"
    if stat.st_size != seal["bytes"]:
        return f"is damaged ({name} is {stat.st_size} bytes, {seal['bytes']} were published)"
    verified = _read_json(version_dir / VERIFIED) or {}
    if _verified_digest(verified, name, stat) == seal["sha256"]:
        return None
    if file_sha256(path) != seal["sha256"]:
        where = "" if name == DATABASE else f" of {name}"
        return f"is damaged (checksum mismatch{where})"
    # Remembered for the next open; a read-only version folder just hashes again.
    with contextlib.suppress(OSError):
        state = {**_file_state(stat), "sha256": seal["sha256"]}
        _write_json_atomically(version_dir / VERIFIED, {**verified, name: state})
    return None


def _verified_digest(verified: dict, name: str, stat: os.stat_result) -> str | None:
    """The SHA-256 that ``.verified.json`` (``verified``) records for the file ``name`` when it
    records the file in its present state (``stat``), else None."""
    record = verified.get(name)
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        return None
    return record["sha256"] if record == {**_file_state(stat), "sha256": record["sha256"]} else None


class BuildLock:
    """One build, rollback or install of a pack at a time, across processes: an exclusive
    flock on the pack's lock file, held from construction until :meth:`release` (or until the
    process dies: a killed build leaves no stale lock). It never waits: a second holder fails
    at once with :func:`already_building`'s message."""

    def __init__(self, folder: Path) -> None:
        self._lock = FileLock(folder / LOCK_FILE)
        if not self._lock.take(wait=False):
            self._lock.release()
            raise already_building(folder.name)

    def release(self) -> None:
        self._lock.release()


def already_building(pack: str) -> PackError:
    return PackError(
        f"pack {pack!r} is already being built (or rolled back or installed); "
        f"wait for it to finish (`kpack status {pack}` shows it)"
    )


@contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """The pack's build lock around a rollback or install (a build takes it through
    :meth:`PackStoreOps.begin_build`)."""
    lock = BuildLock(folder)
    try:
        yield
    finally:
        lock.release()


def build_running(folder: Path) -> bool:
    """Whether a build of the pack holds its lock right now (probed without waiting)."""
    return held_elsewhere(folder / LOCK_FILE)


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in blocks (databases and archives can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _file_state(stat: os.stat_result) -> dict:
    return {"inode": stat.st_ino, "mtime_ns": stat.st_mtime_ns, "bytes": stat.st_size}


def _read_json(path: Path) -> dict | None:
    """A JSON object from ``path``; None when it is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json_atomically(path: Path, value: dict) -> None:
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        temp.write_text(json.dumps(value, indent=2, default=str) + "\n")
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _atomic_symlink(target: str, link: Path) -> None:
    temp = link.with_name(f".{link.name}.{uuid.uuid4().hex}")
    os.symlink(target, temp)
    os.replace(temp, link)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
