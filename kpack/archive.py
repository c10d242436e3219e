"""Packs that travel: export a published version as one archive, validate it, install it.

An archive (``NAME-vN.kpack``) is a gzip-compressed tar file with these members::

    kpack-archive.json      format, pack, version, embedding, and a SHA-256 and size per file
    pack.db                 the Kuzu database of the version          } the version folder
    manifest.json           the build's manifest                      }
    skill.md                the Claude Code skill                     }
    urls.txt                the sources                               } the pack folder (the
    kg_config.json          build and query settings, if any          } query side reads
    few_shot_examples.json  example answers, if any                   } kg_config.json and the
    eval/questions.jsonl    evaluation questions, if any              } examples at query time)

Installing is refused before anything is written when a member is not one of those names, is
a link or a device, would land outside the pack folder (an absolute path, ``..``), differs in
size or SHA-256 from ``kpack-archive.json``, when the database disagrees with the manifest, or
when the embedding model the pack was built with cannot be loaded here (questions would be
embedded in another space than the pack's vectors). A verified pack is then published the way
a build publishes: the files are staged in ``.versions/staging`` and published with the pack
store's rename and atomic ``current`` flip, under the pack's build lock, so readers see the
previous version or the whole installed one. ``pack.db`` is installed byte for byte, so the
installed pack answers exactly as the one that was exported.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from kpack import settings
from kpack.contracts import KUZU_NODES, KUZU_RELS
from kpack.packs import (
    PUBLISHED_FILES,
    PackError,
    current_version,
    pack_dir,
    validate_pack_name,
    versions_dir,
)
from kpack.store import file_sha256

ARCHIVE_FORMAT = 1
ARCHIVE_MANIFEST = "kpack-archive.json"
SUFFIX = ".kpack"
# The files of the published version (installed into .versions/vN); articles.json (url ->
# content hash, what the next build compares with) travels when the version has one ...
VERSION_FILES = PUBLISHED_FILES
VERSION_MEMBERS = (*VERSION_FILES, "articles.json")
# ... and the user's files of the pack folder that travel with it: the query side reads
# kg_config.json ("query" settings) and few_shot_examples.json at query time, so a pack answers
# the same only with them.
PACK_FILES = ("urls.txt", "kg_config.json", "few_shot_examples.json", "eval/questions.jsonl")
REQUIRED_FILES = (*VERSION_FILES, "urls.txt")
# Files whose absence in an archive means "the defaults": installing over an existing pack
# removes the local ones, or the installed pack would answer with settings it was not built for.
SETTINGS_FILES = ("kg_config.json", "few_shot_examples.json")
MAX_MEMBERS = 64  # a real archive has at most 8 files; anything far beyond is not one of ours
CHUNK = 1 << 20
DOWNLOAD_TIMEOUT_S = 60.0


# --- results -------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Report:
    """What ``validate`` found: one line per check, ok when every check passed."""

    subject: str
    checks: list[Check] = field(default_factory=list)
    pack: str | None = None
    version: int | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok

    def failures(self) -> str:
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)


@dataclass
class ExportResult:
    path: Path
    pack: str
    version: int
    files: dict[str, dict]
    bytes: int
    seconds: float


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


# --- export --------------------------------------------------------------------------------


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
    manifest = _read_json(version_dir / "manifest.json", "the published manifest.json")
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
            tar.addfile(_tarinfo(ARCHIVE_MANIFEST, len(data), mtime), _BytesReader(data))
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


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.offset = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else self.offset + size
        chunk, self.offset = self.data[self.offset : end], min(end, len(self.data))
        return chunk


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


# --- reading archives ----------------------------------------------------------------------


class Archive:
    """An opened archive whose members were checked for safety and against its header."""

    def __init__(self, path: Path, tar: tarfile.TarFile, header: dict) -> None:
        self.path, self.tar, self.header = path, tar, header
        self.files: dict[str, dict] = header["files"]

    @property
    def pack(self) -> str:
        return self.header["pack"]

    @property
    def version(self) -> int:
        return int(self.header["version"])

    def extract(self, member: str, dest: Path) -> None:
        """Write one member to ``dest`` (never an archive-chosen path), checking its SHA-256."""
        expected = self.files[member]
        source = self.tar.extractfile(member)
        if source is None:  # pragma: no cover - members were checked to be regular files
            raise PackError(f"{self.path.name}: {member} is not a regular file")
        digest, size = hashlib.sha256(), 0
        dest.parent.mkdir(parents=True, exist_ok=True)
        # "xb": a fresh file, never one that exists already (or a link planted there).
        try:
            with source, dest.open("xb") as out:
                while chunk := source.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise PackError(f"{self.path.name} is damaged ({member}: {exc})") from exc
        if size != expected["size"] or digest.hexdigest() != expected["sha256"]:
            raise PackError(
                f"{self.path.name}: checksum mismatch for {member} (SHA-256 {digest.hexdigest()}, "
                f"{size} bytes; the archive lists {expected['sha256']}, {expected['size']} bytes): "
                "the archive is damaged or was altered"
            )


@contextmanager
def open_archive(path: Path) -> Iterator[Archive]:
    """Open and check an archive's structure; every problem is a PackError naming it."""
    path = Path(path)
    if not path.is_file():
        raise PackError(f"{path}: no such file")
    try:
        tar = tarfile.open(path, "r:gz")  # noqa: SIM115 (closed below, after the checks)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PackError(f"{path.name} is not a kpack archive (a .tar.gz): {exc}") from exc
    with tar:
        try:
            members = _members(tar, path)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise PackError(f"{path.name} is damaged: {exc}") from exc
        header = _header(tar, members, path)
        yield Archive(path, tar, header)


