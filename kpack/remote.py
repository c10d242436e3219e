"""The shared store: one base location for intermediates, caches and published packs.

``KPACK_STORAGE`` names it (kpack.settings.storage_base): a local folder by default, or any
URL universal_pathlib knows, such as ``s3://bucket/prefix``. S3 credentials, region and
endpoint come from the usual AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, and ``AWS_ENDPOINT_URL`` for an S3-compatible server such as MinIO).
The build's IO manager and caches keep their Parquet files there (resources.storage); this
module keeps published packs there, beside them::

    published/<pack>/<pack>-v0007.kpack   the version as one archive (kpack.archive's format)
    published/<pack>/current.json         which archive is current, with its checksums

``push`` uploads the archive of a pack's current version and then rewrites ``current.json``,
so a reader sees the previous version or the whole new one. ``pull`` downloads the current
archive into the packs folder's staging area (kpack.download.copy_bounded: at most the size
``current.json`` recorded, within the download deadline) and installs it
(kpack.archive.install: every size, SHA-256 and the database seal checked before anything is
published), as a new pack or as the next version of an existing one; a pack already at that
version is not downloaded again. ``ensure_local`` is what the
query side calls for a pack it cannot find here: it pulls the pack when the store has it, so
the local packs folder is a cache of the store.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from kpack import settings
from kpack.errors import PackError
from kpack.packs import current_version, read_manifest, validate_pack_name
from kpack.store import file_sha256

if TYPE_CHECKING:
    from upath import UPath

PUBLISHED = "published"
POINTER = "current.json"
COPY_CHUNK = 1 << 20


def storage_path(base: str | None = None) -> UPath:
    """The store's base location (KPACK_STORAGE unless given) as a path, local or remote."""
    from upath import UPath  # fsspec: a second of start-up a query that needs no store skips

    base = base or settings.storage_base()
    if "://" not in base:
        return UPath(Path(base).resolve())
    return UPath(base)


def is_local(path: UPath) -> bool:
    return path.protocol in ("", "file", "local")


def write_atomically(dest: UPath, write: Callable[[BinaryIO], None]) -> None:
    """Write ``dest`` whole or not at all: locally to a temporary name renamed into place; on
    an object store with one upload, which the store makes visible only once complete."""
    if not is_local(dest):
        with dest.open("wb") as handle:
            write(handle)
        return
    final = Path(dest.path)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex}")
    try:
        with open(temp, "wb") as handle:
            write(handle)
        os.replace(temp, final)
    finally:
        temp.unlink(missing_ok=True)


def _copy_from(source: Path) -> Callable[[BinaryIO], None]:
    def write(handle: BinaryIO) -> None:
        with open(source, "rb") as data:
            shutil.copyfileobj(data, handle, COPY_CHUNK)

    return write


@contextmanager
def store_errors(location: UPath) -> Iterator[None]:
    """An unreachable store, missing credentials or a refused write as one PackError.

    Whatever the store's client raises (OSError from fsspec, botocore's connection and
    credential errors, another backend's own) is reported with its class and message.
    """
    try:
        yield
    except PackError:
        raise
    except Exception as exc:  # the client library is the store's (s3fs, gcsfs...), not ours
        raise PackError(f"shared store {location}: {type(exc).__name__}: {exc}") from None


def pack_location(name: str, base: str | None = None) -> UPath:
    return storage_path(base) / PUBLISHED / validate_pack_name(name)


def published(name: str, base: str | None = None) -> dict | None:
    """The store's ``current.json`` of a pack, or None when the pack was never pushed."""
    pointer = pack_location(name, base) / POINTER
    with store_errors(pointer):
        if not pointer.exists():
            return None
        text = pointer.read_text()
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PackError(f"{pointer} is damaged ({exc.msg}); push the pack again") from None
    if not isinstance(record, dict) or not isinstance(record.get("archive"), str):
        raise PackError(f"{pointer} is damaged (no archive named); push the pack again")
    return record


