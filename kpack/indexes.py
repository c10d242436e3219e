"""The retrieval indexes of a pack version: build artifacts a reader memory-maps (issue 20).

The build (assets.graph.pack_graph) writes them into the staged version folder, under
``indexes/``, from the Arrow tables it loads into Kuzu (never read back from Kuzu);
kpack.store.seal_version stamps the size and SHA-256 of every file into the manifest and
kpack.store.verify_version checks them as it checks pack.db. A reader
(retrieval.reader.PackReader) opens them without reading any table row by row:

- ``chunk_vectors.npy`` / ``section_vectors.npy``: float32 unit vectors, one row per chunk
  (section) in id order, opened with ``np.load(mmap_mode="r")``;
- ``chunk_vectors.faiss`` / ``section_vectors.faiss``: an approximate-nearest-neighbour index
  over the vectors, written only for tables of at least :func:`ann_min_vectors` rows (below
  that an exact scan is faster): a faiss ``IndexIVFFlat`` over inner product (the cosine of
  unit vectors), its ~4 sqrt(N) lists trained by spherical k-means on a seeded sample. A
  reader maps it (:func:`load_ann`, zero copy), probes the ``IVF_PROBES`` lists nearest the
  question and re-scores the best ``ANN_RESCORED`` candidates exactly against the mapped
  float32 matrix, so an ANN hit has the exact scan's score and order. An IVF, not a graph
  (HNSW): on a pack with many near-duplicate passages (versioned pages, or the scale
  benchmark's copies) usearch's HNSW found 0.43 of the exact top 10 at a million vectors and
  took 10 to 17 minutes to build on two cores; near-duplicates share an inverted list, and a
  flat list is scanned exactly. faiss replaced a hand-written numpy k-means with the same
  lists: a maintained library, its k-means, list storage and scan in C++;
- ``chunks.arrow``, ``sections.arrow``, ``articles.arrow``, ``article_entities.arrow``,
  ``facts.arrow``: Arrow IPC files sorted by their key, opened with ``pa.memory_map`` (zero
  copy) and looked up by binary search on the key column, so a query reads the rows of its
  top k only; ``sections_by_article.npy`` orders the sections by article for the same search,
  and ``links_offsets.npy`` / ``links_targets.npy`` hold the article links (both directions)
  as CSR over article rows;
- ``keyword_*.npy``: the keyword index (retrieval.bm25). The vocabulary is one UTF-8 byte
  string (``keyword_vocabulary.npy``) with term offsets, sorted, searched by bisection: no
  Python dict is built at open (bm25s loads its vocabulary from JSON into a dict, O(vocabulary)
  at every open, a second or more at a million passages). Postings are CSC-like: per term an
  offset into ``keyword_rows.npy`` (chunk rows, ascending) and ``keyword_weights.npy`` (the
  BM25 weight of the term in that passage, Okapi BM25 as Lucene computes it).

Several processes opening the same version share these pages (read-only maps of one file).
"""

from __future__ import annotations

import bisect
import math
import os
from array import array as flat_array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kpack.docgraph import DOC_GRAPH_FILES
from kpack.packs import INDEX_DIR
from kpack.text import search_terms, words

if TYPE_CHECKING:
    import faiss

    from kpack.graph import EntityGraph