def _members(tar: tarfile.TarFile, path: Path) -> dict[str, tarfile.TarInfo]:
    members: dict[str, tarfile.TarInfo] = {}
    for count, member in enumerate(tar, start=1):
        if count > MAX_MEMBERS:
            raise PackError(f"refusing {path.name}: more than {MAX_MEMBERS} members")
        problem = member_problem(member)
        if problem:
            raise PackError(f"refusing {path.name}: {problem}")
        if member.isreg():
            if member.name in members:
                raise PackError(f"refusing {path.name}: {member.name!r} appears twice")
            members[member.name] = member
    return members


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a member must not be installed, or None. Installing writes each allowed member to a
    path of its own choosing anyway; these checks make a hostile archive fail loudly."""
    name = member.name
    if member.issym() or member.islnk():
        kind = "symbolic" if member.issym() else "hard"
        return f"member {name!r} is a {kind} link (to {member.linkname!r}); links are not allowed"
    if not (member.isreg() or member.isdir()):
        return f"member {name!r} is not a regular file or folder"
    posix = PurePosixPath(name)
    if posix.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return f"member {name!r} has an absolute path and would write outside the pack folder"
    if ".." in posix.parts or "\\" in name:
        return f"member {name!r} would write outside the pack folder"
    allowed = {ARCHIVE_MANIFEST, *VERSION_MEMBERS, *PACK_FILES}
    if member.isreg() and name not in allowed:
        return f"unexpected member {name!r} (a pack archive holds only {sorted(allowed)})"
    if member.isdir() and name.rstrip("/") not in ("eval", "."):
        return f"unexpected folder {name!r}"
    return None


def _header(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], path: Path) -> dict:
    if ARCHIVE_MANIFEST not in members:
        raise PackError(f"{path.name} is not a kpack archive: it has no {ARCHIVE_MANIFEST}")
    handle = tar.extractfile(members[ARCHIVE_MANIFEST])
    try:
        header = json.loads(handle.read(1 << 20)) if handle else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PackError(f"{path.name}: {ARCHIVE_MANIFEST} is not valid JSON ({exc})") from exc
    if not isinstance(header, dict) or not isinstance(header.get("files"), dict):
        raise PackError(f"{path.name}: {ARCHIVE_MANIFEST} has no files table")
    if header.get("format") != ARCHIVE_FORMAT:
        raise PackError(
            f"{path.name}: archive format {header.get('format')!r} is not supported "
            f"(this kpack reads format {ARCHIVE_FORMAT})"
        )
    try:
        validate_pack_name(header.get("pack"))
        int(header.get("version"))
    except (PackError, TypeError, ValueError) as exc:
        raise PackError(f"{path.name}: {ARCHIVE_MANIFEST} names no valid pack and version") from exc
    files: dict = header["files"]
    for name, entry in files.items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and len(entry["sha256"]) == 64
            and isinstance(entry.get("size"), int)
        ):
            raise PackError(f"{path.name}: {ARCHIVE_MANIFEST} has no SHA-256 and size for {name}")
    listed, present = set(files), set(members) - {ARCHIVE_MANIFEST}
    if listed - present:
        raise PackError(
            f"{path.name}: listed but missing from the archive: {sorted(listed - present)}"
        )
    if present - listed:
        raise PackError(
            f"refusing {path.name}: members without a checksum in {ARCHIVE_MANIFEST}: "
            f"{sorted(present - listed)}"
        )
    missing = [f for f in REQUIRED_FILES if f not in files]
    if missing:
        raise PackError(f"{path.name}: the archive lacks {missing}")
    for name, entry in files.items():
        if members[name].size != entry["size"]:
            raise PackError(
                f"{path.name}: {name} is {members[name].size} bytes but {ARCHIVE_MANIFEST} "
                f"says {entry['size']}: the archive is damaged or was altered"
            )
    return header


# --- checks shared by validate and install -------------------------------------------------


def check_pack_files(report: Report, version_dir: Path, manifest: dict) -> None:
    """The manifest's fields, the embedding model, and the database against the manifest."""
    embedding = manifest.get("embedding") if isinstance(manifest, dict) else None
    fields_ok = (
        isinstance(embedding, dict)
        and isinstance(embedding.get("model"), str)
        and isinstance(embedding.get("dimension"), int)
        and isinstance(manifest.get("counts"), dict)
        and isinstance(manifest.get("name"), str)
    )
    detail = (
        f"{manifest['name']} version {manifest.get('version')}, built {manifest.get('built_at')}"
        if fields_ok
        else "it names no embedding model and dimension, counts or pack name"
    )
    if not report.add("manifest", fields_ok, detail):
        return
    check_embedding_model(report, embedding["model"], embedding["dimension"])
    # The seal first: Kuzu can crash the process on a damaged file instead of raising.
    if check_seal(report, version_dir / "pack.db", manifest):
        check_database(report, version_dir / "pack.db", manifest)


