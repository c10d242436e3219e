"""The documentation graph of a pack version (issue 23): which section links to which section
through which anchor, and which passage defines each API identifier.

In documentation the links are the graph: a tutorial section links to the reference entry of
the function it uses ("Saving structured data with json" -> ``json.dump``), and a reference
entry defines an identifier that other pages write. The parse stage finds both
(kpack.ingest.sections: section_links rows, each section's ``defines``); the build writes them
beside the other retrieval indexes (kpack.index_files), in the version's ``indexes/`` folder:

- ``doc_links.arrow``: per section row (sections.arrow's order, by section id) the sections it
  links to and, marked ``incoming``, those that link to it, with the link's anchor, the chunk
  row of the passage that defines the anchor in the linked section (-1 when it defines none
  there) and the linked section's chunk rows (its first and how many: chunks.arrow is sorted
  by id, so a section's chunks are one run); sorted by section row, with
  ``doc_link_offsets.npy`` (CSR offsets over section rows);
- ``definitions.arrow``: per API identifier (its key, kpack.text.normalize_entity, sorted) the
  chunk row of the passage that defines it (the first passage of its defining section that
  writes its name, else the section's first passage), its section row and its name as written.
- ``definition_vectors.npy``: per row of definitions.arrow, the unit vector of the identifier's
  entry text (its name, signature line and first line of description,
  kpack.ingest.definitions), so a question finds a definition by meaning; above the ANN
  crossover (kpack.vector_index) with its IVF index, ``definition_vectors.faiss``, as the
  chunk and section vectors have theirs.

A query (retrieval.docgraph) reads the rows of the few sections it expands, by offset and by
bisection, from the memory-mapped files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kpack.contracts import section_of_chunk
from kpack.index_files import (
    DEFINITION_ANN,
    DEFINITION_VECTORS,
    DEFINITIONS,
    DOC_GRAPH_FILES,
    DOC_LINK_OFFSETS,
    DOC_LINKS,
)
from kpack.ingest.definitions import defining_passage, entry_hash, entry_text
from kpack.mapped_tables import (
    Column,
    SortedKeys,
    column_array,
    load_array,
    load_table,
    write_arrow,
)
from kpack.text import normalize_entity
from kpack.vector_index import ann_min_vectors, load_ann, nearest_rows, write_ann

LINK_SCHEMA = pa.schema(
    [
        ("target", pa.int32()),
        ("anchor", pa.string()),
        ("incoming", pa.bool_()),
        ("defined", pa.int32()),
        ("first_chunk", pa.int32()),
        ("chunks", pa.int32()),
    ]
)
DEFINITION_SCHEMA = pa.schema(
    [
        ("entity_id", pa.string()),
        ("chunk", pa.int32()),
        ("section", pa.int32()),
        ("name", pa.string()),
    ]
)


# -- writing ---------------------------------------------------------------------------------


def _chunk_runs(section_ids: list[str], chunk_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per section row, its first chunk row and its number of chunks (chunk ids sort by section,
    kpack.contracts.chunk_id)."""
    row_of = {sid: row for row, sid in enumerate(section_ids)}
    first = np.full(len(section_ids), -1, dtype=np.int64)
    count = np.zeros(len(section_ids), dtype=np.int64)
    for row, chunk in enumerate(chunk_ids):
        at = row_of.get(section_of_chunk(chunk))
        if at is not None:
            first[at] = row if first[at] < 0 else first[at]
            count[at] += 1
    return first, count


def link_rows(
    section_ids: list[str],
    section_links: pa.Table,
    runs: tuple[np.ndarray, np.ndarray],
    defined: dict[tuple[int, str], int],
) -> tuple[np.ndarray, pa.Table]:
    """(offsets over section rows, the rows of doc_links.arrow): each link once from its
    source and once, marked incoming, from its target; ``runs``: each section's chunk rows
    (_chunk_runs), ``defined``: (section row, key) -> the chunk row defining it there."""
    row_of = {sid: row for row, sid in enumerate(section_ids)}
    first, count = runs
    edges: list[tuple[int, int, str, bool, int]] = []
    for source, target, anchor in zip(
        section_links["source_section_id"].to_pylist(),
        section_links["target_section_id"].to_pylist(),
        section_links["anchor"].to_pylist(),
        strict=True,
    ):
        if source in row_of and target in row_of:
            at, to, anchor = row_of[source], row_of[target], anchor or ""
            edges.append((at, to, anchor, False, defined.get((to, normalize_entity(anchor)), -1)))
            edges.append((to, at, anchor, True, -1))
    edges.sort()
    offsets = np.concatenate(
        [[0], np.cumsum(np.bincount([e[0] for e in edges], minlength=len(section_ids)))]
    ).astype(np.int64)
    table = pa.table(
        {
            "target": [e[1] for e in edges],
            "anchor": [e[2] for e in edges],
            "incoming": [e[3] for e in edges],
            "defined": [e[4] for e in edges],
            "first_chunk": [int(first[e[1]]) for e in edges],
            "chunks": [int(count[e[1]]) for e in edges],
        },
        schema=LINK_SCHEMA,
    )
    return offsets, table


