"""PackReader: one open published version of a pack, and the registry of open readers.

A reader owns everything a query needs from one version: its manifest, its settings (the
``config`` its manifest records, so a query never mixes the version with a later edit of
``kg_config.json``), the few-shot pool (read once when the reader opens), the read-only Kuzu
database (opened through kpack.graphdb, after kpack.store.verify_version passed: Kuzu crashes
the process on some damaged files instead of raising) and the tables every query reads (articles,
sections and their vectors, chunk texts and vectors, links, entities, facts), held in memory so
a query needs no database call: nearest vectors are found by an exact scan of the vectors held
(:meth:`PackReader.nearest`; about 2.5 ms for 10,000 vectors on one thread, where Kuzu's HNSW
index took 10 ms and returned approximate neighbours), keyword search by BM25 over the chunk
texts (retrieval.bm25). Kuzu serves the tables when the reader opens, the entity graph
(retrieval.graph) and related articles.

The process keeps at most one reader per pack: the reader of its current version. When a
newer version is published, the next :func:`checkout` opens it and retires the old reader,
which is closed as soon as the last query using it finishes (or after ``RETIRE_GRACE_S`` at
the latest), so a long-lived process does not keep superseded or pruned versions open.

Two things keep a long-lived reader lean: the Kuzu connection is reopened every
``RECYCLE_AFTER_QUERIES`` statements (see :meth:`PackReader._recycle_connection`), and the
reader's threads are sized for a machine it shares with other readers:
``KPACK_READER_THREADS`` (default 1) for Kuzu, for embedding and for vector scans.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kpack import settings as kpack_settings
from kpack.errors import PackError, PackNotReady
from kpack.packs import current_version, pack_dir

if TYPE_CHECKING:
    import kuzu

    from kpack.config import PackConfig

log = logging.getLogger(__name__)

RECYCLE_AFTER_QUERIES = 500
RETIRE_GRACE_S = 120.0
THREADS_ENV = "KPACK_READER_THREADS"
DEFAULT_THREADS = 1
FEW_SHOT_FILE = "few_shot_examples.json"
QUESTIONS_FILE = Path("eval") / "questions.jsonl"


@dataclass
class Article:
    url: str
    title: str
    category: str
    pagerank: float


@dataclass
class SectionInfo:
    section_id: str
    article_url: str
    heading: str
    title: str
    content: str
    word_count: int


def best_rows(scores: np.ndarray, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """The ``k`` rows (of ``rows``, default all) with the highest ``scores``, best first, ties
    by row: a partial sort, so ranking a few of thousands costs little."""
    rows = np.arange(len(scores)) if rows is None else rows
    if len(rows) > k:
        rows = rows[np.argpartition(-scores[rows], k - 1)[:k]]
    return rows[np.lexsort((rows, -scores[rows]))]


def reader_threads() -> int:
    """Threads one reader may use for Kuzu and for embedding: KPACK_READER_THREADS, else 1.

    Several query processes on a small machine each starting one thread per core slow every
    one of them down (issue 9: p50 285 ms with 4 readers on 2 cores, 47 ms with 1 thread
    each; embedding one question on a loaded 2-core machine: 0.07 s with one BLAS thread,
    0.4 to 2.6 s with two). A question is too small a job to gain from more.
    """
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return DEFAULT_THREADS
    if not raw.isdigit() or int(raw) < 1:
        raise PackError(f"{THREADS_ENV} must be a whole number of at least 1; got {raw!r}")
    return int(raw)


def pack_folder_of(db_path: str | Path) -> str | Path:
    """Accept a pack name, a pack folder, or the path of its pack.db (as the seed's examples do)."""
    path = Path(db_path)
    if path.name == "pack.db":
        path = path.parent
        while path.name != ".versions" and path.parent != path and not (path / "urls.txt").exists():
            path = path.parent
        return path.parent if path.name == ".versions" else path
    return db_path


def resolve_folder(pack: str | Path) -> Path:
    """The folder of a pack given by name, folder path, or pack.db path."""
    pack = pack_folder_of(pack)
    text = str(pack)
    if isinstance(pack, Path) or "/" in text:
        folder = Path(pack)
        if not (folder / "urls.txt").is_file():
            raise PackError(f"{folder} is not a pack folder (it has no urls.txt)")
        return folder.resolve()
    # A pack published only in the shared store (KPACK_STORAGE) is pulled here first. Imported
    # here: the store's client costs a third of a second that `import retrieval` need not pay.
    from kpack.remote import ensure_local

    ensure_local(text, kpack_settings.packs_dir())
    return pack_dir(text, kpack_settings.packs_dir())


def load_examples(folder: Path) -> list[dict]:
    """The few-shot pool: few_shot_examples.json, else the pack's eval questions with answers.

    A file that cannot be read as intended gives no examples (and a log line), never a failed
    query: examples shape an answer's form, they are not what it is made of.
    """
    curated = folder / FEW_SHOT_FILE
    if curated.is_file():
        try:
            data = json.loads(curated.read_bytes().decode("utf-8-sig"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            log.warning("%s is not usable (%s): no few-shot examples", curated, exc)
            return []
        items = data.get("examples", []) if isinstance(data, dict) else data
        items = items if isinstance(items, list) else []
        return [e for e in items if isinstance(e, dict) and e.get("question") and e.get("answer")]
    questions = folder / QUESTIONS_FILE
    if not questions.is_file():
        return []
    examples = []
    for line in questions.read_bytes().decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(item, dict) or item.get("out_of_domain"):
            continue
        answer = item.get("ground_truth") or (item.get("answers") or [None])[0]
        if isinstance(item.get("question"), str) and isinstance(answer, str) and answer:
            examples.append({"id": item.get("id"), "question": item["question"], "answer": answer})
    return examples


class PackReader:
    """One open published version: manifest, settings, database, in-memory tables, caches."""

    def __init__(self, folder: Path, version_dir: Path) -> None:
        self.folder = folder
        self.name = folder.name
        self.version_dir = version_dir
        self.threads = reader_threads()
        self.manifest = self._read_manifest()
        self.config = self._read_config()
        self.examples = load_examples(folder)
        self.articles: dict[str, Article] = {}
        self.sections: dict[str, SectionInfo] = {}
        self.section_ids: list[str] = []
        self.sections_of: dict[str, list[int]] = {}
        self.chunk_text: dict[str, str] = {}
        self.chunk_row: dict[str, int] = {}  # chunk_id -> row of chunk_vectors
        self.chunk_ids: list[str] = []  # row of chunk_vectors -> chunk_id
        self.neighbors: dict[str, list[str]] = {}  # LINKS_TO, both directions
        self.article_entities: dict[str, list[dict]] = {}  # most mentioned first
        self.section_facts: dict[str, list[str]] = {}
        self.cache: dict[str, object] = {}  # per-version results of stages (few-shot vectors)
        self._lock = threading.RLock()  # one Kuzu statement at a time; guards the state below
        self._statements = 0
        self._users = 0
        self._retired = False
        self.closed = False
        self._db: kuzu.Database | None = None
        self._conn: kuzu.Connection | None = None
        try:
            self._open_database()
            self._read_tables()
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            self.close()
            if isinstance(exc, PackNotReady):
                raise
            raise PackNotReady(
                f"pack {self.name!r} version {version_dir.name} cannot be opened ({exc}); "
                f"rebuild it with `kpack build {self.name}`"
            ) from exc

    def __repr__(self) -> str:
        state = "closed" if self.closed else "retired" if self._retired else "current"
        return f"<PackReader {self.name} {self.version_dir.name} ({state})>"

    def __enter__(self) -> PackReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening ---------------------------------------------------------------------------

    def _read_manifest(self) -> dict:
        path = self.version_dir / "manifest.json"
        try:
            manifest = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PackNotReady(
                f"pack {self.name!r} version {self.version_dir.name} has no readable "
                f"manifest.json ({exc}); rebuild it with `kpack build {self.name}`"
            ) from exc
        if not isinstance(manifest, dict) or not isinstance(manifest.get("embedding"), dict):
            raise PackNotReady(
                f"pack {self.name!r} version {self.version_dir.name} has an incomplete "
                f"manifest.json; rebuild it with `kpack build {self.name}`"
            )
        return manifest

    def _read_config(self) -> PackConfig:
        """The settings this version was built with (its manifest's ``config``)."""
        from kpack.config import PackConfig

        try:
            return PackConfig.model_validate(self.manifest.get("config") or {})
        except ValueError as exc:
            raise PackNotReady(
                f"pack {self.name!r} version {self.version_dir.name} records settings this "
                f"kpack cannot read ({str(exc).splitlines()[0]}); rebuild it with "
                f"`kpack build {self.name}`"
            ) from exc

    def _open_database(self) -> None:
        from kpack.graphdb import connect
        from kpack.store import verify_version

        verify_version(self.version_dir)
        self._db, self._conn = connect(self.version_dir / "pack.db", read_only=True)
        self._conn.set_max_threads_for_exec(self.threads)

    def _recycle_connection(self) -> None:
        """A fresh database and connection: frees what Kuzu keeps natively per statement.

        A question runs no statement (the reader holds what it searches), but related
        articles (retrieval.context_pack, 3 to 5 statements a call) and callers of
        :meth:`query` do, and kuzu 0.11.3 keeps native memory for every statement run with
        parameters until its connection closes. Measured on the demo pack, 2,000 runs each,
        with the heap trimmed before reading RSS: a one-parameter MATCH grew the process by
        69 MB (about 35 KB a statement), context_pack by 258 MB, and the same MATCH with its
        value written into the statement (no parameters) by nothing; reopening every 500
        statements held each under 2 MB.

        The old one is closed first (queries wait on the reader's lock meanwhile), and the C
        heap is trimmed, so the freed memory goes back to the system instead of raising the
        process's resident size by one more database each time."""
        if self._conn is not None:
            self._conn.close()
        if self._db is not None:
            self._db.close()
        self._db = self._conn = None
        release_free_memory()
        self._open_database()
        self._statements = 0

    def _read_tables(self) -> None:
        for url, title, category, rank in self.query(
            "MATCH (a:Article) RETURN a.url, a.title, a.category, a.pagerank"
        ):
            self.articles[url] = Article(url, title, category, rank or 0.0)
        dim = int(self.manifest["embedding"].get("dimension") or 0)
        rows = self.query(
            "MATCH (s:Section) RETURN s.section_id, s.article_url, s.heading_path, s.title, "
            "s.content, s.word_count, s.embedding ORDER BY s.section_id"
        )
        vectors = []
        for index, (sid, url, heading, title, content, words, vector) in enumerate(rows):
            self.sections[sid] = SectionInfo(sid, url, heading, title, content, words)
            self.section_ids.append(sid)
            self.sections_of.setdefault(url, []).append(index)
            vectors.append(vector)
        self.section_vectors = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), dim)
        chunk_vectors = []
        for row, (chunk_id, content, vector) in enumerate(
            self.query(
                "MATCH (c:Chunk) RETURN c.chunk_id, c.content, c.embedding ORDER BY c.chunk_id"
            )
        ):
            self.chunk_text[chunk_id] = content
            self.chunk_row[chunk_id] = row
            self.chunk_ids.append(chunk_id)
            chunk_vectors.append(vector)
        self.chunk_vectors = np.asarray(chunk_vectors, dtype=np.float32).reshape(
            len(chunk_vectors), dim
        )
        for source, target in self.query(
            "MATCH (a:Article)-[:LINKS_TO]->(b:Article) RETURN a.url, b.url"
        ):
            self.neighbors.setdefault(source, []).append(target)
            self.neighbors.setdefault(target, []).append(source)
        for url, name, kind, description in self.query(
            "MATCH (a:Article)-[:HAS_ENTITY]->(e:Entity) WHERE e.type <> 'topic' "
            "RETURN a.url, e.name, e.type, e.description ORDER BY e.mention_count DESC, e.name"
        ):
            self.article_entities.setdefault(url, []).append(
                {"name": name, "type": kind, "description": description}
            )
        for section_id, content in self.query(
            "MATCH (f:Fact) RETURN f.section_id, f.content ORDER BY f.fact_id"
        ):
            self.section_facts.setdefault(section_id, []).append(content)

    # -- reading ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.manifest["embedding"]["model"]

    @property
    def version(self) -> int:
        return int(self.manifest.get("version") or self.version_dir.name[1:])

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of texts, by the model this version was built with."""
        from retrieval.encoder import encoder_for

        return encoder_for(self.model_name).encode(texts, self.threads)

    def similarities(
        self, label: str, vector: np.ndarray, rows: np.ndarray | None = None
    ) -> np.ndarray:
        """Cosine similarities of a unit ``vector`` with the vectors of a table ("Chunk" or
        "Section"), all rows or ``rows``, on the reader's threads (BLAS on every core made a
        scan several times slower on a machine shared with other readers)."""
        from retrieval.encoder import blas_limit

        vectors = self.chunk_vectors if label == "Chunk" else self.section_vectors
        with blas_limit(self.threads):
            return (vectors if rows is None else vectors[rows]) @ vector

    def nearest(
        self, label: str, vector: np.ndarray, k: int, similarity: np.ndarray | None = None
    ) -> list[tuple[str, float]]:
        """The ``k`` nodes of a table ("Chunk" or "Section") nearest a unit ``vector``: (id,
        cosine similarity), best first, ties by table order; ``similarity`` is the vector's
        with every row, when the caller has it already. Exact, unlike the HNSW indexes of the
        pack (which remain for Cypher users)."""
        if similarity is None:
            similarity = self.similarities(label, vector)
        ids = self.chunk_ids if label == "Chunk" else self.section_ids
        return [(ids[row], float(similarity[row])) for row in best_rows(similarity, k)]

    def query(self, cypher: str, params: dict | None = None) -> list[list]:
        """Run one read statement (threads of a process share the connection, one at a time)."""
        with self._lock:
            if self.closed or self._conn is None:
                raise PackNotReady(
                    f"pack {self.name!r} version {self.version_dir.name} was replaced by a newer "
                    "version and closed; ask again to query the current one"
                )
            if self._statements >= RECYCLE_AFTER_QUERIES:
                self._recycle_connection()
            self._statements += 1
            return self._conn.execute(cypher, params or {}).get_all()

    # -- life cycle ------------------------------------------------------------------------

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._retired and self._users <= 0:
                self.close()

    def retire(self) -> None:
        """A newer version replaced this one: close now, or when its last query ends."""
        with self._lock:
            self._retired = True
            if self._users <= 0:
                self.close()
                return
        timer = threading.Timer(RETIRE_GRACE_S, self.close)
        timer.daemon = True
        timer.start()

    def close(self) -> None:
        """Close the database (idempotent); the reader answers no more queries."""
        with self._lock:
            self.closed = True
            conn, db, self._conn, self._db = self._conn, self._db, None, None
            if conn is not None:
                conn.close()
            if db is not None:
                db.close()
                release_free_memory()


def release_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc only; elsewhere nothing)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# -- the registry: one reader per pack, the current version's --------------------------------

_current: dict[Path, PackReader] = {}
_registry_lock = threading.Lock()


def checkout(pack: str | Path | PackReader) -> PackReader:
    """The reader of the pack's current version, marked in use: pair it with ``release()``.

    A reader that is passed in is used as it is (a caller pinning one version).
    """
    if isinstance(pack, PackReader):
        pack.acquire()
        return pack
    folder = resolve_folder(pack)
    version = current_version(folder)
    if version is None:
        raise PackNotReady(
            f"pack {folder.name!r} has not been built yet: run `kpack build {folder.name}`"
        )
    with _registry_lock:
        reader = _current.get(folder)
        if reader is None or reader.version_dir != version or reader.closed:
            fresh = PackReader(folder, version)
            _current[folder] = fresh
            if reader is not None:
                reader.retire()
            reader = fresh
        reader.acquire()
        return reader


@contextmanager
def reading(pack: str | Path | PackReader) -> Iterator[PackReader]:
    """``with reading("demo") as reader:`` the current version, held open for the block."""
    reader = checkout(pack)
    try:
        yield reader
    finally:
        reader.release()


def open_pack(pack: str | Path) -> PackReader:
    """The reader of the pack's current version (opened, or replaced by a newer one, as
    needed). It stays open while it is current; use :func:`reading` to hold a version open
    across a publish."""
    reader = checkout(pack)
    reader.release()
    return reader


def close_all() -> None:
    """Close every reader (at exit, or to make the next query read from disk afresh)."""
    with _registry_lock:
        readers = list(_current.values())
        _current.clear()
    for reader in readers:
        reader.close()


atexit.register(close_all)