CHUNK_VECTORS = "chunk_vectors.npy"
SECTION_VECTORS = "section_vectors.npy"
CHUNK_ANN = "chunk_vectors.faiss"
SECTION_ANN = "section_vectors.faiss"
ANN_FILES = {CHUNK_VECTORS: CHUNK_ANN, SECTION_VECTORS: SECTION_ANN}  # vectors -> their index
CHUNKS = "chunks.arrow"
SECTIONS = "sections.arrow"
SECTIONS_BY_ARTICLE = "sections_by_article.npy"
ARTICLES = "articles.arrow"
ARTICLE_ENTITIES = "article_entities.arrow"
FACTS = "facts.arrow"
LINK_OFFSETS = "links_offsets.npy"
LINK_TARGETS = "links_targets.npy"
KEYWORD_VOCABULARY = "keyword_vocabulary.npy"
KEYWORD_TERM_OFFSETS = "keyword_term_offsets.npy"
KEYWORD_OFFSETS = "keyword_offsets.npy"
KEYWORD_ROWS = "keyword_rows.npy"
KEYWORD_WEIGHTS = "keyword_weights.npy"
KEYWORD_LENGTHS = "keyword_lengths.npy"
ENTITIES = "entities.arrow"
# Keyed tables (sorted by their first column, one row per key) -> their key hashes' file.
KEY_HASHES = {
    CHUNKS: "chunks_key_hashes.npy",
    SECTIONS: "sections_key_hashes.npy",
    ARTICLES: "articles_key_hashes.npy",
    ENTITIES: "entities_key_hashes.npy",
}
LONGEST_NAME_KEY = "longest_name"  # entities.arrow metadata: the longest name, in words
GRAPH_INDPTR = "graph_indptr.npy"
GRAPH_INDICES = "graph_indices.npy"
GRAPH_WEIGHTS = "graph_weights.npy"
GRAPH_TRANSITION = "graph_transition.npy"
GRAPH_ARTICLE_OF = "graph_article_of.npy"
GRAPH_TITLE_ENTITY = "graph_title_entity.npy"
GRAPH_PASSAGES_OF_ENTITY = "graph_passages_of_entity.npy"
GRAPH_ABOUT_KEYS = "graph_about_keys.npy"
GRAPH_ABOUT_OFFSETS = "graph_about_offsets.npy"
GRAPH_ABOUT_PASSAGES = "graph_about_passages.npy"
GRAPH_FILES = (
    GRAPH_INDPTR,
    GRAPH_INDICES,
    GRAPH_WEIGHTS,
    GRAPH_TRANSITION,
    GRAPH_ARTICLE_OF,
    GRAPH_TITLE_ENTITY,
    GRAPH_PASSAGES_OF_ENTITY,
    GRAPH_ABOUT_KEYS,
    GRAPH_ABOUT_OFFSETS,
    GRAPH_ABOUT_PASSAGES,
)
KEYWORD_FILES = (
    KEYWORD_VOCABULARY,
    KEYWORD_TERM_OFFSETS,
    KEYWORD_OFFSETS,
    KEYWORD_ROWS,
    KEYWORD_WEIGHTS,
    KEYWORD_LENGTHS,
)
# Every file a version's index folder may hold (the ANN index only in larger packs).
INDEX_FILES = (
    CHUNK_VECTORS,
    SECTION_VECTORS,
    *ANN_FILES.values(),
    CHUNKS,
    SECTIONS,
    SECTIONS_BY_ARTICLE,
    ARTICLES,
    ARTICLE_ENTITIES,
    FACTS,
    LINK_OFFSETS,
    LINK_TARGETS,
    ENTITIES,
    *KEY_HASHES.values(),
    *GRAPH_FILES,
    *KEYWORD_FILES,
    *DOC_GRAPH_FILES,
)

ANN_MIN_VECTORS_ENV = "KPACK_ANN_MIN_VECTORS"
# Below this many chunks the exact scan answers faster than the ANN index plus re-scoring (measured by
# bench/scale_bench.py: on one thread the exact scan of 20,000 vectors takes about 2 ms).
DEFAULT_ANN_MIN_VECTORS = 50_000
# The IVF index (see the module docstring), chosen on the Python docs pack's real vectors
# replicated to 100,000 (bench/scale_bench.py): 4 sqrt(N) lists and 32 probed found 0.9975 of
# the exact top 10 for the python_docs_qa questions, scanning 3% of the vectors. Training on
# 64 vectors per list, or for more rounds, took twice as long and found no more.
IVF_LISTS_PER_SQRT = 4
IVF_PROBES = 32
IVF_TRAINING_PER_LIST = 32  # k-means trains on this many sampled vectors per list ...
IVF_ITERATIONS = 8  # ... for this many rounds
IVF_SEED = 0
# The index's best this many candidates are re-scored exactly (a flat list's scores are
# exact already; re-scoring against the mapped matrix makes them the exact scan's to the bit,
# and orders ties by row).
ANN_RESCORED = 256
# Keyword search takes at most this many passages per question term, the term's heaviest
# (KeywordIndex.search): every passage of every term of a pack of up to this size.
KEYWORD_TERM_CANDIDATES = 20_000
VECTOR_BLOCK = 65_536  # rows of vectors copied at a time when they are saved
STRING_BLOCK = 10_000  # texts converted to Python strings at a time

RELATION_WEIGHT = 0.5  # an ENTITY_RELATION edge of the graph, against 1 for a mention
K1 = 1.2  # BM25 as Lucene and Kuzu compute it
B = 0.75


def ann_min_vectors() -> int:
    """How many chunks a pack needs before its build writes an ANN index:
    KPACK_ANN_MIN_VECTORS, else :data:`DEFAULT_ANN_MIN_VECTORS`."""
    raw = os.environ.get(ANN_MIN_VECTORS_ENV, "").strip()
    return int(raw) if raw.isdigit() else DEFAULT_ANN_MIN_VECTORS


# -- writing ---------------------------------------------------------------------------------