def definition_rows(
    section_ids: list[str],
    defines: list[list[str] | None],
    runs: tuple[np.ndarray, np.ndarray],
    texts: Sequence[str],
) -> tuple[pa.Table, list[str]]:
    """definitions.arrow's rows (see the module docstring), sorted by key; an identifier
    defined in several sections has a row for each. With them, each row's entry hash
    (kpack.ingest.definitions: the key of its entry text's vector)."""
    first, count = runs
    rows: list[tuple[str, int, int, str, str]] = []
    for section_row, names in enumerate(defines):
        start = int(first[section_row])
        if start < 0 or not names:
            continue
        passages = [texts[row] for row in range(start, start + int(count[section_row]))]
        for name in names:
            key = normalize_entity(name)
            if key:
                at = defining_passage(name, passages)
                entry = entry_hash(entry_text(name, passages[at]))
                rows.append((key, start + at, section_row, name, entry))
    rows.sort()
    table = pa.table(
        {
            "entity_id": [r[0] for r in rows],
            "chunk": [r[1] for r in rows],
            "section": [r[2] for r in rows],
            "name": [r[3] for r in rows],
        },
        schema=DEFINITION_SCHEMA,
    )
    return table, [r[4] for r in rows]


def definition_vectors(entries: list[str], vectors: pa.Table, dim: int) -> np.ndarray:
    """The unit vector of each definition's entry text, in the definitions' order, from the
    build's embeddings (content_hash, embedding); zeros for an entry without one (it then
    matches no question)."""
    out = np.zeros((len(entries), dim), dtype=np.float32)
    if not entries or vectors.num_rows == 0:
        return out
    position = pc.index_in(pa.array(entries, pa.string()), value_set=vectors["content_hash"])
    found = np.flatnonzero(position.is_valid().to_numpy(zero_copy_only=False))
    if len(found):
        rows = vectors["embedding"].take(position.take(pa.array(found)))
        out[found] = np.asarray(rows.to_pylist(), dtype=np.float32)
    return out


def write_doc_graph(
    folder: Path,
    sections: pa.Table,
    chunks: pa.Table,
    links: pa.Table,
    entry_vectors: pa.Table,
    dim: int,
) -> None:
    """Write the documentation graph's files into a version's index folder; ``sections`` and
    ``chunks`` sorted by id, as the index folder's own tables are; ``entry_vectors`` the
    build's vectors of the definitions' entry texts (content_hash, embedding). Only the
    passages of the sections that define something are read as text (a million-passage
    pack's texts are gigabytes as Python strings)."""
    section_ids = sections["section_id"].to_pylist()
    runs = _chunk_runs(section_ids, chunks["chunk_id"].to_pylist())
    definitions, entries = definition_rows(
        section_ids, sections["defines"].to_pylist(), runs, Column(chunks["content"])
    )
    defined = {
        (section, key): chunk
        for key, chunk, section in zip(
            definitions["entity_id"].to_pylist(),
            definitions["chunk"].to_pylist(),
            definitions["section"].to_pylist(),
            strict=True,
        )
    }
    offsets, table = link_rows(section_ids, links, runs, defined)
    np.save(folder / DOC_LINK_OFFSETS, offsets)
    write_arrow(folder / DOC_LINKS, table)
    write_arrow(folder / DEFINITIONS, definitions)
    vectors = definition_vectors(entries, entry_vectors, dim)
    np.save(folder / DEFINITION_VECTORS, vectors)
    if len(vectors) >= ann_min_vectors():  # the crossover of the chunk and section vectors
        write_ann(folder / DEFINITION_ANN, vectors)


