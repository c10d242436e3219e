"""Validating a pack: a local pack's published version, or an archive before it is installed.

The checks (:func:`check_pack_files`) are the ones install makes before it publishes: the
manifest's fields, the embedding model loading here with the pack's dimension, ``pack.db``
being the file the manifest was sealed with (kpack.store.database_problem, the check every
query makes), the database's counts against the manifest, and every retrieval index opened as
a reader opens it with the shape the manifest implies (kpack.archive.index_shapes). An archive is first read into
a staging folder (kpack.archive.reader: every member checked and bounded), removed afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kpack import settings
from kpack.archive.format import SUFFIX, VERSION_FILES, read_json
from kpack.archive.index_shapes import index_problem
from kpack.archive.reader import is_url, local_copy, open_archive
from kpack.archive.staging import staging_area
from kpack.contracts import KUZU_NODES, KUZU_RELS
from kpack.errors import PackError, disk_errors
from kpack.packs import built_time, current_version, pack_dir, validate_pack_name
from kpack.store import DATABASE, database_problem, indexes_problem


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


def validate(target: str | Path, packs_root: Path | None = None) -> Report:
    """Check a pack without installing it: an archive file (or URL), or a local pack's name."""
    text = str(target)
    if is_url(text) or Path(text).is_file() or text.endswith((SUFFIX, ".tar.gz", ".tgz")):
        return validate_archive(text, packs_root)
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
        manifest = read_json(version_dir / "manifest.json", "manifest.json")
    except PackError as exc:
        report.add("manifest", False, str(exc))
        return report
    check_pack_files(report, version_dir, manifest)
    return report


def validate_archive(source: str | Path, packs_root: Path | None = None) -> Report:
    """Every check install makes, on a copy in the packs folder's staging area, removed after."""
    report = Report(subject=str(source))
    root = Path(packs_root or settings.packs_dir())
    try:
        with staging_area(root) as staging, disk_errors(f"cannot validate {source}"):
            with open_archive(local_copy(str(source), staging)) as archive:
                report.pack, report.version = archive.pack, archive.version
                files = staging / "files"
                archive.extract_all(lambda member: files / member, staging)
            count = len(archive.files)
            report.add("members", True, f"{count} files, no links, nothing outside the pack folder")
            report.add("checksums", True, f"SHA-256 of {count} files match")
            manifest = read_json(files / "manifest.json", "manifest.json")
            check_pack_files(report, files, manifest)
    except PackError as exc:
        report.add("archive", False, str(exc))
    return report


def check_pack_files(report: Report, version_dir: Path, manifest: dict) -> None:
    """The manifest's fields, the embedding model, and the database against the manifest."""
    embedding = manifest.get("embedding") if isinstance(manifest, dict) else None
    fields_ok = (
        isinstance(embedding, dict)
        and isinstance(embedding.get("model"), str)
        and isinstance(embedding.get("dimension"), int)
        and isinstance(manifest.get("counts"), dict)
        and isinstance(manifest.get("name"), str)
        and built_time(manifest.get("built_at")) is not None
    )
    detail = (
        f"{manifest['name']} version {manifest.get('version')}, built {manifest.get('built_at')}"
        if fields_ok
        else "it names no embedding model and dimension, counts, pack name or build time (an "
        "ISO 8601 date with its offset)"
    )
    if not report.add("manifest", fields_ok, detail):
        return
    check_embedding_model(report, embedding["model"], embedding["dimension"])
    # The seal first: Kuzu can crash the process on a damaged file instead of raising.
    if check_seal(report, version_dir):
        check_database(report, version_dir / DATABASE, manifest)
        check_indexes(report, version_dir, manifest)


def check_indexes(report: Report, version_dir: Path, manifest: dict) -> None:
    """Every retrieval index opened as a reader opens it, its type and shape against the
    manifest's counts and dimension (kpack.archive.index_shapes): a resealed archive carries
    checksums that match whatever it holds."""
    problem = index_problem(version_dir, manifest)
    report.add(
        "indexes",
        problem is None,
        "every index file opens with the manifest's counts and dimension"
        if problem is None
        else f"{problem}; the archive was not written by kpack export, or was altered",
    )


def check_seal(report: Report, version_dir: Path) -> bool:
    """pack.db is the file its manifest was sealed with at publish (size and SHA-256)."""
    problem = database_problem(version_dir) or indexes_problem(version_dir)
    if problem is not None:
        return report.add(
            "database checksum",
            False,
            f"the version {problem}; rebuild the pack (and export it again)",
        )
    size = (version_dir / DATABASE).stat().st_size
    return report.add(
        "database checksum", True, f"pack.db matches the manifest's SHA-256 ({size:,} bytes)"
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
