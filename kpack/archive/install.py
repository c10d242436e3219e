"""Installing an archive: verify it, then publish it the way a build publishes.

Installing is refused before anything is published when a member is not one of the format's
names, is a link or a device, would land outside the pack folder (an absolute path, ``..``),
differs in size or SHA-256 from ``kpack-archive.json``, when the archive declares far more
than it can hold (kpack.archive.reader), when the database disagrees with the manifest, or
when the embedding model the pack was built with cannot be loaded here (questions would be
embedded in another space than the pack's vectors), or when an index file does not have the
shape its manifest implies (kpack.archive.index_shapes). What the archive's kg_config.json
would let a rebuild read outside the pack is dropped unless the user trusts it
(kpack.archive.policy).

A new pack is assembled in the packs folder's staging area (kpack.archive.staging) and renamed
into place, so it appears whole or not at all. Over an existing pack the archive becomes its
next version under the pack's build lock, staged in the pack's ``.versions`` as a build stages
(``PackStore.begin_build``: the staging a killed build or install left is removed first) and
published with the store's rename and atomic ``current`` flip, so readers see the previous
version or the whole installed one. ``pack.db`` is installed byte for byte, so the installed
pack answers exactly as the one that was exported.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from kpack import settings
from kpack.archive.format import PACK_FILES, SETTINGS_FILES, VERSION_MEMBERS, read_json
from kpack.archive.policy import contain_settings
from kpack.archive.reader import Archive, local_copy, open_archive
from kpack.archive.staging import staging_area
from kpack.archive.validate import Report, check_pack_files
from kpack.errors import PackError, disk_errors
from kpack.packs import validate_pack_name, versions_dir
from kpack.store import PackStore, file_sha256


@dataclass
class InstallResult:
    pack: str
    folder: Path
    version: int
    source_pack: str
    source_version: int
    files: dict[str, dict]
    replaced: bool
    seconds: float
    # Settings of the archive's kg_config.json dropped as reaching outside the pack
    # (kpack.archive.policy); empty when trusted or when it had none.
    dropped: list[str]


def install(
    source: str | Path,
    packs_root: Path | None = None,
    name: str | None = None,
    replace: bool = False,
    trust_config: bool = False,
) -> InstallResult:
    """Verify an archive (file or http(s) URL) and publish it as a new local version.

    An existing pack is only replaced with ``replace=True``: then the archive becomes its next
    version, and its urls.txt, kg_config.json, few_shot_examples.json and eval questions are
    those of the archive. Unless ``trust_config``, the installed kg_config.json lets a rebuild
    read nothing outside the pack (kpack.archive.policy).
    """
    started = time.perf_counter()
    root = Path(packs_root or settings.packs_dir())
    with staging_area(root) as staging, disk_errors(f"cannot install {source}"):
        path = local_copy(str(source), staging)
        with open_archive(path) as archive:
            target_name = validate_pack_name(name or archive.pack)
            target = root / target_name
            exists = (target / "urls.txt").is_file()
            if target.exists() and not exists:
                raise PackError(f"{target} exists and is not a pack folder (it has no urls.txt)")
            if exists and not replace:
                raise PackError(
                    f"pack {target_name!r} already exists in {root}: install it under another "
                    f"name with --as NAME, or as the next version of {target_name!r} with "
                    "--replace"
                )
            archive_sha = file_sha256(path)
            dropped: list[str] = []
            stage = partial(_stage, archive, name=target_name, archive_sha=archive_sha)
            stage = partial(stage, trusted=trust_config, dropped=dropped)
            if exists:
                version = _install_over(stage, root, target_name, archive, archive_sha)
            else:
                version = _install_new(stage, root, staging, target_name, archive, archive_sha)
        return InstallResult(
            pack=target_name,
            folder=target,
            version=version,
            source_pack=archive.pack,
            source_version=archive.version,
            files=archive.files,
            replaced=exists,
            seconds=round(time.perf_counter() - started, 3),
            dropped=dropped,
        )


Stage = Callable[..., None]  # _stage with the archive and what to install as bound


def _install_new(
    stage: Stage, root: Path, staging: Path, name: str, archive: Archive, archive_sha: str
) -> int:
    folder = staging / "pack" / name
    version_staging = versions_dir(folder) / "staging"
    stage(staging=version_staging, pack_files=folder, previous=None, version=1)
    store = PackStore(folder.parent)
    store.publish(name, 1, version_staging)
    _record(store, name, 1, None, archive, archive_sha)
    try:
        # rename(2) onto an existing non-empty folder fails, so a pack of that name created
        # meanwhile is never overwritten.
        os.rename(folder, root / name)
    except OSError as exc:
        raise PackError(f"cannot install as {root / name}: {exc.strerror}") from exc
    return 1


def _install_over(stage: Stage, root: Path, name: str, archive: Archive, archive_sha: str) -> int:
    store = PackStore(root)
    folder = store.folder(name)
    run_id = f"install-{uuid.uuid4().hex}"
    # The build lock: an install never publishes while a build or rollback of the pack runs.
    lock = store.begin_build(name)
    try:
        previous = store.current(name)
        previous_number = int(previous.name[1:]) if previous else None
        version = store.next_version(name)
        staging = store.new_staging(name, run_id)
        incoming = staging / ".pack-files"
        stage(staging=staging, pack_files=incoming, previous=previous_number, version=version)
        # The pack's own files first, the flip last: an agent created for the new version
        # must read the installed kg_config.json (agents are cached per version).
        for member in PACK_FILES:
            if (incoming / member).is_file():
                (folder / member).parent.mkdir(parents=True, exist_ok=True)
                os.replace(incoming / member, folder / member)
            elif member in SETTINGS_FILES:
                (folder / member).unlink(missing_ok=True)
        shutil.rmtree(incoming)
        store.publish(name, version, staging)
        _record(store, name, version, previous_number, archive, archive_sha)
    finally:
        store.end_build(name, run_id, lock)  # removes the staging folder unless it was published
    return version


def _stage(
    archive: Archive,
    *,
    staging: Path,
    pack_files: Path,
    name: str,
    archive_sha: str,
    previous: int | None,
    version: int,
    trusted: bool,
    dropped: list[str],
) -> None:
    """Extract (checksums verified), check, contain the settings (what was dropped is added
    to ``dropped``), and write the local manifest.json and skill.md."""
    from kpack.graphdb import opened
    from kpack.skill import skill_inputs, skill_markdown

    staging.mkdir(parents=True, exist_ok=True)
    archive.extract_all(
        lambda member: (staging if member in VERSION_MEMBERS else pack_files) / member, staging
    )
    manifest = read_json(staging / "manifest.json", f"{archive.path.name}: manifest.json")
    report = Report(subject=str(archive.path))
    check_pack_files(report, staging, manifest)
    if not report.ok:
        raise PackError(f"refusing {archive.path.name}: {report.failures()}")
    dropped.extend(contain_settings(pack_files, trusted))
    # The manifest describes this machine's version (its number, its previous one, its name),
    # with where it came from; the database stays byte for byte what was exported.
    manifest["installed_from"] = {
        "pack": manifest["name"],
        "version": manifest.get("version"),
        "previous_version": manifest.get("previous_version"),
        "archive": archive.path.name,
        "archive_sha256": archive_sha,
        "installed_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    manifest.update(name=name, version=version, previous_version=previous)
    (staging / "manifest.json").unlink()
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    with opened(staging / "pack.db", read_only=True) as conn:
        skill = skill_inputs(conn)
    (staging / "skill.md").unlink()
    (staging / "skill.md").write_text(skill_markdown(manifest, skill))


def _record(
    store: PackStore,
    name: str,
    version: int,
    previous: int | None,
    archive: Archive,
    archive_sha: str,
) -> None:
    """last_build.json, so `kpack status` tells the installed version from a built one."""
    store.record_build(
        name,
        {
            "outcome": "published",
            "version": version,
            "previous_version": previous,
            "checked_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "run_id": f"install of {archive.path.name}",
            "installed_from": {
                "pack": archive.pack,
                "version": archive.version,
                "archive_sha256": archive_sha,
            },
        },
    )
