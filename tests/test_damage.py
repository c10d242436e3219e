"""A damaged database or a full disk is an error with a clear message, never a crash.

Kuzu answers some damaged database files with SIGSEGV and a full disk with a C++ terminate
(rc 134), so these tests damage real pack files with real byte writes, fill a real (tmpfs)
filesystem, and run the commands that read or build the pack in child processes: a crash
there is a failed assertion, not a dead test run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import retrieval
from kpack.errors import PackNotReady
from kpack.store import VERIFIED, seal_version, verify_version
from kpack.vector_index import ANN_MIN_VECTORS_ENV
from tests.conftest import TEST_FETCH, build, write_pack

PROJECT = Path(__file__).resolve().parent.parent
PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
QUESTION = "Which environment variable sets where the sprocket cache lives?"
ANSWER = "WIDGET_HOME"
REBUILD = "rebuild it with `kpack build widgets` or `kpack rollback widgets`"


@pytest.fixture(scope="module")
def two_versions(site, tmp_path_factory) -> Path:
    """A workspace whose pack "widgets" has v0001 (kept) and v0002 (current); v0002 is built
    as a large pack is, with its ANN index files (the crossover lowered)."""
    root = tmp_path_factory.mktemp("damage")
    write_pack(root, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert build(root, "widgets").published
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ANN_MIN_VECTORS_ENV, "2")
        assert build(root, "widgets", force=True).published
    return root


@pytest.fixture
def pack_copy(two_versions, tmp_path) -> Path:
    """This test's own copy of the workspace (packs, storage), free to damage."""
    root = tmp_path / "copy"
    shutil.copytree(two_versions, root, symlinks=True)
    return root


def kpack(root: Path, *argv: str) -> subprocess.CompletedProcess:
    """The kpack command in a child process over the workspace ``root``."""
    env = {
        **os.environ,
        "KPACK_PACKS_DIR": str(root / "packs"),
        "KPACK_STORAGE": str(root / "storage"),
        "DAGSTER_HOME": str(root / "dagster_home"),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *argv],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode >= 0, f"kpack {argv} crashed ({done.returncode}): {done.stderr[-2000:]}"
    return done


def overwrite_bytes(path: Path, offset: int, count: int = 4096) -> None:
    """Bytes in the middle of the file replaced, as a bad disk or a stray write would."""
    with open(path.resolve(), "r+b") as handle:
        handle.seek(offset)
        before = handle.read(count)
        handle.seek(offset)
        handle.write(bytes(b ^ 0xA5 for b in before))


def current_db(root: Path) -> Path:
    return (root / "packs" / "widgets" / "pack.db").resolve()


