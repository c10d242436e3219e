"""PackReader: one open published version of a pack, and the registry of open readers.

A reader owns everything a query needs from one version: its manifest, its settings (the
``config`` its manifest records, so a query never mixes the version with a later edit of
``kg_config.json``), the few-shot pool (read once when the reader opens), the read-only Kuzu
database (opened through kpack.graphdb on the first Cypher statement only, after
kpack.store.verify_version passed: Kuzu crashes the process on some damaged files instead of
raising) and the version's retrieval indexes (kpack.indexes: articles, sections, chunk texts,
vectors, keyword postings, links, entities, facts and the entity graph), memory-mapped when
the reader opens, so opening reads no table row by row and a query reads only the rows it
ranks: nearest vectors by an exact scan of the mapped vectors, or through the version's faiss
index above the ANN crossover (:meth:`PackReader.nearest`), keyword search by BM25 over the
mapped postings (retrieval.bm25). Kuzu serves related articles and ``reader.query``.

The process keeps at most one reader per pack: the reader of its current version. When a
newer version is published, the next :func:`checkout` of that pack opens it, warms it (the
functions in ``WARMERS`` run on it: retrieval registers a one-passage search, so the first
query's lazy work is done before any query uses it), and only then makes it current and
retires the old reader. A reader is reference counted (:meth:`PackReader.acquire` /
:meth:`PackReader.release`, or :func:`reading`): a retired one is closed when its last user
releases it, never while a query holds it, so a long-lived process does not keep superseded
or pruned versions open and never pulls one from under a query.

Each pack has its own lock, held only to look at or swap its reader, never while a version
opens: a pack whose new version is opening keeps answering from its old version meanwhile
(the first caller to see the new version opens it and waits for it; callers that come while
it opens get the old reader), and other packs are never touched.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kpack import settings as kpack_settings
from kpack.errors import PackError, PackNotReady
from kpack.indexes import nearest_rows
from kpack.packs import INDEX_DIR, current_version, pack_dir

if TYPE_CHECKING:
    import kuzu

    from kpack.config import PackConfig
    from kpack.docgraph import DocGraph
    from kpack.graph_evidence import GraphChoice
    from retrieval.bm25 import KeywordIndex
    from retrieval.graph import GraphIndex
from retrieval.meaning import WordVectors

log = logging.getLogger(__name__)

RECYCLE_AFTER_QUERIES = 500
BACKGROUND_NICE = 10  # the CPU priority of a server's thread that opens a new version
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
    """One open published version: manifest, settings, its mapped indexes (kpack.indexes)
    and, on first use, the database, the entity graph and the few-shot vectors."""

    def __init__(self, folder: Path, version_dir: Path) -> None:
        self.folder = folder
        self.name = folder.name
        self.version_dir = version_dir
        self.threads = reader_threads()
        self.manifest = self._read_manifest()
        self.config = self._read_config()
        self.examples = load_examples(folder)
        self._lock = threading.RLock()  # one Kuzu statement at a time; guards the state below
        self._statements = 0
        self._users = 0
        self._retired = False
        self.closed = False
        self._db: kuzu.Database | None = None
        self._conn: kuzu.Connection | None = None
        self._graph_choice: GraphChoice | None = None
        from kpack.store import verify_version  # pydantic: not for `import retrieval`
        from retrieval.encoder import use_blas_threads

        use_blas_threads(self.threads)
        try:
            verify_version(version_dir)
            self._map_indexes()
        except (OSError, RuntimeError, KeyError, ValueError, pa.ArrowException) as exc:
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

    def _map_indexes(self) -> None:
        """Map the version's index files (kpack.indexes): nothing is read row by row, and
        the pages are shared with every other process reading this version."""
        from kpack import indexes as ix
        from retrieval.bm25 import KeywordIndex

        folder = self.version_dir / INDEX_DIR
        articles = ix.load_table(folder, ix.ARTICLES)
        sections = ix.load_table(folder, ix.SECTIONS)
        chunks = ix.load_table(folder, ix.CHUNKS)
        article_keys = ix.keys_of(folder, ix.ARTICLES, articles)
        section_keys = ix.keys_of(folder, ix.SECTIONS, sections)
        chunk_keys = ix.keys_of(folder, ix.CHUNKS, chunks)
        self.articles: Mapping[str, Article] = ix.RowMap(articles, Article, article_keys)
        self.sections: Mapping[str, SectionInfo] = ix.RowMap(sections, SectionInfo, section_keys)
        self.section_ids: Sequence[str] = section_keys.values
        self.section_row: Mapping[str, int] = ix.RowOf(section_keys)
        self.sections_of: Mapping[str, list[int]] = ix.RowsOf(
            ix.SortedKeys(sections["article_url"], ix.load_array(folder, ix.SECTIONS_BY_ARTICLE))
        )
        self.chunk_ids: Sequence[str] = chunk_keys.values  # row -> chunk id
        self.chunk_row: Mapping[str, int] = ix.RowOf(chunk_keys)
        self.chunk_text: Mapping[str, str] = ix.RowMap(
            chunks, lambda _, content: content, chunk_keys
        )
        self.neighbors: Mapping[str, list[str]] = ix.Neighbours(  # LINKS_TO, both directions
            article_keys,
            ix.load_array(folder, ix.LINK_OFFSETS),
            ix.load_array(folder, ix.LINK_TARGETS),
        )
        self.article_entities: Mapping[str, list[dict]] = ix.GroupMap(  # most mentioned first
            ix.load_table(folder, ix.ARTICLE_ENTITIES),
            lambda name, kind, description: {
                "name": name,
                "type": kind,
                "description": description,
            },
        )
        self.section_facts: Mapping[str, list[str]] = ix.GroupMap(
            ix.load_table(folder, ix.FACTS), lambda content: content
        )
        self.chunk_vectors = ix.load_array(folder, ix.CHUNK_VECTORS)
        self.section_vectors = ix.load_array(folder, ix.SECTION_VECTORS)
        # faiss IVF indexes, None for a table below the ANN crossover (kpack.indexes).
        self.ann = ix.load_ann(folder, ix.CHUNK_ANN, self.threads)
        self.section_ann = ix.load_ann(folder, ix.SECTION_ANN, self.threads)
        self.keywords: KeywordIndex = KeywordIndex.load(folder)

    def _open_database(self) -> None:
        """Kuzu, opened on the first statement only: no query stage needs it."""
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

    # -- reading ---------------------------------------------------------------------------

    @cached_property
    def graph(self) -> GraphIndex | None:
        """The entity-passage graph the graph stages walk (retrieval.graph), loaded on first
        use; None for a version built without one."""
        from retrieval.graph import load_graph_index

        return load_graph_index(self)

    @property
    def graph_choice(self) -> GraphChoice:
        """Which graph stages this version runs by default, as its own evidence decided
        (kpack.graph_evidence). The build records it just after publishing, so until it has,
        every read looks again (one stat)."""
        from kpack.graph_evidence import read_choice

        if self._graph_choice is None:
            choice = read_choice(self.version_dir)
            if choice.source is None:
                return choice
            self._graph_choice = choice
        return self._graph_choice

    @cached_property
    def doc_graph(self) -> DocGraph | None:
        """The documentation graph (section links, definitions: kpack.docgraph) the
        documentation graph stage reads (retrieval.docgraph); None for a version built
        without one."""
        from kpack.docgraph import load_doc_graph

        return load_doc_graph(self.version_dir / INDEX_DIR)

    @cached_property
    def word_vectors(self) -> WordVectors | None:
        """The model's word vectors (retrieval.meaning), for how close an answer sentence's
        words come to the question's; None when the ONNX encoder does not run the model."""
        from retrieval.meaning import word_vectors_of

        return word_vectors_of(self.model_name)

    @cached_property
    def written_identifiers(self) -> frozenset[str]:
        """The identifiers the version's passages write (retrieval.extractive), collected on
        first use: where an identifier a question names is looked up."""
        from retrieval.key_items import written_identifiers

        return written_identifiers(self.chunk_text.values())

    @cached_property
    def code_starts(self) -> dict[str, bool]:
        """Which passages begin inside a code block, by passage id, learnt as offline answers
        read passages with their neighbours (retrieval.passage_context.passage_in_context)."""
        return {}

    @cached_property
    def example_vectors(self) -> np.ndarray:
        """Vectors of the few-shot pool's questions (retrieval.fewshot), embedded on first use:
        an answer without an LLM uses no examples and embeds nothing."""
        return self.embed([example["question"] for example in self.examples])

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
        "Section"), all rows or ``rows``, on the reader's BLAS threads (set when it opened:
        BLAS on every core made a scan several times slower on a machine shared with other
        readers)."""
        vectors = self.chunk_vectors if label == "Chunk" else self.section_vectors
        return (vectors if rows is None else vectors[rows]) @ vector

    def nearest(self, label: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The ``k`` nodes of a table ("Chunk" or "Section") nearest a unit ``vector``: (id,
        cosine similarity), best first, ties by table order.

        A table with an ANN index (a pack above the ANN crossover) is searched there, and the
        candidates re-scored exactly; otherwise by an exact scan (kpack.indexes.nearest_rows),
        on the reader's BLAS threads (set when it opened)."""
        ids, vectors, ann = (
            (self.chunk_ids, self.chunk_vectors, self.ann)
            if label == "Chunk"
            else (self.section_ids, self.section_vectors, self.section_ann)
        )
        rows, similarity = nearest_rows(vectors, vector, k, ann)
        return [(ids[int(row)], float(s)) for row, s in zip(rows, similarity, strict=True)]

    def query(self, cypher: str, params: dict | None = None) -> list[list]:
        """Run one read statement (threads of a process share the connection, one at a time)."""
        with self._lock:
            if self.closed:
                raise PackNotReady(
                    f"pack {self.name!r} version {self.version_dir.name} was replaced by a newer "
                    "version and closed; ask again to query the current one"
                )
            if self._conn is None:
                self._open_database()
            elif self._statements >= RECYCLE_AFTER_QUERIES:
                self._recycle_connection()
            self._statements += 1
            return self._conn.execute(cypher, params or {}).get_all()

    # -- life cycle ------------------------------------------------------------------------

    @property
    def users(self) -> int:
        """How many holders (queries, callers of :func:`reading`) have it checked out now."""
        return self._users

    def acquire(self) -> None:
        """Mark the reader in use: it is not closed before the matching :meth:`release`."""
        with self._lock:
            if self.closed:
                raise PackNotReady(
                    f"pack {self.name!r} version {self.version_dir.name} was replaced by a newer "
                    "version and closed; ask again to query the current one"
                )
            self._users += 1

    def release(self) -> None:
        """The end of one use; the last user of a retired reader closes it."""
        with self._lock:
            self._users -= 1
            if self._retired and self._users <= 0:
                self.close()

    def retire(self) -> None:
        """A newer version replaced this one: close now, or when its last user releases it."""
        with self._lock:
            self._retired = True
            if self._users <= 0:
                self.close()

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

