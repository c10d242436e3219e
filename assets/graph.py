"""Stage 7, pack_graph: every intermediate loaded into a fresh, staged Kuzu database.

This is the only step that writes Kuzu (Kuzu has a single writer). It builds in this run's
staging folder with COPY FROM Arrow tables (never pandas: kuzu 0.11.3 crashes on pandas 3
string columns), checkpoints and closes, in a child process (kpack.graphdb.writing_graph: a
full disk aborts Kuzu) while this process writes the retrieval indexes on the other core.
Beside the database it writes articles.json (url -> content hash), which the next build
compares its pages with: a build never opens the published database. Nothing a reader sees
changes until pack_manifest publishes the staged folder. pack_graph hands pack_manifest a
kpack.contracts.StagedBuild record through the IO manager: the staged database's facts and
those of the stages it was built from (each input table carries its stage's facts).

Whether anything changed is decided once, by fetched_pages (see assets.fetch): when nothing
did, this stage is skipped; when it runs, its database is published.
"""

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    MetadataValue,
    Output,
)

from assets.partitions import (
    build_stage,
    pack_check,
)
from kpack.changes import page_changes
from kpack.contracts import StagedBuild, facts_of
from kpack.docgraph import write_doc_graph
from kpack.errors import PackError
from kpack.graphdb import graph_counts, opened, writing_graph
from kpack.index_files import CHUNK_ANN, CHUNK_VECTORS, CHUNKS
from kpack.index_writer import write_indexes
from kpack.ingest.mentions import chunk_mentions
from kpack.ingest.vectors import entry_texts
from kpack.keyword_index import KeywordIndex
from kpack.mapped_tables import Column, load_array, load_table
from kpack.packs import INDEX_DIR
from kpack.sentence_index import sentence_hashes
from kpack.store import version_number, write_articles
from kpack.text import normalize_entity, search_words
from kpack.vector_index import load_ann, nearest_rows
from resources.pack_store import PackStore


def _with_embeddings(rows: pa.Table, embeddings: pa.Table, dim: int) -> pa.Table:
    """rows joined to their vectors (fixed-size, as Kuzu's FLOAT[dim] wants)."""
    position = pc.index_in(rows["content_hash"], value_set=embeddings["content_hash"])
    vectors = embeddings["embedding"].take(position)  # no combined copy of every vector first
    fixed = vectors.cast(pa.list_(pa.float32(), dim))
    return rows.append_column("embedding", fixed)


def node_tables(
    articles: pa.Table,
    sections: pa.Table,
    chunks: pa.Table,
    entities: pa.Table,
    facts: pa.Table,
    embeddings: pa.Table,
    pagerank: pa.Table,
    dim: int,
) -> dict[str, pa.Table]:
    ranks = pagerank.select(["url", "pagerank", "pagerank_raw"])
    article_rows = articles.join(ranks, "url", join_type="left outer")
    categories = pc.value_counts(articles["category"])
    return {
        "Article": article_rows,
        "Section": _with_embeddings(sections, embeddings, dim),
        "Chunk": _with_embeddings(chunks, embeddings, dim),
        "Entity": entities,
        "Fact": facts,
        "Category": pa.table(
            {
                "name": categories.field("values"),
                "article_count": pc.cast(categories.field("counts"), pa.int32()),
            }
        ),
    }


def definitions(sections: pa.Table, entities: pa.Table) -> pa.Table:
    """DEFINES rows (section id, entity id): each section and the API identifiers it defines
    (extraction made them entities, kpack.ingest.extraction)."""
    known = set(entities["entity_id"].to_pylist())
    rows = sorted(
        {
            (section, key)
            for section, names in zip(
                sections["section_id"].to_pylist(), sections["defines"].to_pylist(), strict=True
            )
            for key in map(normalize_entity, names or ())
            if key in known
        }
    )
    return pa.table(
        {"section_id": [s for s, _ in rows], "entity_id": [e for _, e in rows]},
        schema=pa.schema([("section_id", pa.string()), ("entity_id", pa.string())]),
    )


