"""Stage 3, chunks: sections cut into overlapping passages for retrieval (kpack.ingest.chunking)."""

import time

import pyarrow as pa
from dagster import AssetExecutionContext, Output

from assets.partitions import build_stage
from kpack.ingest.chunking import chunk_rows
from kpack.ingest.word_pieces import SPECIAL_PIECES, piece_counter
from resources.pack_store import PackStore


@build_stage(
    group_name="parse",
    description="Sections split into overlapping passages for retrieval.",
)
def chunks(
    context: AssetExecutionContext, sections: pa.Table, pack_store: PackStore
) -> Output[list[dict]]:
    started = time.perf_counter()
    config = pack_store.config(context.partition_key)
    counter = piece_counter(config.embedding_model)
    rows = chunk_rows(
        sections.to_pylist(), config.chunk_tokens, config.chunk_overlap_tokens, counter
    )
    split = sum(1 for r in rows if r["chunk_index"] == 1)
    # Only a heading path longer than the model reads leaves a chunk cut (chunking's floor).
    cut = sum(1 for r in rows if r["word_pieces"] > counter.reads)
    return Output(
        rows,
        metadata={
            "chunks": len(rows),
            "sections_split": split,
            "max_word_pieces": max((r["word_pieces"] for r in rows), default=0) + SPECIAL_PIECES,
            "model_reads_word_pieces": counter.reads + SPECIAL_PIECES,
            "chunks_cut_by_the_model": cut,
            "duration_s": round(time.perf_counter() - started, 3),
        },
    )