def check_seal(report: Report, db_path: Path, manifest: dict) -> bool:
    """pack.db is the file its manifest was sealed with at publish (size and SHA-256)."""
    seal = manifest.get("database")
    if not isinstance(seal, dict) or not {"bytes", "sha256"} <= seal.keys():
        return report.add(
            "database checksum",
            False,
            "the manifest has no database checksum (published by an older kpack, which "
            "queries refuse to open); rebuild the pack and export it again",
        )
    try:
        size, digest = db_path.stat().st_size, file_sha256(db_path)
    except OSError as exc:
        return report.add("database checksum", False, f"pack.db cannot be read: {exc}")
    ok = size == seal["bytes"] and digest == seal["sha256"]
    return report.add(
        "database checksum",
        ok,
        f"pack.db matches the manifest's SHA-256 ({size:,} bytes)"
        if ok
        else f"pack.db ({size:,} bytes) is not the file the manifest was sealed with "
        f"({seal['bytes']:,} bytes): it is damaged",
    )


def check_embedding_model(report: Report, model: str, dimension: int) -> None:
    """The pack's model must load here with the pack's dimension: questions are embedded with
    it, and vectors from any other model are not comparable with the pack's."""
    from kpack.embedding import load_model  # torch: only when a check needs it

    try:
        loaded = load_model(model)
    except Exception as exc:  # any loader failure (missing files, offline hub, bad config)
        report.add(
            "embedding model",
            False,
            f"{model} cannot be loaded on this machine ({type(exc).__name__}: {str(exc)[:200]}); "
            "install the model or make it downloadable, then try again",
        )
        return
    actual = int(loaded.get_embedding_dimension())
    report.add(
        "embedding model",
        actual == dimension,
        f"{model}, {actual} dimensions"
        + ("" if actual == dimension else f", but the pack's vectors have {dimension}"),
    )


