"""The deterministic extractor used when no API key is set (and for sections too short to send).

It returns the same shape as the Claude tool call: entities (code identifiers, defined terms,
the section heading, capitalised multi-word names), relations between entities named in the
same sentence, and definitional sentences as facts. Same input, same output, no network.
"""

import re
from itertools import pairwise

CODE_SPAN = re.compile(r"`([^`\n]{2,60})`")
DOTTED = re.compile(r"(?<![\w/.-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?(?![\w/])")
CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w{2,})\(\)")
SNAKE = re.compile(r"(?<![\w.])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?!\w|\.\w)")
CAMEL = re.compile(r"(?<![\w.])[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+(?!\w|\.\w)")
BOLD = re.compile(r"\*\*([^*\n]{2,60})\*\*")
PROPER = re.compile(
    r"(?<![\w.])[A-Z][a-z]+(?:(?:\s+(?:of|the|de|du|von|van|and|for))?\s+[A-Z][a-z]+)+"
)
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(\[])")
DEFINITION = re.compile(
    r"^(?:an?\s+|the\s+)?([^,.;:()]{2,60}?)\s+(?:is|are|was|were|refers to|means|denotes|"
    r"describes|represents|returns|defaults to)\s+\S",
    re.IGNORECASE,
)
NOT_NAMES = {
    "a",
    "an",
    "all",
    "also",
    "although",
    "and",
    "any",
    "as",
    "at",
    "because",
    "before",
    "but",
    "by",
    "each",
    "every",
    "for",
    "from",
    "here",
    "how",
    "however",
    "if",
    "in",
    "it",
    "its",
    "note",
    "on",
    "or",
    "see",
    "since",
    "so",
    "some",
    "that",
    "the",
    "then",
    "there",
    "these",
    "this",
    "to",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "why",
    "with",
    "you",
    "after",
}
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
        while words and words[0].lower() in NOT_NAMES:
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


def prose_lines(content: str) -> list[str]:
    """The lines of a section outside its fenced code blocks."""
    lines, in_code = [], False
    for line in content.split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            lines.append(line)
    return lines


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
        for sentence in SENTENCE.split(paragraph):
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
        and not all(w in NOT_NAMES or w == "page" for w in words)
    )
