"""What a build embeds: each distinct text once across the whole pack, a longer section's
vector taken from its first chunk unless the pack asks for section texts to be embedded, and
every passage's sentences apart unless the pack asks for passages only."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

import retrieval
from kpack.contracts import chunk_id, section_of_chunk
from kpack.graphdb import opened
from kpack.index_files import SENTENCE_OFFSETS, SENTENCE_VECTORS
from kpack.packs import INDEX_DIR, current_version
from kpack.sentence_index import passage_sentences
from retrieval.candidates import nearest_passages
from tests.conftest import TEST_FETCH, build, write_pack
from tests.docsite import prose

# One page with a section far longer than a chunk; two pages copied from one template (a
# mirror, a print view): the same title, headings and text, so the same texts to embed.
LONG_WORDS = 700
PAGES = {
    "manual.md": "# Sprocket Manual\n\n## Overview\n\nThe sprocket manual explains how a "
    "sprocket is fitted to its shaft and kept lubricated.\n\n## Maintenance schedule\n\n"
    + prose("maintenance", LONG_WORDS),
    "mirror-a.md": "# Release Notes\n\n## Support\n\nAsk the widget desk about gasket "
    "replacements; answers come within two working days.\n",
    "mirror-b.md": "# Release Notes\n\n## Support\n\nAsk the widget desk about gasket "
    "replacements; answers come within two working days.\n",
}


# A long passage whose one sentence answers the question below, and a short one about keys in
# general: the question is closer to the second passage as a whole, and to the first one's
# sentence than to any of the second's.
GARDEN = {
    "shed.md": "# Garden Shed\n\n## Upkeep\n\nPaint the timber walls every third summer with a "
    "breathable stain, working from the roof edge down so drips land on unpainted boards. Clear "
    "the gutters of leaves each autumn and check that the downpipe drains away from the base. "
    "Oil the door hinges in spring. Spare keys for the shed hang on a hook behind the greenhouse "
    "door. Replace any roofing felt that has lifted before the winter storms, and keep the floor "
    "raised on bearers so the joists stay dry. Store paint tins on the top shelf, away from "
    "frost.\n",
    "locksmith.md": "# Locksmith Services\n\n## Key cutting\n\nOur locksmiths cut keys for "
    "doors, padlocks and cabinets while you wait. Bring the original key and we copy it on the "
    "bench in a few minutes. Security keys need the owner's card.\n",
}
KEYS_QUESTION = "where do the spare shed keys hang"


def docs_pack(
    workspace,
    section_vectors: str,
    sentence_vectors: str = "none",
    name: str = "manual",
    pages: dict[str, str] = PAGES,
):
    folder = workspace / "packs" / name
    docs = folder / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for page, text in pages.items():
        (docs / page).write_text(text, encoding="utf-8")
    config = {
        "fetch": {**TEST_FETCH, "file_roots": ["docs"]},
        "section_vectors": section_vectors,
        "sentence_vectors": sentence_vectors,
        "extraction": "offline",
    }
    return write_pack(workspace, name, [(docs / n).as_uri() for n in pages], config)


def stage_table(workspace, stage: str, pack: str = "manual"):
    return pq.read_table(workspace / "storage" / stage / f"{pack}.parquet")


def test_sections_derived_from_chunks_and_identical_texts_embedded_once(workspace):
    folder = docs_pack(workspace, "derived")
    first = build(workspace, "manual")
    assert first.published, first.cause
    sections, chunks = stage_table(workspace, "sections"), stage_table(workspace, "chunks")
    chunk_texts = set(chunks["content_hash"].to_pylist())
    # The two copies' chunks are one text: the model saw it once. No section text was
    # embedded: a short section is its only chunk, the long one is derived.
    assert chunks.num_rows == len(chunk_texts) + 1
    embedding = first.manifest["embedding"]
    assert embedding["section_vectors"] == "derived"
    assert embedding["embedded_this_build"] == embedding["texts"] == len(chunk_texts)

    retrieval.close_all()
    with retrieval.reading(folder) as reader:
        long_id = next(
            s for s in reader.section_ids if reader.sections[s].title == "Maintenance schedule"
        )
        rows = [r for r, c in enumerate(reader.chunk_ids) if section_of_chunk(c) == long_id]
        assert len(rows) >= 3
        first_chunk = np.asarray(reader.chunk_vectors)[reader.chunk_row[chunk_id(long_id, 0)]]
        derived = np.asarray(reader.section_vectors)[reader.section_row[long_id]]
        assert np.array_equal(derived, first_chunk)
        # What queries read of section vectors finds it: the section nearest its opening.
        opening = reader.embed([reader.chunk_text[chunk_id(long_id, 0)]])[0]
        (nearest, _), *_ = reader.nearest("Section", opening, 1)
        assert nearest == long_id
    with opened(folder / "pack.db", read_only=True) as conn:
        (stored,), *_ = conn.execute(
            "MATCH (s:Section {section_id: $s}) RETURN s.embedding", {"s": long_id}
        ).get_all()
    assert np.allclose(stored, first_chunk)

    # Asking for embedded section vectors embeds the long section's text alone: every chunk
    # vector comes from the cache.
    config = folder / "kg_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "section_vectors": "embedded"}))
    second = build(workspace, "manual")
    assert second.published, second.cause
    assert second.manifest["embedding"]["section_vectors"] == "embedded"
    multi_chunk = len(set(sections["content_hash"].to_pylist()) - chunk_texts)
    assert multi_chunk == 1
    assert second.manifest["embedding"]["embedded_this_build"] == multi_chunk
    assert second.manifest["embedding"]["texts"] == len(chunk_texts) + multi_chunk


def test_a_passage_is_found_by_its_best_sentence_and_a_pack_can_do_without(workspace):
    folder = docs_pack(workspace, "derived", "embedded", name="garden", pages=GARDEN)
    first = build(workspace, "garden")
    assert first.published, first.cause
    chunks = stage_table(workspace, "chunks", "garden")
    sentences = sum(len(passage_sentences(text)) for text in chunks["content"].to_pylist())
    assert sentences == 9  # six of the shed's upkeep, three of the locksmith's
    embedding = first.manifest["embedding"]
    assert embedding["sentence_vectors"] == "embedded"
    assert embedding["texts"] == embedding["embedded_this_build"] == chunks.num_rows + sentences

    retrieval.close_all()
    with retrieval.reading(folder) as reader:
        vector = reader.embed([KEYS_QUESTION])[0]
        by_passage = nearest_passages(reader, KEYS_QUESTION, vector, 2, labels=("Chunk",))
        by_sentence = nearest_passages(
            reader, KEYS_QUESTION, vector, 2, labels=("Chunk",), sentence_weight=0.6
        )
    # By its own vector the locksmith's passage is nearer; by its best sentence, the shed's.
    assert "locksmiths" in by_passage[0].text
    assert "Spare keys" in by_sentence[0].text
    shed = by_sentence[0]
    assert shed.similarity < by_passage[0].similarity < shed.sentence_similarity
    assert "best sentence" in shed.reasons[0]
    # The search's trace says it too.
    found = retrieval.search(folder, KEYS_QUESTION, k=1)
    assert "Spare keys" in found[0]["text"] and "best sentence" in found[0]["why"]

    # Passages only: nothing is embedded again, the version has no sentence index, and vector
    # search ranks by the passages' own vectors whatever its weight.
    config = folder / "kg_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "sentence_vectors": "none"}))
    second = build(workspace, "garden")
    assert second.published, second.cause
    assert second.manifest["embedding"]["sentence_vectors"] == "none"
    assert second.manifest["embedding"]["embedded_this_build"] == 0
    indexes = current_version(folder) / INDEX_DIR
    assert not (indexes / SENTENCE_VECTORS).exists() and not (indexes / SENTENCE_OFFSETS).exists()
    retrieval.close_all()
    with retrieval.reading(folder) as reader:
        assert reader.sentences is None
        again = nearest_passages(
            reader, KEYS_QUESTION, vector, 2, labels=("Chunk",), sentence_weight=0.6
        )
    assert "locksmiths" in again[0].text and again[0].sentence_similarity is None