# Run on every newly opened reader before it serves (in order; an exception fails the open):
# the lazy work of a first query is done here, not in the first request after a publish.
# retrieval registers a one-passage search; a server or a test may add its own.
WARMERS: list[Callable[[PackReader], object]] = []


@dataclass
class _PackSlot:
    """One pack's current reader; ``changed`` (with its lock) guards it and the open under way."""

    changed: threading.Condition = field(default_factory=threading.Condition)
    reader: PackReader | None = None
    opening: Path | None = None  # the version a thread is opening now, outside the lock
    failed: Path | None = None  # a version whose open failed (not tried again in the background)


# Servers set this (open_versions_in_background): a new version is then opened and warmed by a
# thread of its own, at a lower CPU priority, while the old version answers every request, so
# no request pays for an open and the other packs' requests keep the cores. Elsewhere (a
# notebook, the CLI) the first caller opens it and waits, so a query right after a build
# answers from the new version.
_background_opens = False

_slots: dict[Path, _PackSlot] = {}
_slots_lock = threading.Lock()  # only to find or add a pack's slot; never held while opening


def _slot(folder: Path) -> _PackSlot:
    with _slots_lock:
        return _slots.setdefault(folder, _PackSlot())


def open_warm(folder: Path, version: Path) -> PackReader:
    """A new reader of ``version``, with every warmer run on it (closed again if one fails)."""
    reader = PackReader(folder, version)
    try:
        for warm in WARMERS:
            warm(reader)
    except BaseException:
        reader.close()
        raise
    return reader


