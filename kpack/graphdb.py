"""The one way to open a pack's Kuzu database, and the one way to write one.

Kuzu holds a file lock until both the connection and the database are closed, so every opener
here closes both; the extensions every pack uses (vector, full-text, algorithms) are loaded on
each connection.

A pack database is written in a child process (:func:`writing_graph`): Kuzu 0.11 answers some
write errors, a full disk among them, with a C++ ``terminate`` that aborts the whole process
(rc 134), which would take a build down without a record or a cleanup. In a child the abort is
an error of this build, reported in one line.

The child is bounded. On a nearly full disk Kuzu may instead spin without writing anything
more; a watchdog (:func:`_await_writer`) kills a writer that makes no progress (no byte fed
to it, no byte written to its database files) for FULL_DISK_STALL_S while the disk is low on
space, reported as a full disk, or for STALLED_S in any case. However the parent's wait ends
(the block raising, Ctrl-C), a writer still running is killed; and the child asks the kernel to
kill it when its parent dies (PR_SET_PDEATHSIG), so a killed build leaves no writer holding the
pack's database.
"""

from __future__ import annotations

import ctypes
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import kuzu
import pyarrow as pa

from kpack.contracts import KUZU_NODES, KUZU_RELS
from kpack.errors import PackError

EXTENSIONS = ("vector", "fts", "algo")
# Below this much free space a failed write is reported as a full disk: Kuzu's abort on ENOSPC
# hides the errno, and a write that failed with more room left than this had another cause.
LOW_SPACE_BYTES = 64 << 20
# A writer showing no progress this long is stuck: on a disk low on space (Kuzu spinning on
# ENOSPC), or whatever the disk. Writing a million-passage pack's largest table took under 5
# minutes on a loaded 2-core machine, feeding it or growing its files all along.
FULL_DISK_STALL_S = 15.0
STALLED_S = 600.0
WATCH_INTERVAL_S = 0.5
# prctl(2)'s option that sends a signal to this process when its parent dies (Linux).
PR_SET_PDEATHSIG = 1
PROJECT_ROOT = Path(__file__).resolve().parent.parent
IN_MEMORY = Path(":memory:")  # Kuzu's name for a database that lives in memory only


def connect(db_path: Path, read_only: bool) -> tuple[kuzu.Database, kuzu.Connection]:
    db = kuzu.Database(str(db_path), read_only=read_only)
    conn = kuzu.Connection(db)
    for extension in EXTENSIONS:
        conn.execute(f"LOAD {extension}")
    return db, conn


@contextmanager
def opened(db_path: Path, read_only: bool = True) -> Iterator[kuzu.Connection]:
    """A connection closed together with its database however the block ends."""
    db, conn = connect(db_path, read_only=read_only)
    try:
        yield conn
    finally:
        conn.close()
        db.close()


def graph_counts(conn: kuzu.Connection) -> dict[str, int]:
    """Rows of every node and relationship table, by table name."""
    counts = {}
    for table in KUZU_NODES:
        counts[table.name] = conn.execute(f"MATCH (n:{table.name}) RETURN count(n)").get_next()[0]
    for table in KUZU_RELS:
        counts[table.name] = conn.execute(
            f"MATCH ()-[r:{table.name}]->() RETURN count(r)"
        ).get_next()[0]
    return counts


def load_graph(db_path: Path, tables: Iterator[tuple[str, pa.Table]], dim: int) -> None:
    """Create the schema, COPY every table as it comes ((name, table) pairs, nodes first),
    checkpoint.

    No Kuzu vector or full-text index is created: queries read the version's own indexes
    (kpack.index_writer), and Kuzu's took 90 of the 98 seconds of writing a Python-docs-sized
    database (HNSW 57 s, FTS 33 s, +66 MB, measured on a loaded 2-core machine). A Cypher
    user creates them with CREATE_VECTOR_INDEX / CREATE_FTS_INDEX (docs/data-model.md)."""
    declared = {table.name: table for table in (*KUZU_NODES, *KUZU_RELS)}
    with opened(db_path, read_only=False) as conn:
        for table in declared.values():
            conn.execute(table.ddl(dim))
        for name, data in tables:
            table = declared[name]  # a name read from the pipe is only ever a declared table's
            if data.num_rows:
                conn.execute(f"COPY {table.name} FROM $data", {"data": data})
            del data  # one table in memory at a time
        conn.execute("CHECKPOINT")


def _copied(
    nodes: dict[str, pa.Table], rels: dict[str, pa.Table]
) -> Iterator[tuple[str, pa.Table]]:
    """(name, table) in the order load_graph copies them: node tables with their declared
    columns, then relationship tables."""
    for table in KUZU_NODES:
        yield table.name, nodes[table.name].select([c for c, _ in table.columns])
    for table in KUZU_RELS:
        yield table.name, rels[table.name]


