"""Stage 5, embeddings: one vector per distinct section, chunk and sentence text
(kpack.ingest.vectors), cached by (model, precision, content hash) across builds, so a
rebuild embeds only new text;
a text another pack of the same storage embedded is reused too (a combined pack of several
libraries embeds none of their pages again).
With ``section_vectors: derived`` (the default) the model embeds chunk texts only, and
``embeddings`` adds each longer section's vector, its first chunk's (kpack.ingest.vectors;
never cached: it costs no model call).
The model runs on the machine's device in the pack's precision (kpack.embedding); each step
records the device and its texts per second, and ``embeddings`` gathers them for the manifest.

The texts are embedded in shards (kpack.ingest.shards): ``embeddings_shard_<i>`` embeds the
texts whose content hash falls in range i, as its own step, so a distributed executor runs the
shards on several workers (docs/deployment.md); ``embeddings`` gathers them and is the one
writer of the embedding cache. The number of shards is KPACK_EMBED_SHARDS (default 1).
"""

import time
from dataclasses import dataclass
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetObservation,
    AssetsDefinition,
    Failure,
    Output,
)

from assets.partitions import build_stage
from kpack.contracts import facts_of
from kpack.embedding import ENCODERS, effective_precision, model_label, vector_namespace
from kpack.ingest.published_vectors import published_vectors
from kpack.ingest.shards import PROGRESS_KEY, EmbedProgress, embed_shard, shard_count, shard_of
from kpack.ingest.vectors import derived_section_vectors, distinct_texts
from resources.embedder import EmbedderResource
from resources.pack_store import PackStore
from resources.storage import ContentCacheResource

CACHE_COLUMNS = ("content_hash", "embedding")
SHARDS = shard_count()
SHARD_NAMES = [f"embeddings_shard_{index}" for index in range(SHARDS)]


@dataclass(frozen=True)
class EmbedStep:
    """One run of an embedding step: the pack, the embedding model its config names, the
    precision its config means on this machine, whether the model embeds section texts (else
    they are derived from chunk vectors) and the passages' sentences, and when the step
    started."""

    pack: str
    model: str
    precision: str
    embed_sections: bool
    embed_sentences: bool
    started: float

    @classmethod
    def begin(cls, context: AssetExecutionContext, pack_store: PackStore) -> "EmbedStep":
        started = time.perf_counter()
        pack = context.partition_key
        config = pack_store.config(pack)
        precision = effective_precision(config.embedding_precision)
        embed_sections = config.section_vectors == "embedded"
        embed_sentences = config.sentence_vectors == "embedded"
        return cls(
            pack, config.embedding_model, precision, embed_sections, embed_sentences, started
        )

    @property
    def cache_namespace(self) -> str:
        """Vectors are cached per model and precision: a change of either reuses none."""
        return f"embeddings/{vector_namespace(self.model, self.precision)}"

    def duration_s(self) -> float:
        return round(time.perf_counter() - self.started, 3)


def report_progress(context: AssetExecutionContext, progress: EmbedProgress) -> None:
    """How far the step is, as an observation of its asset: `kpack build` shows it on the
    step's row (pipelines.progress), the UI in the asset's events."""
    context.log_event(
        AssetObservation(
            asset_key=context.asset_key,
            partition=context.partition_key,
            description=progress.words(),
            metadata={
                PROGRESS_KEY: progress.words(),
                "embedded": progress.done,
                "to_embed": progress.total,
            },
        )
    )