def _save_vectors(path: Path, column: pa.ChunkedArray, order: pa.Array, dim: int) -> None:
    """A fixed-size-list vector column, rows in ``order``, saved as a (rows, dim) float32 .npy
    file. Written in blocks into the mapped file: a million vectors are 1.5 GB, which the
    build should not hold twice more in memory."""
    flat = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    source = np.asarray(flat, dtype=np.float32).reshape(len(column), dim)
    rows = order.to_numpy()
    saved = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(len(rows), dim))
    for start in range(0, len(rows), VECTOR_BLOCK):
        saved[start : start + VECTOR_BLOCK] = source[rows[start : start + VECTOR_BLOCK]]
    saved.flush()
    del saved


def key_hash(key: str) -> int:
    """A key's 64-bit hash, the same in every process (Python's hash() is salted per process)."""
    return int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "little")


def write_keyed(folder: Path, name: str, table: pa.Table) -> None:
    """A table sorted by its unique first column, and that column's key hashes (KEY_HASHES):
    hashed a block at a time, sorted once."""
    write_arrow(folder / name, table)
    hashes = np.fromiter(
        (key_hash(key) for key in _strings(table.column(0))), np.uint64, table.num_rows
    )
    order = np.argsort(hashes, kind="stable")
    np.save(folder / KEY_HASHES[name], np.stack([hashes[order], order.astype(np.uint64)]))


def write_arrow(path: Path, table: pa.Table) -> None:
    """A table as one record batch (a reader maps each column as one array, no copy); string
    columns too large for 32-bit offsets become large strings."""
    large = pa.schema(
        [
            field.with_type(pa.large_string())
            if pa.types.is_string(field.type)
            and sum(c.buffers()[2].size for c in table[field.name].chunks if c.buffers()[2])
            >= 2**31
            else field
            for field in table.schema
        ],
        metadata=table.schema.metadata,
    )
    table = table.cast(large).combine_chunks()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))


def write_indexes(
    folder: Path,
    articles: pa.Table,
    sections: pa.Table,
    chunks: pa.Table,
    links: pa.Table,
    entities: pa.Table,
    entity_mentions: pa.Table,
    mentions: pa.Table,
    relations: pa.Table,
    facts: pa.Table,
    dim: int,
) -> None:
    """Write every index file of a version into ``folder/indexes``: the build's own tables
    (kpack.contracts), ``sections`` and ``chunks`` with an ``embedding`` column (fixed-size
    lists of ``dim`` floats) and ``articles`` with their ``pagerank``."""
    out = folder / INDEX_DIR
    out.mkdir(parents=True, exist_ok=True)
    chunk_order = pc.sort_indices(chunks["chunk_id"])
    section_order = pc.sort_indices(sections["section_id"])
    _save_vectors(out / CHUNK_VECTORS, chunks["embedding"], chunk_order, dim)
    _save_vectors(out / SECTION_VECTORS, sections["embedding"], section_order, dim)
    for vectors, ann in ANN_FILES.items():
        if len(load_array(out, vectors)) >= ann_min_vectors():
            write_ann(out / ann, load_array(out, vectors))
    chunks = chunks.select(["chunk_id", "article_url", "content"]).take(chunk_order)
    sections = sections.select(
        ["section_id", "article_url", "heading_path", "title", "content", "word_count", "anchor"]
    ).take(section_order)
    articles = articles.sort_by("url")
    write_keyed(out, CHUNKS, chunks.select(["chunk_id", "content"]))
    write_keyed(out, SECTIONS, sections)
    np.save(
        out / SECTIONS_BY_ARTICLE,
        np.asarray(pc.sort_indices(sections["article_url"]), dtype=np.int64),
    )
    write_keyed(
        out,
        ARTICLES,
        articles.set_column(
            articles.schema.get_field_index("pagerank"),
            "pagerank",
            pc.fill_null(articles["pagerank"], 0.0),
        )
        .select(["url", "title", "category", "pagerank"])
        .cast(
            pa.schema(
                [
                    ("url", pa.string()),
                    ("title", pa.string()),
                    ("category", pa.string()),
                    ("pagerank", pa.float64()),
                ]
            )
        ),
    )
    article_entities = (
        entity_mentions.group_by(["article_url", "entity_id"])
        .aggregate([])
        .join(entities, "entity_id")
    )
    write_arrow(
        out / ARTICLE_ENTITIES,
        article_entities.filter(pc.not_equal(article_entities["type"], "topic"))
        .sort_by(
            [("article_url", "ascending"), ("mention_count", "descending"), ("name", "ascending")]
        )
        .select(["article_url", "name", "type", "description"]),
    )
    write_arrow(
        out / FACTS,
        facts.sort_by([("section_id", "ascending"), ("fact_id", "ascending")]).select(
            ["section_id", "content"]
        ),
    )
    offsets, targets = _link_csr(articles["url"], links)
    np.save(out / LINK_OFFSETS, offsets)
    np.save(out / LINK_TARGETS, targets)
    for name, array in keyword_postings(_strings(chunks["content"])).items():
        np.save(out / name, array)
    _write_graph(out, chunks, articles, entities, mentions, links, relations)


