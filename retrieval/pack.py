"""Opening a published pack for reading: resolved once, cached per process.

A pack is opened by name (under the packs folder; KPACK_PACKS_DIR overrides) or by the path
of its folder. The ``current`` version is resolved once, so the database, manifest and model
all belong to one version even while a build publishes the next; a newer version is picked
up by the next ``open_pack`` call.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import kuzu

from kpack import settings
from kpack.packs import PackError, current_version, pack_dir
from resources.embedder import load_model
from resources.pack_store import connect


class PackNotReady(PackError):
    """The pack exists but cannot be read: never built, or its files are damaged."""


@dataclass
class OpenPack:
    name: str
    version_dir: Path
    manifest: dict
    db: kuzu.Database
    conn: kuzu.Connection

    @property
    def model_name(self) -> str:
        return self.manifest["embedding"]["model"]

    def embed(self, texts: list[str]):
        from resources.embedder import encode

        return encode(load_model(self.model_name), texts)


_open: dict[Path, OpenPack] = {}
_lock = threading.Lock()


def resolve_folder(pack: str | Path) -> Path:
    candidate = Path(pack)
    if isinstance(pack, Path) or "/" in str(pack):
        if not (candidate / "urls.txt").is_file() and not (candidate / ".versions").is_dir():
            raise PackError(f"{candidate} is not a pack folder (no urls.txt)")
        return candidate.resolve()
    return pack_dir(str(pack), settings.packs_dir())


def open_pack(pack: str | Path) -> OpenPack:
    folder = resolve_folder(pack)
    version = current_version(folder)
    if version is None:
        raise PackNotReady(f"pack {folder.name!r} has not been built yet: run `kpack build {folder.name}`")
    with _lock:
        if version not in _open:
            _open[version] = _load(folder.name, version)
        return _open[version]


def _load(name: str, version: Path) -> OpenPack:
    try:
        manifest = json.loads((version / "manifest.json").read_text())
        db, conn = connect(version / "pack.db", read_only=True)
    except (OSError, json.JSONDecodeError, RuntimeError) as exc:
        raise PackNotReady(
            f"pack {name!r} version {version.name} cannot be opened ({exc}); rebuild it with "
            f"`kpack build {name}`"
        ) from exc
    return OpenPack(name, version, manifest, db, conn)
