"""What a pack embeds: one text per distinct content hash, and vectors as an Arrow column.

Keyed by content hash (the heading path and text, kpack.contracts.passage_text), so a text
met several times in a pack (a page served under two URLs, a copied page, a section identical
to its only chunk) is embedded once per pack, and cacheable by (model, content hash) across
builds, so a rebuild embeds only new text. Boilerplate under different page titles is not the
same text: its heading path names the page (the Python docs have no repeated passage at all).

With ``sentence_vectors: embedded`` (the default) every passage's sentences are texts too
(kpack.sentence_index): about five per passage, short ones.

A section longer than one chunk has a text of its own. With ``section_vectors: embedded`` the
model embeds it too, but reads only its first 256 tokens, which its first chunk already holds;
with ``derived`` (the default) the section takes its first chunk's vector
(:func:`derived_section_vectors`) and the model embeds chunk texts only: 1,361 fewer of the
Python docs' 8,722 texts (16%), 45 fewer of HotpotQA's 1,089. Measured in bench/RESULTS.md
(issue 24): the retrieval figures do not change, while the mean of a section's chunk
vectors, the other way to derive one, lost hit@1 (SQuAD vector search 0.659 -> 0.626,
Python docs 0.743 -> 0.714).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kpack.contracts import passage_text
from kpack.ingest.definitions import defining_passage, entry_hash, entry_text
from kpack.sentence_index import sentence_texts


def distinct_texts(
    sections: pa.Table,
    chunks: pa.Table,
    embed_sections: bool = True,
    embed_sentences: bool = True,
) -> dict[str, str]:
    """content_hash -> the text the model embeds for it: every chunk's, every section's
    when ``embed_sections`` (a section of one chunk has its chunk's hash either way), every
    definition's entry text (:func:`entry_texts`) and, when ``embed_sentences``, every
    passage's sentences (kpack.sentence_index)."""
    heading_of = dict(
        zip(sections["section_id"].to_pylist(), sections["heading_path"].to_pylist(), strict=True)
    )
    texts: dict[str, str] = {}
    if embed_sections:
        for row in sections.select(["content_hash", "heading_path", "content"]).to_pylist():
            texts.setdefault(row["content_hash"], passage_text(row["heading_path"], row["content"]))
    for row in chunks.select(["content_hash", "section_id", "content"]).to_pylist():
        texts.setdefault(
            row["content_hash"], passage_text(heading_of[row["section_id"]], row["content"])
        )
    texts.update(entry_texts(sections, chunks))
    if embed_sentences:
        for key, text in sentence_texts(sections, chunks).items():
            texts.setdefault(key, text)
    return texts


def entry_texts(sections: pa.Table, chunks: pa.Table) -> dict[str, str]:
    """entry hash -> entry text of every identifier the sections define
    (kpack.ingest.definitions), read from its defining passage."""
    defining = sections.filter(pc.invert(pc.is_null(sections["defines"])))
    if defining.num_rows == 0:
        return {}
    wanted = chunks.filter(pc.is_in(chunks["section_id"], value_set=defining["section_id"]))
    passages: dict[str, list[tuple[int, str]]] = {}
    for row in wanted.select(["section_id", "chunk_index", "content"]).to_pylist():
        passages.setdefault(row["section_id"], []).append((row["chunk_index"], row["content"]))
    texts: dict[str, str] = {}
    for row in defining.select(["section_id", "defines"]).to_pylist():
        ordered = [text for _, text in sorted(passages.get(row["section_id"], []))]
        if not ordered:
            continue
        for name in row["defines"] or []:
            text = entry_text(name, ordered[defining_passage(name, ordered)])
            texts.setdefault(entry_hash(text), text)
    return texts


def derived_section_vectors(sections: pa.Table, chunks: pa.Table, vectors: pa.Table) -> pa.Table:
    """(content_hash, embedding) of the sections whose text ``vectors`` lacks: their first
    chunk's vector (every chunk's is in ``vectors``), one row per distinct text."""
    missing = pc.invert(pc.is_in(sections["content_hash"], value_set=vectors["content_hash"]))
    candidates = sections.filter(missing)
    # A section copied on several pages has one text, and the same first chunk.
    row_of = {h: row for row, h in enumerate(candidates["content_hash"].to_pylist())}
    wanted = candidates.take(pa.array(sorted(row_of.values()), type=pa.int64()))
    first_chunks = chunks.filter(pc.equal(chunks["chunk_index"], 0))
    first_chunk = pc.index_in(wanted["section_id"], value_set=first_chunks["section_id"])
    chunk_texts = first_chunks["content_hash"].take(first_chunk)
    rows = pc.index_in(chunk_texts, value_set=vectors["content_hash"])
    return pa.table(
        {"content_hash": wanted["content_hash"], "embedding": vectors["embedding"].take(rows)},
        schema=vectors.schema,
    )


def embedding_column(vectors: np.ndarray) -> pa.Array:
    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    fixed = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
    return fixed.cast(pa.list_(pa.float32()))
