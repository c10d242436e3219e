"""Stage 3, chunks: sections cut into overlapping passages for retrieval (kpack.ingest.chunking)."""

import time

import pyarrow as pa
from dagster import AssetExecutionContext, Output, asset

from assets.partitions import BUILD_CODE_VERSION, follow_upstream, packs_partitions
from kpack.ingest.chunking import chunk_rows
from resources.pack_store import PackStore


@asset(
    partitions_def=packs_partitions,
    group_name="parse",
    code_version=BUILD_CODE_VERSION,
    automation_condition=follow_upstream,
    description="Sections split into overlapping passages for retrieval.",
)
def chunks(
    context: AssetExecutionContext, sections: pa.Table, pack_store: PackStore
) -> Output[list[dict]]:
    started = time.perf_counter()
    config = pack_store.config(context.partition_key)
    rows = chunk_rows(sections.to_pylist(), config.chunk_tokens, config.chunk_overlap_tokens)
    split = sum(1 for r in rows if r["chunk_index"] == 1)
    return Output(
        rows,
        metadata={
            "chunks": len(rows),
            "sections_split": split,
            "max_tokens": max((r["token_estimate"] for r in rows), default=0),
            "duration_s": round(time.perf_counter() - started, 3),
        },
    )
