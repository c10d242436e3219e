"""Stage 4, extractions: entities, relations and facts of every section (kpack.ingest.extraction).

Claude (tool use with a JSON schema) when an API key is set, the deterministic offline
extractor otherwise. Claude results are cached by (section content hash, model, prompt
version) in the content cache, so a rebuild only pays for sections whose text changed; a large
extraction goes through the Message Batches API at half price, and a build that did not finish
leaves its batches in a ledger beside the cache for the next build to collect
(kpack.ingest.claude_extraction). A key the API refuses fails the build at the first refusal:
a pack labelled ``claude:<model>`` is never offline extraction in disguise. When the sections,
the method and the extractor's code are those of the last materialization, its tables are
reused as they are (their facts record that digest, see kpack.contracts.with_facts): a
no-change rebuild extracts nothing.
"""

import hashlib
import time

import pyarrow as pa
from dagster import AssetExecutionContext, Failure, MetadataValue, Output, multi_asset

from assets.partitions import packs_partitions, stage_outputs
from kpack import contracts, text
from kpack.changes import code_digest, table_digest
from kpack.config import PackConfig
from kpack.ingest import claude_extraction, extraction
from kpack.ingest.claude_extraction import (
    BatchWaitExpired,
    ClaudeExtractions,
    ExtractionCache,
    ExtractionSettings,
    claude_extractions,
    extraction_cache_namespace,
)
from kpack.ingest.extraction import extract_offline, merge_extractions
from kpack.llm import API_KEY_ENV, Billing, KeyRefused
from resources.llm import ClaudeResource
from resources.pack_store import PackStore
from resources.storage import ContentCacheResource, IntermediatesResource

BATCH_LEDGER = "batches"  # the record beside the extraction cache (ContentCacheResource)


def extraction_settings(config: PackConfig, claude: ClaudeResource) -> ExtractionSettings:
    """How a pack's sections go to Claude: its settings and the resource's polling."""
    return ExtractionSettings(
        model=config.extraction_model,
        max_tokens=claude.max_tokens,
        batch_threshold=config.extraction_batch_threshold,
        batch_wait_s=config.extraction_batch_wait_s,
        poll_s=claude.batch_poll_s,
        poll_max_s=claude.batch_poll_max_s,
    )


def extraction_cache(cache: ContentCacheResource, model: str, pack: str) -> ExtractionCache:
    """The pack's cached Claude extractions and batch ledger, written back through ``cache``."""
    namespace = extraction_cache_namespace(model)
    table = cache.load(namespace, pack, ("key", "value"))
    return ExtractionCache(
        entries=(
            dict(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True))
            if table is not None
            else {}
        ),
        pending=cache.load_record(namespace, pack, BATCH_LEDGER) or [],
        write_entries=lambda entries: cache.save(
            namespace, pack, pa.table({"key": list(entries), "value": list(entries.values())})
        ),
        write_pending=lambda pending: cache.save_record(namespace, pack, BATCH_LEDGER, pending),
    )


def _claude_extractions(
    context: AssetExecutionContext,
    claude: ClaudeResource,
    cache: ContentCacheResource,
    config: PackConfig,
    sections: list[dict],
) -> ClaudeExtractions:
    """Extractions by section content hash through the pack's cache and batch ledger; a
    refused key or a batch still running past the build's wait fails the step."""
    pack = context.partition_key
    try:
        return claude_extractions(
            claude.client,
            extraction_settings(config, claude),
            sections,
            extraction_cache(cache, config.extraction_model, pack),
            context.log.warning,
        )
    except KeyRefused as exc:
        raise Failure(exc.one_line(claude.client.api_key_env)) from None
    except BatchWaitExpired as exc:
        raise Failure(str(exc)) from None


OUTPUTS = {
    "entities": "Named concepts, APIs, types and names, deduplicated across the pack.",
    "entity_mentions": "Which article and section mention which entity.",
    "relations": "Entity-to-entity relations with the sentence that states them.",
    "facts": "Self-contained factual statements per section.",
}


@multi_asset(
    outs=stage_outputs(OUTPUTS),
    partitions_def=packs_partitions,
    group_name="extract",
    compute_kind="anthropic",
)
def extractions(
    context: AssetExecutionContext,
    sections: pa.Table,
    pack_store: PackStore,
    claude: ClaudeResource,
    content_cache: ContentCacheResource,
    intermediates: IntermediatesResource,
):
    started = time.perf_counter()
    pack = context.partition_key
    config = pack_store.config(pack)
    if config.extraction == "claude" and not claude.available:
        raise Failure(f"kg_config.json asks for Claude extraction but ${API_KEY_ENV} is not set")
    method = config.extraction_method(claude.available)
    use_claude = method != "offline"
    code = code_digest(extraction, claude_extraction, text)
    inputs = hashlib.sha256(f"{method} {table_digest(sections)} {code}".encode()).hexdigest()
    tables = {name: intermediates.previous(name, pack) for name in OUTPUTS}
    claude_result = ClaudeExtractions({}, Billing(config.extraction_model))
    reused = all(
        contracts.facts_of(table).get("inputs_digest") == inputs for table in tables.values()
    )
    if not reused:
        rows = sections.to_pylist()
        if use_claude:
            claude_result = _claude_extractions(context, claude, content_cache, config, rows)
        by_hash = claude_result.by_hash
        merged = merge_extractions(
            (s, by_hash.get(s["content_hash"]) or extract_offline(s["title"], s["content"]))
            for s in rows
        )
        tables = {name: contracts.conform(name, merged[name]) for name in OUTPUTS}
    metadata = {
        "method": method,
        "reused": reused,
        # Not reusable when Claude failed on some sections: they are tried again next build.
        "inputs_digest": None if claude_result.fallbacks else inputs,
        **{
            key: MetadataValue.json(value) if isinstance(value, list) else value
            for key, value in claude_result.metadata().items()
        },
        "duration_s": round(time.perf_counter() - started, 3),
    }
    top = sorted(tables["entities"].to_pylist(), key=lambda e: -e["mention_count"])[:15]
    for name, table in tables.items():
        extra = (
            {
                "top_entities": MetadataValue.md(
                    "| entity | type | mentions |\n|---|---|---|\n"
                    + "\n".join(
                        f"| {e['name']} | {e['type']} | {e['mention_count']} |" for e in top
                    )
                )
            }
            if name == "entities"
            else {}
        )
        yield Output(table, output_name=name, metadata={name: table.num_rows, **metadata, **extra})
