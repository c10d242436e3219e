"""The entity-passage graph's files in a version: the build saves the graph (kpack.graph)
as CSR arrays beside the other retrieval indexes (``graph_*.npy`` and ``entities.arrow``,
kpack.index_files), and a reader loads it back memory-mapped.

Passage node i is chunk row i (chunks.arrow, sorted by id); entity node ``len(chunks) + j`` is
row j of entities.arrow (sorted by key).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from kpack.graph import Csr, EntityGraph, SortedGroups, build_entity_graph
from kpack.index_files import (
    ENTITIES,
    GRAPH_ABOUT_KEYS,
    GRAPH_ABOUT_OFFSETS,
    GRAPH_ABOUT_PASSAGES,
    GRAPH_ARTICLE_OF,
    GRAPH_FILES,
    GRAPH_INDICES,
    GRAPH_INDPTR,
    GRAPH_PASSAGES_OF_ENTITY,
    GRAPH_TITLE_ENTITY,
    GRAPH_TRANSITION,
    GRAPH_WEIGHTS,
    LONGEST_NAME_KEY,
)
from kpack.mapped_tables import Column, RowOf, keys_of, load_array, load_table, write_keyed
from kpack.text import normalize_entity

RELATION_WEIGHT = 0.5  # an ENTITY_RELATION edge of the graph, against 1 for a mention


def write_entity_graph(
    out: Path,
    chunks: pa.Table,
    articles: pa.Table,
    entities: pa.Table,
    mentions: pa.Table,
    links: pa.Table,
    relations: pa.Table,
) -> None:
    """Save the entity-passage graph of a version's tables into its index folder ``out``."""
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


def load_entity_graph(folder: Path, passages: Sequence[str]) -> EntityGraph:
    """The entity-passage graph of a version, its arrays memory-mapped (see
    write_entity_graph)."""
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