def check_database(report: Report, db_path: Path, manifest: dict) -> None:
    """Open the database read-only and compare every table's count with the manifest."""
    from kpack.graphdb import opened

    try:
        with opened(db_path, read_only=True) as conn:
            counts = {
                t.name: conn.execute(f"MATCH (n:{t.name}) RETURN count(n)").get_next()[0]
                for t in KUZU_NODES
            }
            counts |= {
                t.name: conn.execute(f"MATCH ()-[r:{t.name}]->() RETURN count(r)").get_next()[0]
                for t in KUZU_RELS
            }
            row = conn.execute("MATCH (s:Section) RETURN s.embedding LIMIT 1").get_all()
    except Exception as exc:  # Kuzu raises RuntimeError for every kind of damage
        report.add("database", False, f"cannot be opened: {str(exc)[:300]}")
        return
    declared = manifest["counts"]
    differ = {k: (declared.get(k), v) for k, v in counts.items() if declared.get(k) != v}
    report.add(
        "database",
        not differ,
        f"{counts['Article']} articles, {counts['Section']} sections, {counts['Chunk']} chunks"
        if not differ
        else f"counts differ from the manifest (manifest, database): {differ}",
    )
    dimension = len(row[0][0]) if row and row[0][0] is not None else None
    wanted = manifest["embedding"]["dimension"]
    report.add(
        "vectors",
        dimension in (wanted, None),
        f"{dimension or wanted} dimensions"
        if dimension in (wanted, None)
        else f"{dimension} dimensions, the manifest says {wanted}",
    )


# --- validate ------------------------------------------------------------------------------


def validate(target: str | Path, packs_root: Path | None = None) -> Report:
    """Check a pack without installing it: an archive file (or URL), or a local pack's name."""
    text = str(target)
    if _is_url(text) or Path(text).is_file() or text.endswith((SUFFIX, ".tar.gz", ".tgz")):
        with _local_copy(text, packs_root) as path:
            return validate_archive(path)
    return validate_local(text, packs_root)


def validate_local(name: str, packs_root: Path | None = None) -> Report:
    folder = pack_dir(validate_pack_name(name), packs_root or settings.packs_dir())
    report = Report(subject=f"pack {name} ({folder})", pack=name)
    version_dir = current_version(folder)
    if not report.add(
        "published",
        version_dir is not None and version_dir.is_dir(),
        version_dir.name if version_dir else f"never built: run `kpack build {name}`",
    ):
        return report
    report.version = int(version_dir.name[1:])
    missing = [f for f in VERSION_FILES if not (version_dir / f).is_file()]
    if not report.add("files", not missing, f"missing {missing}" if missing else "all present"):
        return report
    try:
        manifest = _read_json(version_dir / "manifest.json", "manifest.json")
    except PackError as exc:
        report.add("manifest", False, str(exc))
        return report
    check_pack_files(report, version_dir, manifest)
    return report


def validate_archive(path: Path) -> Report:
    """Every check install makes, on a scratch copy that is removed afterwards."""
    report = Report(subject=str(path))
    try:
        with open_archive(path) as archive:
            report.pack, report.version = archive.pack, archive.version
            report.add(
                "members",
                True,
                f"{len(archive.files)} files, no links, nothing outside the pack folder",
            )
            with tempfile.TemporaryDirectory(prefix="kpack-validate-") as scratch:
                for member in archive.files:
                    archive.extract(member, Path(scratch) / member)
                report.add("checksums", True, f"SHA-256 of {len(archive.files)} files match")
                manifest = _read_json(Path(scratch) / "manifest.json", "manifest.json")
                check_pack_files(report, Path(scratch), manifest)
    except PackError as exc:
        report.add("archive", False, str(exc))
    return report


# --- install -------------------------------------------------------------------------------


def install(
    source: str | Path,
    packs_root: Path | None = None,
    name: str | None = None,
    replace: bool = False,
) -> InstallResult:
    """Verify an archive (file or http(s) URL) and publish it as a new local version.

    A new pack is assembled in a hidden folder of the packs folder and renamed into place, so
    it appears whole or not at all. An existing pack is only replaced with ``replace=True``:
    then the archive becomes its next version (under its build lock, published like a build),
    and its urls.txt, kg_config.json, few_shot_examples.json and eval questions are those of
    the archive.
    """
    started = time.perf_counter()
    root = Path(packs_root or settings.packs_dir())
    root.mkdir(parents=True, exist_ok=True)
    with _local_copy(str(source), root) as path, open_archive(path) as archive:
        target_name = validate_pack_name(name or archive.pack)
        target = root / target_name
        exists = (target / "urls.txt").is_file()
        if target.exists() and not exists:
            raise PackError(f"{target} exists and is not a pack folder (it has no urls.txt)")
        if exists and not replace:
            raise PackError(
                f"pack {target_name!r} already exists in {root}: install it under another name "
                f"with --as NAME, or as the next version of {target_name!r} with --replace"
            )
        archive_sha = file_sha256(path)
        if exists:
            version = _install_over(archive, root, target_name, archive_sha)
        else:
            version = _install_new(archive, root, target_name, archive_sha)
        return InstallResult(
            pack=target_name,
            folder=target,
            version=version,
            source_pack=archive.pack,
            source_version=archive.version,
            files=archive.files,
            replaced=exists,
            seconds=round(time.perf_counter() - started, 3),
        )


