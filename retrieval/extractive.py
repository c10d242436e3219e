"""The offline answer: the sentences of the top passages that answer the question, quoted.

Without a Claude key the answer is made of the pack's own sentences, so it can only say what
the pack says. Which sentences:

1. Candidates are the units of the passages kept for the answer (the k best), never the whole
   context: a prose sentence (:func:`sentences_of`; a list item, read without its marker, and
   a table row start their own), or a lead-in sentence ending in a colon together with the fenced
   code block that follows it ("The simplest example of reading a CSV file:" and its code),
   quoted as a fenced block so a how-to keeps the code it needs; so is a sentence that ends
   its paragraph and announces the code after it ("This example gets the main page and
   displays the first 300 bytes of it."). A lead-in whose code is not in the passage (or is
   longer than ``MAX_CODE_LINES``) would end in nothing and is skipped. A passage is read
   with what its section holds around it that its units need (:func:`passage_in_context`):
   the code its last lead-in introduces and the opening of the entry its first sentences
   explain (its definition line and the first lines that say what it does), when the
   chunking cut them off into the passages next to it, and, for a when / which-version
   question, the release notes that close that entry passages later. A definition line of
   API documentation (retrieval.key_items.SIGNATURE: ``json.dumps(obj, *, indent=None,
   ...)``, ``class csv.DictReader(f, ...)``) is no sentence: the units after it explain it,
   so each keeps it, counts its words as context and is quoted after it, as code (once per
   answer), and the name it defines reaches the answer. Sentences that only talk about the
   page ("This page describes ..."), point elsewhere ("... is described in [pack layout]
   (pack-layout.md)"), are navigation (a line of links) or are the tail of a sentence cut at
   a passage boundary are no answers either; markdown links are quoted as their text. A
   sentence that adds no term to the question's own, counting its definition line (it
   restates the question), answers nothing.
2. Each unit gets two scores on the same 0..1 scale: the cosine similarity of its passage to
   the question (the embedding model's, as the search computed it) and the IDF-weighted share
   of the question's terms it contains (kpack.text's terms; IDF over the pack's passages when
   the reader's keyword index is at hand, else over the candidates; the asking sentences of a
   question that first describes a situation weigh ``ASKED_WEIGHT`` times more; the terms of
   the sentence before the unit, of its definition line, the words of the names it writes and
   its article's title count half: :func:`name_words`; a sentence says "the race" on the page
   of the regatta it is about). A question term the unit lacks counts by meaning too: its
   closest word of the unit by the embedding model's word vectors (retrieval.meaning), when
   close enough, gives part of the term's weight ("folder" for "directory"). Embedding every
   sentence with the full model would be the better measure of meaning, but it costs about
   18 ms per sentence on one core (measured: 155 ms for a batch of 8, 630 ms for 32; again
   27 ms for one and 199 ms for 8 on the loaded machine), several times the query's latency
   budget for the few dozen sentences of five passages. The answer score is a weighted mean
   of similarity and coverage (``COVERAGE_WEIGHT``: all sentences of a passage share its
   similarity, so only coverage tells them apart), plus ``ANSWER_TYPE_BONUS`` when the unit
   (with its definition line) holds what the question asks for (retrieval.answer_type: a
   version for which version, a count for how many, a date for when, an exception for what
   error / what happens if, a name for who / which / where, a reason for why, an identifier
   for a how-to) that the question does not already
   hold; a release note ("Changed in version 3.8: ...") loses as much for any question but a
   version or date one. Those units are quoted first, and when none
   of the chosen ones holds the kind asked for, the best that does is added. After the best
   unit, each further one is chosen for what it adds to the quoted ones, and each part of a
   question of several parts gets the unit that holds its own terms
   (:func:`answering_sentences`). A question that names API names ("time.perf_counter or
   time.process_time?") is answered from each definition it names as well
   (:func:`with_named_definitions`); one that asks how they differ gets their parallel
   sentences first (:func:`contrasted`).
3. The answer says plainly that the passages do not answer, instead of quoting weak matches,
   when the question names something (a capitalised name: "Neo4j", "Windows", an
   identifier: "requests.get", or a release: "Python 3.14") that none of the passages
   mentions (:func:`missing_names`), or when even the best unit
   scores below ``ANSWER_THRESHOLD``. The threshold was measured, not tuned per question: it
   is the highest round score that wrongly refuses at most 1% of the answerable questions
   whose gold passage was retrieved, on SQuAD (0.7%) and on the demo pack's 32 questions.
4. Multi-hop: a quoted sentence that names another of the top passages by its title (the
   bridge the graph's second hop follows) is followed by that passage's best sentence (the
   answer); a passage that came in through a bridge (the graph stages: its ``via`` is
   ``bridge``) and names the best sentence's article puts its naming sentence first. Each
   is cited (:func:`chain`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations, pairwise

from kpack.contracts import chunk_id
from kpack.gate import question_terms
from kpack.text import (
    fence_roles,
    fold_word,
    normalize_entity,
    search_terms,
    split_sentences,
    stem,
    words,
)
from retrieval.answer_type import answer_kind, holds_answer
from retrieval.key_items import (
    QUESTION_IDENTIFIER,
    QUESTION_NAME,
    RELEASE,
    WRITTEN_IDENTIFIER,
    defined_name,
    identifiers,
    is_signature,
    same_name,
)
from retrieval.meaning import WordVectors
from retrieval.query import ContextSection

EXTRACTIVE_SENTENCES = 3
MIN_SENTENCE_WORDS, MAX_SENTENCE_WORDS = 4, 120
MAX_CODE_LINES = 20
# An entry's release notes are looked for in at most this many passages after a passage (a long
# entry runs over several: zip()'s "Changed in version 3.10" is three passages after its
# definition line).
MAX_ENTRY_PASSAGES = 4
# A passage that begins inside an entry is read with the entry's opening: its definition line
# and at most this many lines of prose after it, where reference documentation says what the
# definition does ("Create an object that operates like a regular reader but maps ... to a
# dict"); the rest of the entry is details.
ENTRY_OPENING_LINES = 4
# Below this answer score the best unit is not taken for an answer (module docstring).
ANSWER_THRESHOLD = 0.3
# What a unit holding the kind of answer asked for gains (module docstring, point 2).
ANSWER_TYPE_BONUS = 0.1
# A question's name is taken for a misspelled passage word from this many letters on.
MIN_TYPO_NAME = 5
# A multi-hop answer: at most this many units, from at most this many passages.
MAX_CHAINED, MAX_SOURCES = 4, 3
# Coverage's weight against passage similarity in a unit's score (module docstring).
COVERAGE_WEIGHT = 0.6
# The question's terms held only by the sentence before a unit count at this share.
CONTEXT_SHARE = 0.5
# A further unit is quoted only when what it adds is worth this share of the best unit's score.
FURTHER_SHARE = 0.6
# A question term matched by meaning only (word vectors) counts at most this share.
MEANING_SHARE = 0.6
# A further unit's coverage counts this share for the terms no quoted unit holds yet, the rest
# for all its terms (answering_sentences).
NOVELTY_SHARE = 0.3
# In a question that describes a situation before it asks ("I call basicConfig twice and
# nothing changes. Why?"), the terms of the asking sentences weigh this many times more.
ASKED_WEIGHT = 2.0

# Every offline answer that declines starts so (the benchmarks count them by it).
DECLINED = "The pack's passages do not"
NO_SENTENCE_ANSWER = (
    f"{DECLINED} answer this question: none of their sentences says what was asked."
)

# Markdown links: quoted as their text, the way the page reads.
MARKDOWN_LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
# A sentence about the page or section it is on, not about the subject.
SELF_REFERENCE = re.compile(
    r"^(this|the (following|next|previous|present)|these)\s+(\w+\s+)?"
    r"(page|pages|section|sections|document|chapter|guide|article|tutorial|reference)\b",
    re.IGNORECASE,
)
# A sentence whose point is where something else is explained.
POINTER = re.compile(
    r"\b(is|are)\s+(also\s+)?(described|explained|covered|documented|detailed|introduced)"
    r"\s+(below|above|later|elsewhere|in|on)\b"
    r"|^(see|read)\b|^(if|for)\b[^,]*,\s*(see|read)\b",
    re.IGNORECASE,
)
# A link's target without its text ("as described in (building-packs.md)").
LINK_RESIDUE = re.compile(r"(?<!\])\([\w./-]+\.(md|html?|rst|txt)\)")
# A row of a table as the page's text writes it: its cells joined by " | ".
TABLE_ROW = re.compile(r"\S \| \S")
# What no sentence starts with but the tail of one that a passage boundary cut does.
CUT_START = frozenset("=,;:.)]}|/%&")
# A list of links: a table of contents, "Next: [x](y)".
NAVIGATION_LINKS = 3

# A sentence that announces the code after it without a colon ("This example gets the
# python.org main page ...", "Look at the following example, which ..."): quoted with it.
ANNOUNCES_CODE = re.compile(r"\b(examples?|following|below|as follows|like this|snippet)\b", re.I)
# The words inside an identifier: its parts between dots and underscores, split at case.
NAME_SEPARATOR = re.compile(r"[._]")
NAME_WORD_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
# A list item's marker at the start of its line ("- The sort is stable", "2. Open the file").
LIST_ITEM = re.compile(r"^\s*([-*+•]|\d{1,2}[.)])\s+")
# A sentence's end followed by a note mark ("[citation needed]", "[12]") or the bracket or quote
# it closes ("(Default values are calculated once ...; this should usually be avoided.)"), and
# the next sentence's start.
CLOSED_END = re.compile(r"([.!?](\[[^\]\n]{1,40}\]|[)\"'’”]))\s+(?=[A-Z0-9`\"'(\[])")
# A fence line of a code block ("```", "~~~").
FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})")
# A release note of API documentation: "New in version 3.8.", "Changed in version 3.3: ...".
VERSION_NOTE = re.compile(r"(new|changed|deprecated) (in|since) version\b", re.IGNORECASE)
# A question that asks how the things it names differ (:func:`contrasted`), and the least word
# overlap (Jaccard) of two parallel sentences of theirs.
COMPARISON = re.compile(r"\b(differ|differs|difference|differences|versus|vs)\b", re.IGNORECASE)
MIN_PARALLEL = 0.4
# Interactive-session lines left in prose (">>> print(row)"): code, not a sentence.
PROMPT = ">>>"


@dataclass(frozen=True)
class Unit:
    """What an answer quotes: one sentence, or a lead-in with the code block it introduces."""

    sentence: str  # as quoted: the passage's words, links shown as their text
    code: str | None = None  # the fenced block, fences included
    before: str = ""  # the sentence before it in its paragraph, which it may lean on
    signature: str = ""  # the definition line it explains ("json.dumps(obj, *, ...)")

    @property
    def text(self) -> str:
        return f"{self.sentence}\n{self.code}" if self.code else self.sentence

    @property
    def subject(self) -> str:
        """What the unit says and the definition it says it of."""
        return f"{self.signature}\n{self.text}" if self.signature else self.text

    def render(self, title: str, with_signature: bool = True) -> str:
        """The unit and its citation, after its definition line as code (unless an earlier
        unit of the answer showed it); a code block is quoted before the citation, so the
        statement a citation check reads is the lead-in with its code."""
        sentence = self.sentence
        if self.signature and with_signature:
            sentence = f"`{self.signature}`: {sentence}"
        if self.code:
            return f"{sentence}\n\n{self.code}\n[Source: {title}]\n"
        return f"{sentence} [Source: {title}]"


@dataclass(frozen=True)
class ScoredSentence:
    unit: Unit
    passage: ContextSection
    similarity: float  # its passage's cosine similarity to the question
    coverage: float  # IDF-weighted share of the question's terms (by words and meaning)
    typed: bool  # holds the kind of answer the question asks for
    score: float
    # What each question term it holds (by word, context or meaning) adds to its coverage.
    credit: tuple[tuple[str, float], ...] = ()
    note: bool = False  # a release note ("Changed in version 3.8: ...") for another question

    @property
    def text(self) -> str:
        return self.unit.text


@lru_cache(maxsize=16384)
def stems(text: str) -> frozenset[str]:
    """The stemmed search terms of a text (pack sentences repeat across questions)."""
    return frozenset(search_terms(text))


def is_boilerplate(sentence: str, cut: bool = True) -> bool:
    """True for a sentence about the page itself, a pointer elsewhere, navigation, or (where
    a passage boundary can ``cut`` one) the tail of a sentence: it starts in lower case, or
    with the punctuation of a sentence's middle ("= expression, the function is said to ...")."""
    if cut and (sentence[:1].islower() or sentence[:1] in CUT_START):
        return True
    plain = MARKDOWN_LINK.sub(r"\1", sentence).strip(" -*")
    # A pointer to an API name ("For example, see time.perf_counter().") names the answer.
    pointer = POINTER.search(plain) and not identifiers(plain)
    if SELF_REFERENCE.match(plain) or pointer or LINK_RESIDUE.search(sentence):
        return True
    links = MARKDOWN_LINK.findall(sentence)
    linked_words = sum(len(text.split()) for text, _ in links)
    return len(links) >= NAVIGATION_LINKS or linked_words >= 0.5 * len(plain.split())