def open_versions_in_background(enabled: bool = True) -> bool:
    """Whether this process opens new versions in the background (see ``_background_opens``);
    returns what it was."""
    global _background_opens
    was, _background_opens = _background_opens, enabled
    return was


def checkout(pack: str | Path | PackReader) -> PackReader:
    """The reader of the pack's current version, marked in use: pair it with ``release()``.

    A reader that is passed in is used as it is (a caller pinning one version). A version not
    open yet is opened and warmed by the first caller that asks for it, holding no lock: callers
    of the same pack that come meanwhile get the previous version's reader (when there is one),
    callers of other packs never wait for it. In a server (:func:`open_versions_in_background`)
    a thread of its own opens it, and the previous version answers every caller until it is
    warm; a version whose open failed there is not tried again (the log says why).
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
    slot = _slot(folder)
    with slot.changed:
        while True:
            reader = slot.reader
            if reader is not None and reader.version_dir == version and not reader.closed:
                reader.acquire()
                return reader
            serving = reader is not None and not reader.closed
            if _background_opens and serving:
                if slot.opening is None and slot.failed != version:
                    slot.opening = version
                    threading.Thread(
                        target=_open_in_background,
                        args=(slot, folder, version),
                        name=f"open {folder.name}",
                        daemon=True,
                    ).start()
                reader.acquire()
                return reader
            if slot.opening is None:
                slot.opening = version
                break
            if serving:
                reader.acquire()  # another thread opens the new version: answer from this one
                return reader
            slot.changed.wait()
    fresh = _open_into(slot, folder, version)
    fresh.acquire()
    return fresh


def _open_into(slot: _PackSlot, folder: Path, version: Path) -> PackReader:
    """Open and warm ``version``, make it the slot's reader and retire the one it replaces."""
    try:
        fresh = open_warm(folder, version)
    except BaseException:
        with slot.changed:
            slot.opening, slot.failed = None, version
            slot.changed.notify_all()
        raise
    with slot.changed:
        previous, slot.reader, slot.opening, slot.failed = slot.reader, fresh, None, None
        slot.changed.notify_all()
    if previous is not None:
        previous.retire()
    return fresh


def _open_in_background(slot: _PackSlot, folder: Path, version: Path) -> None:
    # Linux gives each thread its own nice value: the open yields the cores to requests.
    with suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    try:
        _open_into(slot, folder, version)
    except Exception as exc:  # the old version keeps answering; the log says why
        log.error("pack %r version %s could not be opened: %s", folder.name, version.name, exc)


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
    """Retire every reader (at exit, or to make the next query read from disk afresh): those
    not in use close now, those in use when their last user releases them."""
    with _slots_lock:
        slots = list(_slots.values())
        _slots.clear()
    for slot in slots:
        with slot.changed:
            reader, slot.reader = slot.reader, None
        if reader is not None:
            reader.retire()


atexit.register(close_all)
