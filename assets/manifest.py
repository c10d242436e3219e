"""Stage 8, pack_manifest: manifest.json and skill.md written, then the pack published.

The manifest gathers what every stage recorded (counts, failures, durations, LLM tokens) from
the kpack.contracts.StagedBuild record pack_graph hands it, so it describes the tables the graph
was built from, with no event-log lookup. Publishing renames the
staged folder to the next version and flips the ``current`` link; publish also stamps the
database's size and SHA-256 into the manifest (``database``, see kpack.store).

Per build it also records what changed against the version it replaces (``changes``: pages
fetched, new, changed, unchanged (a 304 or the same content hash), failed, removed from
urls.txt, and the 304 count), that ``previous_version``, the LLM requests and tokens with an
estimated cost (list prices with the batch and caching discounts, kpack.llm), and the sources
fingerprint the version was built from, which the next build's fetch compares with to tell
whether anything changed at all (see assets.fetch).
"""

import json
import time
from datetime import UTC, datetime

import pyarrow as pa
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetExecutionContext,
    MetadataValue,
    Output,
)

from assets.partitions import (
    build_stage,
    pack_check,
)
from kpack.config import PackConfig
from kpack.contracts import StagedBuild
from kpack.embedding import ENCODERS, model_label
from kpack.graphdb import graph_counts, opened
from kpack.ingest.gate_calibration import PROBE_CACHE_COLUMNS, probe_cache_namespace
from kpack.ingest.gate_calibration import calibrate as calibrate_gate
from kpack.llm import model_prices
from kpack.skill import skill_inputs, skill_markdown
from kpack.store import verify_version
from resources.embedder import EmbedderResource
from resources.pack_store import PackStore
from resources.storage import ContentCacheResource

STAGES = ("fetched_pages", "articles", "chunks", "entities", "embeddings", "pagerank", "pack_graph")
MANIFEST_FORMAT = 1
# What the extraction stage counted of its Claude requests (kpack.ingest.claude_extraction).
LLM_COUNTS = (
    "llm_calls",
    "llm_batch_requests",
    "llm_input_tokens",
    "llm_cache_write_tokens",
    "llm_cache_read_tokens",
    "llm_output_tokens",
    "llm_failures",
    "offline_fallbacks",
)
NO_CHANGES = {
    "fetched": 0,
    "new": 0,
    "changed": 0,
    "unchanged": 0,
    "failed": 0,
    "not_modified": 0,
    "removed": 0,
}


def build_manifest(
    pack: str,
    version: int,
    config: PackConfig,
    counts: dict[str, int],
    staged: StagedBuild,
    run_id: str,
) -> dict:
    stage_meta = staged.stages
    fetched, extraction, embedded = (
        stage_meta.get("fetched_pages", {}),
        stage_meta.get("entities", {}),
        stage_meta.get("embeddings", {}),
    )
    method = extraction.get("method", "offline")
    llm_model = method.removeprefix("claude:") if method.startswith("claude:") else None
    prices = model_prices(llm_model) if llm_model else None
    return {
        "format": MANIFEST_FORMAT,
        "name": pack,
        "version": version,
        "previous_version": staged.previous_version,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_id": run_id,  # the build_pack run that published it (pipelines.status)
        "changes": staged.changes or dict(NO_CHANGES),
        "sources": {
            "urls": fetched.get("urls", 0),
            "ok": fetched.get("ok", 0),
            "failed": fetched.get("failed", 0),
            "failures": fetched.get("failures", []),
            "invalid_lines": staged.invalid_lines,
            # Found, kept, skipped by reason and capped by crawl.max_pages (kpack.ingest.crawl).
            "pages": fetched.get("pages"),
        },
        # The documentation's own name and release, read from its pages
        # (kpack.ingest.doc_version).
        "documentation_title": fetched.get("documentation_title") or None,
        "documentation_version": fetched.get("documentation_version") or None,
        "counts": counts,
        "embedding": {
            "model": model_label(config.embedding_model),
            "dimension": staged.embedding_dimension,
            "texts": embedded.get("texts", 0),
            "embedded_this_build": embedded.get("embedded", 0),
            # Vectors taken from the published version, having no cache of them (an installed
            # pack's first build: kpack.ingest.published_vectors).
            "from_published": embedded.get("from_published", 0),
            # Vectors other packs of the same storage had computed for the same texts.
            "from_other_packs": embedded.get("from_other_packs", 0),
            # The arithmetic every vector came from (they are cached per precision), and
            # where and how fast this build's were computed (None: all came from the cache).
            "precision": embedded["precision"],
            "encoder": ENCODERS[embedded["precision"]],
            "device": embedded.get("device"),
            "texts_per_second": embedded.get("texts_per_second"),
            # "derived": a longer section has its first chunk's vector (kpack.ingest.vectors).
            "section_vectors": embedded["section_vectors"],
            # "embedded": the passages' sentences too (kpack.sentence_index).
            "sentence_vectors": embedded.get("sentence_vectors", "none"),
        },
        "extraction": {
            "method": method,
            **{key: extraction.get(key, 0) for key in LLM_COUNTS},
            "fallback_sections": extraction.get("fallback_sections", []),
            "batches": extraction.get("batches", []),
            # An estimate at list prices with the batch and prompt-caching discounts (see
            # kpack.llm); 0 without LLM calls, None for a model without a known price.
            "estimated_cost_usd": extraction.get("llm_cost_usd", 0.0),
            "price_usd_per_mtok": {"input": prices[0], "output": prices[1]} if prices else None,
        },
        "stage_seconds": {s: stage_meta.get(s, {}).get("duration_s") for s in STAGES},
        "config": config.to_json(),
        "sources_fingerprint": staged.sources_fingerprint,
    }