@contextmanager
def writing_graph(
    db_path: Path, nodes: dict[str, pa.Table], rels: dict[str, pa.Table], dim: int
) -> Iterator[None]:
    """:func:`load_graph` in a child process while the block runs, so the caller's own work
    (a build writes the retrieval indexes) takes the other core meanwhile; raises PackError
    when the child fails or aborts, and kills it when the block raises.

    The tables travel through the child's stdin as Arrow IPC streams, one after another
    (no temporary files: the disk may be the thing that is full; no pickled copy of them
    all: a million-passage pack's tables are gigabytes), and the child holds one at a time.
    """
    inherited = os.environ.get("PYTHONPATH")
    path = os.pathsep.join([str(PROJECT_ROOT), *([inherited] if inherited else [])])
    env = {**os.environ, "PYTHONPATH": path}
    child = subprocess.Popen(
        [sys.executable, "-m", "kpack.graphdb", str(db_path), str(dim), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    errors: list[bytes] = []
    fed = _Counted(child.stdin)
    # Feeding stdin and draining stderr in threads of their own: neither pipe can fill and
    # stall the child while the block runs.
    drain = threading.Thread(target=lambda: errors.append(child.stderr.read()), daemon=True)
    feed = threading.Thread(target=_feed, args=(fed, nodes, rels), daemon=True)
    drain.start()
    feed.start()
    try:
        yield
        _await_writer(child, db_path, fed)
    finally:
        if child.poll() is None:  # the block raised, the watchdog fired, or Ctrl-C
            child.kill()
        feed.join()
        child.wait()
        drain.join()
    if child.returncode != 0:
        raise write_failure(db_path, child.returncode, b"".join(errors))


class _Counted(io.RawIOBase):
    """The child's stdin, counting the bytes written to it (the watchdog's sign of progress)."""

    def __init__(self, sink: IO[bytes]) -> None:
        super().__init__()
        self.sink, self.written = sink, 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.sink.write(data)
        self.written += memoryview(data).nbytes
        return len(data)

    def flush(self) -> None:
        if not self.closed:
            self.sink.flush()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.sink.close()


def _await_writer(child: subprocess.Popen, db_path: Path, fed: _Counted) -> None:
    """Wait for the writer child; kill it and raise PackError when it makes no progress (see
    the module docstring)."""
    last, last_change = None, time.monotonic()
    while child.poll() is None:
        with suppress(subprocess.TimeoutExpired):
            child.wait(WATCH_INTERVAL_S)
            break
        now = time.monotonic()
        progress = (fed.written, _written(db_path))
        if progress != last:
            last, last_change = progress, now
            continue
        stalled = now - last_change
        free = shutil.disk_usage(db_path.parent).free
        if free < LOW_SPACE_BYTES and stalled >= FULL_DISK_STALL_S:
            child.kill()
            raise PackError(
                f"no space left on device while writing the pack database in {db_path.parent} "
                f"({free / 2**20:.1f} MiB free; the writer made no progress for "
                f"{stalled:.0f} s); free some space and build again"
            )
        if stalled >= STALLED_S:
            child.kill()
            raise PackError(
                f"writing the pack database made no progress for {stalled:.0f} s; the writer "
                "was stopped (build again; if it recurs, report it with the pack's size)"
            )


def _written(db_path: Path) -> int:
    """The bytes of the database's files (the database, its write-ahead log, ...)."""
    total = 0
    for path in db_path.parent.glob(f"{db_path.name}*"):
        with suppress(OSError):  # a file Kuzu removed meanwhile
            total += path.stat().st_size
    return total


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux; elsewhere nothing), and
    exit now if the parent has died already."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(1)


def _feed(sink: _Counted, nodes: dict[str, pa.Table], rels: dict[str, pa.Table]) -> None:
    with suppress(BrokenPipeError):  # the child failed or was killed; its stderr says why
        for name, table in _copied(nodes, rels):
            _send(sink, name, table)
        sink.close()


def write_failure(db_path: Path, returncode: int, stderr: bytes) -> PackError:
    """The one-line error of a writer child that failed: a full disk named as such."""
    lines = stderr.decode(errors="replace").strip().splitlines()
    detail = lines[-1] if lines else _exit_reason(returncode)
    free = shutil.disk_usage(db_path.parent).free
    if "No space left" in detail or free < LOW_SPACE_BYTES:
        return PackError(
            f"no space left on device while writing the pack database in {db_path.parent} "
            f"({free / 2**20:.1f} MiB free); free some space and build again"
        )
    return PackError(f"writing the pack database failed: {detail}")


def _send(sink: _Counted, name: str, table: pa.Table) -> None:
    """One table as a line with its name, then its Arrow IPC stream."""
    sink.write(name.encode() + b"\n")
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def _received(source: IO[bytes]) -> Iterator[tuple[str, pa.Table]]:
    """The (name, table) pairs :func:`_send` wrote, read one at a time. Each is copied whole:
    copying a node table in slices (an append each) made a million-passage pack's database
    take 922 s instead of 282 s (one run each, loaded machine), for no lower peak: the
    MENTIONS copy sets it."""
    while name := source.readline().decode().strip():
        yield name, pa.ipc.open_stream(source).read_all()


def _exit_reason(returncode: int) -> str:
    if returncode < 0:
        return f"the writer process was killed by {signal.Signals(-returncode).name}"
    return f"the writer process exited with status {returncode}"


if __name__ == "__main__":  # the child of writing_graph: argv = database path, dimension, parent
    _die_with_parent(int(sys.argv[3]))
    try:
        load_graph(Path(sys.argv[1]), _received(sys.stdin.buffer), int(sys.argv[2]))
    except Exception as exc:  # one line for the parent; its traceback would say no more
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        sys.exit(1)
