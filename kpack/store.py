"""The packs folder: pack sources in, published Kuzu graph versions out.

One writer builds a staged database; readers only ever see published ones.

Layout of a pack folder::

    .versions/staging/        the build in progress (wiped at the start of every build)
    .versions/v0007/          a published version: pack.db, manifest.json, skill.md
    .versions/current -> v0007
    pack.db -> .versions/current/pack.db      (and manifest.json, skill.md)

Publishing renames the finished staging folder to the next version and flips ``current`` with
an atomic rename of a symlink, so a reader resolves one whole version or the previous one, and
a build that fails or is killed anywhere before that leaves the published pack untouched.
The version that was current before a publish is kept (and older ones removed), so
``rollback`` can flip ``current`` back to it the same atomic way.

``.versions/last_build.json`` records the outcome of the latest build (published, unchanged or
failed) for ``kpack status``; it is written atomically and never read by queries.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from kpack.config import PackConfig, load_config
from kpack.errors import PackError
from kpack.graphdb import opened
from kpack.packs import (
    PUBLISHED_FILES,
    LineProblem,
    Source,
    current_version,
    pack_dir,
    parse_urls,
    versions_dir,
)

KEEP_PREVIOUS_VERSIONS = 1
LAST_BUILD = "last_build.json"


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
        return parse_urls((folder / "urls.txt").read_text(), folder)

    def file_roots(self, pack: str) -> list[Path]:
        folder = self.folder(pack)
        return [(folder / root).resolve() for root in self.config(pack).fetch.file_roots]

    def staging(self, pack: str) -> Path:
        return versions_dir(self.folder(pack)) / "staging"

    def new_staging(self, pack: str) -> Path:
        """An empty staging folder; leftovers of a failed or killed build are discarded."""
        staging = self.staging(pack)
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

    def publish(self, pack: str, version: int) -> Path:
        folder = self.folder(pack)
        root = versions_dir(folder)
        target = root / f"v{version:04d}"
        previous = self.current(pack)
        os.rename(self.staging(pack), target)
        _atomic_symlink(target.name, root / "current")
        for name in PUBLISHED_FILES:
            link = folder / name
            wanted = f"{root.name}/current/{name}"
            if not (link.is_symlink() and os.readlink(link) == wanted):
                _atomic_symlink(wanted, link)
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
        by hand. The caller holds the build lock, so no publish runs meanwhile.
        """
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
        _atomic_symlink(target.name, root / "current")
        _fsync_dir(root)
        return current, target

    def published_articles(self, pack: str) -> dict[str, str] | None:
        """url -> content hash of the current version's articles; None without one."""
        current = self.current(pack)
        if current is None or not (current / "pack.db").exists():
            return None
        try:
            with opened(current / "pack.db", read_only=True) as conn:
                rows = conn.execute("MATCH (a:Article) RETURN a.url, a.content_hash").get_all()
        except Exception:  # an unreadable previous version compares as no version at all
            return None
        return dict(rows)

    def record_build(self, pack: str, record: dict) -> None:
        """Write .versions/last_build.json atomically (the outcome of the latest build)."""
        root = versions_dir(self.folder(pack))
        root.mkdir(parents=True, exist_ok=True)
        temp = root / f".last_build.{uuid.uuid4().hex}"
        temp.write_text(json.dumps(record, indent=2, default=str) + "\n")
        os.replace(temp, root / LAST_BUILD)

    def last_build(self, pack: str) -> dict | None:
        path = versions_dir(self.folder(pack)) / LAST_BUILD
        return json.loads(path.read_text()) if path.is_file() else None


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


class PackStore(PackStoreOps):
    """The pack store outside Dagster."""

    def __init__(self, packs_dir: str | Path) -> None:
        self.packs_dir = str(packs_dir)