@build_stage(
    group_name="publish",
    description="manifest.json and skill.md; publishes the staged pack as the next version.",
)
def pack_manifest(
    context: AssetExecutionContext,
    pack_store: PackStore,
    embedder: EmbedderResource,
    content_cache: ContentCacheResource,
    sections: pa.Table,  # these three: what the gate is calibrated from
    chunks: pa.Table,
    embeddings: pa.Table,
    pack_graph: StagedBuild,  # what is published
) -> Output[None]:
    started = time.perf_counter()
    pack = context.partition_key
    staging = pack_store.staging(pack, context.run_id)
    with opened(staging / "pack.db", read_only=True) as conn:
        counts = graph_counts(conn)
        skill = skill_inputs(conn)
    version = pack_store.next_version(pack)
    config = pack_store.config(pack)
    manifest = build_manifest(pack, version, config, counts, pack_graph, context.run_id)
    # The confidence gate's threshold for this version (kpack.ingest.gate_calibration), from
    # the build's vectors.
    precision = manifest["embedding"]["precision"]  # the probes are embedded as the passages
    probe_cache = probe_cache_namespace(config.embedding_model, precision)
    gate = calibrate_gate(
        sections,
        chunks,
        embeddings,
        lambda texts: embedder.embed(texts, config.embedding_model, precision),
        config.embedding_model,
        content_cache.load(probe_cache, pack, PROBE_CACHE_COLUMNS),
    )
    if gate.embedded:
        content_cache.save(probe_cache, pack, gate.probe_vectors)
    manifest["gate"] = gate.record
    manifest["stage_seconds"]["pack_manifest"] = round(time.perf_counter() - started, 3)
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (staging / "skill.md").write_text(skill_markdown(manifest, skill))
    published = pack_store.publish(pack, version, staging)
    context.log.info(f"published {pack} version {version} at {published}")
    return Output(
        None,
        metadata={
            "outcome": f"published v{version:04d}",
            "version": version,
            "published": MetadataValue.path(str(published)),
            "manifest": MetadataValue.json(manifest),
            "duration_s": manifest["stage_seconds"]["pack_manifest"],
        },
    )


@pack_check(
    pack_manifest, "The manifest's embedding dimension is the dimension of the published vectors."
)
def manifest_matches_graph(
    context: AssetCheckExecutionContext, pack_store: PackStore
) -> AssetCheckResult:
    version = pack_store.current(context.partition_key)
    verify_version(version)  # a published database is never opened unverified (kpack.store)
    manifest = json.loads((version / "manifest.json").read_text())
    with opened(version / "pack.db", read_only=True) as conn:
        rows = conn.execute("MATCH (s:Section) RETURN s.embedding LIMIT 1").get_all()
    actual = len(rows[0][0]) if rows else None
    declared = manifest["embedding"]["dimension"]
    return AssetCheckResult(
        passed=actual == declared,
        metadata={"manifest_dimension": declared, "graph_dimension": actual},
    )