def _blocks(text: str) -> list[tuple[str, str]]:
    """The passage as ("prose", paragraph), ("item", list item), ("row", table row), ("code",
    fenced block) and ("signature", definition line) pieces, in order; a code block the
    passage cuts off (no closing fence) is left out. A definition line of API documentation
    ends the paragraph before it: it is no sentence ("contextlib.chdir(path)" is not the tail
    of "New in version 3.5."); a table row is a piece of its own ("'x' | open for exclusive
    creation, failing if the file already exists"), and so is a list item, without its
    marker ("- The sort is stable" is not the tail of the sentence before the list)."""
    blocks: list[tuple[str, str]] = []
    prose: list[str] = []
    code: list[str] = []
    paragraph = ["prose"]  # what the lines gathered in prose are: a paragraph or a list item

    def flush_prose() -> None:
        if prose:
            blocks.append((paragraph[0], " ".join(" ".join(prose).split())))
            prose.clear()
        paragraph[0] = "prose"

    for line, role in fence_roles(text.split("\n")):
        if role == "text":
            if is_signature(line):
                flush_prose()
                blocks.append(("signature", line.strip()))
            elif TABLE_ROW.search(line):  # a row is read on its own, not as one long sentence
                flush_prose()
                blocks.append(("row", " ".join(line.split())))
            elif LIST_ITEM.match(line):
                flush_prose()
                paragraph[0] = "item"
                prose.append(LIST_ITEM.sub("", line, count=1))
            elif line.strip():
                if paragraph[0] == "item" and not line[:1].isspace():
                    flush_prose()  # an item goes on only on indented lines
                prose.append(line)
            else:
                flush_prose()
        elif role == "open":
            flush_prose()
            code[:] = [line.strip()]
        elif role == "code":
            code.append(line)
        else:
            code.append(line.strip())
            blocks.append(("code", "\n".join(code)))
            code.clear()
    flush_prose()
    return blocks