def _install_new(archive: Archive, root: Path, name: str, archive_sha: str) -> int:
    from kpack.store import PackStore

    work = root / f".install-{uuid.uuid4().hex}"  # hidden: list_packs never shows it
    folder = work / name
    try:
        staging = versions_dir(folder) / "staging"
        _stage(archive, staging, folder, name, archive_sha, previous=None, version=1)
        store = PackStore(work)
        store.publish(name, 1, staging)
        _record(store, name, 1, None, archive, archive_sha)
        try:
            # rename(2) onto an existing non-empty folder fails, so a pack of that name
            # created meanwhile is never overwritten.
            os.rename(folder, root / name)
        except OSError as exc:
            raise PackError(f"cannot install as {root / name}: {exc.strerror}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1


def _install_over(archive: Archive, root: Path, name: str, archive_sha: str) -> int:
    from kpack.store import PackStore, build_lock

    store = PackStore(root)
    folder = store.folder(name)
    # The build lock: an install never publishes while a build or rollback of the pack runs.
    with build_lock(folder):
        previous = store.current(name)
        previous_number = int(previous.name[1:]) if previous else None
        version = store.next_version(name)
        staging = store.new_staging(name, f"install-{uuid.uuid4().hex}")
        incoming = staging / ".pack-files"
        try:
            _stage(archive, staging, incoming, name, archive_sha, previous_number, version)
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
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _record(store, name, version, previous_number, archive, archive_sha)
    return version


def _stage(
    archive: Archive,
    staging: Path,
    pack_files: Path,
    name: str,
    archive_sha: str,
    previous: int | None,
    version: int,
) -> None:
    """Extract (checksums verified), check, and write the local manifest.json and skill.md."""
    from kpack.graphdb import opened
    from kpack.skill import skill_inputs, skill_markdown

    staging.mkdir(parents=True, exist_ok=True)
    for member in archive.files:
        archive.extract(member, (staging if member in VERSION_MEMBERS else pack_files) / member)
    manifest = _read_json(staging / "manifest.json", f"{archive.path.name}: manifest.json")
    report = Report(subject=str(archive.path))
    check_pack_files(report, staging, manifest)
    if not report.ok:
        raise PackError(f"refusing {archive.path.name}: {report.failures()}")
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
        top_articles, top_entities = skill_inputs(conn)
    (staging / "skill.md").unlink()
    (staging / "skill.md").write_text(skill_markdown(manifest, top_articles, top_entities))


def _record(
    store, name: str, version: int, previous: int | None, archive: Archive, archive_sha: str
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


# --- helpers -------------------------------------------------------------------------------


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


@contextmanager
def _local_copy(source: str, root: Path | None) -> Iterator[Path]:
    """The archive as a local file: the file itself, or a download removed afterwards."""
    if not _is_url(source):
        yield Path(source.removeprefix("file://"))
        return
    import requests

    folder = Path(root or settings.packs_dir())
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / f".download-{uuid.uuid4().hex}{SUFFIX}"
    try:
        try:
            with requests.get(source, stream=True, timeout=DOWNLOAD_TIMEOUT_S) as response:
                response.raise_for_status()
                with temp.open("wb") as out:
                    for chunk in response.iter_content(CHUNK):
                        out.write(chunk)
        except requests.RequestException as exc:
            raise PackError(f"cannot download {source}: {exc}") from exc
        yield temp
    finally:
        temp.unlink(missing_ok=True)


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PackError(f"{what} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise PackError(f"{what} is not a JSON object")
    return data


__all__ = [
    "ARCHIVE_MANIFEST",
    "Archive",
    "Check",
    "ExportResult",
    "InstallResult",
    "Report",
    "export_pack",
    "install",
    "member_problem",
    "open_archive",
    "validate",
    "validate_archive",
    "validate_local",
]
