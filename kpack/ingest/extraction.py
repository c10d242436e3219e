"""Entities, relations and facts of every section: Claude when a key is set, else offline.

``extract_offline`` is the deterministic extractor used when no API key is set (and for sections
too short to send). It returns the same shape as the Claude tool call: entities (code
identifiers, defined terms, the section heading, proper names: runs of capitalised words and a
single capitalised word inside a sentence, read across the line breaks of wrapped paragraphs),
relations between entities named in the same sentence, and definitional sentences as facts.
Same input, same output, no network.

Claude's extractions (kpack.ingest.claude_extraction) have the same shape.
``merge_extractions`` turns section-level results into
pack-level tables, entities deduplicated across the pack by normalised name
(kpack.text.normalize_entity, the key queries look names up by: aliases meet), and adds the
pack's own article titles as entities of their sections and of every section that names them
(``TitleMatcher``) and the API identifiers each section defines (its ``defines``), for both
extractors: the entity-passage graph (kpack.ingest.mentions
for the build, kpack.graph for queries) is built from these mentions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from itertools import pairwise

from kpack.contracts import stable_id
from kpack.text import (
    DOTTED_NAME,
    NAME_WORD,
    QUALIFIER,
    STOPWORDS,
    fence_roles,
    normalize_entity,
    split_sentences,
)

CODE_SPAN = re.compile(r"`([^`\n]{2,60})`")
DOTTED = re.compile(rf"(?<![\w/.-]){DOTTED_NAME}(?:\(\))?(?![\w/])")
# A call with nothing between its parentheses, as prose names a function ("frobnicate()").
PROSE_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w{2,})\(\)")
SNAKE = re.compile(r"(?<![\w.])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?!\w|\.\w)")
CAMEL = re.compile(r"(?<![\w.])[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+(?!\w|\.\w)")
BOLD = re.compile(r"\*\*([^*\n]{2,60})\*\*")
DEFINITION = re.compile(
    r"^(?P<article>an?\s+|the\s+)?(?P<subject>[^,.;:()]{2,60}?)\s+(?:is|are|was|were|refers to|means|denotes|"
    r"describes|represents|returns|defaults to)\s+\S",
    re.IGNORECASE,
)
# Lower-case words that may join the capitalised words of one name ("Bank of England").
NAME_JOINERS = frozenset(
    [
        "of",
        "the",
        "de",
        "du",
        "des",
        "del",
        "der",
        "di",
        "da",
        "von",
        "van",
        "la",
        "le",
        "and",
        "for",
    ]
)
# Capitalised words that are not names on their own.
NOT_NAMES = STOPWORDS | frozenset(
    [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
        "he",
        "she",
        "we",
        "our",
        "his",
        "her",
        "him",
        "one",
        "two",
        "three",
        "many",
        "most",
        "other",
        "such",
        "than",
        "both",
        "either",
        "neither",
        "not",
        "no",
        "yes",
    ]
)
ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "cf"}
FILE_SUFFIXES = (".md", ".html", ".htm", ".txt", ".json", ".rst", ".yaml", ".yml", ".toml", ".db")
TYPE_PRIORITY = {"api": 0, "type": 1, "term": 2, "name": 3, "topic": 4, "concept": 5}
MAX_RELATIONS_PER_SECTION = 12
MAX_FACTS_PER_SECTION = 5
# A pack title is matched in the text of other sections unless it is this common a phrase:
# in more than this share of the sections (and more than MIN_TITLE_SECTIONS), it is a word,
# not a name (the rule Wikipedia editors follow for links).
MAX_TITLE_SHARE = 0.02
MIN_TITLE_SECTIONS = 3
MIN_TITLE_CHARS = 4
MAX_NAME_WORDS = 8
BLOCK_START = re.compile(r"([-*+>|#]|\d+[.)])\s")  # a list item, quote, table row, heading
OPENERS = " \t\"'“‘([-*"  # what may come before the first word of a sentence


def _paragraphs(content: str) -> list[str]:
    """The prose of a passage as paragraphs: a hard-wrapped paragraph is one (a name or a
    sentence may run across a line break); a blank line, a list item, a table row or a
    heading starts the next. Code blocks are left out."""
    paragraphs: list[list[str]] = []
    for line, role in fence_roles(content.split("\n")):
        text = line.strip()
        if role != "text" or not text:
            paragraphs.append([])
        elif not paragraphs or BLOCK_START.match(text):
            paragraphs.append([text])
        else:
            paragraphs[-1].append(text)
    return [" ".join(lines) for lines in paragraphs if lines]


def _names_a_term(definition: re.Match) -> bool:
    """Whether a definitional sentence's subject is a term worth an entity: not a pronoun-like
    opener ("Neither version ...") and not an anaphor ("The film was ...", "The single is ...":
    one lower-case word after "the" refers back to something, it names nothing)."""
    words = normalize_entity(definition.group("subject")).split()
    anaphor = (
        (definition.group("article") or "").strip().lower() == "the"
        and len(words) == 1
        and definition.group("subject").islower()
    )
    return 0 < len(words) <= 5 and words[0] not in NOT_NAMES and not anaphor


def _proper_names(sentence: str) -> list[str]:
    """Runs of capitalised words ("Grace Krilanovich", "Bank of England"), and a single
    capitalised word that does not open the sentence ("... the island of Oahu")."""
    names: list[str] = []
    run: list[re.Match] = []

    def close() -> None:
        opens_sentence = bool(run) and not sentence[: run[0].start()].strip(OPENERS)
        while run and run[-1].group(0).lower() in NAME_JOINERS:
            run.pop()
        while run and run[0].group(0).lower() in NOT_NAMES:
            run.pop(0)
        if run and (len(run) > 1 or (not opens_sentence and len(run[0].group(0)) >= 3)):
            names.append(sentence[run[0].start() : run[-1].end()])
        run.clear()

    for match in NAME_WORD.finditer(sentence):
        word = match.group(0)
        joined = bool(run) and sentence[run[-1].end() : match.start()].isspace()
        if run and not joined:
            close()
        if word[0].isupper() or (run and word in NAME_JOINERS):
            run.append(match)
        elif run and word[0].isdigit() and run[-1].group(0)[0].isupper():
            run.append(match)  # "Harbor Regatta 2031", "BWV 1033"
        else:
            close()
        if len(run) > MAX_NAME_WORDS:
            close()
    close()
    return names


def _sentence_entities(sentence: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = [(m.group(1), "api") for m in CODE_SPAN.finditer(sentence)]
    found += [
        (m.group(0), "api")
        for m in DOTTED.finditer(sentence)
        if m.group(0).lower().rstrip("()") not in ABBREVIATIONS
        and not m.group(0).lower().endswith(FILE_SUFFIXES)
    ]
    found += [(m.group(1) + "()", "api") for m in PROSE_CALL.finditer(sentence)]
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
    for paragraph in _paragraphs(content):
        for sentence in split_sentences(paragraph):
            sentence = sentence.strip()
            if len(sentence) < 3:
                continue
            named = _sentence_entities(sentence)
            definition = DEFINITION.match(sentence.lstrip("- "))
            subject = normalize_entity(definition.group("subject")) if definition else None
            for name, kind in named:
                key = normalize_entity(name)
                if key not in entities:
                    entities[key] = {"name": name, "type": kind, "description": ""}
            if definition and subject and 30 <= len(sentence) <= 400:
                if subject not in entities and _names_a_term(definition):
                    entities[subject] = {
                        "name": definition.group("subject").replace("`", "").strip(),
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


class TitleMatcher:
    """Finds the pack's own article titles in text: on whole words, case as written, longest
    title first, punctuation between words ignored ("Leland, North Carolina"). Titles too short,
    written without a capital or a digit, or too common a phrase (see MAX_TITLE_SHARE) are not
    names and are never matched."""

    def __init__(self, titles: Iterable[str]) -> None:
        self.by_words: dict[tuple[str, ...], str] = {}
        for title in titles:
            name = QUALIFIER.sub("", title).strip()
            words = tuple(NAME_WORD.findall(name))
            if (
                len(name) >= MIN_TITLE_CHARS
                and 0 < len(words) <= MAX_NAME_WORDS
                and any(c.isupper() or c.isdigit() for c in name)
                and not (len(words) == 1 and words[0].lower() in NOT_NAMES)
            ):
                self.by_words.setdefault(words, title)
        self.first_words = {words[0] for words in self.by_words}
        self.longest = max(map(len, self.by_words), default=0)

    def find(self, text: str) -> list[str]:
        """The titles named in a text, each once, in order of first mention."""
        words = NAME_WORD.findall(text)
        found: dict[str, None] = {}
        at = 0
        while at < len(words):
            step = 1
            if words[at] in self.first_words:
                for length in range(min(self.longest, len(words) - at), 0, -1):
                    title = self.by_words.get(tuple(words[at : at + length]))
                    if title is not None:
                        found[title] = None
                        step = length
                        break
            at += step
        return list(found)

    def mentions(self, texts: list[str]) -> list[list[str]]:
        """The titles each text names, less those named in too many of the texts."""
        per_text = [self.find(text) for text in texts]
        counts = Counter(title for titles in per_text for title in titles)
        limit = max(MIN_TITLE_SECTIONS, MAX_TITLE_SHARE * len(texts))
        return [[t for t in titles if counts[t] <= limit] for titles in per_text]


def _meaningful(key: str) -> bool:
    """Not a function word, a number or a fragment ("and", "this page", "2")."""
    words = key.split()
    return (
        len(key) >= 3
        and not key.isdigit()
        and not all(w in STOPWORDS or w == "page" for w in words)
    )


def merge_extractions(per_section: Iterable[tuple[dict, dict]]) -> dict[str, list[dict]]:
    """Section-level extractions into pack-level tables, entities deduplicated by name (see
    normalize_entity), with the pack's own article titles added as entities of the sections
    that belong to them or name them."""
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

    pairs = list(per_section)
    # The pack's own article titles are entities of both extractors: each section mentions
    # its article's title, and every title its text names (the links a reader would follow).
    titled = TitleMatcher(s["article_title"] or "" for s, _ in pairs).mentions(
        [s["content"] for s, _ in pairs]
    )
    for (section, data), titles in zip(pairs, titled, strict=True):
        where = (section["article_url"], section["section_id"])
        named = [
            (
                str(item.get("name", "")),
                str(item.get("type") or "concept"),
                str(item.get("description") or ""),
            )
            for item in data.get("entities", [])
        ]
        named += [(section["article_title"] or "", "topic", "")]
        named += [(title, "name", "") for title in titles]
        # What the section defines (a signature, kpack.ingest.html) is an API identifier,
        # whichever extractor read it: the documentation graph's definitions.
        named += [(name, "api", "") for name in section.get("defines") or ()]
        for name, kind, description in named:
            key = entity(name, kind, description)
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