def passage_in_context(
    chunk: str,
    text: str,
    chunk_text: Mapping[str, str],
    code_starts: dict[str, bool] | None = None,
    release_notes: bool = False,
) -> str:
    """The text of passage ``chunk`` with what its section holds around it that its units
    need (module docstring, point 1): the opening of the entry its first units explain (its
    definition line and what the entry first says of it), when the passage begins after it (a
    long entry is cut into several passages), and the code block
    its last lead-in introduces, when the passage ends before it; a code block it begins
    inside of is left out. With ``release_notes`` (for a question that asks when or since
    which version), also the release notes of the entry the passage ends inside, which a
    long entry writes at its end, passages later (:func:`_release_notes_after`). All of it
    comes from the passages next to it in its section (``chunk_text``: passage id to text),
    so the answer still quotes only the pack's text. ``code_starts`` keeps what is learnt of
    which passages begin inside a code block (retrieval.synthesis keeps one per version:
    ``reader.memo(code_starts)``)."""
    section, _, number = chunk.rpartition("-")
    if not number.isdigit():
        return text
    index = int(number)
    earlier = [chunk_text.get(chunk_id(section, index - n), "") for n in range(1, 3) if index >= n]
    if _opens_inside_code(section, index, chunk_text, {} if code_starts is None else code_starts):
        text = _without_code_head(text)
    definition = _entry_opening(text, earlier)
    code = _code_after(text, chunk_text.get(chunk_id(section, index + 1), ""))
    read = "\n".join(part for part in (definition, text, code) if part)
    notes = _release_notes_after(text, section, index, chunk_text) if release_notes else ""
    if notes and (definition or any(kind == "signature" for kind, _ in _blocks(text))):
        # A blank line before the notes: they are paragraphs of their own, not the tail of
        # the passage's last one.
        return f"{read}\n\n{notes}"
    return read


