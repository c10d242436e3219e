"""What a build embeds: each distinct text once across the whole pack, and a longer section's
vector taken from its first chunk unless the pack asks for section texts to be embedded."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

import retrieval
from kpack.contracts import chunk_id, section_of_chunk
from kpack.graphdb import opened
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


def docs_pack(workspace, section_vectors: str):
    folder = workspace / "packs" / "manual"
    docs = folder / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for name, text in PAGES.items():
        (docs / name).write_text(text, encoding="utf-8")
    config = {
        "fetch": {**TEST_FETCH, "file_roots": ["docs"]},
        "section_vectors": section_vectors,
        "extraction": "offline",
    }
    return write_pack(workspace, "manual", [(docs / n).as_uri() for n in PAGES], config)


def stage_table(workspace, stage: str):
    return pq.read_table(workspace / "storage" / stage / "manual.parquet")


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
