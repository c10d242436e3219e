"""The one way to open a pack's Kuzu database.

Kuzu holds a file lock until both the connection and the database are closed, so every opener
here closes both; the extensions every pack uses (vector, full-text, algorithms) are loaded on
each connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import kuzu

EXTENSIONS = ("vector", "fts", "algo")


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