def _release_notes_after(text: str, section: str, index: int, chunk_text: Mapping[str, str]) -> str:
    """The release notes ("New in version 3.11.", "Changed in version 3.10: Added the strict
    argument.") that the passages after passage ``index`` hold before the next definition
    line: those of the entry the passage ends inside. At most ``MAX_ENTRY_PASSAGES`` are read."""
    notes: list[str] = []
    current = text
    for number in range(index + 1, index + 1 + MAX_ENTRY_PASSAGES):
        following = chunk_text.get(chunk_id(section, number), "")
        if not following:
            break
        for line in _continuation(current, following).split("\n"):
            if is_signature(line):
                return "\n\n".join(notes)
            if VERSION_NOTE.match(line.strip()):
                notes.append(line.strip())
        current = following
    return "\n\n".join(notes)


def _overlap_start(text: str, previous: str) -> int:
    """Where the passage begins in the passage before it (they overlap): the first line from
    which the rest of that passage is how this one begins, else where its first line last
    stands there (a fence line "```" stands at both ends of a block, so the first rule goes
    first), or the end of that passage when they do not overlap."""
    starts = [0, *(i + 1 for i, char in enumerate(previous) if char == "\n")]
    shared = next(
        (at for at in starts if at < len(previous) and text.startswith(previous[at:])), None
    )
    if shared is not None:
        return shared
    opening = next((line for line in text.split("\n") if line.strip()), "")
    at = previous.rfind(opening) if opening else -1
    return at if at >= 0 else len(previous)


def _opens_inside_code(
    section: str, index: int, chunk_text: Mapping[str, str], known: dict[str, bool]
) -> bool:
    """True when passage ``index`` of a section begins inside a code block an earlier passage
    opened: whether a fence line opens or closes a block depends on all the section before
    it, so the state is carried through the section's passages from the nearest one whose
    state is ``known`` (the first begins outside any block), and learnt on the way."""
    start = index
    while start > 0 and chunk_id(section, start) not in known:
        start -= 1
    inside = known.get(chunk_id(section, start), False)
    previous = chunk_text.get(chunk_id(section, start), "")
    for number in range(start + 1, index + 1):
        current = chunk_text.get(chunk_id(section, number), "")
        head = previous[: _overlap_start(current, previous)].split("\n")
        roles = [role for _, role in fence_roles(["```", *head] if inside else head)]
        inside = bool(roles) and roles[-1] in ("open", "code")
        known[chunk_id(section, number)] = inside
        previous = current
    return inside


def _without_code_head(text: str) -> str:
    """The passage without the end of a code block it begins in (up to its closing fence)."""
    lines = text.split("\n")
    close = next((i for i, line in enumerate(lines) if FENCE_LINE.match(line)), len(lines) - 1)
    return "\n".join(lines[close + 1 :])


def _entry_opening(text: str, earlier: list[str]) -> str:
    """The opening of the entry the passage begins inside (``ENTRY_OPENING_LINES``): the last
    definition line before the passage in the passages before it (nearest first) and the
    lines of prose after it, up to the first code block, when the passage's first sentences
    come before any definition line of its own."""
    first = next((kind for kind, _ in _blocks(text) if kind != "code"), None)
    if first != "prose":
        return ""
    current = text
    heads: list[str] = []
    for previous in earlier:
        head = previous[: _overlap_start(current, previous)]
        lines = head.split("\n")
        at = next((i for i in reversed(range(len(lines))) if is_signature(lines[i])), None)
        if at is not None:
            entry = "\n".join([*lines[at:], *reversed(heads)]).split("\n")
            prose = next(
                (i for i, line in enumerate(entry[1:], 1) if FENCE_LINE.match(line)), len(entry)
            )
            return "\n".join(entry[: min(prose, 1 + ENTRY_OPENING_LINES)]).strip()
        heads.append(head)
        current = previous
    return ""


def _code_after(text: str, following: str) -> str:
    """The rest of the code block the passage's end needs from the next passage: the lines
    up to its closing fence when the passage ends inside a block, or the block that follows
    when it ends with prose (a lead-in); "" otherwise, or when the block would be longer than
    ``MAX_CODE_LINES``."""
    roles = [role for _, role in fence_roles(text.split("\n"))]
    inside = bool(roles) and roles[-1] in ("open", "code")
    last = next((line for line in reversed(text.split("\n")) if line.strip()), "")
    rest = _continuation(text, following).split("\n")
    while rest and not rest[0].strip():
        rest = rest[1:]
    if not rest or not (
        inside or (last and not FENCE_LINE.match(last) and FENCE_LINE.match(rest[0]))
    ):
        return ""
    block: list[str] = []
    for line, role in fence_roles(["```", *rest] if inside else rest):
        block.append(line)
        if role == "close":
            break
    closed = len(block) >= 2 and FENCE_LINE.match(block[-1])
    if not closed or len(block) - 2 > MAX_CODE_LINES:
        return ""
    return "\n".join(block[1:] if inside else block)


