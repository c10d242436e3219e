"""Which passage mentions which entity: the MENTIONS edges of the entity-passage graph.

Extraction (kpack.ingest.extraction) names the entities of each section; the graph joins
entities to passages (chunks), so the build works out which chunks of a section spell each
name. Queries read these edges from the pack database and walk them (kpack.graph).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kpack.graph import rows_of, spans
from kpack.text import name_words

MENTIONS_SCHEMA = pa.schema([("chunk_id", pa.string()), ("entity_id", pa.string())])


def chunk_mentions(chunks: pa.Table, entity_mentions: pa.Table) -> pa.Table:
    """(chunk_id, entity_id), sorted: the chunks of a section that mention each of its entities.

    Extraction names a section's entities; a chunk mentions one when its words contain the
    entity's normalised name. An entity that no chunk spells out (a name an LLM paraphrased)
    is mentioned by every chunk of its section, so no mention is lost.

    The pairs are worked out as row numbers (a million-chunk pack has tens of millions), and
    a chunk's words are spelled out only when its section has more than one chunk.
    """
    sections = pc.unique(chunks["section_id"])
    chunk_section = rows_of(chunks["section_id"], sections)
    members = np.argsort(chunk_section, kind="stable")  # chunk rows grouped by section
    counts = np.bincount(chunk_section, minlength=len(sections))
    starts = np.concatenate([[0], np.cumsum(counts)])
    mention_section = rows_of(entity_mentions["section_id"], sections)
    mention_rows = np.flatnonzero(mention_section >= 0)
    mention_section = mention_section[mention_rows]
    sizes = counts[mention_section]
    # Every (chunk of the section, mention) pair: a section's mention may name any chunk.
    pair_chunk = members[spans(starts[mention_section], sizes)]
    pair_mention = np.repeat(mention_rows, sizes)
    shared = np.repeat(sizes > 1, sizes)  # pairs of sections with several chunks
    spelled = _spelled(chunks["content"], np.unique(pair_chunk[shared]))
    keys = entity_mentions["entity_id"].to_pylist()
    named = np.ones(len(pair_chunk), dtype=bool)
    named[shared] = [
        f" {keys[m]} " in spelled[c]
        for c, m in zip(pair_chunk[shared].tolist(), pair_mention[shared].tolist(), strict=True)
    ]
    # A mention no chunk of its section spells keeps every chunk of the section.
    spelled_anywhere = np.bincount(pair_mention[named], minlength=entity_mentions.num_rows) > 0
    kept = named | ~spelled_anywhere[pair_mention]
    pair_chunk, pair_mention = pair_chunk[kept], pair_mention[kept]
    order = np.lexsort(
        (_ranks(entity_mentions["entity_id"])[pair_mention], _ranks(chunks["chunk_id"])[pair_chunk])
    )
    return pa.table(
        {
            "chunk_id": chunks["chunk_id"].take(pair_chunk[order]),
            "entity_id": entity_mentions["entity_id"].take(pair_mention[order]),
        },
        schema=MENTIONS_SCHEMA,
    )


def _spelled(texts: pa.ChunkedArray, rows: np.ndarray) -> dict[int, str]:
    """Row -> `` word word ... `` (the folded words of the text, space-delimited)."""
    chosen = texts.take(rows).to_pylist()
    return {
        int(row): f" {' '.join(name_words(text))} "
        for row, text in zip(rows.tolist(), chosen, strict=True)
    }


def _ranks(values: pa.ChunkedArray) -> np.ndarray:
    """Each value's rank in sorted order (equal values, equal ranks)."""
    return pc.rank(values, sort_keys="ascending", tiebreaker="dense").to_numpy().astype(np.int64)