def shard_asset(index: int) -> AssetsDefinition:
    """The step that embeds shard ``index`` of the pack's texts."""

    @build_stage(
        name=SHARD_NAMES[index],
        group_name="embed",
        compute_kind="sentence-transformers",
        metadata={"contract": "embedding_shard"},
        description=f"Vectors of the texts in content-hash range {index + 1} of {SHARDS}.",
    )
    def embedding_shard(
        context: AssetExecutionContext,
        sections: pa.Table,
        chunks: pa.Table,
        embedder: EmbedderResource,
        content_cache: ContentCacheResource,
        pack_store: PackStore,
    ) -> Output[pa.Table]:
        step = EmbedStep.begin(context, pack_store)
        texts = {
            h: text
            for h, text in distinct_texts(
                sections, chunks, step.embed_sections, step.embed_sentences
            ).items()
            if shard_of(h, SHARDS) == index
        }
        cached = content_cache.load(step.cache_namespace, step.pack, CACHE_COLUMNS)
        # No cache (an installed pack's first build, a cache lost): the published version's
        # vectors of the same model and precision serve instead (kpack.ingest.published_vectors).
        from_published = cached is None
        if from_published:
            cached = published_vectors(pack_store.current(step.pack), step.model, step.precision)
        # Texts other packs of this storage have embedded (a combined pack of several
        # libraries) are reused: a vector depends on the model, precision and text only.
        known = set(cached["content_hash"].to_pylist()) if cached is not None else set()
        from_other_packs = content_cache.load_from_other_packs(
            step.cache_namespace, step.pack, CACHE_COLUMNS, set(texts) - known
        )
        if from_other_packs is not None:
            own = cached.select(list(CACHE_COLUMNS)) if cached is not None else None
            cached = (
                from_other_packs
                if own is None
                else pa.concat_tables([own, from_other_packs.cast(own.schema)])
            )
        # The model is loaded on first use: a shard served from the cache never loads it.
        result = embed_shard(
            texts,
            cached,
            lambda batch: embedder.embed(batch, step.model, step.precision),
            partial(report_progress, context),
        )
        reused_from_others = from_other_packs.num_rows if from_other_packs is not None else 0
        # The device is known once the model is loaded, i.e. when something was embedded.
        device = embedder.embedder(step.model, step.precision).device if result.embedded else None
        return Output(
            result.table,
            metadata={
                "shard": index,
                "shards": SHARDS,
                "texts": len(texts),
                "embedded": result.embedded,
                "cached": result.cached,
                # Of those, the vectors taken from the published version.
                "from_published": (result.cached - reused_from_others if from_published else 0),
                "from_other_packs": reused_from_others,
                "embed_seconds": round(result.seconds, 3),
                "texts_per_second": (
                    round(result.embedded / result.seconds, 1) if result.embedded else 0.0
                ),
                "precision": step.precision,
                **({"device": device} if device else {}),
                "duration_s": step.duration_s(),
            },
        )

    return embedding_shard


embedding_shards = [shard_asset(index) for index in range(SHARDS)]


@build_stage(
    ins={name: AssetIn() for name in SHARD_NAMES},
    group_name="embed",
    compute_kind="sentence-transformers",
    description="Vectors of every distinct section and chunk text (sentence-transformers "
    "fp32, or its int8 export); a longer section takes its first chunk's by default.",
)
def embeddings(
    context: AssetExecutionContext,
    content_cache: ContentCacheResource,
    pack_store: PackStore,
    sections: pa.Table,
    chunks: pa.Table,
    **shards: pa.Table,
) -> Output[pa.Table]:
    step = EmbedStep.begin(context, pack_store)
    shard_facts = [facts_of(shards[name]) for name in SHARD_NAMES]
    # "auto" is decided on each worker: on a cluster of GPU and CPU workers the shards could
    # come back in fp32 and int8, and one pack never mixes the two.
    precisions = {facts["precision"] for facts in shard_facts if facts.get("texts")}
    if precisions - {step.precision}:
        raise Failure(
            f"pack {step.pack!r}: its embedding steps ran in different precisions "
            f"({', '.join(sorted(precisions | {step.precision}))}), as workers with and without "
            f"a GPU decide embedding_precision auto differently; set embedding_precision to "
            f"fp32 or int8 in its kg_config.json"
        )
    gathered = pa.concat_tables([shards[name] for name in SHARD_NAMES])
    embedded = pc.sum(gathered["fresh"]).as_py() or 0
    seconds = sum(facts.get("embed_seconds", 0.0) for facts in shard_facts)
    # Several workers of a distributed executor may have embedded on different devices.
    devices = sorted({facts["device"] for facts in shard_facts if "device" in facts})
    table = gathered.select(list(CACHE_COLUMNS))
    from_published = sum(facts.get("from_published", 0) for facts in shard_facts)
    from_other_packs = sum(facts.get("from_other_packs", 0) for facts in shard_facts)
    if embedded or from_published or from_other_packs:
        # The cache becomes exactly this pack's texts: new vectors in, vanished texts out.
        content_cache.save(step.cache_namespace, step.pack, table)
    derived = derived_section_vectors(sections, chunks, table)
    return Output(
        pa.concat_tables([table, derived]),
        metadata={
            "model": model_label(step.model),
            "dimension": len(table["embedding"][0]) if table.num_rows else 0,
            "texts": table.num_rows,
            "embedded": embedded,
            "cached": table.num_rows - embedded,
            "from_published": from_published,
            "from_other_packs": from_other_packs,
            "section_vectors": "embedded" if step.embed_sections else "derived",
            "sentence_vectors": "embedded" if step.embed_sentences else "none",
            "derived": derived.num_rows,
            "shards": SHARDS,
            "precision": step.precision,
            "encoder": ENCODERS[step.precision],
            **({"device": ", ".join(devices)} if devices else {}),
            # Time in the model (tokenizing included), summed over the shards.
            "embed_seconds": round(seconds, 3),
            **({"texts_per_second": round(embedded / seconds, 1)} if embedded and seconds else {}),
            # Its shards' seconds and this merge's, so the stage times of a build add up.
            "duration_s": round(
                step.duration_s()
                + sum(facts_of(shards[name]).get("duration_s", 0.0) for name in SHARD_NAMES),
                3,
            ),
        },
    )