def test_a_damaged_database_is_refused_with_a_clear_error_instead_of_a_crash(pack_copy):
    db = current_db(pack_copy)
    # About a third into the file: bytes there made every Kuzu reader segfault (issue 9).
    overwrite_bytes(db, db.stat().st_size // 3)
    with pytest.raises(PackNotReady) as refused:
        verify_version(db.parent)
    assert str(refused.value) == (
        f"pack 'widgets' version v0002 is damaged (checksum mismatch); {REBUILD}"
    )
    for command in (("query", "widgets", QUESTION, "--no-llm"), ("search", "widgets", QUESTION)):
        done = kpack(pack_copy, *command)
        message = " ".join(done.stderr.split())
        assert done.returncode == 2, (command, done.returncode, done.stderr[-2000:])
        assert "version v0002 is damaged (checksum mismatch)" in message
        assert "Traceback" not in done.stderr
    status = kpack(pack_copy, "status", "widgets")
    assert status.returncode == 0
    assert "damaged (checksum mismatch)" in " ".join(status.stdout.split())


def test_a_truncated_database_is_refused_and_replaced_by_a_normal_build(pack_copy):
    db = current_db(pack_copy)
    published = db.stat().st_size
    os.truncate(db, published // 2)
    with pytest.raises(PackNotReady) as refused:
        verify_version(db.parent)
    assert str(refused.value) == (
        f"pack 'widgets' version v0002 is damaged (pack.db is {published // 2} bytes, "
        f"{published} were published); {REBUILD}"
    )
    # Nothing changed in the sources: without the check this build kept the damaged version
    # as "unchanged". It must publish a new one, and never open the damaged file meanwhile.
    done = kpack(pack_copy, "build", "widgets", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    folder = pack_copy / "packs" / "widgets"
    assert os.readlink(folder / ".versions" / "current") == "v0003"
    verify_version(folder / ".versions" / "current")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["previous_version"] == 2
    assert manifest["changes"]["unchanged"] == len(PAGES)  # compared via articles.json
    answer = kpack(pack_copy, "query", "widgets", QUESTION, "--no-llm")
    assert answer.returncode == 0 and ANSWER in answer.stdout


def test_rollback_leaves_a_damaged_current_version(pack_copy):
    overwrite_bytes(current_db(pack_copy), 8192)
    done = kpack(pack_copy, "rollback", "widgets")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rolled back from v0002 to v0001" in " ".join(done.stdout.split())
    folder = pack_copy / "packs" / "widgets"
    verify_version(folder / ".versions" / "current")
    answer = kpack(pack_copy, "query", "widgets", QUESTION, "--no-llm")
    assert answer.returncode == 0 and ANSWER in answer.stdout


def test_the_full_hash_runs_once_per_file_state(pack_copy):
    version = current_db(pack_copy).parent
    marker = version / VERIFIED
    assert json.loads(marker.read_text())["pack.db"][
        "sha256"
    ]  # written at publish: no hash on first open
    marker.unlink()
    verify_version(version)  # hashes, then remembers
    remembered = json.loads(marker.read_text())
    # A copy of the same bytes is another file state (inode, mtime): hashed again, and passes.
    db = version / "pack.db"
    shutil.copy2(db, version / "pack.db.copy")
    os.replace(version / "pack.db.copy", db)
    verify_version(version)
    assert json.loads(marker.read_text())["pack.db"]["inode"] != remembered["pack.db"]["inode"]


def test_sealing_again_hashes_only_files_changed_since(pack_copy, tmp_path, monkeypatch):
    import kpack.store as store

    staged = tmp_path / "staged"
    shutil.copytree(current_db(pack_copy).parent, staged)  # new inodes: a fresh staging
    seal_version(staged)
    index = next(p for p in sorted((staged / "indexes").iterdir()) if p.suffix == ".npy")
    overwrite_bytes(index, 128, 64)  # changed after it was sealed
    hashed: list[str] = []
    real_sha256 = store.file_sha256
    monkeypatch.setattr(
        store, "file_sha256", lambda path: hashed.append(Path(path).name) or real_sha256(path)
    )
    seal_version(staged)
    assert hashed == [index.name]  # the unchanged files kept their digests
    manifest = json.loads((staged / "manifest.json").read_text())
    assert manifest["indexes"][f"indexes/{index.name}"]["sha256"] == real_sha256(index)
    verify_version(staged)


@contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """``mount``, a new folder, on its own tmpfs of ``size`` (needs root; the test is skipped
    with the reason if not)."""
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the full-disk test: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """tmp_path/packs on its own 64 MiB disk; the storage and the Dagster home elsewhere."""
    with tmpfs(tmp_path / "packs", "64m") as mount:
        yield mount


@pytest.fixture
def small_project_disk(tmp_path) -> Iterator[Path]:
    """A workspace whose packs, storage and Dagster home share one 128 MiB disk, as they do
    in a project folder."""
    with tmpfs(tmp_path / "project", "128m") as mount:
        yield mount


def fill(folder: Path, leave_bytes: int) -> Path:
    """A file that takes all the free space of ``folder``'s filesystem but ``leave_bytes``."""
    filler = folder / "filler"
    size = shutil.disk_usage(folder).free - leave_bytes
    with open(filler, "wb") as handle:
        block = b"\0" * (1 << 20)
        while size > 0:
            size -= handle.write(block[: min(size, len(block))])
    return filler


def test_a_full_disk_fails_the_build_cleanly_and_keeps_the_published_pack(
    small_disk, site, tmp_path
):
    folder = write_pack(tmp_path, "full", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert build(tmp_path, "full").published
    filler = fill(small_disk, leave_bytes=1 << 20)

    failed = build(tmp_path, "full", force=True)  # Kuzu aborted on this before (rc 134)
    assert failed.outcome == "failed"
    assert "no space left on device while writing the pack database" in failed.cause
    assert not list((folder / ".versions").glob("staging*"))  # its staging folder is gone
    last = json.loads((folder / ".versions" / "last_build.json").read_text())
    assert last["outcome"] == "failed" and "no space left" in last["cause"]
    assert os.readlink(folder / ".versions" / "current") == "v0001"
    verify_version(folder / ".versions" / "current")
    assert ANSWER in retrieval.query(folder, QUESTION, use_llm=False)["answer"]

    filler.unlink()  # space again: the next build recovers, no --force, nothing to delete
    again = build(tmp_path, "full")
    assert again.success and again.outcome == "unchanged"


def test_a_build_on_a_full_disk_reports_its_outcome_in_one_line(small_disk, site, tmp_path):
    """Not a byte left where the packs live: a rebuild that finds nothing changed still says
    so, and that its outcome could not be written for `kpack status`, with no traceback."""
    folder = write_pack(tmp_path, "full", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert build(tmp_path, "full").published
    fill(small_disk, leave_bytes=0)

    done = kpack(tmp_path, "build", "full", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert "nothing changed since v0001" in done.stdout
    warning = " ".join(done.stderr.split())
    not_written = "the outcome was not written to full/.versions/last_build.json: no space left"
    assert f"warning: {not_written} on the device" in warning, warning
    assert os.readlink(folder / ".versions" / "current") == "v0001"
    assert not list(small_disk.glob("full/.versions/.last_build.json.*"))  # no half a file
    status = kpack(tmp_path, "status", "full")
    assert "nothing changed since v0001" in " ".join(status.stdout.split()), status.stderr
    assert ANSWER in retrieval.query(folder, QUESTION, use_llm=False)["answer"]


def test_a_full_disk_under_the_whole_workspace_is_one_line_and_loses_nothing(
    small_project_disk, site
):
    """Not a byte left on the disk of the packs, their storage and the Dagster home: SQLite
    cannot even open Dagster's files, so no build can run; each command says so in one line,
    the published pack still answers, and a build once there is room again publishes."""
    root = small_project_disk
    folder = write_pack(root, "full", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert kpack(root, "build", "full", "--no-progress").returncode == 0
    filler = fill(root, leave_bytes=0)

    for argv in (["build", "full"], ["build", "full", "--force"], ["status", "full"]):
        done = kpack(root, *argv)
        said = " ".join(done.stderr.split())
        assert done.returncode == 2 and "Traceback" not in said, done.stderr[-3000:]
        assert said.startswith(f"error: Dagster's storage in {root / 'dagster_home'} failed:")
        assert said.endswith("its disk is full (0 bytes free): free some space and try again")
    assert os.readlink(folder / ".versions" / "current") == "v0001"
    searched = kpack(root, "search", "full", QUESTION, "--k", "3")
    assert searched.returncode == 0 and ANSWER in searched.stdout

    filler.unlink()
    again = kpack(root, "build", "full", "--force", "--no-progress")
    assert again.returncode == 0, again.stderr[-3000:]
    assert os.readlink(folder / ".versions" / "current") == "v0002"


def index_file(root: Path, name: str) -> Path:
    return current_db(root).parent / "indexes" / name


@pytest.mark.parametrize(
    ("name", "damage", "problem"),
    [
        (
            "chunk_vectors.npy",
            lambda path: overwrite_bytes(path, path.stat().st_size // 2, 64),
            "is damaged (checksum mismatch of indexes/chunk_vectors.npy)",
        ),
        (
            "keyword_rows.npy",
            lambda path: os.truncate(path, 10),
            "is damaged (indexes/keyword_rows.npy is 10 bytes,",
        ),
        ("chunks.arrow", os.unlink, "has no indexes/chunks.arrow"),
        (
            "chunk_vectors.faiss",
            lambda path: overwrite_bytes(path, path.stat().st_size // 2, 64),
            "is damaged (checksum mismatch of indexes/chunk_vectors.faiss)",
        ),
    ],
)
def test_a_damaged_or_missing_index_file_is_refused_like_a_damaged_database(
    pack_copy, name, damage, problem
):
    damage(index_file(pack_copy, name))
    with pytest.raises(PackNotReady) as refused:
        verify_version(current_db(pack_copy).parent)
    assert f"pack 'widgets' version v0002 {problem}" in str(refused.value)
    assert str(refused.value).endswith(REBUILD)
    done = kpack(pack_copy, "search", "widgets", QUESTION)
    assert done.returncode == 2, done.stderr[-2000:]
    assert problem in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