def rel_tables(
    articles: pa.Table,
    sections: pa.Table,
    chunks: pa.Table,
    links: pa.Table,
    section_links: pa.Table,
    entities: pa.Table,
    mentions: pa.Table,
    relations: pa.Table,
    facts: pa.Table,
    entity_mentions: pa.Table,
) -> dict[str, pa.Table]:
    """Each edge table as (from, to, properties...) in the declared column order; ``mentions``
    are the MENTIONS edges (kpack.ingest.mentions.chunk_mentions)."""
    article_entities = entity_mentions.group_by(["article_url", "entity_id"]).aggregate([])
    return {
        "HAS_SECTION": sections.select(["article_url", "section_id", "section_index"]),
        "HAS_CHUNK": chunks.select(["article_url", "chunk_id", "section_index", "chunk_index"]),
        "LINKS_TO": links.select(["source_url", "target_url", "link_type"]),
        "IN_CATEGORY": articles.select(["url", "category"]),
        "HAS_ENTITY": article_entities.select(["article_url", "entity_id"]),
        "HAS_FACT": facts.select(["article_url", "fact_id"]),
        "ENTITY_RELATION": relations.select(["source_id", "target_id", "relation", "context"]),
        "MENTIONS": mentions.select(["chunk_id", "entity_id"]),
        "LINKS_TO_SECTION": section_links.select(
            ["source_section_id", "target_section_id", "anchor"]
        ),
        "DEFINES": definitions(sections, entities),
    }


def write_staged(
    staging: Path,
    tables: dict[str, pa.Table],
    dim: int,
    done: Callable[[str], None] = lambda step: None,
) -> None:
    """A staged version's database and retrieval indexes (kpack.index_writer, kpack.docgraph),
    from the build's tables by their contract names and ``mentions`` (the MENTIONS edges,
    kpack.ingest.mentions.chunk_mentions); pack_graph writes its versions with it, and so does
    bench/scale_bench.py, which calls ``done`` after each step to time it.

    The embeddings are taken out of ``tables`` once joined to the sections and chunks: a
    million-passage pack's are 1.5 GB that the later steps do not need."""
    t = tables
    # The definitions' entry vectors and the sentences', kept apart before the embeddings
    # are let go (below).
    sentences = sentence_hashes(t["sections"], t["chunks"])
    entry_vectors, sentence_vectors = (
        t["embeddings"].filter(
            pc.is_in(t["embeddings"]["content_hash"], value_set=pa.array(list(keys), pa.string()))
        )
        for keys in (
            entry_texts(t["sections"], t["chunks"]),
            {key for keys in sentences.values() for key in keys},
        )
    )
    nodes = node_tables(
        t["articles"],
        t["sections"],
        t["chunks"],
        t["entities"],
        t["facts"],
        t.pop("embeddings"),
        t["pagerank"],
        dim,
    )
    done("node tables")
    rels = rel_tables(
        t["articles"],
        t["sections"],
        t["chunks"],
        t["links"],
        t["section_links"],
        t["entities"],
        t["mentions"],
        t["relations"],
        t["facts"],
        t["entity_mentions"],
    )
    done("relationship tables")
    with writing_graph(staging / "pack.db", nodes, rels, dim):  # Kuzu in a child, the indexes here
        write_indexes(
            staging,
            nodes["Article"],
            nodes["Section"],
            nodes["Chunk"],
            t["links"],
            t["entities"],
            t["entity_mentions"],
            t["mentions"],
            t["relations"],
            t["facts"],
            sentences,
            sentence_vectors,
            dim,
        )
    done("Kuzu database and retrieval indexes")
    del nodes, rels  # copies with vectors: the documentation graph needs ids and texts only
    write_doc_graph(
        staging / INDEX_DIR,
        t["sections"].select(["section_id", "defines"]).sort_by("section_id"),
        load_table(staging / INDEX_DIR, CHUNKS),  # mapped, sorted by chunk_id: no copy of the texts
        t["section_links"],
        entry_vectors,
        dim,
    )
    done("documentation graph")


