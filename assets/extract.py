"""Stage 4, extractions: entities, relations and facts of every section (kpack.ingest.extraction).

Claude (tool use with a JSON schema) when an API key is set, the deterministic offline
extractor otherwise. Claude results are cached by (section content hash, model, prompt
version) in the content cache, so a rebuild only pays for sections whose text changed. When
the sections, the method and the extractor's code are those of the last materialization, its
tables are reused as they are (their facts record that digest, see kpack.contracts.with_facts):
a no-change rebuild extracts nothing.
"""

import hashlib
import time

import pyarrow as pa
from dagster import AssetExecutionContext, AssetOut, Failure, MetadataValue, Output, multi_asset

from assets.partitions import BUILD_CODE_VERSION, follow_upstream, packs_partitions
from kpack import contracts, text
from kpack.changes import source_digest, table_digest
from kpack.ingest import extraction
from kpack.ingest.extraction import (
    claude_extractions,
    extract_offline,
    extraction_cache_namespace,
    merge_extractions,
)
from kpack.llm import API_KEY_ENV, Usage
from resources.llm import ClaudeResource
from resources.pack_store import PackStore
from resources.storage import ContentCacheResource, IntermediatesResource

OUTPUTS = {
    "entities": "Named concepts, APIs, types and names, deduplicated across the pack.",
    "entity_mentions": "Which article and section mention which entity.",
    "relations": "Entity-to-entity relations with the sentence that states them.",
    "facts": "Self-contained factual statements per section.",
}


def _claude_extractions(
    context: AssetExecutionContext,
    claude: ClaudeResource,
    cache: ContentCacheResource,
    model: str,
    sections: list[dict],
) -> tuple[dict[str, dict], Usage, int]:
    """Extractions by section content hash through the pack's cache; usage and failures."""
    pack = context.partition_key
    namespace = extraction_cache_namespace(model)
    table = cache.load(namespace, pack, ("key", "value"))
    cached = (
        dict(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True))
        if table is not None
        else {}
    )
    by_hash, keep, usage, failures = claude_extractions(
        claude.client, model, claude.max_tokens, sections, cached, context.log.warning
    )
    cache.save(namespace, pack, pa.table({"key": list(keep), "value": list(keep.values())}))
    return by_hash, usage, failures


@multi_asset(
    outs={
        name: AssetOut(
            description=description,
            code_version=BUILD_CODE_VERSION,
            automation_condition=follow_upstream,
        )
        for name, description in OUTPUTS.items()
    },
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
    inputs = hashlib.sha256(
        f"{method} {table_digest(sections)} {source_digest(extraction, text)}".encode()
    ).hexdigest()
    tables = {name: intermediates.previous(name, pack) for name in OUTPUTS}
    usage, failures = Usage(), 0
    reused = all(
        contracts.facts_of(table).get("inputs_digest") == inputs for table in tables.values()
    )
    if not reused:
        rows = sections.to_pylist()
        by_hash: dict[str, dict] = {}
        if use_claude:
            by_hash, usage, failures = _claude_extractions(
                context, claude, content_cache, config.extraction_model, rows
            )
        merged = merge_extractions(
            (s, by_hash.get(s["content_hash"]) or extract_offline(s["title"], s["content"]))
            for s in rows
        )
        tables = {name: contracts.conform(name, merged[name]) for name in OUTPUTS}
    metadata = {
        "method": method,
        "reused": reused,
        # Not reusable when Claude failed on some sections: they are tried again next build.
        "inputs_digest": None if failures else inputs,
        "llm_calls": usage.api_calls,
        "llm_input_tokens": usage.input_tokens,
        "llm_output_tokens": usage.output_tokens,
        "llm_failures": failures,
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
