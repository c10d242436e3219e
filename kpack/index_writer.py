"""Writing a version's retrieval indexes (issue 20): every file of ``indexes/``
(kpack.index_files) from the build's own Arrow tables, which the build also loads into Kuzu
(the indexes are never read back from Kuzu).

The build (assets.graph.pack_graph) calls :func:`write_indexes` on the staged version folder;
the documentation graph's files are kpack.docgraph's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kpack.entity_graph_files import write_entity_graph
from kpack.identifier_index import write_identifier_index
from kpack.index_files import (
    ANN_FILES,
    ARTICLE_ENTITIES,
    ARTICLES,
    CHUNK_VECTORS,
    CHUNKS,
    FACTS,
    LINK_OFFSETS,
    LINK_TARGETS,
    SECTION_VECTORS,
    SECTIONS,
    SECTIONS_BY_ARTICLE,
)
from kpack.keyword_index import keyword_postings
from kpack.mapped_tables import load_array, strings, write_arrow, write_keyed
from kpack.packs import INDEX_DIR
from kpack.sentence_index import write_sentence_index
from kpack.vector_index import ann_min_vectors, save_vectors, write_ann


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
    sentences: Mapping[str, list[str]],
    sentence_vectors: pa.Table,
    dim: int,
) -> None:
    """Write every index file of a version into ``folder/indexes``: the build's own tables
    (kpack.contracts), ``sections`` and ``chunks`` with an ``embedding`` column (fixed-size
    lists of ``dim`` floats), ``articles`` with their ``pagerank``, each chunk's sentences'
    hashes (kpack.sentence_index.sentence_hashes) and their vectors (content_hash, embedding;
    none: no sentence index)."""
    out = folder / INDEX_DIR
    out.mkdir(parents=True, exist_ok=True)
    chunk_order = pc.sort_indices(chunks["chunk_id"])
    section_order = pc.sort_indices(sections["section_id"])
    save_vectors(out / CHUNK_VECTORS, chunks["embedding"], chunk_order, dim)
    save_vectors(out / SECTION_VECTORS, sections["embedding"], section_order, dim)
    for vectors in (CHUNK_VECTORS, SECTION_VECTORS):  # the definitions': kpack.docgraph
        if len(load_array(out, vectors)) >= ann_min_vectors():
            write_ann(out / ANN_FILES[vectors], load_array(out, vectors, whole=True))
    write_sentence_index(
        out, chunks["chunk_id"].take(chunk_order).to_pylist(), sentences, sentence_vectors, dim
    )
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
    for name, array in keyword_postings(strings(chunks["content"])).items():
        np.save(out / name, array)
    write_identifier_index(out, strings(chunks["content"]))
    write_entity_graph(out, chunks, articles, entities, mentions, links, relations)


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
