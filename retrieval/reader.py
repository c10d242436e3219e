"""PackReader: one open published version of a pack.

A reader owns everything a query needs from one version: its manifest, its settings (the
``config`` its manifest records, so a query never mixes the version with a later edit of
``kg_config.json``), the few-shot pool (read once when the reader opens), the read-only Kuzu
database (opened through kpack.graphdb on the first Cypher statement only, after
kpack.store.verify_version passed: Kuzu crashes the process on some damaged files instead of
raising; retrieval.kuzu_session) and the version's retrieval indexes (kpack.index_files:
articles, sections, chunk texts, vectors, keyword postings, links, entities and facts),
memory-mapped when the reader opens, so opening reads no table row by row and a query reads
only the rows it ranks: nearest vectors by an exact scan of the mapped vectors, or through the
version's faiss index above the ANN crossover (:meth:`PackReader.nearest`), keyword search by
BM25 over the mapped postings (kpack.keyword_index). Kuzu serves related articles and
``reader.query``.

What a stage loads or learns of a version (the entity graph, the identifiers the passages
write, ...) is its own: it keeps it with the version through :meth:`PackReader.memo`, one
value per function, so the reader knows no stage and no stage writes into the reader.

Readers are opened, shared and retired by the registry (retrieval.registry).

Two things keep a long-lived reader lean: the Kuzu connection is reopened every
``RECYCLE_AFTER_QUERIES`` statements (retrieval.kuzu_session), and the reader's threads are
sized for a machine it shares with other readers: ``KPACK_READER_THREADS`` (default 1) for
Kuzu, for embedding and for vector scans.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Container, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from kpack.errors import PackError, PackNotReady
from kpack.mapped_tables import read_into_cache
from kpack.packs import INDEX_DIR
from kpack.vector_index import nearest_rows
from retrieval.kuzu_session import KuzuSession

if TYPE_CHECKING:
    from kpack.config import PackConfig
    from kpack.docgraph import DocGraph
    from kpack.graph_evidence import GraphChoice
    from kpack.keyword_index import KeywordIndex
    from kpack.sentence_index import SentenceIndex
from retrieval.meaning import WordVectors

log = logging.getLogger(__name__)

T = TypeVar("T")
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
    word_count: int
    anchor: str | None = None  # its deep link's fragment (None: a version built without)


# What a SectionInfo holds, in its order; the text is reader.section_text's.
SECTION_INFO_COLUMNS = (
    "section_id",
    "article_url",
    "heading_path",
    "title",
    "word_count",
    "anchor",
)


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


BACKGROUND_NICE = 10  # the CPU priority of a reader's work in the background


def start_in_background(name: str, work: Callable[[], None]) -> None:
    """Run ``work`` on a daemon thread at a lower CPU priority (Linux gives each thread its own
    nice value), so that queries keep the cores: a server opening a new version
    (retrieval.registry), a reader reading its files into the page cache."""

    def run() -> None:
        with suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        work()

    threading.Thread(target=run, name=name, daemon=True).start()


# One version's index files read into the page cache at a time, process-wide: the first
# answers of several packs (a question asked of seven packs at once) do not make as many
# threads read gigabytes at once against the searches that follow.
_cache_reads = threading.Lock()


def _cache_index_files(folder: Path) -> None:
    with _cache_reads:
        read_into_cache(folder)


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
    """One open published version: manifest, settings, its mapped indexes (kpack.index_files)
    and, on first use, the database, the few-shot vectors and what stages keep (memo)."""

    def __init__(self, folder: Path, version_dir: Path) -> None:
        self.folder = folder
        self.name = folder.name
        self.version_dir = version_dir
        self.threads = reader_threads()
        self.manifest = self._read_manifest()
        self.config = self._read_config()
        self.examples = load_examples(folder)
        self._lock = threading.RLock()  # one Kuzu statement at a time; guards the state below
        self._users = 0
        self._retired = False
        self._files_cached = False  # read into the page cache after the first answer
        self.closed = False
        self._kuzu = KuzuSession(version_dir, self.threads)
        self._memos: dict[Callable[[PackReader], Any], Any] = {}
        self._memo_lock = threading.RLock()  # a memo's maker may ask for another memo
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
        """Map the version's index files (kpack.index_files): nothing is read row by row,
        and the pages are shared with every other process reading this version."""
        from kpack import index_files as ix
        from kpack import mapped_tables as mt
        from kpack.keyword_index import KeywordIndex
        from kpack.sentence_index import SentenceIndex
        from kpack.vector_index import load_ann

        folder = self.version_dir / INDEX_DIR
        articles = mt.load_table(folder, ix.ARTICLES)
        sections = mt.load_table(folder, ix.SECTIONS)
        chunks = mt.load_table(folder, ix.CHUNKS)
        article_keys = mt.keys_of(folder, ix.ARTICLES, articles)
        section_keys = mt.keys_of(folder, ix.SECTIONS, sections)
        chunk_keys = mt.keys_of(folder, ix.CHUNKS, chunks)
        self.articles: Mapping[str, Article] = mt.RowMap(articles, Article, article_keys)
        self.sections: Mapping[str, SectionInfo] = mt.RowMap(
            sections, SectionInfo, section_keys, SECTION_INFO_COLUMNS
        )
        self.section_text: Mapping[str, str] = mt.RowMap(sections, str, section_keys, ["content"])
        self.section_ids: Sequence[str] = section_keys.values
        self.section_row: Mapping[str, int] = mt.RowOf(section_keys)
        self.sections_of: Mapping[str, list[int]] = mt.RowsOf(
            mt.SortedKeys(sections["article_url"], mt.load_array(folder, ix.SECTIONS_BY_ARTICLE))
        )
        self.chunk_ids: Sequence[str] = chunk_keys.values  # row -> chunk id
        self.chunk_row: Mapping[str, int] = mt.RowOf(chunk_keys)
        self.chunk_text: Mapping[str, str] = mt.RowMap(chunks, str, chunk_keys, ["content"])
        self.neighbors: Mapping[str, list[str]] = mt.Neighbours(  # LINKS_TO, both directions
            article_keys,
            mt.load_array(folder, ix.LINK_OFFSETS),
            mt.load_array(folder, ix.LINK_TARGETS),
        )
        self.article_entities: Mapping[str, list[dict]] = mt.GroupMap(  # most mentioned first
            mt.load_table(folder, ix.ARTICLE_ENTITIES),
            lambda name, kind, description: {
                "name": name,
                "type": kind,
                "description": description,
            },
        )
        self.section_facts: Mapping[str, list[str]] = mt.GroupMap(
            mt.load_table(folder, ix.FACTS), lambda content: content
        )
        self.chunk_vectors = mt.load_array(folder, ix.CHUNK_VECTORS)
        self.section_vectors = mt.load_array(folder, ix.SECTION_VECTORS)
        # faiss IVF indexes, None for a table below the ANN crossover (kpack.vector_index).
        self.ann = load_ann(folder, ix.CHUNK_ANN, self.threads)
        self.section_ann = load_ann(folder, ix.SECTION_ANN, self.threads)
        self.keywords: KeywordIndex = KeywordIndex.load(folder)
        # The passages' sentences, None in a version built without (kpack.sentence_index).
        self.sentences: SentenceIndex | None = SentenceIndex.load(folder, len(self.chunk_ids))

    # -- reading ---------------------------------------------------------------------------

    def memo(self, make: Callable[[PackReader], T]) -> T:
        """What ``make(reader)`` gives for this version, made on first use and then kept with
        the reader (one value per function): how a stage keeps what it loads or learns of a
        version (retrieval.entity_graph's entity graph, which passages open inside code) without the reader knowing the stage. Made once even when
        queries ask for it at the same time."""
        with self._memo_lock:
            if make not in self._memos:
                self._memos[make] = make(self)
            return self._memos[make]

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

        return load_doc_graph(self.version_dir / INDEX_DIR, self.threads)

    @cached_property
    def identifiers(self) -> Container[str]:
        """The identifiers the version's passages write, lower case (kpack.identifier_index):
        where an identifier a question names is looked up. A version built before that index
        reads its passages once instead."""
        from kpack.identifier_index import load_identifier_index
        from kpack.text import written_identifiers

        index = load_identifier_index(self.version_dir / INDEX_DIR)
        return index if index is not None else written_identifiers(self.chunk_text.values())

    @cached_property
    def word_vectors(self) -> WordVectors | None:
        """The model's word vectors (retrieval.meaning), for how close an answer sentence's
        words come to the question's; None when the ONNX encoder does not run the model."""
        from retrieval.meaning import word_vectors_of

        return word_vectors_of(self.model_name)

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

    def nearest(
        self, label: str, vector: np.ndarray, k: int, scanned: np.ndarray | None = None
    ) -> list[tuple[str, float]]:
        """The ``k`` nodes of a table ("Chunk" or "Section") nearest a unit ``vector``: (id,
        cosine similarity), best first, ties by table order.

        A table with an ANN index (a pack above the ANN crossover) is searched there, and the
        candidates re-scored exactly; otherwise by an exact scan (kpack.vector_index.nearest_rows),
        on the reader's BLAS threads (set when it opened), or from ``scanned``, the vector's
        similarities with the whole table when the caller has them."""
        ids, vectors, ann = (
            (self.chunk_ids, self.chunk_vectors, self.ann)
            if label == "Chunk"
            else (self.section_ids, self.section_vectors, self.section_ann)
        )
        rows, similarity = nearest_rows(vectors, vector, k, ann, scanned)
        return [(ids[int(row)], float(s)) for row, s in zip(rows, similarity, strict=True)]

    def query(self, cypher: str, params: dict | None = None) -> list[list]:
        """Run one read statement (threads of a process share the connection, one at a time)."""
        with self._lock:
            if self.closed:
                raise PackNotReady(
                    f"pack {self.name!r} version {self.version_dir.name} was replaced by a newer "
                    "version and closed; ask again to query the current one"
                )
            return self._kuzu.execute(cypher, params)

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

    def answered(self) -> None:
        """A question was answered from this version (retrieval.agent). The first time, the
        version's index files are read into the page cache in the background: their maps read
        a page at a time (kpack.mapped_tables.map_file), so a cold first search read only its
        own rows, and the searches after it find every page in memory. Not before the first
        search: it would compete with it for the disk. Every search calls it: after the first,
        one attribute read, without waiting on the lock a Kuzu statement may hold."""
        if self._files_cached:
            return
        with self._lock:
            if self._files_cached or self.closed:
                return
            self._files_cached = True
        start_in_background(
            f"cache {self.name}", partial(_cache_index_files, self.version_dir / INDEX_DIR)
        )

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
            self._kuzu.close()
