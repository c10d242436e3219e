"""Which passage mentions which entity: the MENTIONS edges of the entity-passage graph.

Extraction (kpack.ingest.extraction) names the entities of each section; the graph joins
entities to passages (chunks), so the build works out which chunks of a section spell each
name. Queries read these edges from the pack database and walk them (kpack.graph).
"""

from __future__ import annotations

import pyarrow as pa

from kpack.text import code_names, name_words

MENTION_SCHEMA = pa.schema(
    [("chunk_id", pa.string()), ("entity_id", pa.string()), ("named", pa.bool_())]
)


def spelled_keys(text: str) -> list[str]:
    """What a passage spells, as name keys (kpack.text.normalize_entity): its folded words and
    its code names ("ensure_ascii", which the words cut at the underscore)."""
    return name_words(text) + code_names(text)


def chunk_mentions(chunks: pa.Table, entity_mentions: pa.Table) -> pa.Table:
    """(chunk_id, entity_id, named): the chunks of a section that mention each of its entities.

    Extraction names a section's entities; a chunk mentions one when its words contain the
    entity's normalised name (``named``). An entity that no chunk spells out (a name an LLM
    paraphrased, the page's own title) is mentioned by every chunk of its section, so no
    mention is lost, but those chunks do not name it: an entity's mention count is the
    passages that name it (kpack.graph), not the passages that merely sit near it.
    """
    by_section: dict[str, list[tuple[str, str]]] = {}
    for chunk, section, text in zip(
        chunks["chunk_id"].to_pylist(),
        chunks["section_id"].to_pylist(),
        chunks["content"].to_pylist(),
        strict=True,
    ):
        by_section.setdefault(section, []).append((chunk, text))
    keys: dict[str, list[str]] = {}
    for section, entity in zip(
        entity_mentions["section_id"].to_pylist(),
        entity_mentions["entity_id"].to_pylist(),
        strict=True,
    ):
        keys.setdefault(section, []).append(entity)
    rows: list[tuple[str, str, bool]] = []
    for section, entities in keys.items():
        parts = by_section.get(section, [])
        spelled = [(chunk, f" {' '.join(spelled_keys(text))} ") for chunk, text in parts]
        for entity in entities:
            named = [chunk for chunk, words in spelled if f" {entity} " in words]
            if named:
                rows += [(chunk, entity, True) for chunk in named]
            else:
                rows += [(chunk, entity, False) for chunk, _ in parts]
    rows.sort()
    return pa.table(
        {
            "chunk_id": [c for c, _, _ in rows],
            "entity_id": [e for _, e, _ in rows],
            "named": [n for _, _, n in rows],
        },
        schema=MENTION_SCHEMA,
    )