def _continuation(text: str, following: str) -> str:
    """The next passage without the lines it repeats from the end of this one (passages
    overlap by whole lines, or by the last words of one)."""
    ends = [i for i, char in enumerate(following) if char == "\n"] + [len(following)]
    repeated = max((end for end in ends if text.endswith(following[:end])), default=0)
    return following[repeated:]


def sentences_of(paragraph: str) -> list[str]:
    """The sentences of a paragraph, also where a note mark or a closing bracket or quote
    follows a sentence's end ("... Alice Through the Looking Glass.[citation needed] Westwood
    One will carry ..."): the mark stays with the sentence it ends."""
    return [
        sentence
        for piece in CLOSED_END.sub("\\1\n", paragraph).split("\n")
        for sentence in split_sentences(piece)
    ]


@lru_cache(maxsize=16384)
def units_of(text: str) -> tuple[Unit, ...]:
    """The units of a passage that could answer (module docstring, point 1), each with the
    definition line it explains: the last one before it in the passage."""
    units: list[Unit] = []
    blocks = _blocks(text)
    signature = ""
    for index, (kind, body) in enumerate(blocks):
        if kind == "signature":
            signature = body
        if kind not in ("prose", "item", "row"):
            continue
        # A table row is one unit; it may start with a name in lower case ("defaultdict | dict
        # subclass that calls a factory function to supply missing values").
        sentences = [body] if kind == "row" else sentences_of(body)
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        for number, sentence in enumerate(sentences):
            before = MARKDOWN_LINK.sub(r"\1", sentences[number - 1]) if number else ""
            if not MIN_SENTENCE_WORDS <= len(sentence.split()) <= MAX_SENTENCE_WORDS:
                continue
            # An item may start with a name in lower case ("monotonic: time.monotonic()").
            cut = kind == "prose" or (kind == "item" and number > 0)
            if is_boilerplate(sentence, cut=cut) or PROMPT in sentence:
                continue
            quoted = MARKDOWN_LINK.sub(r"\1", sentence)
            code_after = (
                following[1]
                if number == len(sentences) - 1
                and following is not None
                and following[0] == "code"
                and following[1].count("\n") - 1 <= MAX_CODE_LINES
                else None
            )
            lead_in = quoted.rstrip().endswith(":")
            if code_after is not None and (lead_in or ANNOUNCES_CODE.search(quoted)):
                units.append(Unit(quoted, code_after, before, signature))
            elif not lead_in:  # a lead-in with nothing after it in the passage is no unit
                units.append(Unit(quoted, before=before, signature=signature))
    return tuple(units)


@lru_cache(maxsize=16384)
def name_words(text: str) -> frozenset[str]:
    """The stemmed words of the identifiers a text writes ("with_suffix": with, suffix;
    "TemporaryDirectory": temporary, directory): what a name says in the question's words."""
    parts = [
        word
        for name in identifiers(text)
        for piece in NAME_SEPARATOR.split(name)
        for word in NAME_WORD_PART.findall(piece)
    ]
    return stems(" ".join(parts))


@lru_cache(maxsize=16384)
def word_stems(text: str) -> frozenset[str]:
    """Every word of a text (stop words too), as a name key (kpack.text.fold_word: accents
    folded, so "Beyonce" is "Beyoncé") and stemmed: what a name is looked up in."""
    return frozenset(stem(fold_word(w)) for w in set(words(text)))


def misspelled(name: str, mentioned: frozenset[str]) -> bool:
    """True when a name of the question is a passage's word misspelled: one letter added,
    dropped or changed ("Hatmanis" for "Hartmanis"), or the word with up to two letters more
    or fewer at its end ("Californian", "California"). Names of fewer than ``MIN_TYPO_NAME``
    letters are not guessed at."""
    folded = fold_word(name.lower())
    # Both the stem and the whole word: the stemmer takes "Merceds" for a past tense ("merc").
    keys = {k for k in (stem(folded), folded) if len(k) >= MIN_TYPO_NAME}
    return any(
        _one_edit(key, word)
        or (
            abs(len(word) - len(key)) <= 2
            and min(len(word), len(key)) >= MIN_TYPO_NAME
            and (word.startswith(key) or key.startswith(word))
        )
        for key in keys
        for word in mentioned
        if abs(len(word) - len(key)) <= 2
    )


def _one_edit(a: str, b: str) -> bool:
    """True when a and b differ by one inserted, deleted or replaced letter."""
    if len(a) > len(b):
        a, b = b, a
    if len(b) - len(a) > 1:
        return False
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    return a[at + (len(a) == len(b)) :] == b[at + 1 :] and a != b


def written_apart(name: str, passages: list[ContextSection]) -> bool:
    """True when the passages write a name of the question as two words ("Superbowl": "Super
    Bowl")."""
    key = fold_word(name.lower())
    return any(
        fold_word(a.lower()) + fold_word(b.lower()) == key
        for p in passages
        for a, b in pairwise(words(p.text))
    )


def written_identifiers(texts: Iterable[str]) -> frozenset[str]:
    """The identifiers the texts write, lower case: every dotted name as written and each of
    its leading parts ("os.path.join", "os.path"; not "path.join", so "self.requests.get" is
    no "requests.get"), and every underscored word."""
    found: set[str] = set()
    for text in texts:
        for name in WRITTEN_IDENTIFIER.findall(text.lower()):
            parts = name.split(".")
            found.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return frozenset(found)


