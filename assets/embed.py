"""Stage 5, embeddings: one vector per distinct section and chunk text (kpack.ingest.vectors),
cached by (model, content hash) across builds, so a rebuild embeds only new text.
"""

import time

import pyarrow as pa
from dagster import AssetExecutionContext, Output, asset

from assets.partitions import follow_upstream, packs_partitions
from kpack.embedding import model_label
from kpack.ingest.vectors import distinct_texts, embedding_column
from resources.embedder import EmbedderResource
from resources.pack_store import PackStore
from resources.storage import ContentCacheResource


@asset(
    partitions_def=packs_partitions,
    group_name="embed",
    compute_kind="sentence-transformers",
    automation_condition=follow_upstream,
    description="Sentence-transformers vectors of every distinct section and chunk text.",
)
def embeddings(
    context: AssetExecutionContext,
    sections: pa.Table,
    chunks: pa.Table,
    embedder: EmbedderResource,
    content_cache: ContentCacheResource,
    pack_store: PackStore,
) -> Output[pa.Table]:
    started = time.perf_counter()
    pack = context.partition_key
    model = pack_store.config(pack).embedding_model
    namespace = f"embeddings/{model_label(model)}"
    texts = distinct_texts(sections, chunks)
    cached = content_cache.load(namespace, pack)
    known: dict[str, int] = {}
    if cached is not None:
        known = {h: i for i, h in enumerate(cached["content_hash"].to_pylist()) if h in texts}
    missing = [h for h in texts if h not in known]
    reused = (
        cached.take(pa.array(list(known.values()))).select(["content_hash", "embedding"])
        if known
        else None
    )
    embed_seconds = 0.0
    if missing or reused is None:
        # The model is loaded here, on first use: a rebuild served from the cache never
        # loads it (see EmbedderResource).
        embed_started = time.perf_counter()
        fresh = embedder.embed([texts[h] for h in missing], model)
        embed_seconds = time.perf_counter() - embed_started
        fresh_table = pa.table({"content_hash": missing, "embedding": embedding_column(fresh)})
        table = (
            pa.concat_tables([reused, fresh_table.cast(reused.schema)])
            if reused is not None
            else fresh_table
        )
        dimension = embedder.dimension(model)
    else:
        table = reused
        dimension = len(table["embedding"][0])
    if missing or cached is None or cached.num_rows != table.num_rows:
        content_cache.save(namespace, pack, table)
    return Output(
        table,
        metadata={
            "model": model_label(model),
            "dimension": dimension,
            "texts": len(texts),
            "embedded": len(missing),
            "cached": len(known),
            "embed_seconds": round(embed_seconds, 3),
            "texts_per_second": round(len(missing) / embed_seconds, 1) if missing else 0.0,
            "duration_s": round(time.perf_counter() - started, 3),
        },
    )