def _write_graph(
    out: Path,
    chunks: pa.Table,
    articles: pa.Table,
    entities: pa.Table,
    mentions: pa.Table,
    links: pa.Table,
    relations: pa.Table,
) -> None:
    """The entity-passage graph (kpack.graph) as CSR arrays: passage node i is chunk row i,
    entity node ``len(chunks) + j`` is row j of entities.arrow (sorted by key)."""
    from kpack.graph import build_entity_graph
    from kpack.text import normalize_entity

    entities = entities.select(["entity_id", "name"]).sort_by("entity_id")
    titles = {
        url: normalize_entity(title or "")
        for url, title in zip(
            articles["url"].to_pylist(), articles["title"].to_pylist(), strict=True
        )
    }
    graph = build_entity_graph(
        chunks.select(["chunk_id", "article_url"]),
        entities,
        mentions.select(["chunk_id", "entity_id", "named"]),
        titles=titles,
        links=links.select(["source_url", "target_url"]),
        relations=relations.select(["source_id", "target_id"]),
        relation_weight=RELATION_WEIGHT,
    )
    write_keyed(
        out,
        ENTITIES,
        entities.replace_schema_metadata({LONGEST_NAME_KEY: str(graph.longest_name)}),
    )
    about = graph.about
    arrays = {
        GRAPH_INDPTR: graph.adjacency.indptr,
        GRAPH_INDICES: graph.adjacency.indices,
        GRAPH_WEIGHTS: graph.adjacency.data.astype(np.float32),
        GRAPH_TRANSITION: graph.transition.data,
        GRAPH_ARTICLE_OF: graph.article_of,
        GRAPH_TITLE_ENTITY: graph.title_entity,
        GRAPH_PASSAGES_OF_ENTITY: graph.passages_of_entity,
        GRAPH_ABOUT_KEYS: about.keys,
        GRAPH_ABOUT_OFFSETS: about.offsets,
        GRAPH_ABOUT_PASSAGES: about.values,
    }
    for name, array in arrays.items():
        np.save(out / name, array)


def write_ann(path: Path, vectors: np.ndarray) -> None:
    """The IVF index of unit ``vectors`` (see the module docstring) written to ``path``:
    trained on a seeded sample, the rows added a block at a time (a million mapped vectors
    are never copied whole; the index itself holds them once, 1.5 GB at a million)."""
    import faiss

    rng = np.random.default_rng(IVF_SEED)
    count, dim = vectors.shape
    lists = max(1, min(count, round(IVF_LISTS_PER_SQRT * math.sqrt(count))))
    sampled = rng.choice(count, min(count, lists * IVF_TRAINING_PER_LIST), replace=False)
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
    index.cp.niter = IVF_ITERATIONS
    index.cp.seed = IVF_SEED
    index.cp.spherical = True
    index.cp.max_points_per_centroid = IVF_TRAINING_PER_LIST  # the sample is the whole set
    index.cp.min_points_per_centroid = 1  # a small table has few vectors per list: no warning
    index.train(np.ascontiguousarray(vectors[np.sort(sampled)], dtype=np.float32))
    for start in range(0, count, VECTOR_BLOCK):
        index.add(np.ascontiguousarray(vectors[start : start + VECTOR_BLOCK], dtype=np.float32))
    faiss.write_index(index, str(path))


def load_ann(folder: Path, name: str, threads: int = 1) -> faiss.Index | None:
    """The ANN index saved as ``name``, served from the memory-mapped file, or None when the
    version has none (a small pack). faiss runs on ``threads`` OpenMP threads in this thread
    (a question is one query, which faiss scans on one thread anyway).

    ``IO_FLAG_MMAP_IFC`` maps the whole file and reads the lists in place (zero copy).
    Not ``IO_FLAG_MMAP``: it serves the lists as OnDiskInvertedLists, which start 32 prefetch
    threads for every search, 3.3 ms a question against 0.37 ms at 100,000 vectors."""
    path = folder / name
    if not path.is_file():
        return None
    import faiss

    faiss.omp_set_num_threads(threads)
    index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)
    index.nprobe = IVF_PROBES
    return index