# -- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Links:
    """The links of one section, as arrays (one element per link): the linked section's row,
    whether it links to this one (``incoming``), the chunk row defining the anchor there (-1:
    none), and the linked section's chunk rows (``first_chunk``, ``chunks``). ``anchor(i)``
    reads a link's anchor."""

    targets: np.ndarray
    incoming: np.ndarray
    defined: np.ndarray
    first_chunk: np.ndarray
    chunks: np.ndarray
    start: int
    graph: DocGraph

    def __len__(self) -> int:
        return len(self.targets)

    def anchor(self, i: int) -> str:
        return self.graph.anchors[self.start + i]


@dataclass(frozen=True)
class Definition:
    chunk: int  # chunk row of the defining passage
    section: int  # section row
    name: str  # as the documentation writes it
    row: int = -1  # its row in definitions.arrow (and definition_vectors.npy)


class DocGraph:
    """A version's documentation graph, its files memory-mapped (see the module docstring)."""

    def __init__(self, folder: Path, threads: int = 1) -> None:
        self.offsets = load_array(folder, DOC_LINK_OFFSETS)
        links = load_table(folder, DOC_LINKS)
        self._links = {
            name: column_array(links[name])
            for name in ("target", "incoming", "defined", "first_chunk", "chunks")
        }
        self.anchors = Column(links["anchor"])
        definitions = load_table(folder, DEFINITIONS)
        self._keys = SortedKeys(definitions["entity_id"])
        self._chunks = column_array(definitions["chunk"])
        self._sections = column_array(definitions["section"])
        self._names = Column(definitions["name"])
        self._key_column = definitions["entity_id"]
        vectors = folder / DEFINITION_VECTORS
        # Unit vectors of the entries, row for row; None in a version built before them.
        self.vectors: np.ndarray | None = (
            load_array(folder, DEFINITION_VECTORS) if vectors.is_file() else None
        )
        self.ann = load_ann(folder, DEFINITION_ANN, threads)  # None below the ANN crossover
        self._last_parts: dict[str, list[int]] | None = None

    def links(self, section_row: int) -> Links:
        """The links of a section, out and in, in the order of their target rows."""
        start, end = int(self.offsets[section_row]), int(self.offsets[section_row + 1])
        part = {name: column[start:end] for name, column in self._links.items()}
        return Links(
            part["target"],
            part["incoming"],
            part["defined"],
            part["first_chunk"],
            part["chunks"],
            start,
            self,
        )

    def definitions(self, key: str) -> list[Definition]:
        """Where the identifier with this key (normalize_entity) is defined; [] if nowhere."""
        return [self._definition(at) for at in self._keys.span(key)]

    def nearest(self, vector: np.ndarray, k: int) -> list[tuple[Definition, float]]:
        """The k definitions whose entry texts are nearest a unit ``vector``, with their
        cosine similarity, best first, ties by row (through the ANN index where the version
        has one, kpack.vector_index.nearest_rows); [] in a version without entry vectors."""
        if self.vectors is None or not len(self.vectors):
            return []
        rows, similarity = nearest_rows(self.vectors, vector, k, self.ann)
        return [
            (self._definition(int(at)), float(s)) for at, s in zip(rows, similarity, strict=True)
        ]

    def definitions_named(self, last: str) -> list[Definition]:
        """Where an identifier whose last part is ``last`` (lower case) is defined, whatever
        it is defined on: "groupby" finds ``DataFrame.groupby`` and ``Series.groupby``."""
        return [self._definition(at) for at in self._by_last_part().get(last.lower(), ())]

    def _definition(self, at: int) -> Definition:
        return Definition(int(self._chunks[at]), int(self._sections[at]), self._names[at], at)

    def entry_similarity(self, definitions: Sequence[Definition], vector: np.ndarray) -> np.ndarray:
        """The cosine similarity of a unit ``vector`` with each definition's entry text; zeros
        in a version without entry vectors."""
        if self.vectors is None:
            return np.zeros(len(definitions), dtype=np.float32)
        return self.vectors[[d.row for d in definitions]] @ vector

    def _by_last_part(self) -> dict[str, list[int]]:
        """Definition rows by the last part of their key, made on first use (one pass over the
        keys, once per version)."""
        if self._last_parts is None:
            index: dict[str, list[int]] = {}
            for at, key in enumerate(self._key_column.to_pylist()):
                index.setdefault(key.rsplit(".", 1)[-1], []).append(at)
            self._last_parts = index
        return self._last_parts


def load_doc_graph(folder: Path, threads: int = 1) -> DocGraph | None:
    """The documentation graph of a version's index folder (its ANN index searched on
    ``threads``); None for one built without it."""
    if not all((folder / name).is_file() for name in DOC_GRAPH_FILES):
        return None
    return DocGraph(folder, threads)
