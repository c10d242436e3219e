"""Entities, relations and facts of every section: Claude when a key is set, else offline.

``extract_offline`` is the deterministic extractor used when no API key is set (and for sections
too short to send). It returns the same shape as the Claude tool call: entities (code
identifiers, defined terms, the section heading, capitalised multi-word names), relations
between entities named in the same sentence, and definitional sentences as facts. Same input,
same output, no network.

``claude_extractions`` sends the sections that changed to Claude (results are cached by section
content hash, model and prompt version); ``merge_extractions`` turns section-level results into
pack-level tables, entities deduplicated across the pack by normalised name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

from kpack.contracts import stable_id
from kpack.llm import EXTRACTION_PROMPT_VERSION, ClaudeClient, ExtractionFailed, Usage
from kpack.text import STOPWORDS, prose_lines, split_sentences

CODE_SPAN = re.compile(r"`([^`\n]{2,60})`")
DOTTED = re.compile(r"(?<![\w/.-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?(?![\w/])")
CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w{2,})\(\)")
SNAKE = re.compile(r"(?<![\w.])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?!\w|\.\w)")
CAMEL = re.compile(r"(?<![\w.])[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+(?!\w|\.\w)")
BOLD = re.compile(r"\*\*([^*\n]{2,60})\*\*")
PROPER = re.compile(
    r"(?<![\w.])[A-Z][a-z]+(?:(?:\s+(?:of|the|de|du|von|van|and|for))?\s+[A-Z][a-z]+)+"
)
DEFINITION = re.compile(
    r"^(?:an?\s+|the\s+)?([^,.;:()]{2,60}?)\s+(?:is|are|was|were|refers to|means|denotes|"
    r"describes|represents|returns|defaults to)\s+\S",
    re.IGNORECASE,
)
ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "cf"}
FILE_SUFFIXES = (".md", ".html", ".htm", ".txt", ".json", ".rst", ".yaml", ".yml", ".toml", ".db")
TYPE_PRIORITY = {"api": 0, "type": 1, "term": 2, "name": 3, "topic": 4, "concept": 5}
MAX_RELATIONS_PER_SECTION = 12
MAX_FACTS_PER_SECTION = 5


def normalize_entity(name: str) -> str:
    """The dedup key: case, quotes, call parentheses and a leading article don't matter."""
    key = name.replace("`", "").strip().strip("'\"").removesuffix("()").lower()
    key = " ".join(key.split())
    for article in ("the ", "an ", "a "):
        key = key.removeprefix(article)
    return key.strip()


def _proper_names(sentence: str) -> list[str]:
    names = []
    for match in PROPER.finditer(sentence):
        words = match.group(0).split()
        while words and words[0].lower() in STOPWORDS:
            words = words[1:]
        if len(words) >= 2:
            names.append(" ".join(words))
    return names