def _link_csr(urls: pa.ChunkedArray, links: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Article links as CSR over article rows (both directions, as a reader walks them)."""
    source = pc.index_in(links["source_url"], value_set=urls).to_numpy(zero_copy_only=False)
    target = pc.index_in(links["target_url"], value_set=urls).to_numpy(zero_copy_only=False)
    known = ~(np.isnan(source.astype(float)) | np.isnan(target.astype(float)))
    source, target = source[known].astype(np.int64), target[known].astype(np.int64)
    rows = np.concatenate([source, target])
    cols = np.concatenate([target, source])
    order = np.lexsort((cols, rows))
    counts = np.bincount(rows, minlength=len(urls))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return offsets, cols[order].astype(np.int64)


def _strings(column: pa.ChunkedArray) -> Iterator[str]:
    """The values of a string column, converted a block at a time (not a million at once)."""
    for start in range(0, len(column), STRING_BLOCK):
        yield from column.slice(start, STRING_BLOCK).to_pylist()


def keyword_postings(texts: Iterable[str]) -> dict[str, np.ndarray]:
    """BM25 postings of ``texts`` (kpack.text.search_terms), in the module docstring's format:
    file name -> array.

    Each text's words are counted in C (Counter) and each distinct word is stemmed once per
    pack; the postings are gathered in flat integer arrays and grouped by one sort, so a
    million passages' tens of millions of postings take a few hundred MB, not a Python
    object each."""
    term_of_word: dict[str, int] = {}  # word -> its term's number (-1 for a stop word)
    numbers: dict[str, int] = {}  # term -> its number, in order of first use
    rows, terms, frequencies = flat_array("i"), flat_array("i"), flat_array("i")
    lengths = flat_array("d")
    for row, text in enumerate(texts):
        counts: dict[int, int] = {}
        for word, n in Counter(words(text)).items():
            number = term_of_word.get(word)
            if number is None:
                term = next(iter(search_terms(word)), "")
                number = term_of_word[word] = numbers.setdefault(term, len(numbers)) if term else -1
            if number >= 0:
                counts[number] = counts.get(number, 0) + n
        lengths.append(sum(counts.values()))
        rows.extend([row] * len(counts))
        terms.extend(counts)
        frequencies.extend(counts.values())
    return _postings_arrays(list(numbers), rows, terms, frequencies, np.asarray(lengths))


def _postings_arrays(
    vocabulary: list[str],
    rows: flat_array,
    terms: flat_array,
    frequencies: flat_array,
    lengths: np.ndarray,
) -> dict[str, np.ndarray]:
    """The keyword index files from flat (row, term number, frequency) postings."""
    encoded = [term.encode() for term in vocabulary]
    order = sorted(range(len(encoded)), key=encoded.__getitem__)  # by UTF-8 bytes
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    term = position[np.frombuffer(terms, dtype=np.int32)]
    grouped = np.argsort(term, kind="stable")  # by term, rows ascending within each
    at = np.frombuffer(rows, dtype=np.int32)[grouped]
    tf = np.frombuffer(frequencies, dtype=np.int32)[grouped].astype(np.float64)
    held = np.bincount(term, minlength=len(order))
    offsets = np.concatenate([[0], np.cumsum(held)]).astype(np.int64)
    average = float(lengths.mean()) if len(lengths) and lengths.mean() > 0 else 1.0
    norm = K1 * (1.0 - B + B * lengths / average)
    idf = np.log(1.0 + (len(lengths) - held + 0.5) / (held + 0.5))
    weights = np.repeat(idf, held) * tf * (K1 + 1.0) / (tf + norm[at])
    ordered = [encoded[i] for i in order]
    return {
        KEYWORD_VOCABULARY: np.frombuffer(b"".join(ordered), dtype=np.uint8),
        KEYWORD_TERM_OFFSETS: np.concatenate([[0], np.cumsum([len(e) for e in ordered])]).astype(
            np.int64
        ),
        KEYWORD_OFFSETS: offsets,
        KEYWORD_ROWS: at.astype(np.int32),
        KEYWORD_WEIGHTS: weights.astype(np.float32),
        KEYWORD_LENGTHS: lengths.astype(np.float32),
    }


# -- reading ---------------------------------------------------------------------------------


def load_entity_graph(folder: Path, passages: Sequence[str]) -> EntityGraph:
    """The entity-passage graph of a version, its arrays memory-mapped (see _write_graph)."""
    from kpack.graph import Csr, EntityGraph, SortedGroups

    arrays = {name: load_array(folder, name) for name in GRAPH_FILES}
    entities = load_table(folder, ENTITIES)
    structure = (arrays[GRAPH_INDPTR], arrays[GRAPH_INDICES])
    keys = keys_of(folder, ENTITIES, entities)
    return EntityGraph(
        passages=passages,
        entities=keys.values,
        names=Column(entities["name"]),
        article_of=arrays[GRAPH_ARTICLE_OF],
        title_entity=arrays[GRAPH_TITLE_ENTITY],
        adjacency=Csr(*structure, arrays[GRAPH_WEIGHTS]),
        transition=Csr(*structure, arrays[GRAPH_TRANSITION]),
        passages_of_entity=arrays[GRAPH_PASSAGES_OF_ENTITY],
        about=SortedGroups(
            arrays[GRAPH_ABOUT_KEYS], arrays[GRAPH_ABOUT_OFFSETS], arrays[GRAPH_ABOUT_PASSAGES]
        ),
        entity_index=RowOf(keys),
        longest_name=int((entities.schema.metadata or {}).get(LONGEST_NAME_KEY.encode(), b"0")),
    )


def best_rows(scores: np.ndarray, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """The ``k`` rows (of ``rows``, default all) with the highest ``scores``, best first, ties
    by row: a partial sort, so ranking a few of thousands costs little."""
    rows = np.arange(len(scores)) if rows is None else rows
    if len(rows) > k:
        rows = rows[np.argpartition(-scores[rows], k - 1)[:k]]
    return rows[np.lexsort((rows, -scores[rows]))]


def nearest_rows(
    vectors: np.ndarray, vector: np.ndarray, k: int, ann: faiss.Index | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` rows of ``vectors`` nearest a unit ``vector`` and their cosine similarities,
    best first, ties by row. With an ``ann`` index, its best ``ANN_RESCORED`` (at least
    ``k``) candidates are re-scored against ``vectors``; without, every row is scanned, as it
    is when the probed lists hold fewer than ``k`` rows."""
    if ann is not None:
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        _, found = ann.search(query, max(k, ANN_RESCORED))
        candidates = np.sort(found[0][found[0] >= 0])
        if len(candidates) >= min(k, len(vectors)):
            similarity = vectors[candidates] @ vector
            best = best_rows(similarity, k)
            return candidates[best], similarity[best]
    similarity = vectors @ vector
    rows = best_rows(similarity, k)
    return rows, similarity[rows]


def load_array(folder: Path, name: str) -> np.ndarray:
    """A saved array, memory-mapped read-only, as a plain ndarray over the map (np.memmap's
    Python-level indexing cost ~10 us per element read, which a query pays thousands of
    times)."""
    return np.asarray(np.load(folder / name, mmap_mode="r", allow_pickle=False))


def load_table(folder: Path, name: str) -> pa.Table:
    """An Arrow IPC file, memory-mapped (zero copy)."""
    return pa.ipc.open_file(pa.memory_map(str(folder / name), "r")).read_all()


def column_array(column: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """A number or boolean column without nulls as an ndarray (numbers viewed in place, zero
    copy from a mapped file; booleans unpacked from their bits); None for any other column.
    Not ``to_numpy``: it imports pandas, 0.4 s of a fresh reader's first search."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = column.type
    if column.null_count or not (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    ):
        return None
    start, end = column.offset, column.offset + len(column)
    data = column.buffers()[1]
    if pa.types.is_boolean(kind):
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[start:end].astype(bool)
    letter = (
        "f" if pa.types.is_floating(kind) else "u" if pa.types.is_unsigned_integer(kind) else "i"
    )
    return np.frombuffer(data, dtype=np.dtype(f"{letter}{kind.bit_width // 8}"))[start:end]


class Column(Sequence[Any]):
    """One column of a memory-mapped table as a Python sequence (values read one at a time)."""

    def __init__(self, column: pa.ChunkedArray | pa.Array) -> None:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        self._column = column
        self._text: tuple[np.ndarray, memoryview] | None = None
        self._numbers: np.ndarray | None = None
        # Values are read from the column's buffers: Arrow's scalar access costs ~10 us a
        # value, which a binary search over a million keys pays 40 times.
        if pa.types.is_string(column.type) and column.null_count == 0:
            _, offsets, data = column.buffers()
            starts = np.frombuffer(offsets, dtype=np.int32)[column.offset :]
            self._text = (starts, memoryview(data) if data is not None else memoryview(b""))
        else:
            self._numbers = column_array(column)

    def __len__(self) -> int:
        return len(self._column)

    def __getitem__(self, index: Any) -> Any:  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if self._text is not None:
            starts, data = self._text
            at = int(index)
            return str(data[starts[at] : starts[at + 1]], "utf-8")
        if self._numbers is not None:
            return self._numbers[int(index)].item()
        return self._column[int(index)].as_py()

    def __iter__(self) -> Iterator[Any]:
        for value in self._column:
            yield value.as_py()


def keys_of(folder: Path, name: str, table: pa.Table) -> SortedKeys:
    """The keys of a keyed table the build wrote (write_keyed), with their hashes when the
    version has them."""
    hashes = KEY_HASHES[name]
    saved = load_array(folder, hashes) if (folder / hashes).is_file() else None
    return SortedKeys(table.column(0), hashes=saved)


class SortedKeys:
    """The positions of a key in a table's key column, by bisection over ``order`` (the rows in
    key order; the rows themselves when the table is sorted by that key). ``hashes`` (a keyed
    table's KEY_HASHES array) makes ``row`` a bisection over integers instead of strings."""

    def __init__(
        self,
        column: pa.ChunkedArray,
        order: np.ndarray | None = None,
        hashes: np.ndarray | None = None,
    ) -> None:
        self.values = Column(column)
        self.order = order
        self._hashes = None
        if hashes is not None:  # memoryviews: bisect reads them as Python ints, no numpy call
            self._hashes = (memoryview(hashes[0]), memoryview(hashes[1]))

    def _key(self, position: int) -> Any:
        row = position if self.order is None else int(self.order[position])
        return self.values[row]

    def span(self, key: Any) -> range:
        keyed = _KeyView(self)
        return range(bisect.bisect_left(keyed, key), bisect.bisect_right(keyed, key))

    def rows(self, key: Any) -> list[int]:
        span = self.span(key)
        if self.order is None:
            return list(span)
        return [int(self.order[p]) for p in span]

    def row(self, key: Any) -> int | None:
        """The first row holding ``key``, or None (one bisection)."""
        if self._hashes is not None:
            hashes, rows = self._hashes
            wanted = key_hash(key)
            at = bisect.bisect_left(hashes, wanted)
            while at < len(hashes) and hashes[at] == wanted:  # another key may share the hash
                if self.values[rows[at]] == key:
                    return rows[at]
                at += 1
            return None
        keyed = _KeyView(self)
        at = bisect.bisect_left(keyed, key)
        if at == len(keyed) or keyed[at] != key:
            return None
        return at if self.order is None else int(self.order[at])


@dataclass(frozen=True)
class _KeyView(Sequence[Any]):
    keys: SortedKeys

    def __len__(self) -> int:
        return len(self.keys.values)

    def __getitem__(self, position: Any) -> Any:  # type: ignore[override]
        return self.keys._key(position)


V = TypeVar("V")


class Lookup(Mapping[str, V]):
    """A read-only mapping over a memory-mapped index: a subclass says what ``found(key)`` is
    (None when the key is absent) and how to list its keys."""

    def found(self, key: str) -> V | None:
        raise NotImplementedError

    def __getitem__(self, key: str) -> V:
        value = self.found(key)
        if value is None:
            raise KeyError(key)
        return value


class _TableLookup(Lookup[V]):
    """A lookup over a table sorted by its first column (``keys``, by default found by
    bisection); ``make`` builds the values."""

    def __init__(self, table: pa.Table, make: Any, keys: SortedKeys | None = None) -> None:
        self.table = table
        self.keys = keys or SortedKeys(table.column(0))
        self._make = make
        self._columns: list[Column] | None = None


class RowMap(_TableLookup[Any]):
    """A table sorted by its first column as a read-only mapping key -> ``make(row)``."""

    def row(self, key: str) -> int | None:
        return self.keys.row(key)

    def record(self, row: int) -> Any:
        if self._columns is None:  # made at first use: a table only iterated needs none
            self._columns = [Column(column) for column in self.table.columns]
        return self._make(*(column[row] for column in self._columns))

    def found(self, key: str) -> Any:
        row = self.row(key)
        return None if row is None else self.record(row)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys.values)

    def __len__(self) -> int:
        return self.table.num_rows


class GroupMap(_TableLookup[list]):
    """A table sorted by its first column as key -> the ``make(*rest)`` of its rows, in order."""

    def found(self, key: str) -> list | None:
        span = self.keys.span(key)
        if not span:
            return None
        part = self.table.slice(span.start, len(span)).to_pylist()
        names = self.table.column_names[1:]
        return [self._make(*(item[n] for n in names)) for item in part]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(self.keys.values))

    def __len__(self) -> int:
        return len(set(self.keys.values))


