"""What a pack embeds: one text per distinct content hash, and vectors as an Arrow column.

Keyed by content hash (heading path + text), so a chunk identical to its section is embedded
once, and cacheable by (model, content hash) across builds, so a rebuild embeds only new text.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kpack.contracts import passage_text


def distinct_texts(sections: pa.Table, chunks: pa.Table) -> dict[str, str]:
    """content_hash -> the text embedded for it."""
    heading_of = dict(
        zip(sections["section_id"].to_pylist(), sections["heading_path"].to_pylist(), strict=True)
    )
    texts: dict[str, str] = {}
    for row in sections.select(["content_hash", "heading_path", "content"]).to_pylist():
        texts.setdefault(row["content_hash"], passage_text(row["heading_path"], row["content"]))
    for row in chunks.select(["content_hash", "section_id", "content"]).to_pylist():
        texts.setdefault(
            row["content_hash"], passage_text(heading_of[row["section_id"]], row["content"])
        )
    return texts


def embedding_column(vectors: np.ndarray) -> pa.Array:
    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    fixed = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
    return fixed.cast(pa.list_(pa.float32()))