def missing_names(
    question: str, passages: list[ContextSection], known: frozenset[str] | None = None
) -> list[str]:
    """The names the question asks about that none of the passages mentions, and the
    identifiers ("requests.get") that the pack (``known``: written_identifiers of all its
    passages; else of the passages) never writes. A name has no paraphrase (a question about
    Neo4j is not answered by a passage about Kuzu), so a passage that does not name it does
    not answer the question, however close its words are; a name one typing slip away from
    a passage's word is taken for that word (:func:`misspelled`), and one the passages write as
    two words is mentioned (:func:`written_apart`)."""
    mentioned = frozenset().union(*(word_stems(p.text) for p in passages))
    names = dict.fromkeys(m.group(0) for m in QUESTION_NAME.finditer(question))
    missing = [
        name
        for name in names
        if not word_stems(name) <= mentioned
        and not misspelled(name, mentioned)
        and not written_apart(name, passages)
    ]
    if known is None:
        known = written_identifiers(p.text for p in passages)
    for identifier in dict.fromkeys(m.group(0) for m in QUESTION_IDENTIFIER.finditer(question)):
        if identifier.lower() not in known:
            missing.append(identifier)
    # A release the question names ("Python 3.14") that no passage mentions: the passages
    # are about other releases, however close their words.
    held = " ".join(p.text for p in passages)
    missing += [v for v in dict.fromkeys(RELEASE.findall(question)) if not _holds_version(held, v)]
    return missing


def _holds_version(text: str, version: str) -> bool:
    """True when the text writes the version (not as part of a longer one: "3.14" is not
    "3.1")."""
    return re.search(rf"(?<![\w.]){re.escape(version)}(?![\w]|\.\d)", text) is not None


def score_sentences(
    question: str,
    passages: list[ContextSection],
    idf: Callable[[str], float] | None = None,
    meaning: WordVectors | None = None,
) -> list[ScoredSentence]:
    """Every candidate unit of the passages with its scores, best first (module docstring)."""
    # A unit of two passages (chunks overlap) is the better one's, unless only the other
    # holds the definition line it explains.
    by_text: dict[str, tuple[Unit, ContextSection]] = {}
    for passage in passages:
        for unit in units_of(passage.text):
            held = by_text.get(unit.text)
            if held is None or (unit.signature and not held[0].signature):
                by_text[unit.text] = (unit, passage)
    seen = dict(by_text.values())
    wanted = stems(question)
    if not seen or not wanted:
        return []
    spelled = question_terms(question)  # each term with the word the question writes
    units = list(seen)
    found = [stems(u.text) & wanted for u in units]
    # A code block's words count half: the lead-in says what the code is for.
    led = [stems(u.sentence) & wanted for u in units]
    if idf is None:
        frequency = Counter(t for f in found for t in f)
        weight = {t: math.log(1 + len(units) / (1 + frequency[t])) for t in wanted}
    else:
        weight = {t: idf(t) for t in wanted}
    asked = stems(asking_part(question))
    weight = {t: w * (ASKED_WEIGHT if t in asked else 1.0) for t, w in weight.items()}
    total = sum(weight.values()) or 1.0
    kind = answer_kind(question)
    scored = []
    for unit, matched, lead in zip(units, found, led, strict=True):
        if not stems(unit.subject) - wanted:
            continue  # it only restates the question
        typed = kind is not None and holds_answer(kind, unit.subject, question)
        # A release note answers when something came or changed, not what it does: it holds
        # the kind of answer of another question.
        note = kind not in ("version", "date") and bool(VERSION_NOTE.match(unit.sentence))
        credit = {t: weight[t] * (1.0 if t in lead else 0.5) for t in matched}
        # The sentence before it ("These methods will raise ..."), the definition it explains
        # and the words of the names it writes say what it is about: their terms at half
        # weight.
        about = (
            stems(unit.before)
            | stems(unit.signature)
            | name_words(unit.subject)
            | stems(seen[unit].title)
        )
        context = about & wanted - matched
        for t in context:
            credit[t] = CONTEXT_SHARE * weight[t]
        unmatched = wanted - matched - context
        if meaning is not None and unmatched:
            # By the words the question writes: a stem's word pieces ("separ", "heavi") mean
            # less than the word's ("separate").
            closeness = meaning.closeness(tuple(spelled[t] for t in sorted(unmatched)), unit.text)
            for t in unmatched:
                if spelled[t] in closeness:
                    credit[t] = MEANING_SHARE * weight[t] * closeness[spelled[t]]
        coverage = sum(credit.values()) / total
        similarity = seen[unit].similarity
        scored.append(
            ScoredSentence(
                unit,
                seen[unit],
                similarity,
                coverage,
                typed,
                unit_score(similarity, coverage, typed, note),
                tuple((t, c / total) for t, c in credit.items()),
                note,
            )
        )
    return sorted(scored, key=lambda s: -s.score)