class RowOf(Lookup[int]):
    """Key -> row of a table sorted by that key (its first column)."""

    def __init__(self, keys: SortedKeys) -> None:
        self.keys = keys

    def found(self, key: str) -> int | None:
        return self.keys.row(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys.values)

    def __len__(self) -> int:
        return len(self.keys.values)


class RowsOf(Lookup[list]):
    """Key -> the rows holding it, for a column the table is not sorted by (``keys.order``)."""

    def __init__(self, keys: SortedKeys) -> None:
        self.keys = keys

    def found(self, key: str) -> list[int] | None:
        return self.keys.rows(key) or None

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(self.keys.values))

    def __len__(self) -> int:
        return len(set(self.keys.values))


class Neighbours(Lookup[list]):
    """Article url -> the urls it links to or is linked from (CSR over article rows)."""

    def __init__(self, urls: SortedKeys, offsets: np.ndarray, targets: np.ndarray) -> None:
        self.urls, self.offsets, self.targets = urls, offsets, targets

    def found(self, url: str) -> list[str] | None:
        row = self.urls.row(url)
        if row is None or self.offsets[row] == self.offsets[row + 1]:
            return None
        linked = self.targets[self.offsets[row] : self.offsets[row + 1]]
        return [self.urls.values[int(r)] for r in linked]

    def __iter__(self) -> Iterator[str]:
        for row in np.flatnonzero(np.diff(self.offsets)):
            yield self.urls.values[int(row)]

    def __len__(self) -> int:
        return int(np.count_nonzero(np.diff(self.offsets)))