@build_stage(
    group_name="graph",
    compute_kind="kuzu",
    io_manager_key="staged_build_io_manager",
    description="The staged Kuzu database and retrieval indexes (not yet published).",
)
def pack_graph(
    context: AssetExecutionContext,
    pack_store: PackStore,
    fetched_pages: pa.Table,
    articles: pa.Table,
    sections: pa.Table,
    links: pa.Table,
    section_links: pa.Table,
    chunks: pa.Table,
    entities: pa.Table,
    entity_mentions: pa.Table,
    relations: pa.Table,
    facts: pa.Table,
    embeddings: pa.Table,
    pagerank: pa.Table,
) -> Output[StagedBuild]:
    started = time.perf_counter()
    pack = context.partition_key
    pages = fetched_pages.select(["url", "status", "content_hash", "error"]).to_pylist()
    current = pack_store.current(pack)
    previous_version = version_number(current) if current else None
    changes = page_changes(pages, pack_store.published_articles(pack))
    if not chunks.num_rows:
        # Pages of headings only (or nothing a reader would read): no passage to embed or
        # search, and a database of no vectors has no dimension to declare.
        raise PackError(
            f"nothing to index: the {articles.num_rows} page(s) fetched have no text beside "
            "their headings; add pages with content to urls.txt"
        )
    dim = len(embeddings["embedding"][0])
    staging = pack_store.new_staging(pack, context.run_id)
    db_path = staging / "pack.db"
    write_staged(
        staging,
        {
            "articles": articles,
            "sections": sections,
            "links": links,
            "section_links": section_links,
            "chunks": chunks,
            "entities": entities,
            "entity_mentions": entity_mentions,
            "mentions": chunk_mentions(chunks, entity_mentions),
            "relations": relations,
            "facts": facts,
            "embeddings": embeddings,
            "pagerank": pagerank,
        },
        dim,
    )
    write_articles(
        staging,
        dict(zip(articles["url"].to_pylist(), articles["content_hash"].to_pylist(), strict=True)),
    )
    with opened(db_path, read_only=True) as conn:
        counts = graph_counts(conn)
    duration = round(time.perf_counter() - started, 3)
    stages = {
        "fetched_pages": fetched_pages,
        "articles": articles,
        "chunks": chunks,
        "entities": entities,
        "embeddings": embeddings,
        "pagerank": pagerank,
    }
    record = StagedBuild(
        previous_version=previous_version,
        sources_fingerprint=facts_of(fetched_pages).get("sources_fingerprint"),
        embedding_dimension=dim,
        changes=changes,
        invalid_lines=[str(problem) for problem in pack_store.sources(pack)[1]],
        stages={
            **{name: facts_of(table) for name, table in stages.items()},
            "pack_graph": {"duration_s": duration},
        },
    )
    return Output(
        record,
        metadata={
            **{f"count_{k}": v for k, v in counts.items()},
            "embedding_dimension": dim,
            "previous_version": previous_version,
            "changes": MetadataValue.json(changes),
            "staged_at": MetadataValue.path(str(db_path)),
            "db_bytes": db_path.stat().st_size,
            "duration_s": duration,
        },
    )


@pack_check(
    pack_graph,
    "Every section and chunk has an embedding, and the retrieval indexes answer a query.",
    blocking=True,
)
def graph_is_queryable(
    context: AssetCheckExecutionContext, pack_store: PackStore
) -> AssetCheckResult:
    staging = pack_store.staging(context.partition_key, context.run.run_id)
    with opened(staging / "pack.db", read_only=True) as conn:
        missing = {
            label: conn.execute(
                f"MATCH (n:{label}) WHERE n.embedding IS NULL RETURN count(n)"
            ).get_next()[0]
            for label in ("Section", "Chunk")
        }
    folder = staging / INDEX_DIR
    vectors = load_array(folder, CHUNK_VECTORS)
    keywords = KeywordIndex.load(folder)
    vector_hits = keyword_hits = 0
    if len(vectors):
        ann = load_ann(folder, CHUNK_ANN)
        rows, _ = nearest_rows(vectors, np.asarray(vectors[0]), 3, ann)
        vector_hits = len(rows)
        text = Column(load_table(folder, CHUNKS)["content"])[0]
        word = max(search_words(text) or ["the"], key=len)
        keyword_hits = len(keywords.search(word, 3))
    passed = not any(missing.values()) and vector_hits > 0 and keyword_hits > 0
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.ERROR,
        description="sections/chunks without embeddings, or a retrieval index that returns "
        "nothing, stop the pack from being published",
        metadata={
            "sections_without_embedding": missing["Section"],
            "chunks_without_embedding": missing["Chunk"],
            "vector_index_hits": vector_hits,
            "keyword_index_hits": keyword_hits,
        },
    )
