"""Writing an archive: the published version of a pack as one ``NAME-vN.kpack`` file."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from kpack import settings
from kpack.archive.format import (
    ARCHIVE_FORMAT,
    ARCHIVE_MANIFEST,
    PACK_FILES,
    SUFFIX,
    VERSION_FILES,
    VERSION_MEMBERS,
    read_json,
)
from kpack.errors import PackError
from kpack.packs import current_version, pack_dir, validate_pack_name
from kpack.store import file_sha256


@dataclass
class ExportResult:
    path: Path
    pack: str
    version: int
    files: dict[str, dict]
    bytes: int
    seconds: float


def export_pack(
    name: str, output: Path | None = None, packs_root: Path | None = None
) -> ExportResult:
    """Write the published version of a pack to one archive (``NAME-vN.kpack`` by default).

    The version folder is resolved once, so the archive holds one version even while a build
    publishes the next. The archive is written under a temporary name and renamed, so a
    failed export never leaves a truncated file behind under the requested name.
    """
    started = time.perf_counter()
    folder = pack_dir(validate_pack_name(name), packs_root or settings.packs_dir())
    version_dir = current_version(folder)
    if version_dir is None:
        raise PackError(f"pack {name!r} has not been built yet: run `kpack build {name}` first")
    manifest = read_json(version_dir / "manifest.json", "the published manifest.json")
    version = int(manifest.get("version") or int(version_dir.name[1:]))
    sources = {f: version_dir / f for f in VERSION_FILES}
    sources |= {f: version_dir / f for f in VERSION_MEMBERS if (version_dir / f).is_file()}
    sources |= {f: folder / f for f in PACK_FILES if (folder / f).is_file()}
    missing = [f for f, path in sources.items() if not path.is_file()]
    if missing or "urls.txt" not in sources:
        raise PackError(f"pack {name!r} version {version_dir.name} is missing {missing}")
    files = {
        f: {"sha256": file_sha256(path), "size": path.stat().st_size} for f, path in sources.items()
    }
    exported_at = datetime.now(UTC)
    header = {
        "format": ARCHIVE_FORMAT,
        "kind": "knowledge-pack",
        "pack": manifest.get("name", name),
        "version": version,
        "built_at": manifest.get("built_at"),
        "exported_at": exported_at.isoformat(timespec="seconds"),
        "embedding": manifest.get("embedding"),
        "counts": manifest.get("counts"),
        "files": files,
    }
    output = Path(output) if output else Path.cwd() / f"{name}-v{version}{SUFFIX}"
    output.parent.mkdir(parents=True, exist_ok=True)
    temp = output.with_name(f".{output.name}.{uuid.uuid4().hex}.part")
    mtime = int(exported_at.timestamp())
    try:
        with tarfile.open(temp, "w:gz", format=tarfile.PAX_FORMAT) as tar:
            data = json.dumps(header, indent=2).encode() + b"\n"
            tar.addfile(_tarinfo(ARCHIVE_MANIFEST, len(data), mtime), io.BytesIO(data))
            for member, path in sources.items():
                with path.open("rb") as handle:
                    reader = _HashingReader(handle)
                    tar.addfile(_tarinfo(member, files[member]["size"], mtime), reader)
                # Hashed twice (before, for the header that goes first; while writing, to be
                # sure the bytes written are the bytes hashed): a file changed in between
                # (a kg_config.json being edited) would otherwise make a corrupt archive.
                if reader.hexdigest() != files[member]["sha256"]:
                    raise PackError(f"{path} changed while it was exported; export again")
        os.replace(temp, output)
    except OSError as exc:
        raise PackError(f"cannot write {output}: {exc.strerror or exc}") from exc
    finally:
        temp.unlink(missing_ok=True)
    return ExportResult(
        path=output,
        pack=name,
        version=version,
        files=files,
        bytes=output.stat().st_size,
        seconds=round(time.perf_counter() - started, 3),
    )


def _tarinfo(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    """A plain file member: no owner, fixed mode, so an archive reveals nothing of the host."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _HashingReader:
    """A file object for tarfile.addfile that hashes what it hands out."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle, self.digest = handle, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self.handle.read(size)
        self.digest.update(chunk)
        return chunk

    def hexdigest(self) -> str:
        return self.digest.hexdigest()