class KeywordIndex:
    """Per term, the passages (rows of the reader's chunk table) that hold it and the BM25
    weight each gets for it; ``frequency`` (term -> how many passages hold it) is the gate's
    idf."""

    def __init__(
        self,
        vocabulary: np.ndarray,
        term_offsets: np.ndarray,
        offsets: np.ndarray,
        rows: np.ndarray,
        weights: np.ndarray,
        passages: int,
    ) -> None:
        self._vocabulary = vocabulary
        self._term_offsets = term_offsets
        self._offsets = offsets
        self._rows = rows
        self._weights = weights
        self.passages = passages
        self.frequency: Mapping[str, int] = _Frequency(self)

    @classmethod
    def load(cls, folder: Path) -> KeywordIndex:
        """The index the build wrote into a version's index folder, memory-mapped."""
        return cls._of({name: load_array(folder, name) for name in KEYWORD_FILES})

    @classmethod
    def of(cls, texts: list[str]) -> KeywordIndex:
        """The index of ``texts`` (passage i is row i), in memory."""
        return cls._of(keyword_postings(texts))

    @classmethod
    def _of(cls, arrays: Mapping[str, np.ndarray]) -> KeywordIndex:
        return cls(
            arrays[KEYWORD_VOCABULARY],
            arrays[KEYWORD_TERM_OFFSETS],
            arrays[KEYWORD_OFFSETS],
            arrays[KEYWORD_ROWS],
            arrays[KEYWORD_WEIGHTS],
            len(arrays[KEYWORD_LENGTHS]),
        )

    @property
    def terms(self) -> int:
        return len(self._term_offsets) - 1

    def term(self, number: int) -> str:
        start, end = self._term_offsets[number], self._term_offsets[number + 1]
        return bytes(self._vocabulary[start:end]).decode()

    def number_of(self, term: str) -> int | None:
        """The term's position in the sorted vocabulary (bisection on its UTF-8 bytes)."""
        wanted = term.encode()
        low, high = 0, self.terms
        while low < high:
            middle = (low + high) // 2
            start, end = self._term_offsets[middle], self._term_offsets[middle + 1]
            if bytes(self._vocabulary[start:end]) < wanted:
                low = middle + 1
            else:
                high = middle
        return low if low < self.terms and self.term(low) == term else None

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(rows, weights) of the passages holding ``term`` (rows ascending); empty if none."""
        number = self.number_of(term)
        if number is None:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        start, end = self._offsets[number], self._offsets[number + 1]
        return self._rows[start:end], self._weights[start:end]

    def search(self, text: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` best rows for the terms of ``text``: (row, BM25 score), best first, ties
        by row; rows without any of the terms are not returned.

        A term held by more than ``KEYWORD_TERM_CANDIDATES`` passages (a common word of a
        large pack) brings only that many of them, those it weighs most: summing every
        passage of every common word is the length-N work a query must not do, and a
        passage below them has a lower weight for that word than each of the ones kept.
        Exact for a pack of fewer passages."""
        if k <= 0:
            return []
        found = [
            _strongest(*self.postings(t), KEYWORD_TERM_CANDIDATES)
            for t in dict.fromkeys(search_terms(text))
        ]
        found = [(rows, weights) for rows, weights in found if len(rows)]
        if not found:
            return []
        rows = np.concatenate([r for r, _ in found])
        weights = np.concatenate([w for _, w in found]).astype(np.float64)
        held, at = np.unique(rows, return_inverse=True)
        scores = np.bincount(at, weights=weights, minlength=len(held))
        order = np.lexsort((held, -scores))[:k]
        return [(int(held[i]), float(scores[i])) for i in order]


def _strongest(rows: np.ndarray, weights: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``most`` postings of highest weight (all of them when there are no more)."""
    if len(rows) <= most:
        return rows, weights
    kept = np.sort(np.argpartition(-np.asarray(weights), most - 1)[:most])
    return rows[kept], weights[kept]


class _Frequency(Lookup[int]):
    """term -> how many passages hold it, read from the postings' offsets."""

    def __init__(self, index: KeywordIndex) -> None:
        self._index = index

    def found(self, term: str) -> int | None:
        number = self._index.number_of(term)
        if number is None:
            return None
        return int(self._index._offsets[number + 1] - self._index._offsets[number])

    def __iter__(self) -> Iterator[str]:
        return (self._index.term(n) for n in range(self._index.terms))

    def __len__(self) -> int:
        return self._index.terms