def _sentence_entities(sentence: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = [(m.group(1), "api") for m in CODE_SPAN.finditer(sentence)]
    found += [
        (m.group(0), "api")
        for m in DOTTED.finditer(sentence)
        if m.group(0).lower().rstrip("()") not in ABBREVIATIONS
        and not m.group(0).lower().endswith(FILE_SUFFIXES)
    ]
    found += [(m.group(1) + "()", "api") for m in CALL.finditer(sentence)]
    found += [(m.group(0), "api") for m in SNAKE.finditer(sentence)]
    found += [(m.group(0), "type") for m in CAMEL.finditer(sentence)]
    found += [(m.group(1), "term") for m in BOLD.finditer(sentence)]
    found += [(name, "name") for name in _proper_names(sentence)]
    seen: set[str] = set()
    unique = []
    for name, kind in found:
        key = normalize_entity(name)
        if len(key) >= 2 and key not in seen:
            seen.add(key)
            unique.append((name.strip("`"), kind))
    return unique


def extract_offline(title: str, content: str) -> dict:
    """Entities, relations and facts of one section, shaped like the Claude tool input."""
    entities: dict[str, dict] = {}
    relations: list[dict] = []
    facts: list[dict] = []
    if title:
        entities[normalize_entity(title)] = {
            "name": title,
            "type": "topic",
            "description": f"Section heading: {title}",
        }
    for paragraph in prose_lines(content):
        for sentence in split_sentences(paragraph):
            sentence = sentence.strip()
            if len(sentence) < 3:
                continue
            named = _sentence_entities(sentence)
            definition = DEFINITION.match(sentence.lstrip("- "))
            subject = normalize_entity(definition.group(1)) if definition else None
            for name, kind in named:
                key = normalize_entity(name)
                if key not in entities:
                    entities[key] = {"name": name, "type": kind, "description": ""}
            if definition and subject and 30 <= len(sentence) <= 400:
                if subject not in entities and len(subject.split()) <= 5:
                    entities[subject] = {
                        "name": definition.group(1).replace("`", "").strip(),
                        "type": "term",
                        "description": "",
                    }
                if subject in entities and not entities[subject]["description"]:
                    entities[subject]["description"] = sentence[:300]
                if len(facts) < MAX_FACTS_PER_SECTION:
                    facts.append(
                        {
                            "content": sentence[:400],
                            "entity": entities.get(subject, {}).get("name", ""),
                        }
                    )
            for (left, _), (right, _) in pairwise(named):
                if len(relations) >= MAX_RELATIONS_PER_SECTION:
                    break
                relations.append(
                    {
                        "source": left,
                        "relation": "MENTIONED_WITH",
                        "target": right,
                        "context": sentence[:300],
                    }
                )
    kept = {k: v for k, v in entities.items() if _meaningful(k)}
    relations = [
        r
        for r in relations
        if _meaningful(normalize_entity(r["source"])) and _meaningful(normalize_entity(r["target"]))
    ]
    return {"entities": list(kept.values()), "relations": relations, "facts": facts}


def _meaningful(key: str) -> bool:
    """Not a function word, a number or a fragment ("and", "this page", "2")."""
    words = key.split()
    return (
        len(key) >= 3
        and not key.isdigit()
        and not all(w in STOPWORDS or w == "page" for w in words)
    )


MIN_WORDS_FOR_LLM = 20
LLM_WORKERS = 4


def extraction_cache_namespace(model: str) -> str:
    """Where Claude extractions are cached: a new model or prompt never reuses old results."""
    return f"extractions/{model}/{EXTRACTION_PROMPT_VERSION}"


def claude_extractions(
    client: ClaudeClient,
    model: str,
    max_tokens: int,
    sections: list[dict],
    cached: dict[str, str],
    warn: Callable[[str], None],
) -> tuple[dict[str, dict], dict[str, str], Usage, int]:
    """Claude's extraction of every section long enough to send, by section content hash.

    ``cached`` maps content hash to a JSON extraction from earlier builds; only the sections
    missing from it are sent. Returns the extractions, the cache to keep (the wanted sections
    only), the token usage and how many sections failed (those fall back to the offline
    extractor; ``warn`` is told why).
    """
    wanted = {s["content_hash"]: s for s in sections if s["word_count"] >= MIN_WORDS_FOR_LLM}
    missing = [s for h, s in wanted.items() if h not in cached]
    fresh = dict(cached)
    usage, failures = Usage(), 0

    def run(section: dict) -> tuple[str, dict | None, Usage, str | None]:
        try:
            data, used = client.extract(
                model, section["heading_path"], section["content"], max_tokens
            )
            return section["content_hash"], data, used, None
        except ExtractionFailed as exc:
            return section["content_hash"], None, Usage(), str(exc)

    with ThreadPoolExecutor(max_workers=LLM_WORKERS) as pool:
        for key, data, used, error in pool.map(run, missing):
            usage.add(used)
            if data is None:
                failures += 1
                warn(f"Claude extraction failed, offline extractor used: {error}")
            else:
                fresh[key] = json.dumps(data)
    keep = {k: fresh[k] for k in wanted if k in fresh}
    return {k: json.loads(v) for k, v in keep.items()}, keep, usage, failures


def merge_extractions(per_section: Iterable[tuple[dict, dict]]) -> dict[str, list[dict]]:
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
