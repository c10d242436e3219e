"""Text utilities shared by ingest and retrieval: one sentence splitter, one code-fence
scanner, one stopword list, one way to cut a text into search terms and one key for a name
(:func:`normalize_entity`), so a passage is cut and scored, and a name is matched, the same way
by the build that extracts entities and by the query that looks for them.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import Stemmer

# A sentence ends at . ! or ? (with a note mark, "[citation needed]", "[12]", or the bracket or
# quote it closes after it) followed by space and something that starts a sentence (a capital,
# a digit, a code span, a quote or a bracket). A dotted name ("os.path.join()") or a version
# ("3.11.2") has no space after its dots, so it never ends one.
SENTENCE_END = re.compile(r"[.!?](?:\[[^\]\n]{1,40}\]|[)\"'’”])?(?=\s+[A-Z0-9`\"'(\[])")
# Abbreviations after which a full stop ends no sentence, whatever follows ("e.g. `open()`",
# "i.e. The", "Dr. Lee", "vs. Python 2"), read in lower case: the word before the stop.
# "etc." is not one: it often closes a sentence ("... pears, etc. The next").
ABBREVIATIONS = frozenset(
    [
        "e.g",
        "i.e",
        "cf",
        "vs",
        "viz",
        "approx",
        "dr",
        "mr",
        "mrs",
        "ms",
        "prof",
        "st",
        "jr",
        "sr",
        "fig",
        "figs",
        "eq",
        "vol",
        "pp",
        "ca",
        "resp",
        "al",
    ]
)
# The word a full stop closes: letters with inner dots ("e.g", "i.e", "Dr").
WORD_BEFORE_STOP = re.compile(r"([A-Za-z]+(?:\.[A-Za-z]+)*)$")

# A Markdown code fence: three or more backticks or tildes, possibly indented.
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")

LineRole = Literal["text", "open", "code", "close"]

# A word: word characters of any script (letters, digits, underscores), so "Zürich" and
# "straße" are words and an identifier (allow_private_hosts) is one word.
WORD = re.compile(r"\w+")
# The Snowball stemmer every search term goes through (PyStemmer). English for every pack:
# words of other languages still tokenize, fold and match as written (see :func:`stem`).
STEMMER_LANGUAGE = "english"

# A word of a name, as prose writes it: letters and digits, with inner apostrophes, hyphens,
# dots or ampersands ("O'Brien", "mom-and-pop", "U.S", "AT&T").
NAME_WORD = re.compile(r"[^\W_]+(?:['’.\-&][^\W_]+)*")
# A name written like code (dots, underscores, options, operators): normalised as written.
CODE_LIKE = re.compile(r"\w[._]\w|_|\(\)$|(?:^|\s)--?\w|[/\\=<>{}\[\]$@#*+|]")
# An identifier as a text writes one, read in lower case: a name with dots or underscores, not
# after a dot ("json.dump", "ensure_ascii"), which folded_words would cut at the underscore.
CODE_NAME = re.compile(r"(?<![\w.])[a-z_]\w*(?:\.[a-z_]\w*)+|\b\w+_\w+\b")
# A dotted name as code writes it ("json.dump", "pathlib.PurePath.suffix"): the one pattern of
# a qualified identifier, which the build's and the answers' identifier patterns are made of.
DOTTED_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"
# The words a signature line may start with before the name it defines ("class
# json.JSONEncoder(...)", "async def ...").
SIGNATURE_KINDS = (
    "class|exception|async|awaitable|coroutine|abstractmethod|classmethod|staticmethod|property"
)
# "Lilu (mythology)", "Python (programming language)": the qualifier is not part of the name.
QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")
POSSESSIVE = re.compile(r"['’]s$")

# Function words: never a search term, never the start of a name.
STOPWORDS = frozenset(
    [
        # the letters an apostrophe leaves of a contraction or a possessive ("don't", "it's",
        # "I'd", "I'm"; "re" is not one of them: it names a Python module)
        "d",
        "m",
        "s",
        "t",
        "a",
        "after",
        "all",
        "also",
        "although",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "before",
        "but",
        "by",
        "can",
        "do",
        "does",
        "each",
        "every",
        "for",
        "from",
        "has",
        "have",
        "here",
        "how",
        "however",
        "i",
        "if",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "note",
        "of",
        "on",
        "or",
        "see",
        "since",
        "so",
        "some",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)


def split_sentences(text: str) -> list[str]:
    """The sentences of a text: the one splitter of chunking, entity extraction, the gate's
    probes and the offline answer. A sentence ends where :data:`SENTENCE_END` says, except
    after an abbreviation (:data:`ABBREVIATIONS`: "e.g.", "vs.", "Dr.") and inside a code span
    (`` `x = 1. Then` ``); a fenced code block is one piece, fences and newlines included.
    Within prose, newlines are kept where they stand (no newlines are needed)."""
    pieces: list[str] = []
    prose: list[str] = []
    block: list[str] = []

    def flush_prose() -> None:
        if prose:
            pieces.extend(s for s in _prose_sentences("\n".join(prose)) if s.strip())
            prose.clear()

    if "```" not in text and "~~~" not in text:
        return _prose_sentences(text)
    for line, role in fence_roles(text.split("\n")):
        if role == "text":
            prose.append(line)
            continue
        flush_prose()
        block.append(line)
        if role == "close":
            pieces.append("\n".join(block))
            block.clear()
    flush_prose()
    if block:  # a block the text cuts off before its closing fence
        pieces.append("\n".join(block))
    return pieces


def _prose_sentences(text: str) -> list[str]:
    """The sentences of prose without fenced code (:func:`split_sentences`)."""
    sentences: list[str] = []
    start = 0
    for end in SENTENCE_END.finditer(text):
        before = text[start : end.start()]
        if before.count("`") % 2:  # inside a code span
            continue
        if end.group(0) == ".":
            word = WORD_BEFORE_STOP.search(before)
            if word and word.group(1).lower() in ABBREVIATIONS:
                continue
        sentences.append(text[start : end.end()])
        start = end.end()
        while start < len(text) and text[start].isspace():
            start += 1
    sentences.append(text[start:])
    return sentences


def fence_roles(lines: Iterable[str]) -> Iterator[tuple[str, LineRole]]:
    """Each line with its role: prose ``text``, or the ``open`` fence, ``code`` inside it and
    the ``close`` fence of a fenced code block. A fence closes with the same character, at
    least as long; an unclosed fence runs to the end."""
    fence: str | None = None
    for line in lines:
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                yield line, "open"
            else:
                yield line, "text"
        elif match and match.group(1).startswith(fence):
            fence = None
            yield line, "close"
        else:
            yield line, "code"


def prose_lines(content: str) -> list[str]:
    """The lines of a passage outside its fenced code blocks."""
    return [line for line, role in fence_roles(content.split("\n")) if role == "text"]


def words(text: str) -> list[str]:
    """The words of a text (the one tokenizer of keyword search, the gate, the graph's terms,
    the extractive answer and the quality filter): NFKC-normalised and case-folded ("Straße"
    -> "strasse", "ﬁle" -> "file"), then runs of word characters of any script."""
    return WORD.findall(unicodedata.normalize("NFKC", text).casefold())


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A word's search term: its Snowball stem (so "publishes", "published" and "publish"
    meet, and "page" and "pages"), accents folded ("café" and "cafe" meet). A word with
    digits or underscores is an identifier and stays as written (``allow_private_hosts``)."""
    if len(word) > 3 and word.isalpha():
        word = _stemmer().stemWord(word)
    if word.isascii():
        return word
    plain = unicodedata.normalize("NFKD", word)
    return "".join(c for c in plain if not unicodedata.combining(c))


@lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    import Stemmer

    return Stemmer.Stemmer(STEMMER_LANGUAGE)


def search_words(text: str) -> list[str]:
    """The words of a text that become search terms: no stop words. A one-letter word is
    a term ("Malcolm X", "the C library", "F. Scott"), except the pieces an apostrophe
    leaves ("don't" -> "don", "t"), which are stop words."""
    return [w for w in words(text) if w not in STOPWORDS]


def search_terms(text: str) -> list[str]:
    """The search terms of a text, in order and repeated: its search words, stemmed. Keyword
    search counts them, the gate weighs them."""
    return [stem(w) for w in search_words(text)]


@lru_cache(maxsize=65536)
def term_set(text: str) -> frozenset[str]:
    """The distinct search terms of a text, which the gate and the answers compare with a
    question's; cached, because a pack's passages and sentences repeat across questions."""
    return frozenset(search_terms(text))


# -- names -------------------------------------------------------------------------------------


@lru_cache(maxsize=1 << 16)
def fold_word(word: str) -> str:
    """One word as a name key: accents, case and a possessive don't matter; a lower-case plural
    is its singular ("sprockets" -> "sprocket"; capitalised words are names: "Williams")."""
    plain = POSSESSIVE.sub("", word)
    if not plain.isascii():
        plain = unicodedata.normalize("NFKD", plain)
        plain = "".join(c for c in plain if not unicodedata.combining(c))
    key = plain.lower()
    if plain.islower() and len(key) > 3:
        if key.endswith("sses"):
            key = key[:-2]
        elif key.endswith("s") and not key.endswith(("ss", "us", "is")):
            key = key[:-1]
    return key


def folded_words(text: str) -> list[str]:
    """The folded words of a name or a question, in order (see fold_word)."""
    return [fold_word(w) for w in NAME_WORD.findall(text)]


def code_names(text: str) -> list[str]:
    """The identifiers a text writes with dots or underscores, lower case, in order: the keys
    (normalize_entity) of the code names it spells."""
    return CODE_NAME.findall(text.lower())


def written_identifiers(texts: Iterable[str]) -> frozenset[str]:
    """The identifiers the texts write, lower case: every dotted name as written and each of
    its leading parts ("os.path.join", "os.path"; not "path.join", so "self.requests.get" is
    no "requests.get"), and every underscored word."""
    found: set[str] = set()
    for text in texts:
        for name in code_names(text):
            parts = name.split(".")
            found.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return frozenset(found)


@lru_cache(maxsize=1 << 16)  # a pack names the same entities again and again
def normalize_entity(name: str) -> str:
    """The dedup key of an entity, so aliases meet: case, accents, quotes, punctuation, a
    possessive, a lower-case plural, a qualifier in parentheses and a leading article don't
    matter ("The Oberoi Group's" = "Oberoi Group"). Code names keep their dots and
    underscores ("widget.frob()" -> "widget.frob")."""
    text = name.replace("`", "").strip().strip("'\"“”‘’").removesuffix("()")
    if CODE_LIKE.search(text):
        key = " ".join(text.lower().split())
    else:
        key = " ".join(folded_words(QUALIFIER.sub("", text) or text))
    for article in ("the ", "an ", "a "):
        key = key.removeprefix(article)
    return key.strip()
