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

A query (retrieval.docgraph) reads the rows of the few sections it expands, by offset and by
bisection, from the memory-mapped files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from kpack.contracts import section_of_chunk
from kpack.index_files import DEFINITIONS, DOC_GRAPH_FILES, DOC_LINK_OFFSETS, DOC_LINKS
from kpack.mapped_tables import (
    Column,
    SortedKeys,
    column_array,
    load_array,
    load_table,
    write_arrow,
)
from kpack.text import normalize_entity

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
) -> pa.Table:
    """definitions.arrow's rows (see the module docstring), sorted by key; an identifier
    defined in several sections has a row for each."""
    first, count = runs
    rows: list[tuple[str, int, int, str]] = []
    for section_row, names in enumerate(defines):
        start = int(first[section_row])
        if start < 0 or not names:
            continue
        for name in names:
            key = normalize_entity(name)
            if key:
                chunk = _defining_chunk(name, texts, start, start + int(count[section_row]))
                rows.append((key, chunk, section_row, name))
    rows.sort()
    return pa.table(
        {
            "entity_id": [r[0] for r in rows],
            "chunk": [r[1] for r in rows],
            "section": [r[2] for r in rows],
            "name": [r[3] for r in rows],
        },
        schema=DEFINITION_SCHEMA,
    )


def _defining_chunk(name: str, texts: Sequence[str], start: int, end: int) -> int:
    """The first chunk row in [start, end) that writes the identifier's signature (its last part
    and a parenthesis: a method's signature writes "default(o)" for json.JSONEncoder.default),
    else the first that writes its last part (an attribute), else start."""
    last = name.rsplit(".", 1)[-1]
    for written in (f"{last}(", last):
        found = next((row for row in range(start, end) if written in texts[row]), None)
        if found is not None:
            return found
    return start


def write_doc_graph(folder: Path, sections: pa.Table, chunks: pa.Table, links: pa.Table) -> None:
    """Write the documentation graph's files into a version's index folder; ``sections`` and
    ``chunks`` sorted by id, as the index folder's own tables are. Only the passages of the
    sections that define something are read as text (a million-passage pack's texts are
    gigabytes as Python strings)."""
    section_ids = sections["section_id"].to_pylist()
    runs = _chunk_runs(section_ids, chunks["chunk_id"].to_pylist())
    definitions = definition_rows(
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


class DocGraph:
    """A version's documentation graph, its files memory-mapped (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
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
        return [
            Definition(int(self._chunks[at]), int(self._sections[at]), self._names[at])
            for at in self._keys.span(key)
        ]


def load_doc_graph(folder: Path) -> DocGraph | None:
    """The documentation graph of a version's index folder; None for one built without it."""
    if not all((folder / name).is_file() for name in DOC_GRAPH_FILES):
        return None
    return DocGraph(folder)
