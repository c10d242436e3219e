"""The one way to open a pack's Kuzu database, and the one way to write one.

Kuzu holds a file lock until both the connection and the database are closed, so every opener
here closes both; the extensions every pack uses (vector, full-text, algorithms) are loaded on
each connection.

A pack database is written in a child process (:func:`writing_graph`): Kuzu 0.11 answers some
write errors, a full disk among them, with a C++ ``terminate`` that aborts the whole process
(rc 134), which would take a build down without a record or a cleanup. In a child the abort is
an error of this build, reported in one line.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import kuzu
import pyarrow as pa

from kpack.contracts import KUZU_NODES, KUZU_RELS
from kpack.errors import PackError

EXTENSIONS = ("vector", "fts", "algo")
# Below this much free space a failed write is reported as a full disk: Kuzu's abort on ENOSPC
# hides the errno, and a write that failed with more room left than this had another cause.
LOW_SPACE_BYTES = 64 << 20
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


def load_graph(
    db_path: Path, nodes: dict[str, pa.Table], rels: dict[str, pa.Table], dim: int
) -> None:
    """Create the schema, COPY every table, checkpoint.

    No Kuzu vector or full-text index is created: queries read the version's own indexes
    (kpack.indexes), and Kuzu's took 90 of the 98 seconds of writing a Python-docs-sized
    database (HNSW 57 s, FTS 33 s, +66 MB, measured on a loaded 2-core machine). A Cypher
    user creates them with CREATE_VECTOR_INDEX / CREATE_FTS_INDEX (docs/data-model.md)."""
    with opened(db_path, read_only=False) as conn:
        for table in (*KUZU_NODES, *KUZU_RELS):
            conn.execute(table.ddl(dim))
        for table in KUZU_NODES:
            data = nodes[table.name].select([c for c, _ in table.columns])
            if data.num_rows:
                conn.execute(f"COPY {table.name} FROM $data", {"data": data})
        for table in KUZU_RELS:
            data = rels[table.name]
            if data.num_rows:
                conn.execute(f"COPY {table.name} FROM $data", {"data": data})
        conn.execute("CHECKPOINT")


@contextmanager
def writing_graph(
    db_path: Path, nodes: dict[str, pa.Table], rels: dict[str, pa.Table], dim: int
) -> Iterator[None]:
    """:func:`load_graph` in a child process while the block runs, so the caller's own work
    (a build writes the retrieval indexes) takes the other core meanwhile; raises PackError
    when the child fails or aborts, and kills it when the block raises.

    The tables travel pickled through the child's stdin (Arrow buffers, no temporary files:
    the disk may be the thing that is full).
    """
    payload = pickle.dumps((str(db_path), nodes, rels, dim), protocol=pickle.HIGHEST_PROTOCOL)
    inherited = os.environ.get("PYTHONPATH")
    path = os.pathsep.join([str(PROJECT_ROOT), *([inherited] if inherited else [])])
    env = {**os.environ, "PYTHONPATH": path}
    child = subprocess.Popen(
        [sys.executable, "-m", "kpack.graphdb"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    stderr: list[bytes] = []
    # communicate() feeds stdin and drains stderr together, so neither pipe can fill and
    # stall the child while the block runs.
    talker = threading.Thread(target=lambda: stderr.append(child.communicate(payload)[1]))
    talker.start()
    try:
        yield
    except BaseException:
        child.kill()
        raise
    finally:
        talker.join()
    if child.returncode != 0:
        raise write_failure(db_path, child.returncode, stderr[0] if stderr else b"")


def write_graph(
    db_path: Path, nodes: dict[str, pa.Table], rels: dict[str, pa.Table], dim: int
) -> None:
    """:func:`load_graph` in a child process, waited for (see :func:`writing_graph`)."""
    with writing_graph(db_path, nodes, rels, dim):
        pass


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


def _exit_reason(returncode: int) -> str:
    if returncode < 0:
        return f"the writer process was killed by {signal.Signals(-returncode).name}"
    return f"the writer process exited with status {returncode}"


if __name__ == "__main__":  # the child of write_graph
    try:
        path, node_tables, rel_tables, dimension = pickle.load(sys.stdin.buffer)
        load_graph(Path(path), node_tables, rel_tables, dimension)
    except Exception as exc:  # one line for the parent; its traceback would say no more
        print(f"{type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        sys.exit(1)