def answering_sentences(
    scored: list[ScoredSentence], parts: list[frozenset[str]] | None = None
) -> list[ScoredSentence]:
    """The units to quote: the best, if it answers; for a question of several ``parts`` (the
    terms only each part asks with, :func:`part_terms`), the unit holding most of a part's
    terms when no quoted unit holds any; then one at a time the unit that adds most
    (:func:`added_value`) while that clears the answer threshold and is worth
    ``FURTHER_SHARE`` of the best: at most three, and one more for each further part. A
    second sentence that says the best one's words again adds less than one that holds what
    it lacks: the bridge's second passage of a two-hop question, the fix after the sentence
    that restates the problem. When
    none of these holds the kind of answer asked for (a version, a name, an identifier), the
    best unit that does is added (one explaining the same definition as the best unit first:
    "since which version" of ``contextlib.chdir`` is its own "New in version 3.11", not the
    one of the entry before); units that hold it go first."""
    if not scored or scored[0].score < ANSWER_THRESHOLD:
        return []
    picked = [scored[0]]
    earned = dict(scored[0].credit)
    parts = parts or []
    for terms in parts if len(parts) > 1 else []:
        if not any(earned.get(t, 0.0) for t in terms):
            best = _best_for(terms, scored, scored[0])
            if best is not None:
                picked.append(best)
                _earn(earned, best)
    while len(picked) < EXTRACTIVE_SENTENCES + max(len(parts), 1) - 1:
        value, best = max(
            ((added_value(s, earned), s) for s in scored if all(s is not p for p in picked)),
            key=lambda pair: pair[0],
            default=(0.0, None),
        )
        if best is None or value < max(ANSWER_THRESHOLD, FURTHER_SHARE * scored[0].score):
            break
        picked.append(best)
        _earn(earned, best)
    anchor = picked[0]
    typed = [s for s in scored if s.typed and s.score >= ANSWER_THRESHOLD]
    if typed and not any(s.typed for s in picked):
        picked.append(max(typed, key=lambda s: (_same_definition(s, anchor), s.score)))
    return sorted(picked, key=lambda s: not s.typed)


def _best_for(
    terms: frozenset[str], scored: list[ScoredSentence], anchor: ScoredSentence
) -> ScoredSentence | None:
    """The answering unit that holds most of a part's terms, or None when none holds any. A
    further part asks about what the first one asked of ("... and since which version is it
    available?"), so a unit explaining the same definition as the best unit (``anchor``)
    goes before the others that hold any of the part's terms."""
    shares = {id(s): sum(c for t, c in s.credit if t in terms) for s in scored}
    held = [s for s in scored if s.score >= ANSWER_THRESHOLD and shares[id(s)] > 0]
    return max(
        held, key=lambda s: (_same_definition(s, anchor), shares[id(s)], s.score), default=None
    )


def _earn(earned: dict[str, float], unit: ScoredSentence) -> None:
    """Count what a quoted unit holds of each question term."""
    for term, share in unit.credit:
        earned[term] = max(earned.get(term, 0.0), share)


def added_value(unit: ScoredSentence, earned: dict[str, float]) -> float:
    """A further unit's score when ``earned`` is what the quoted units hold of each question
    term: its coverage counts ``NOVELTY_SHARE`` for what it holds beyond them."""
    fresh = sum(max(0.0, share - earned.get(term, 0.0)) for term, share in unit.credit)
    coverage = NOVELTY_SHARE * fresh + (1 - NOVELTY_SHARE) * unit.coverage
    return unit_score(unit.similarity, coverage, unit.typed, unit.note)


def unit_score(similarity: float, coverage: float, typed: bool, note: bool) -> float:
    """A unit's score: its passage's similarity and its coverage of the question's terms,
    with a bonus for holding the kind of answer asked for (none for a release note)."""
    return (
        (1 - COVERAGE_WEIGHT) * similarity
        + COVERAGE_WEIGHT * coverage
        + ANSWER_TYPE_BONUS * (typed - note)
    )


def asking_part(question: str) -> str:
    """The sentences of a question that ask (end in "?"), when others describe a situation
    first; else the whole question."""
    sentences = [s for s in split_sentences(question) if s.strip()]
    asking = [s for s in sentences if s.rstrip().endswith("?")]
    return " ".join(asking) if asking and len(asking) < len(sentences) else question


def _same_definition(unit: ScoredSentence, anchor: ScoredSentence) -> bool:
    """True when both units explain the same definition line of the same page (a long entry
    runs over several passages)."""
    return bool(anchor.unit.signature) and (
        unit.passage.article_url == anchor.passage.article_url
        and unit.unit.signature == anchor.unit.signature
    )


# Where a question asks a further thing: a second question mark, or "..., and what/how ...".
FURTHER_PART = re.compile(
    r"\?\s+\S|,?\s+(and|or)\s+(what|how|which|why|where|when|who|whom|is|are|does|do|can|"
    r"will|should|since)\b",
    re.IGNORECASE,
)


def part_terms(question: str) -> list[frozenset[str]]:
    """The search terms only each part of a question asks with (one part for most; "Which
    function writes the JSON, and what closes the file?": its two halves, less the terms
    both share)."""
    cuts = [m.start() for m in FURTHER_PART.finditer(question)][:2]
    bounds = [0, *cuts, len(question)]
    terms = [stems(question[a:b]) for a, b in pairwise(bounds)]
    return [t - frozenset().union(*(o for o in terms if o is not t)) for t in terms]


def question_parts(question: str) -> int:
    """How many things a question asks (1 for most; 2 for "What error is it, and what should
    I use instead?"), at most 3."""
    return min(3, 1 + len(FURTHER_PART.findall(question)))


