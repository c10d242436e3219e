"""The graph writer child (`python -m kpack.graphdb`) is bounded (issue 36): a writer that
stalls on a nearly full disk is stopped with one line, Ctrl-C ends it, and a killed build
leaves no writer behind. A real child process, a real (tmpfs) nearly full disk, real signals."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

import retrieval
from kpack import graphdb
from kpack.contracts import KUZU_NODES, KUZU_RELS
from kpack.errors import PackError
from kpack.graphdb import writing_graph
from tests.conftest import TEST_FETCH, build, write_pack
from tests.test_damage import ANSWER, PAGES, QUESTION, fill, kpack, tmpfs

PROJECT = Path(__file__).resolve().parent.parent


HOLD_S = 10.0


class Held(dict):
    """Tables the writer gets only after HOLD_S: it has created its database and waits for
    them on its stdin meanwhile."""

    def __getitem__(self, key: str) -> pa.Table:
        time.sleep(HOLD_S) if not getattr(self, "given", False) else None
        self.given = True
        return super().__getitem__(key)


def held_tables() -> tuple[dict[str, pa.Table], dict[str, pa.Table]]:
    def empty(table) -> pa.Table:
        return pa.table({column: pa.array([], pa.null()) for column, _ in table.columns})

    return Held({t.name: empty(t) for t in KUZU_NODES}), {t.name: empty(t) for t in KUZU_RELS}


def stalled_writer(db_path: Path) -> psutil.Process:
    """The graph writer this process started, stopped (SIGSTOP) once it has created the
    database: from then on it makes no progress, as Kuzu spinning on a full disk."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):  # another child that just ended
                if "kpack.graphdb" in " ".join(child.cmdline()) and db_path.exists():
                    child.suspend()
                    return child
        time.sleep(0.01)
    raise AssertionError("no writer child created the database")


def gone(process: psutil.Process, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


@pytest.fixture
def nearly_full(tmp_path) -> Iterator[Path]:
    """A 16 MiB disk with 3 MiB free."""
    with tmpfs(tmp_path / "disk", "16m") as disk:
        fill(disk, leave_bytes=3 << 20)
        yield disk


def test_a_writer_stalled_on_a_nearly_full_disk_is_stopped_with_one_line(nearly_full, monkeypatch):
    monkeypatch.setattr(graphdb, "FULL_DISK_STALL_S", 2.0)
    nodes, rels = held_tables()
    outcome: list[BaseException | None] = []
    children: list[psutil.Process] = []

    def write() -> None:
        try:
            with writing_graph(nearly_full / "pack.db", nodes, rels, 8):
                children.append(stalled_writer(nearly_full / "pack.db"))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    thread.join(timeout=60)
    try:
        assert not thread.is_alive(), "the build waited on a stalled writer"
        error = outcome[0]
        assert isinstance(error, PackError), error
        message = str(error)
        assert message.startswith("no space left on device while writing the pack database")
        assert "made no progress" in message and "\n" not in message
        assert time.monotonic() - started < 30
        assert gone(children[0])
    finally:
        for child in children:
            if not gone(child, 0):
                child.kill()  # the writer the fix did not end


def test_ctrl_c_while_waiting_ends_the_writer(tmp_path):
    nodes, rels = held_tables()
    timer = threading.Timer(1.0, _thread.interrupt_main)
    child = None
    # Python's own Ctrl-C handler, which interrupt_main needs: a test run started in the
    # background of a script inherits SIGINT ignored, and the interrupt would never come.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with (
            pytest.raises(KeyboardInterrupt),
            writing_graph(tmp_path / "pack.db", nodes, rels, 8),
        ):
            child = stalled_writer(tmp_path / "pack.db")
            timer.start()
        assert gone(child)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handler)
        if child is not None and not gone(child, 0):
            child.kill()  # the writer the fix did not end


def test_a_killed_build_leaves_no_writer_behind(tmp_path):
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from tests.test_graph_writer import held_tables, stalled_writer
        from kpack.graphdb import writing_graph

        nodes, rels = held_tables()
        db_path = Path({str(tmp_path / "pack.db")!r})
        with writing_graph(db_path, nodes, rels, 8):
            print(stalled_writer(db_path).pid, flush=True)
            time.sleep(120)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    build = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env, cwd=PROJECT
    )
    try:
        child = psutil.Process(int(build.stdout.readline()))
        build.send_signal(signal.SIGKILL)
        build.wait(timeout=30)
        assert gone(child), "the writer outlived the killed build"
    finally:
        build.kill()
        build.wait()


def test_a_build_with_a_few_mib_free_ends_in_one_line_and_keeps_the_published_version(
    site, tmp_path
):
    """`kpack build --force` with 3 MiB free where the packs live: one line within a minute,
    no process of the build left, the published version still current and answering."""
    with tmpfs(tmp_path / "packs", "64m") as disk:
        folder = write_pack(tmp_path, "full", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
        assert build(tmp_path, "full").published
        fill(disk, leave_bytes=3 << 20)
        started = time.monotonic()
        done = kpack(tmp_path, "build", "full", "--force", "--no-progress")
        seconds = time.monotonic() - started
        said = " ".join(done.stderr.split())  # the terminal's wrapping undone
        assert done.returncode != 0 and "Traceback" not in said, said[-3000:]
        assert said.startswith("build of full failed: no space left on device"), said
        assert "v0001 stays current" in said
        assert seconds < 60, seconds
        leftover = [
            p.info["pid"]
            for p in psutil.process_iter(["pid", "cmdline"])
            if "kpack.graphdb" in " ".join(p.info["cmdline"] or ()) and str(disk) in str(p.info)
        ]
        assert leftover == []
        assert os.readlink(folder / ".versions" / "current") == "v0001"
        assert ANSWER in retrieval.query(folder, QUESTION, use_llm=False)["answer"]
