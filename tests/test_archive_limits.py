"""Hostile archives and downloads: bombs, endless and dripping servers, kills, a full disk.

The archives are real gzip-compressed tar files written here byte for byte (a gigabyte of
repeated bytes is one small gzip member written many times, which gunzip reads as one
stream). The CLI runs in a process of its own, whose peak RSS its parent reads from the kernel
(``resource.getrusage``); the servers are real HTTP servers on 127.0.0.1.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import retrieval
from kpack import remote
from kpack.archive import ARCHIVE_MANIFEST, install, validate
from kpack.archive.format import MAX_ARCHIVE_VARIABLE
from kpack.archive.staging import STAGING_FOLDER
from kpack.download import CHUNK, DEADLINE_VARIABLE
from kpack.errors import SPACE_MARGIN_BYTES, PackError
from tests.hostile_site import HostileHandler
from tests.loopback import LoopbackServer
from tests.test_archive import leftovers, sha256

KPACK = Path(sys.executable).with_name("kpack")
MIB, GIB = 1 << 20, 1 << 30
QUESTION = "How do I install the toolkit?"
# The growth of peak RSS a refused bomb may cause over refusing a file that is no archive.
RSS_GROWTH_LIMIT_MIB = 32
SMALL_FILES = {
    "manifest.json": b"{}",
    "skill.md": b"# a pack\n",
    "urls.txt": b"https://example.com/\n",
}

# --- archives written byte for byte ----------------------------------------------------------


def block(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    """One 512-byte tar header."""
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(tarfile.USTAR_FORMAT)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % tarfile.BLOCKSIZE)


def repeated(byte: bytes, size: int) -> list[tuple[bytes, int]]:
    """``size`` copies of ``byte`` (padded to whole blocks) as gzip parts: (data, times)."""
    whole, rest = divmod(size, MIB)
    return [(byte * MIB, whole), (padded(byte * rest), 1)]


def write_gzip(path: Path, parts: list[tuple[bytes, int]]) -> Path:
    """Each (data, times) compressed once and written ``times`` times: gzip members that
    gunzip (and Python's gzip module) read as one stream."""
    with path.open("wb") as out:
        for data, times in parts:
            member = gzip.compress(data, compresslevel=9, mtime=0)
            for _ in range(times):
                out.write(member)
    return path


def header_member(database_bytes: int, database_sha256: str = "0" * 64) -> bytes:
    """kpack-archive.json for a pack.db of that size plus SMALL_FILES, as a tar member."""
    files = {"pack.db": {"sha256": database_sha256, "size": database_bytes}}
    files |= {
        n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in SMALL_FILES.items()
    }
    data = json.dumps({"format": 1, "pack": "bomb", "version": 1, "files": files}).encode()
    return block(ARCHIVE_MANIFEST, len(data)) + padded(data)


def small_members() -> bytes:
    return b"".join(block(n, len(d)) + padded(d) for n, d in SMALL_FILES.items()) + bytes(1024)


def pax_record(key: str, value: str) -> bytes:
    """One pax record, "LENGTH KEY=VALUE\\n", LENGTH counting the whole record."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length).encode() + body) != length:
        length += 1
    return str(length).encode() + body


def pax_bomb(path: Path, size: int) -> Path:
    """An archive that starts with a pax extended header of ``size`` bytes (one record)."""
    prefix = f"{size} comment=".encode()
    body = size - len(prefix) - 1
    parts = [(block("././@PaxHeader", size, tarfile.XHDTYPE) + prefix, 1)]
    parts += [(b"a" * MIB, body // MIB), (b"a" * (body % MIB) + b"\n" + bytes(-size % 512), 1)]
    parts += [(header_member(1), 1), (block("pack.db", 1) + padded(b"x") + small_members(), 1)]
    return write_gzip(path, parts)


def expansion_bomb(path: Path, declared: int, actual: int) -> Path:
    """An archive whose pack.db is ``actual`` bytes of zeros; its header says ``declared``."""
    parts = [(header_member(declared) + block("pack.db", actual), 1), *repeated(b"\0", actual)]
    return write_gzip(path, [*parts, (small_members(), 1)])


# --- the CLI in a process of its own ---------------------------------------------------------


@dataclass
class Run:
    code: int
    out: str
    err: str
    peak_rss_mib: float
    seconds: float


# Runs a command and writes its peak RSS (KiB) and seconds to the file named first. A process
# of its own: a child started by the test process itself would report the test process's RSS
# (Linux keeps the peak across exec, and the child starts as a copy of its parent).
MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
code = subprocess.call(sys.argv[2:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
record = {"code": code, "kib": usage.ru_maxrss, "seconds": time.perf_counter() - started}
open(sys.argv[1], "w").write(json.dumps(record))
"""


def run_kpack(*args: str, packs: Path, env: dict[str, str] | None = None) -> Run:
    """`kpack ARGS` with KPACK_PACKS_DIR=packs: its exit code, output, peak RSS and time."""
    environment = {**os.environ, "KPACK_PACKS_DIR": str(packs), "COLUMNS": "500", **(env or {})}
    with tempfile.TemporaryDirectory() as scratch:
        record = Path(scratch) / "record.json"
        done = subprocess.run(
            [sys.executable, "-c", MEASURE, str(record), str(KPACK), *args],
            capture_output=True,
            text=True,
            env=environment,
        )
        measured = json.loads(record.read_text())
    return Run(
        measured["code"], done.stdout, done.stderr, measured["kib"] / 1024, measured["seconds"]
    )


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Run:
    """`kpack install` of a file that is no archive: what starting the CLI costs."""
    folder = tmp_path_factory.mktemp("baseline")
    junk = folder / "junk.kpack"
    junk.write_bytes(b"not a tarball")
    run = run_kpack("install", str(junk), packs=folder / "packs")
    assert run.code == 2 and "is not a kpack archive" in run.err
    return run


def one_line_error(run: Run) -> str:
    assert run.code == 2 and run.out == "", (run.out, run.err)
    assert "Traceback" not in run.err and len(run.err.strip().splitlines()) == 1, run.err
    return run.err.strip()


@pytest.fixture(scope="module")
def installed(archive, tmp_path_factory) -> Path:
    """A packs folder where `widgets` is installed: the pack a refused install must not touch."""
    packs = tmp_path_factory.mktemp("installed") / "packs"
    install(archive, packs_root=packs)
    return packs


def snapshot(packs: Path) -> tuple:
    folder = packs / "widgets"
    current = (folder / ".versions" / "current").resolve()
    versions = sorted(p.name for p in (folder / ".versions").iterdir())
    return current.name, sha256(current / "pack.db"), versions, (folder / "urls.txt").read_bytes()


def assert_untouched(packs: Path, before: tuple) -> None:
    assert snapshot(packs) == before
    assert leftovers(packs) == [] and sorted(p.name for p in packs.iterdir()) == [
        STAGING_FOLDER,
        "widgets",
    ]
    assert retrieval.search(packs / "widgets", QUESTION, k=3)


# --- bombs -----------------------------------------------------------------------------------


BOMBS = {
    # tarfile read this header into memory whole: 1.1 GB of RSS for a 1.6 MB archive.
    "a 1 GiB pax header": (
        lambda path: pax_bomb(path, GIB),
        r"extended \(pax\) header of 1,073,741,824 bytes",
    ),
    # The header and the tar member both say 1 GiB: far beyond what a 1 MB archive holds.
    "1 GiB declared": (
        lambda path: expansion_bomb(path, GIB, GIB),
        r"declares 1,073,74\d,\d+ bytes unpacked from 1,0\d\d,\d+ .* compression bomb",
    ),
    # The header says 1 KiB, the tar member 1 GiB: refused before a byte of it is written.
    "1 GiB behind a 1 KiB entry": (
        lambda path: expansion_bomb(path, 1024, GIB),
        r"pack.db is 1,073,741,824 bytes but kpack-archive.json says 1,024",
    ),
}


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_bomb_is_refused_quickly_in_little_memory_and_leaves_nothing(
    bomb, baseline, installed, tmp_path
):
    make, message = BOMBS[bomb]
    path = make(tmp_path / "bomb.kpack")
    assert path.stat().st_size < 2 * MIB
    before = snapshot(installed)
    for args in (["install", str(path), "--as", "widgets", "--replace"], ["install", str(path)]):
        run = run_kpack(*args, packs=installed)
        assert re.search(message, one_line_error(run)), run.err
        growth = run.peak_rss_mib - baseline.peak_rss_mib
        print(
            f"\n{bomb}: kpack install{' --replace' * ('--replace' in args)}: peak RSS {run.peak_rss_mib:.0f} MiB "
            f"(+{growth:.0f} over the CLI's own), {run.seconds:.2f} s "
            f"(the CLI alone: {baseline.seconds:.2f} s)"
        )
        assert growth < RSS_GROWTH_LIMIT_MIB
        assert run.seconds < baseline.seconds + 5
        assert_untouched(installed, before)
    run = run_kpack("validate", str(path), "--json", packs=installed)
    report = json.loads(run.out)
    assert run.code == 1 and not report["ok"]
    assert re.search(message, report["checks"][-1]["detail"])
    assert run.peak_rss_mib - baseline.peak_rss_mib < RSS_GROWTH_LIMIT_MIB
    assert_untouched(installed, before)


def test_an_archive_with_pax_headers_of_its_own_is_read_as_tarfile_writes_them(archive, tmp_path):
    """tarfile writes a pax header for a long name or a size over 8 GiB; the reader applies
    its path and size records (here on every member, over another name in the tar header, and
    with a comment it ignores)."""
    copy = tmp_path / "pax.kpack"
    with tarfile.open(archive, "r:gz") as source, tarfile.open(copy, "w:gz") as target:
        for number, member in enumerate(source):
            data = source.extractfile(member)
            member.pax_headers = {"path": member.name, "size": str(member.size), "comment": "é"}
            member.name = f"renamed-{number}"
            target.addfile(member, data)
    with tarfile.open(copy, "r:gz") as check:
        assert check.getnames()[0] == ARCHIVE_MANIFEST
        assert all(m.pax_headers.get("comment") == "é" for m in check)
    report = validate(copy, tmp_path / "packs")
    assert report.ok, report.failures()


def test_too_many_members_and_sparse_files_are_refused(tmp_path):
    crowded = [(header_member(1), 1), (block("eval", 0, tarfile.DIRTYPE), 70)]
    crowded += [(block("pack.db", 1) + padded(b"x") + small_members(), 1)]
    with pytest.raises(PackError, match="more than 64 members"):
        install(write_gzip(tmp_path / "crowded.kpack", crowded), packs_root=tmp_path / "packs")
    sparse = pax_record("GNU.sparse.major", "1") + pax_record("GNU.sparse.minor", "0")
    parts = [(header_member(1), 1), (block("pax", len(sparse), tarfile.XHDTYPE), 1)]
    parts += [(padded(sparse) + block("pack.db", 1) + padded(b"x") + small_members(), 1)]
    with pytest.raises(PackError, match="sparse members are not allowed"):
        install(write_gzip(tmp_path / "sparse.kpack", parts), packs_root=tmp_path / "packs")
    assert leftovers(tmp_path / "packs") == []


# --- a full disk -----------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Callable[[str], Path]]:
    """Mounts tmpfs file systems (``mount -o OPTIONS``); unmounted afterwards."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}); needs root")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


def test_an_archive_larger_than_the_free_space_is_refused_before_writing(
    archive, small_disk, tmp_path
):
    # The archive unpacks to about 9 MB; with the 16 MiB kept free, 20 MB is too small.
    packs = small_disk("size=20m")
    with pytest.raises(PackError, match=r"unpacks to [\d,]+ bytes, but the disk .* free"):
        install(archive, packs_root=packs)
    report = validate(archive, packs)
    assert not report.ok and "free some space" in report.failures()
    assert leftovers(packs) == [] and [p.name for p in packs.iterdir()] == [STAGING_FOLDER]


def test_no_space_left_while_unpacking_is_one_clear_line_and_nothing_is_left(archive, small_disk):
    # Room for the bytes but for 7 files and folders only: the disk fills (ENOSPC) while the
    # members are written, after the free-space check passed.
    packs = small_disk("size=100m,nr_inodes=7")
    no_space = r"no space left on the device \(.*\); free some space and try again"
    with pytest.raises(PackError, match=rf"cannot install .*: {no_space}"):
        install(archive, packs_root=packs)
    assert leftovers(packs) == []
    report = validate(archive, packs)
    assert not report.ok and re.search(no_space, report.failures())
    assert leftovers(packs) == [] and [p.name for p in packs.iterdir()] == [STAGING_FOLDER]


# --- downloads -------------------------------------------------------------------------------


class HostileArchives(HostileHandler):
    """Archive URLs that misbehave: endless, oversized, encoded; and hostile_site's trickling
    answers (a byte every 0.1 s, of the body or of the headers)."""

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path not in ("/endless.kpack", "/huge.kpack", "/gzipped.kpack"):
            super().do_GET()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        try:
            if path == "/endless.kpack":  # no length: the body ends when the connection does
                self.send_header("Connection", "close")
                self.end_headers()
                while True:
                    self.wfile.write(bytes(64 << 10))
            elif path == "/huge.kpack":
                self.send_header("Content-Length", str(100 * GIB))
                self.end_headers()
                self.wfile.write(bytes(MIB))
            else:
                body = gzip.compress(bytes(MIB))
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
        except OSError:  # the client gave up: what its cap is for
            return


@pytest.fixture(scope="module")
def hostile() -> Iterator[LoopbackServer]:
    with LoopbackServer(HostileArchives) as server:
        yield server


def test_an_endless_download_is_cut_at_the_cap(hostile, tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_ARCHIVE_VARIABLE, str(4 * MIB))
    started = time.perf_counter()
    with pytest.raises(PackError, match=r"download of .*/endless.kpack is larger than 4,194,304"):
        install(hostile.url("/endless.kpack"), packs_root=tmp_path / "packs")
    assert time.perf_counter() - started < 10
    with pytest.raises(PackError, match=r"it is 107,374,182,400 bytes, more than the 4,194,304"):
        install(hostile.url("/huge.kpack"), packs_root=tmp_path / "packs")
    with pytest.raises(PackError, match="sent it gzip-encoded"):
        install(hostile.url("/gzipped.kpack"), packs_root=tmp_path / "packs")
    assert leftovers(tmp_path / "packs") == []


@pytest.mark.parametrize("path", ["/trickle-body.html", "/trickle-headers.html"])
def test_a_dripping_server_ends_at_the_overall_deadline(hostile, tmp_path, monkeypatch, path):
    """A byte every 0.1 s never trips a timeout per read; the deadline of the whole download
    shuts the socket after 3 s, whether the body or the headers drip."""
    monkeypatch.setenv(DEADLINE_VARIABLE, "3")
    started = time.perf_counter()
    with pytest.raises(PackError, match=rf"download of .*{path} did not finish within 3 s"):
        install(hostile.url(path), packs_root=tmp_path / "packs")
    elapsed = time.perf_counter() - started
    print(f"\n{path}: refused after {elapsed:.2f} s (deadline 3 s, a byte every 0.1 s)")
    assert 3 <= elapsed < 6
    report = validate(hostile.url(path), tmp_path / "packs")
    assert "did not finish within 3 s" in report.failures()
    assert leftovers(tmp_path / "packs") == []


def staged_files(packs: Path, name: str) -> list[Path]:
    return list((packs / STAGING_FOLDER).glob(f"*/**/{name}"))


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    stop = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < stop, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_killed_download_is_removed_by_the_next_install_and_not_before(hostile, tmp_path):
    packs, junk = tmp_path / "packs", tmp_path / "junk.kpack"
    junk.write_bytes(b"not a tarball")
    environment = {**os.environ, "KPACK_PACKS_DIR": str(packs)}
    command = [str(KPACK), "install", hostile.url("/trickle-body.html")]
    client = subprocess.Popen(command, env=environment, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: staged_files(packs, "trickle-body.html"), "the download to start")
        # An install meanwhile leaves the running download alone ...
        with pytest.raises(PackError, match="is not a kpack archive"):
            install(junk, packs_root=packs)
        assert staged_files(packs, "trickle-body.html")
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    assert staged_files(packs, "trickle-body.html")  # a kill runs no clean-up of its own
    # ... and the next one after the kill removes what it left.
    with pytest.raises(PackError, match="is not a kpack archive"):
        install(junk, packs_root=packs)
    assert leftovers(packs) == []


def lowest_free_space(folder: Path, while_running: Callable[[], Run]) -> tuple[Run, int]:
    """What ``while_running`` returned, and the least free space its disk had meanwhile."""
    lowest, done = shutil.disk_usage(folder).free, threading.Event()

    def sample() -> None:
        nonlocal lowest
        while not done.is_set():
            lowest = min(lowest, shutil.disk_usage(folder).free)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        return while_running(), lowest
    finally:
        done.set()
        sampler.join()


def test_a_download_never_fills_the_disk(hostile, small_disk):
    """An endless answer under the default cap (64 GiB) on a 20 MiB disk stops before the disk
    is full, and an answer that declares more than the disk holds is refused before it comes:
    one line each, nothing left, the margin for other writers never touched."""
    disk = small_disk("size=20m")
    packs = disk / "packs"
    run, lowest = lowest_free_space(
        disk, lambda: run_kpack("install", hostile.url("/endless.kpack"), packs=packs)
    )
    message = one_line_error(run)
    assert re.search(
        r"download of .*endless.kpack stopped at [\d,]+ bytes, before it filled", message
    )
    assert lowest >= SPACE_MARGIN_BYTES - CHUNK, lowest
    assert leftovers(packs) == []

    over_the_disk = {MAX_ARCHIVE_VARIABLE: str(200 * GIB)}  # /huge.kpack declares 100 GiB
    run = run_kpack("install", hostile.url("/huge.kpack"), packs=packs, env=over_the_disk)
    message = one_line_error(run)
    assert re.search(r"/huge.kpack: it is 107,374,182,400 bytes, but the disk of .* free", message)
    assert leftovers(packs) == []


# --- a kill while unpacking ------------------------------------------------------------------


def with_a_large_database(archive: Path, path: Path, size: int) -> Path:
    """The archive with pack.db replaced by ``size`` zero bytes (a whole number of MiB), listed
    with their SHA-256: unpacking it takes a while, and the database check refuses it."""
    with tarfile.open(archive, "r:gz") as tar:
        header = json.loads(tar.extractfile(ARCHIVE_MANIFEST).read())
        files = {n: tar.extractfile(n).read() for n in header["files"] if n != "pack.db"}
    digest = hashlib.sha256()
    for _ in range(size // MIB):
        digest.update(bytes(MIB))
    header["files"]["pack.db"] = {"sha256": digest.hexdigest(), "size": size}
    data = json.dumps(header).encode()
    first = block(ARCHIVE_MANIFEST, len(data)) + padded(data) + block("pack.db", size)
    rest = b"".join(block(n, len(d)) + padded(d) for n, d in files.items()) + bytes(1024)
    return write_gzip(path, [(first, 1), *repeated(b"\0", size), (rest, 1)])


@pytest.mark.parametrize("replace", [False, True], ids=["new pack", "over a pack"])
def test_a_killed_install_leaves_nothing_the_next_one_does_not_remove(archive, tmp_path, replace):
    packs, junk = tmp_path / "packs", tmp_path / "junk.kpack"
    junk.write_bytes(b"not a tarball")
    big = with_a_large_database(archive, tmp_path / "big.kpack", 200 * MIB)
    if replace:
        install(archive, packs_root=packs)
        before = snapshot(packs)
        staged = "widgets/.versions/staging-install-*/pack.db"  # where a build stages
    else:
        staged = f"{STAGING_FOLDER}/*/pack/widgets/.versions/staging/pack.db"

    def unpacking() -> bool:
        return any(p.stat().st_size for p in packs.glob(staged))

    environment = {**os.environ, "KPACK_PACKS_DIR": str(packs)}
    command = [str(KPACK), "install", str(big), *(["--replace"] if replace else [])]
    client = subprocess.Popen(command, env=environment, stderr=subprocess.DEVNULL)
    try:
        wait_for(unpacking, "pack.db to be written")
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    assert list(packs.glob(staged))  # a kill runs no clean-up of its own
    if replace:
        assert snapshot(packs)[:2] == before[:2]  # the published version is untouched
        assert retrieval.search(packs / "widgets", QUESTION, k=3)
        # The next install over the pack (or build of it) removes the killed one's staging.
        assert install(archive, packs_root=packs, replace=True).version == 2
        assert not list((packs / "widgets" / ".versions").glob("staging*"))
    else:
        with pytest.raises(PackError, match="is not a kpack archive"):
            install(junk, packs_root=packs)
        assert [p.name for p in packs.iterdir()] == [STAGING_FOLDER]
    assert leftovers(packs) == []


def test_a_pull_stops_at_the_size_the_store_recorded(built, tmp_path):
    store = str(tmp_path / "store")
    pointer = remote.push("widgets", built, base=store)
    stored = tmp_path / "store" / "published" / "widgets" / pointer["archive"]
    with stored.open("ab") as grown:  # a store object that grew behind current.json's back
        grown.write(bytes(MIB))
    packs = tmp_path / "packs"
    with pytest.raises(
        PackError, match=rf"{pointer['archive']} is larger than {pointer['bytes']:,}"
    ):
        remote.pull("widgets", packs, base=store)
    assert leftovers(packs) == [] and [p.name for p in packs.iterdir()] == [STAGING_FOLDER]