def chain(
    chosen: list[ScoredSentence],
    scored: list[ScoredSentence],
    passages: list[ContextSection],
    question: str = "",
) -> list[ScoredSentence]:
    """The chosen units with the hops of a multi-hop answer (module docstring, point 4).

    A chosen unit that names another of the passages by its title (the bridge sentence:
    "She was born in Young, New South Wales") is followed by that passage's best unit (the
    answer sentence); a passage that came in through a bridge and names the best unit's
    article puts its naming unit first. A question that names two of the passages' articles
    ("Which band was formed first, The Exies or Circus Diablo?") gets the best unit of each.
    Each unit keeps its own citation; at most ``MAX_CHAINED`` units from ``MAX_SOURCES``
    passages.
    """
    if not chosen:
        return chosen
    by_passage: dict[int, list[ScoredSentence]] = {}
    for s in scored:
        by_passage.setdefault(id(s.passage), []).append(s)
    result = list(chosen)
    named = [p for p in passages if _names(question, p.title) and by_passage.get(id(p))]
    if len({p.title for p in named}) >= 2:
        for other in named:
            quoted = {id(s.passage) for s in result}
            if id(other) not in quoted and len(quoted) < MAX_SOURCES:
                result.append(by_passage[id(other)][0])
    for unit in chosen:
        for other in passages:
            quoted = {id(s.passage) for s in result}
            if id(other) in quoted or len(quoted) >= MAX_SOURCES:
                continue
            answers = by_passage.get(id(other), [])
            if answers and _names(unit.unit.text, other.title):
                result.insert(result.index(unit) + 1, answers[0])
    best = chosen[0]
    for other in passages:
        quoted = {id(s.passage) for s in result}
        if other.via != "bridge" or id(other) in quoted or len(quoted) >= MAX_SOURCES:
            continue
        naming = [s for s in by_passage.get(id(other), []) if _names(s.text, best.passage.title)]
        if naming:
            result.insert(result.index(best), naming[0])
    return result[:MAX_CHAINED]


def with_named_definitions(
    chosen: list[ScoredSentence], scored: list[ScoredSentence], question: str
) -> list[ScoredSentence]:
    """The chosen units after the best unit of each definition the question names and none
    of them explains: "should I use time.perf_counter or time.process_time?" is answered by
    what each of the two definitions says, not by the best two sentences of one of them."""
    if not chosen:
        return chosen
    asked = [name.lower() for name in identifiers(question)]
    quoted = {defined_name(s.unit.signature) for s in chosen}
    named: dict[str, ScoredSentence] = {}
    for s in scored:  # best first
        name = defined_name(s.unit.signature)
        if (
            name
            and name not in quoted
            and name not in named
            and s.score >= ANSWER_THRESHOLD
            and any(same_name(name, a) for a in asked)
        ):
            named[name] = s
    return [*named.values(), *chosen]


def contrasted(
    chosen: list[ScoredSentence], scored: list[ScoredSentence], question: str
) -> list[ScoredSentence]:
    """The chosen units after a contrast, for a question that asks how the definitions it names
    differ ("should I use time.perf_counter or time.process_time? How do they differ?"):
    documentation says what differs in parallel sentences ("It does include time elapsed
    during sleep" / "It does not include time elapsed during sleep"), so of two named
    definitions the pair of units whose words, less the definitions' names, overlap most
    (at least ``MIN_PARALLEL``, Jaccard) without being the same words."""
    asked = [name.lower() for name in identifiers(question)]
    if not chosen or len(asked) < 2 or not COMPARISON.search(question):
        return chosen
    by_name: dict[str, list[ScoredSentence]] = {}
    for s in scored:
        name = defined_name(s.unit.signature)
        if name and s.score >= ANSWER_THRESHOLD and any(same_name(name, a) for a in asked):
            by_name.setdefault(name, []).append(s)
    names = frozenset(w for name in by_name for w in words(name))

    def plain_words(unit: ScoredSentence) -> frozenset[str]:
        # Without the names it writes: "Use perf_counter_ns() ..." and "Use process_time_ns()
        # ..." say the same of each.
        named = {w for name in identifiers(unit.unit.sentence) for w in words(name)}
        return frozenset(words(unit.unit.sentence)) - names - named

    plain = {id(s): plain_words(s) for units in by_name.values() for s in units}
    best, pair = MIN_PARALLEL, None
    for first, second in combinations(by_name, 2):
        for a in by_name[first]:
            mine = plain[id(a)]
            for b in by_name[second]:
                theirs = plain[id(b)]
                overlap = len(mine & theirs) / (len(mine | theirs) or 1)
                if mine != theirs and overlap > best:
                    best, pair = overlap, (a, b)
    if pair is None:
        return chosen
    return [*pair, *(s for s in chosen if s is not pair[0] and s is not pair[1])]


def _names(text: str, title: str) -> bool:
    """True when ``text`` names the article ``title`` (its name without a qualifier)."""
    name = normalize_entity(title)
    return bool(name) and f" {name} " in f" {' '.join(words(text))} "


def extractive_answer(
    question: str,
    passages: list[ContextSection],
    idf: Callable[[str], float] | None = None,
    meaning: WordVectors | None = None,
    known_identifiers: frozenset[str] | None = None,
) -> tuple[str, list[ContextSection]]:
    """The quoted answer, each unit followed by [Source: title], and the passages quoted; a
    plain statement that the passages do not answer, and no passage, when none does."""
    missing = missing_names(question, passages, known_identifiers)
    if missing:
        return f"{DECLINED} mention {', '.join(missing)}, so they do not answer this question.", []
    scored = score_sentences(question, passages, idf, meaning)
    chosen = chain(answering_sentences(scored, part_terms(question)), scored, passages, question)
    chosen = contrasted(with_named_definitions(chosen, scored, question), scored, question)
    if not chosen:
        return NO_SENTENCE_ANSWER, []
    shown: set[str] = set()
    rendered = []
    for s in chosen:
        rendered.append(s.unit.render(s.passage.title, s.unit.signature not in shown))
        shown.add(s.unit.signature)
    answer = " ".join(rendered).strip()
    return answer, list({id(s.passage): s.passage for s in chosen}.values())