def push(name: str, packs_root: Path | None = None, base: str | None = None) -> dict:
    """Upload the current version of a local pack to the store; its new ``current.json``."""
    from kpack.archive import export_pack

    location = pack_location(name, base)
    with tempfile.TemporaryDirectory(prefix="kpack-push-") as scratch:
        exported = export_pack(name, Path(scratch) / f"{name}.kpack", packs_root)
        archive_name = f"{name}-v{exported.version:04d}.kpack"
        manifest = read_manifest(Path(packs_root or settings.packs_dir()) / name) or {}
        pointer = {
            "pack": name,
            "version": exported.version,
            "archive": archive_name,
            "archive_sha256": file_sha256(exported.path),
            "bytes": exported.bytes,
            "database_sha256": (manifest.get("database") or {}).get("sha256"),
            "pushed_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        with store_errors(location):
            write_atomically(location / archive_name, _copy_from(exported.path))
    data = json.dumps(pointer, indent=2).encode()
    with store_errors(location):
        write_atomically(location / POINTER, lambda handle: handle.write(data))
    return pointer


@dataclass
class PullResult:
    pack: str
    version: int  # the local version now current
    source_version: int  # the version number in the store
    downloaded: bool  # False: the local pack already was at the store's version
    bytes: int


def pull(name: str, packs_root: Path | None = None, base: str | None = None) -> PullResult:
    """Install the store's current version of a pack here (see the module docstring)."""
    from kpack.archive import install
    from kpack.archive.format import max_archive_bytes
    from kpack.archive.reader import plain_file_name
    from kpack.archive.staging import staging_area
    from kpack.download import copy_bounded, download_deadline

    pointer = published(name, base)
    if pointer is None:
        raise PackError(
            f"pack {name!r} is not in the shared store {storage_path(base)}: "
            f"push it first with `kpack push {name}`"
        )
    root = Path(packs_root or settings.packs_dir())
    folder = root / name
    exists = (folder / "urls.txt").is_file()
    local = read_manifest(folder) if exists else None
    if (
        local
        and pointer.get("database_sha256")
        and ((local.get("database") or {}).get("sha256") == pointer["database_sha256"])
    ):
        version = current_version(folder)
        return PullResult(name, int(version.name[1:]), pointer["version"], False, 0)
    recorded = pointer.get("bytes")
    limit = min(recorded, max_archive_bytes()) if isinstance(recorded, int) else max_archive_bytes()
    # The download goes where an install stages, so a killed pull leaves nothing behind.
    with staging_area(root) as staging:
        archive = staging / plain_file_name(pointer["archive"])
        source = pack_location(name, base) / pointer["archive"]
        deadline = download_deadline()
        with store_errors(source):
            if not source.exists():
                raise PackError(f"{source} is missing; push the pack again")
            with source.open("rb") as remote:
                copy_bounded(remote, archive, max_bytes=limit, deadline=deadline, what=str(source))
        if file_sha256(archive) != pointer.get("archive_sha256"):
            raise PackError(f"{source} does not match {POINTER} (checksum); push the pack again")
        result = install(archive, root, name, replace=exists)
        return PullResult(name, result.version, pointer["version"], True, archive.stat().st_size)


def ensure_local(name: str, packs_root: Path | None = None, base: str | None = None) -> bool:
    """Pull a pack that has no published version here but has one in the store.

    True when it pulled one; False when the pack is here already or the store does not have
    it (the caller then reports the pack as unknown or unbuilt, as it would without a store).
    """
    root = Path(packs_root or settings.packs_dir())
    folder = root / validate_pack_name(name)
    if (folder / "urls.txt").is_file() and current_version(folder) is not None:
        return False
    if published(name, base) is None:
        return False
    try:
        pull(name, root, base)
    except PackError:
        # Another reader pulled it at the same moment: its install won the rename.
        if current_version(folder) is None:
            raise
    return True
