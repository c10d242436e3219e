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
from kpack.text import code_names, folded_words

MENTIONS_SCHEMA = pa.schema(
    [("chunk_id", pa.string()), ("entity_id", pa.string()), ("named", pa.bool_())]
)


def spelled_keys(text: str) -> list[str]:
    """What a passage spells, as name keys (kpack.text.normalize_entity): its folded words and
    its code names ("ensure_ascii", which the words cut at the underscore)."""
    return folded_words(text) + code_names(text)


def chunk_mentions(chunks: pa.Table, entity_mentions: pa.Table) -> pa.Table:
    """(chunk_id, entity_id, named), sorted: the chunks of a section that mention each of its
    entities.

    Extraction names a section's entities; a chunk mentions one when its words contain the
    entity's normalised name (``named``). An entity that no chunk spells out (a name an LLM
    paraphrased, the page's own title) is mentioned by every chunk of its section, so no
    mention is lost, but those chunks do not name it: an entity's mention count is the
    passages that name it (kpack.graph), not the passages that merely sit near it.

    The pairs are worked out as row numbers (a million-chunk pack has tens of millions), and
    each chunk's words are spelled out once.
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
    spelled = _spelled(chunks["content"], np.unique(pair_chunk))
    keys = entity_mentions["entity_id"].to_pylist()
    named = np.array(
        [
            f" {keys[m]} " in spelled[c]
            for c, m in zip(pair_chunk.tolist(), pair_mention.tolist(), strict=True)
        ],
        dtype=bool,
    )
    # A mention no chunk of its section spells keeps every chunk of the section.
    spelled_anywhere = np.bincount(pair_mention[named], minlength=entity_mentions.num_rows) > 0
    kept = named | ~spelled_anywhere[pair_mention]
    pair_chunk, pair_mention, named = pair_chunk[kept], pair_mention[kept], named[kept]
    order = np.lexsort(
        (_ranks(entity_mentions["entity_id"])[pair_mention], _ranks(chunks["chunk_id"])[pair_chunk])
    )
    return pa.table(
        {
            "chunk_id": chunks["chunk_id"].take(pair_chunk[order]),
            "entity_id": entity_mentions["entity_id"].take(pair_mention[order]),
            "named": named[order],
        },
        schema=MENTIONS_SCHEMA,
    )


def _spelled(texts: pa.ChunkedArray, rows: np.ndarray) -> dict[int, str]:
    """Row -> `` key key ... `` (the name keys the text spells, space-delimited)."""
    chosen = texts.take(rows).to_pylist()
    return {
        int(row): f" {' '.join(spelled_keys(text))} "
        for row, text in zip(rows.tolist(), chosen, strict=True)
    }


def _ranks(values: pa.ChunkedArray) -> np.ndarray:
    """Each value's rank in sorted order (equal values, equal ranks)."""
    return pc.rank(values, sort_keys="ascending", tiebreaker="dense").to_numpy().astype(np.int64)
