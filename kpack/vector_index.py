"""Nearest-vector search over a version's mapped vectors, and the ANN index of a large table.

``chunk_vectors.npy`` / ``section_vectors.npy`` (kpack.index_files) hold float32 unit
vectors, one row per chunk (section) in id order; a question's nearest rows are an exact scan
of the mapped matrix (:func:`nearest_rows`). A table of at least :func:`ann_min_vectors` rows
(below that the exact scan is faster) also gets ``chunk_vectors.faiss`` /
``section_vectors.faiss``: a faiss ``IndexIVFFlat`` over inner product (the cosine of unit
vectors), its ~4 sqrt(N) lists trained by spherical k-means on a seeded sample. A reader maps
it (:func:`load_ann`, zero copy), probes the ``IVF_PROBES`` lists nearest the question and
re-scores its best candidates (``ANN_RESCORED_PER_HIT`` per row asked for) exactly against
the mapped float32 matrix, so an ANN hit has the exact scan's score and order. An IVF, not a
graph (HNSW): on a pack with many near-duplicate passages (versioned pages, or the scale
benchmark's copies) usearch's HNSW found 0.43 of the exact top 10 at a million vectors and
took 10 to 17 minutes to build on two cores; near-duplicates share an inverted list, and a
flat list is scanned exactly. faiss replaced a hand-written numpy k-means with the same lists:
a maintained library, its k-means, list storage and scan in C++.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import faiss

ANN_MIN_VECTORS_ENV = "KPACK_ANN_MIN_VECTORS"
# Below this many rows the exact scan answers about as fast as the ANN index plus re-scoring.
# On one thread, with IVF_PROBES probed lists, over real chunk vectors of the ten-site pack of
# bench/ecosystem_bench.py sampled to N rows (questions made from its section titles): 5,000
# rows 0.23 ms exact against 0.38 ms, 10,000 rows 1.28 against 0.53, 20,000 rows 4.3 against
# 0.95 (0.985 of the exact top 10), 30,000 rows 5.4 against 0.98 (0.981); its 39,115 sections
# 6.3 ms against 1.0 (0.981). 20,000 leaves every pack of a few thousand pages exact.
DEFAULT_ANN_MIN_VECTORS = 20_000
# The IVF index (see the module docstring): 4 sqrt(N) lists, chosen on the Python docs pack's
# real vectors replicated to 100,000 (bench/scale_bench.py). Training on 64 vectors per list,
# or for more rounds, took twice as long and found no more. Probed lists: replicas make the
# exact top 10 easy to find (32 found 0.9975 there), real documentation does not. On the
# ten-site pack of bench/ecosystem_bench.py (101,714 real chunks, 1,276 lists), questions
# made from 300 of its section titles found 0.929 of the exact top 10 with 32 probed, 0.956
# with 64, 0.972 with 96 (the fewest to reach 0.97), 0.979 with 128; 96 probed take 2 ms a
# question on one thread, against about 10 ms for the exact scan.
IVF_LISTS_PER_SQRT = 4
IVF_PROBES = 96
IVF_TRAINING_PER_LIST = 32  # k-means trains on this many sampled vectors per list ...
IVF_ITERATIONS = 8  # ... for this many rounds
IVF_SEED = 0
# The index's best this many candidates per row asked for are re-scored exactly. A flat
# list's scores are exact but for float rounding, so only a candidate near the k-th can change
# places: re-scoring against the mapped matrix makes the scores the exact scan's to the bit
# and orders ties by row. Each candidate re-scored is a random read of the matrix: twice k
# found the same rows as a fixed 256 for all 360 real questions of bench/ecosystem_bench.py
# at k = 10 and 40, but for ties among identical vectors at the k-th place.
ANN_RESCORED_PER_HIT = 2
ANN_RESCORED_LEAST = 32
VECTOR_BLOCK = 65_536  # rows of vectors copied at a time when they are saved


def ann_min_vectors() -> int:
    """How many chunks a pack needs before its build writes an ANN index:
    KPACK_ANN_MIN_VECTORS, else :data:`DEFAULT_ANN_MIN_VECTORS`."""
    raw = os.environ.get(ANN_MIN_VECTORS_ENV, "").strip()
    return int(raw) if raw.isdigit() else DEFAULT_ANN_MIN_VECTORS


def save_vectors(path: Path, column: pa.ChunkedArray, order: pa.Array, dim: int) -> None:
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


def best_rows(scores: np.ndarray, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """The ``k`` rows (of ``rows``, default all) with the highest ``scores``, best first, ties
    by row: a partial sort, so ranking a few of thousands costs little."""
    rows = np.arange(len(scores)) if rows is None else rows
    if len(rows) > k:
        rows = rows[np.argpartition(-scores[rows], k - 1)[:k]]
    return rows[np.lexsort((rows, -scores[rows]))]


def nearest_rows(
    vectors: np.ndarray,
    vector: np.ndarray,
    k: int,
    ann: faiss.Index | None = None,
    scanned: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` rows of ``vectors`` nearest a unit ``vector`` and their cosine similarities,
    best first, ties by row. With an ``ann`` index, its best candidates (see
    ANN_RESCORED_PER_HIT) are re-scored against ``vectors``; without, every row is scanned, as
    it is when the probed lists hold fewer than ``k`` rows, unless the caller has that scan
    (``scanned``: ``vectors @ vector``)."""
    if ann is not None:
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        wanted = max(ANN_RESCORED_PER_HIT * k, ANN_RESCORED_LEAST)
        _, found = ann.search(query, wanted)
        candidates = np.sort(found[0][found[0] >= 0])
        if len(candidates) >= min(k, len(vectors)):
            similarity = vectors[candidates] @ vector
            best = best_rows(similarity, k)
            return candidates[best], similarity[best]
    similarity = vectors @ vector if scanned is None else scanned
    rows = best_rows(similarity, k)
    return rows, similarity[rows]
