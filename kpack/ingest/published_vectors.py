"""The vectors a published version already holds, as embedding-cache rows.

A pack installed from a ``.kpack`` archive (or one whose build cache was lost) has a published
version but no embedding cache: without this, its first build would embed every text again.
The version's index files hold each chunk's text, its section's heading path, its vector and
its sentences' (kpack.indexes, kpack.sentence_index), which is all a cache row needs: the
content hash of the text the model embedded (kpack.contracts.passage_text) and the vector.
They are reused only when the version was embedded by the same model in the same precision,
so a build never mixes vectors of two models or of fp32 and int8; a version whose files fail
their checksums is not read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from kpack.contracts import content_hash, passage_text, section_of_chunk
from kpack.embedding import model_label
from kpack.errors import PackError
from kpack.index_files import (
    CHUNK_VECTORS,
    CHUNKS,
    SECTION_VECTORS,
    SECTIONS,
    SENTENCE_OFFSETS,
    SENTENCE_VECTORS,
)
from kpack.ingest.vectors import embedding_column
from kpack.mapped_tables import load_array, load_table
from kpack.packs import INDEX_DIR
from kpack.sentence_index import sentence_texts_of
from kpack.store import verify_version


def published_vectors(version: Path | None, model: str, precision: str) -> pa.Table | None:
    """(content_hash, embedding) of every text the published ``version`` embedded, when its
    vectors come from ``model`` in ``precision``; None when there is no version, it was
    embedded otherwise, or its files are damaged or of an older layout."""
    if version is None:
        return None
    try:
        embedding = json.loads((version / "manifest.json").read_text()).get("embedding") or {}
        if (embedding.get("model"), embedding.get("precision", "fp32")) != (
            model_label(model),
            precision,
        ):
            return None
        verify_version(version)
        folder = version / INDEX_DIR
        sections = load_table(folder, SECTIONS, whole=True)
        chunks = load_table(folder, CHUNKS, whole=True)
        heading = dict(
            zip(
                sections["section_id"].to_pylist(),
                sections["heading_path"].to_pylist(),
                strict=True,
            )
        )
        hashes = [
            content_hash(passage_text(heading[section_of_chunk(chunk)], text))
            for chunk, text in zip(
                chunks["chunk_id"].to_pylist(), chunks["content"].to_pylist(), strict=True
            )
        ]
        vectors = [load_array(folder, CHUNK_VECTORS, whole=True)]
        # Derived section vectors are a chunk's: only sections the model embedded are cached.
        if embedding.get("section_vectors") == "embedded":
            hashes += [
                content_hash(passage_text(path, text))
                for path, text in zip(
                    sections["heading_path"].to_pylist(),
                    sections["content"].to_pylist(),
                    strict=True,
                )
            ]
            vectors.append(load_array(folder, SECTION_VECTORS, whole=True))
        # The passages' sentences, in the order kpack.sentence_index wrote them (float16).
        if (folder / SENTENCE_OFFSETS).is_file():
            hashes += [
                content_hash(sentence)
                for chunk, text in zip(
                    chunks["chunk_id"].to_pylist(), chunks["content"].to_pylist(), strict=True
                )
                for sentence in sentence_texts_of(heading[section_of_chunk(chunk)], text)
            ]
            vectors.append(load_array(folder, SENTENCE_VECTORS, whole=True).astype(np.float32))
    except (OSError, ValueError, KeyError, pa.ArrowException, PackError):
        return None  # nothing to reuse: the build embeds the texts
    stacked = np.concatenate(vectors)
    if len(stacked) != len(hashes):
        return None
    table = pa.table({"content_hash": hashes, "embedding": embedding_column(stacked)})
    # A text in several places has one vector: keep its first row.
    first = np.unique(np.asarray(hashes, dtype=object), return_index=True)[1]
    return table.take(pa.array(np.sort(first)))
