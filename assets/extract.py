"""Stage 4, extractions: entities, relations and facts of every section.

Claude (tool use with a JSON schema) when an API key is set, the deterministic offline
extractor otherwise. Claude results are cached by (section content hash, model, prompt
version), so a rebuild only pays for sections whose text changed. Entities are deduplicated
across the pack by normalised name.
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from dagster import AssetExecutionContext, AssetOut, Failure, MetadataValue, Output, multi_asset

from assets.offline_extraction import TYPE_PRIORITY, extract_offline, normalize_entity
from assets.partitions import follow_upstream, packs_partitions
from kpack.contracts import stable_id
from kpack.llm import EXTRACTION_PROMPT_VERSION, ExtractionFailed, Usage
from resources.llm import ClaudeResource
from resources.pack_store import PackStore
from resources.storage import ContentCacheResource

MIN_WORDS_FOR_LLM = 20
LLM_WORKERS = 4


def _cache_namespace(model: str) -> str:
    return f"extractions/{model}/{EXTRACTION_PROMPT_VERSION}"


def claude_extractions(
    context: AssetExecutionContext,
    claude: ClaudeResource,
    cache: ContentCacheResource,
    model: str,
    sections: list[dict],
) -> tuple[dict[str, dict], Usage, int]:
    """Extractions by section content hash (cached or fresh), token usage and failure count."""
    pack = context.partition_key
    namespace = _cache_namespace(model)
    cached_table = cache.load(namespace, pack)
    cached = (
        dict(zip(cached_table["key"].to_pylist(), cached_table["value"].to_pylist(), strict=True))
        if cached_table is not None
        else {}
    )
    wanted = {s["content_hash"]: s for s in sections if s["word_count"] >= MIN_WORDS_FOR_LLM}
    missing = [s for h, s in wanted.items() if h not in cached]
    usage, failures = Usage(), 0

    def run(section: dict) -> tuple[str, dict | None, Usage, str | None]:
        try:
            data, used = claude.extract(model, section["heading_path"], section["content"])
            return section["content_hash"], data, used, None
        except ExtractionFailed as exc:
            return section["content_hash"], None, Usage(), str(exc)

    with ThreadPoolExecutor(max_workers=LLM_WORKERS) as pool:
        for key, data, used, error in pool.map(run, missing):
            usage.add(used)
            if data is None:
                failures += 1
                context.log.warning(f"Claude extraction failed, offline extractor used: {error}")
            else:
                cached[key] = json.dumps(data)
    keep = {k: cached[k] for k in wanted if k in cached}
    cache.save(namespace, pack, pa.table({"key": list(keep), "value": list(keep.values())}))
    return {k: json.loads(v) for k, v in keep.items()}, usage, failures


@multi_asset(
    outs={
        name: AssetOut(description=text, automation_condition=follow_upstream)
        for name, text in {
            "entities": "Named concepts, APIs, types and names, deduplicated across the pack.",
            "entity_mentions": "Which article and section mention which entity.",
            "relations": "Entity-to-entity relations with the sentence that states them.",
            "facts": "Self-contained factual statements per section.",
        }.items()
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
):
    started = time.perf_counter()
    config = pack_store.config(context.partition_key)
    rows = sections.to_pylist()
    use_claude = config.extraction == "claude" or (config.extraction == "auto" and claude.available)
    if config.extraction == "claude" and not claude.available:
        raise Failure(
            f"kg_config.json asks for Claude extraction but ${claude.api_key_env} is not set"
        )
    by_hash, usage, failures = ({}, Usage(), 0)
    if use_claude:
        by_hash, usage, failures = claude_extractions(
            context, claude, content_cache, config.extraction_model, rows
        )
    tables = merge_extractions(
        (s, by_hash.get(s["content_hash"]) or extract_offline(s["title"], s["content"]))
        for s in rows
    )
    metadata = {
        "method": f"claude:{config.extraction_model}" if use_claude else "offline",
        "llm_calls": usage.api_calls,
        "llm_input_tokens": usage.input_tokens,
        "llm_output_tokens": usage.output_tokens,
        "llm_failures": failures,
        "duration_s": round(time.perf_counter() - started, 3),
    }
    top = sorted(tables["entities"], key=lambda e: -e["mention_count"])[:15]
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
        yield Output(table, output_name=name, metadata={name: len(table), **metadata, **extra})


def merge_extractions(per_section) -> dict[str, list[dict]]:
    """Section-level extractions into pack-level tables, entities deduplicated by name."""
    entities: dict[str, dict] = {}
    mentions: set[tuple[str, str, str]] = set()
    relations: dict[tuple[str, str, str], dict] = {}
    facts: dict[str, dict] = {}

    def entity(name: str, kind: str = "concept", description: str = "") -> str | None:
        key = normalize_entity(name or "")
        if len(key) < 2:
            return None
        known = entities.get(key)
        if known is None:
            entities[key] = {
                "entity_id": key,
                "name": name.strip("` ").removesuffix("()") or key,
                "type": kind,
                "description": description,
                "mention_count": 0,
            }
        else:
            if TYPE_PRIORITY.get(kind, 9) < TYPE_PRIORITY.get(known["type"], 9):
                known["type"] = kind
            if description and not known["description"]:
                known["description"] = description
        return key

    for section, data in per_section:
        where = (section["article_url"], section["section_id"])
        for item in data.get("entities", []):
            key = entity(
                str(item.get("name", "")),
                str(item.get("type") or "concept"),
                str(item.get("description") or ""),
            )
            if key and (*where, key) not in mentions:
                mentions.add((*where, key))
                entities[key]["mention_count"] += 1
        for item in data.get("relations", []):
            source, target = (
                entity(str(item.get("source", ""))),
                entity(str(item.get("target", ""))),
            )
            relation = str(item.get("relation") or "RELATED_TO").upper().replace(" ", "_")
            if (
                source
                and target
                and source != target
                and (source, relation, target) not in relations
            ):
                relations[(source, relation, target)] = {
                    "source_id": source,
                    "relation": relation,
                    "target_id": target,
                    "context": str(item.get("context") or "")[:400],
                    "article_url": where[0],
                    "section_id": where[1],
                }
        for item in data.get("facts", []):
            content = str(item.get("content") or "").strip()
            if not content:
                continue
            fact_id = stable_id(section["section_id"], content)
            facts[fact_id] = {
                "fact_id": fact_id,
                "article_url": where[0],
                "section_id": where[1],
                "entity_id": normalize_entity(str(item.get("entity") or "")) or None,
                "content": content,
            }
    mention_rows = [
        {"article_url": a, "section_id": s, "entity_id": e} for a, s, e in sorted(mentions)
    ]
    return {
        "entities": list(entities.values()),
        "entity_mentions": mention_rows,
        "relations": list(relations.values()),
        "facts": list(facts.values()),
    }
