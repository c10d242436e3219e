"""The packs folder as a resource: pack sources in, published Kuzu graph versions out.

One writer builds a staged database; readers only ever see published ones.

Layout of a pack folder::

    .versions/staging/        the build in progress (wiped at the start of every build)
    .versions/v0007/          a published version: pack.db, manifest.json, skill.md
    .versions/current -> v0007
    pack.db -> .versions/current/pack.db      (and manifest.json, skill.md)

Publishing renames the finished staging folder to the next version and flips ``current`` with
an atomic rename of a symlink, so a reader resolves one whole version or the previous one, and
a build that fails or is killed anywhere before that leaves the published pack untouched.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import kuzu
from dagster import ConfigurableResource

from kpack.packs import (
    PUBLISHED_FILES,
    LineProblem,
    PackConfig,
    Source,
    current_version,
    load_config,
    pack_dir,
    parse_urls,
    versions_dir,
)

EXTENSIONS = ("vector", "fts", "algo")
KEEP_PREVIOUS_VERSIONS = 1


def connect(db_path: Path, read_only: bool) -> tuple[kuzu.Database, kuzu.Connection]:
    db = kuzu.Database(str(db_path), read_only=read_only)
    conn = kuzu.Connection(db)
    for extension in EXTENSIONS:
        conn.execute(f"LOAD {extension}")
    return db, conn


def version_number(path: Path) -> int:
    return int(path.name[1:])


class PackStore(ConfigurableResource):
    """Reads pack definitions and stages/publishes pack databases under ``packs_dir``."""

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
        os.rename(self.staging(pack), target)
        _atomic_symlink(target.name, root / "current")
        for name in PUBLISHED_FILES:
            link = folder / name
            wanted = f"{root.name}/current/{name}"
            if not (link.is_symlink() and os.readlink(link) == wanted):
                _atomic_symlink(wanted, link)
        _fsync_dir(root)
        _fsync_dir(folder)
        self._prune(pack, keep=target)
        return target

    def _prune(self, pack: str, keep: Path) -> None:
        older = [v for v in self.published_versions(pack) if v != keep]
        for stale in older[: max(0, len(older) - KEEP_PREVIOUS_VERSIONS)]:
            shutil.rmtree(stale, ignore_errors=True)


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
