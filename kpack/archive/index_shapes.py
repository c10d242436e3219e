"""Whether a version's retrieval indexes (kpack.index_files) have the shapes its manifest implies.

A checksum says a file is the one its manifest was sealed with; a stranger's archive reseals
whatever it carries, so the checksums prove nothing about the files' content. Before a pack is
called valid or installed, every index file is opened as a reader opens it (memory-mapped
arrays, Arrow files, the ANN index) and its type and shape are checked against the manifest's
counts and embedding dimension: a (3, 7) matrix where 11 vectors of 384 dimensions belong is a
refused archive, never a server whose every query ends in a matmul error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kpack import index_files as files
from kpack.mapped_tables import load_array, load_table
from kpack.packs import INDEX_DIR
from kpack.vector_index import load_ann, nearest_rows

# Array kinds, as numpy's dtype.kind: float, signed or unsigned integer; vectors are float32
# exactly (a reader maps them as they are, and the question's vector is float32).
FLOAT, INTEGER, VECTORS = "f", "iu", "float32"
# Arrow tables and the manifest count their rows must equal.
TABLE_COUNTS = {
    files.CHUNKS: "Chunk",
    files.SECTIONS: "Section",
    files.ARTICLES: "Article",
    files.ENTITIES: "Entity",
}
OPTIONAL_TABLES = (files.ARTICLE_ENTITIES, files.FACTS, files.DOC_LINKS, files.DEFINITIONS)


class IndexShapeError(Exception):
    """An index file whose type or shape does not fit its manifest."""


def index_problem(version_dir: Path, manifest: dict) -> str | None:
    """What is wrong with the version's index files, in one line; None when they fit."""
    try:
        _check(version_dir / INDEX_DIR, manifest)
    except IndexShapeError as exc:
        return str(exc)
    except Exception as exc:  # a file numpy, Arrow or faiss cannot read at all
        return f"an index file cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
    return None


def _check(folder: Path, manifest: dict) -> None:
    counts, dim = manifest["counts"], manifest["embedding"]["dimension"]
    chunks, sections, articles = counts.get("Chunk"), counts.get("Section"), counts.get("Article")
    entities = counts.get("Entity")

    def array(name: str, kinds: str, *shape: int | None) -> np.ndarray:
        data = load_array(folder, name)
        wrong_type = data.dtype != np.float32 if kinds == VECTORS else data.dtype.kind not in kinds
        if wrong_type or data.ndim != len(shape):
            raise IndexShapeError(
                f"{INDEX_DIR}/{name} is a {data.ndim}-dimensional {data.dtype} array, "
                f"not the {len(shape)}-dimensional {_kind_name(kinds)} array a reader needs"
            )
        for axis, (actual, wanted) in enumerate(zip(data.shape, shape, strict=True)):
            if wanted is not None and actual != wanted:
                raise IndexShapeError(
                    f"{INDEX_DIR}/{name} has shape {data.shape}, but the manifest implies "
                    f"{wanted} along axis {axis} ({_shape_text(shape)})"
                )
        return data

    # Every Arrow file opens as a reader maps it; the keyed ones hold the manifest's rows.
    tables = {}
    for name in (*TABLE_COUNTS, *OPTIONAL_TABLES):
        if (folder / name).is_file() or name in TABLE_COUNTS:
            tables[name] = load_table(folder, name).num_rows
    for name, count in TABLE_COUNTS.items():
        _equal(f"{INDEX_DIR}/{name}", "rows", tables[name], counts.get(count))
    for table, hashes in files.KEY_HASHES.items():
        array(hashes, INTEGER, 2, tables[table])

    for name, rows in ((files.CHUNK_VECTORS, chunks), (files.SECTION_VECTORS, sections)):
        vectors = array(name, VECTORS, rows, dim)
        # A reader's first step on every question: the nearest rows to a unit vector.
        probe = np.zeros(dim, dtype=np.float32)
        probe[0] = 1.0
        nearest_rows(vectors, probe, 1)
        _ann_shape(folder, name, rows, dim)

    array(files.SECTIONS_BY_ARTICLE, INTEGER, sections)
    offsets = array(files.LINK_OFFSETS, INTEGER, None if articles is None else articles + 1)
    array(files.LINK_TARGETS, INTEGER, _last(offsets))

    array(files.KEYWORD_LENGTHS, FLOAT, chunks)
    array(files.KEYWORD_VOCABULARY, INTEGER, None)
    terms = array(files.KEYWORD_TERM_OFFSETS, INTEGER, None)
    postings = array(files.KEYWORD_OFFSETS, INTEGER, len(terms))
    array(files.KEYWORD_ROWS, INTEGER, _last(postings))
    array(files.KEYWORD_WEIGHTS, FLOAT, _last(postings))

    nodes = None if chunks is None or entities is None else chunks + entities + 1
    edges = _last(array(files.GRAPH_INDPTR, INTEGER, nodes))
    array(files.GRAPH_INDICES, INTEGER, edges)
    array(files.GRAPH_WEIGHTS, FLOAT, edges)
    array(files.GRAPH_TRANSITION, FLOAT, edges)
    array(files.GRAPH_ARTICLE_OF, INTEGER, chunks)
    array(files.GRAPH_TITLE_ENTITY, INTEGER, articles)
    array(files.GRAPH_PASSAGES_OF_ENTITY, INTEGER, entities)
    keys = array(files.GRAPH_ABOUT_KEYS, INTEGER, None)
    about = array(files.GRAPH_ABOUT_OFFSETS, INTEGER, len(keys) + 1)
    array(files.GRAPH_ABOUT_PASSAGES, INTEGER, _last(about))
    if (folder / files.DOC_LINK_OFFSETS).is_file():
        array(files.DOC_LINK_OFFSETS, INTEGER, None if sections is None else sections + 1)
    if (folder / files.DEFINITION_VECTORS).is_file():
        definitions = tables.get(files.DEFINITIONS)
        array(files.DEFINITION_VECTORS, VECTORS, definitions, dim)
        _ann_shape(folder, files.DEFINITION_VECTORS, definitions, dim)
    if (folder / files.IDENTIFIERS).is_file():
        array(files.IDENTIFIERS, INTEGER, None)


def _last(offsets: np.ndarray) -> int | None:
    """The length offsets end at (their last value), for the array they index."""
    return int(offsets[-1]) if len(offsets) else None


def _ann_shape(folder: Path, vectors: str, rows: int | None, dim: int | None) -> None:
    """The ANN index of a vectors file, where the version has one, indexes as many vectors of
    as many dimensions."""
    ann_name = files.ANN_FILES[vectors]
    ann = load_ann(folder, ann_name)
    if ann is not None:
        _equal(f"{INDEX_DIR}/{ann_name}", "dimensions", ann.d, dim)
        _equal(f"{INDEX_DIR}/{ann_name}", "vectors", ann.ntotal, rows)


def _equal(name: str, what: str, actual: int, wanted: int | None) -> None:
    if wanted is not None and actual != wanted:
        raise IndexShapeError(f"{name} has {actual} {what}, the manifest says {wanted}")


def _kind_name(kinds: str) -> str:
    return {FLOAT: "float", VECTORS: "float32"}.get(kinds, "integer")


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("any" if n is None else str(n) for n in shape) + ")"
