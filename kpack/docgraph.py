"""The documentation graph of a pack version (issue 23): which section links to which section
through which anchor, and which passage defines each API identifier.

In documentation the links are the graph: a tutorial section links to the reference entry of
the function it uses ("Saving structured data with json" -> ``json.dump``), and a reference
entry defines an identifier that other pages write. The parse stage finds both
(kpack.ingest.sections: section_links rows, each section's ``defines``); the build writes them
beside the other retrieval indexes (kpack.indexes), in the version's ``indexes/`` folder:

- ``doc_links.arrow``: per section row (sections.arrow's order, by section id) the sections it
  links to and, marked ``incoming``, those that link to it, with the link's anchor; sorted by
  section row, with ``doc_link_offsets.npy`` (CSR offsets over section rows);
- ``definitions.arrow``: per API identifier (its key, kpack.text.normalize_entity, sorted) the
  chunk row of the passage that defines it (the first passage of its defining section that
  writes its name, else the section's first passage), its section row and its name as written.

A query (retrieval.docgraph) reads the rows of the few sections it expands, by offset and by
bisection, from the memory-mapped files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from kpack.contracts import section_of_chunk
from kpack.text import normalize_entity

DOC_LINKS = "doc_links.arrow"
DOC_LINK_OFFSETS = "doc_link_offsets.npy"
DEFINITIONS = "definitions.arrow"
DOC_GRAPH_FILES = (DOC_LINKS, DOC_LINK_OFFSETS, DEFINITIONS)

LINK_SCHEMA = pa.schema([("target", pa.int32()), ("anchor", pa.string()), ("incoming", pa.bool_())])
DEFINITION_SCHEMA = pa.schema(
    [
        ("entity_id", pa.string()),
        ("chunk", pa.int32()),
        ("section", pa.int32()),
        ("name", pa.string()),
    ]
)


# -- writing ---------------------------------------------------------------------------------


def link_rows(section_ids: list[str], section_links: pa.Table) -> tuple[np.ndarray, pa.Table]:
    """(offsets over section rows, the rows: target section row, anchor, incoming): each link
    once from its source and once, marked incoming, from its target."""
    row_of = {sid: row for row, sid in enumerate(section_ids)}
    edges: list[tuple[int, int, str, bool]] = []
    for source, target, anchor in zip(
        section_links["source_section_id"].to_pylist(),
        section_links["target_section_id"].to_pylist(),
        section_links["anchor"].to_pylist(),
        strict=True,
    ):
        if source in row_of and target in row_of:
            edges.append((row_of[source], row_of[target], anchor or "", False))
            edges.append((row_of[target], row_of[source], anchor or "", True))
    edges.sort()
    counts = np.bincount(
        np.array([e[0] for e in edges], dtype=np.int64), minlength=len(section_ids)
    )
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    table = pa.table(
        {
            "target": [e[1] for e in edges],
            "anchor": [e[2] for e in edges],
            "incoming": [e[3] for e in edges],
        },
        schema=LINK_SCHEMA,
    )
    return offsets, table


def definition_rows(
    section_ids: list[str], defines: list[list[str] | None], chunk_ids: list[str], texts: list[str]
) -> pa.Table:
    """definitions.arrow's rows (see the module docstring), sorted by key; an identifier
    defined in several sections has a row for each."""
    first_chunk: dict[str, int] = {}
    for row, chunk in enumerate(chunk_ids):
        first_chunk.setdefault(section_of_chunk(chunk), row)
    rows: list[tuple[str, int, int, str]] = []
    for section_row, (section, names) in enumerate(zip(section_ids, defines, strict=True)):
        start = first_chunk.get(section)
        if start is None or not names:
            continue
        end = start
        while end < len(chunk_ids) and section_of_chunk(chunk_ids[end]) == section:
            end += 1
        for name in names:
            key = normalize_entity(name)
            if key:
                rows.append((key, _defining_chunk(name, texts, start, end), section_row, name))
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


def _defining_chunk(name: str, texts: list[str], start: int, end: int) -> int:
    """The first chunk row in [start, end) that writes the identifier's last part as a word
    (a method's signature writes "default(o)" for json.JSONEncoder.default), else start."""
    word = re.compile(rf"(?<![\w]){re.escape(name.rsplit('.', 1)[-1])}(?!\w)")
    return next((row for row in range(start, end) if word.search(texts[row])), start)


def write_doc_graph(folder: Path, sections: pa.Table, chunks: pa.Table, links: pa.Table) -> None:
    """Write the documentation graph's files into a version's index folder; ``sections`` and
    ``chunks`` sorted by id, as the index folder's own tables are."""
    from kpack.indexes import write_arrow

    section_ids = sections["section_id"].to_pylist()
    offsets, table = link_rows(section_ids, links)
    np.save(folder / DOC_LINK_OFFSETS, offsets)
    write_arrow(folder / DOC_LINKS, table)
    write_arrow(
        folder / DEFINITIONS,
        definition_rows(
            section_ids,
            sections["defines"].to_pylist(),
            chunks["chunk_id"].to_pylist(),
            chunks["content"].to_pylist(),
        ),
    )


# -- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    target: int  # section row
    anchor: str
    incoming: bool  # the target section links to the section it was read from


@dataclass(frozen=True)
class Definition:
    chunk: int  # chunk row of the defining passage
    section: int  # section row
    name: str  # as the documentation writes it


class DocGraph:
    """A version's documentation graph, its files memory-mapped (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        from kpack.indexes import Column, SortedKeys, load_array, load_table

        self.offsets = load_array(folder, DOC_LINK_OFFSETS)
        links = load_table(folder, DOC_LINKS)
        self._targets = links["target"].to_numpy()
        self._anchors = Column(links["anchor"])
        self._incoming = links["incoming"].to_numpy(zero_copy_only=False)
        definitions = load_table(folder, DEFINITIONS)
        self._keys = SortedKeys(definitions["entity_id"])
        self._chunks = definitions["chunk"].to_numpy()
        self._sections = definitions["section"].to_numpy()
        self._names = Column(definitions["name"])

    def links(self, section_row: int) -> list[Link]:
        """The links of a section, out and in, in the order of their target rows."""
        start, end = int(self.offsets[section_row]), int(self.offsets[section_row + 1])
        return [
            Link(int(self._targets[at]), self._anchors[at], bool(self._incoming[at]))
            for at in range(start, end)
        ]

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
