"""A version's read-only Kuzu database, opened on its first statement and recycled.

No query stage needs Kuzu (a reader holds what it searches, memory-mapped), but related
articles (retrieval.context_pack) and callers of ``PackReader.query`` run Cypher statements.
The database is opened only then, after kpack.store.verify_version passed (Kuzu crashes the
process on some damaged files instead of raising), and reopened every
``RECYCLE_AFTER_QUERIES`` statements (see :meth:`KuzuSession._recycle`).
"""

from __future__ import annotations

import ctypes
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import kuzu

RECYCLE_AFTER_QUERIES = 500


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc only; elsewhere nothing)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class KuzuSession:
    """The database and connection of one version, on ``threads`` threads. Not thread-safe:
    its reader runs one statement at a time under its own lock."""

    def __init__(self, version_dir: Path, threads: int) -> None:
        self.version_dir = version_dir
        self.threads = threads
        self.statements = 0  # run on the current connection
        self.database: kuzu.Database | None = None
        self.connection: kuzu.Connection | None = None

    def execute(self, cypher: str, params: dict | None = None) -> list[list]:
        """Run one read statement, opening (or recycling) the connection first as needed."""
        if self.connection is None:
            self._open()
        elif self.statements >= RECYCLE_AFTER_QUERIES:
            self._recycle()
        self.statements += 1
        assert self.connection is not None
        return self.connection.execute(cypher, params or {}).get_all()

    def _open(self) -> None:
        from kpack.graphdb import connect
        from kpack.store import verify_version

        verify_version(self.version_dir)
        self.database, self.connection = connect(self.version_dir / "pack.db", read_only=True)
        self.connection.set_max_threads_for_exec(self.threads)

    def _recycle(self) -> None:
        """A fresh database and connection: frees what Kuzu keeps natively per statement.

        kuzu 0.11.3 keeps native memory for every statement run with parameters until its
        connection closes. Measured on the demo pack, 2,000 runs each, with the heap trimmed
        before reading RSS: a one-parameter MATCH grew the process by 69 MB (about 35 KB a
        statement), context_pack by 258 MB, and the same MATCH with its value written into
        the statement (no parameters) by nothing; reopening every 500 statements held each
        under 2 MB.

        The old one is closed first (queries wait on the reader's lock meanwhile), and the C
        heap is trimmed, so the freed memory goes back to the system instead of raising the
        process's resident size by one more database each time."""
        self.close()
        self._open()
        self.statements = 0

    def close(self) -> None:
        """Close the connection and the database (idempotent)."""
        connection, database, self.connection, self.database = (
            self.connection,
            self.database,
            None,
            None,
        )
        if connection is not None:
            connection.close()
        if database is not None:
            database.close()
            release_free_memory()
