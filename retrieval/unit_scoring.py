"""Each candidate unit scored against the question (retrieval.extractive, point 2).

Each unit gets two scores on the same 0..1 scale: the cosine similarity of its passage to the
question (the embedding model's, as the search computed it), blended as vector search blends it
(retrieval.candidates.vector_score, ``sentence_weight``) with the similarity of the sentence of
the sentence index that holds the unit (kpack.sentence_index: every sentence embedded at build
time, so a passage's sentences differ by meaning, not only by their words) where the blend is
the higher (a sentence that answers need not read like the question), and the IDF-weighted
share of the question's terms it contains (kpack.text's terms; IDF over the pack's passages
when the reader's keyword index is at hand, else over the candidates; the asking sentences of a
question that first describes a situation weigh ``ASKED_WEIGHT`` times more; the terms of the
sentence before the unit, of its definition line, the words of the names it writes and its
article's title count ``CONTEXT_SHARE``: :func:`name_words`; a sentence says "the race" on the
page of the regatta it is about). A question term the unit lacks counts by meaning too: its
closest word of the unit by the embedding model's word vectors (retrieval.meaning), when close
enough, gives part of the term's weight ("folder" for "directory"). A unit the sentence index
does not hold (a pack built without it, a sentence from a neighbouring passage that the answer
reads for context) has its passage's similarity alone: embedding it at query time would cost
about 18 ms a sentence on one core, several times the query's budget. The score is a weighted
mean of similarity and coverage (``COVERAGE_WEIGHT``), plus ``ANSWER_TYPE_BONUS`` when the unit
(with its definition line) holds what the question asks for (retrieval.answer_type) that the
question does not already hold; a release note ("Changed in version 3.8: ...") loses as much
for any question but a version or date one.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from kpack.gate import question_terms
from kpack.text import split_sentences, term_set
from retrieval.answer_type import answer_kind, holds_answer
from retrieval.answer_units import VERSION_NOTE, Unit, quoted_words, units_of
from retrieval.candidates import vector_score
from retrieval.key_items import NAME, identifiers
from retrieval.meaning import WordVectors
from retrieval.query import ContextSection
from retrieval.series import series_named, speaks_of

# Coverage's weight against passage similarity in a unit's score: every unit of a passage
# shares its similarity, so only coverage tells them apart; more than half, so a unit that
# holds the question's terms beats a neighbour in a slightly closer passage.
COVERAGE_WEIGHT = 0.6
# What a unit holding the kind of answer asked for gains: a tie-breaker worth a sixth of full
# coverage, so it orders units of close scores and never lifts one that holds no term.
ANSWER_TYPE_BONUS = 0.1
# The question's terms held only by a unit's context (the sentence before it, its definition
# line, its names' words, its article's title) count at this share: the unit leans on them
# but does not say them.
CONTEXT_SHARE = 0.5
# A question term matched by meaning only (word vectors) counts at most this share: a close
# word is evidence, weaker than the word itself and a little more than its context.
MEANING_SHARE = 0.6
# In a question that describes a situation before it asks ("I call shelf.open twice and
# nothing changes. Why?"), the terms of the asking sentences weigh this many times more: the
# description's words are on every page about the subject, the question's say what is asked.
ASKED_WEIGHT = 2.0
# The words inside an identifier: its parts between dots and underscores, split at case.
NAME_SEPARATOR = re.compile(r"[._]")
NAME_WORD_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
# A word written in lower case (a name never is), and a capitalised word opening a sentence.
LOWER_WORD = re.compile(r"\b[a-z][\w'’-]*")
CAPITALISED = re.compile(r"[A-Z][\w'’-]+")


@dataclass(frozen=True)
class ScoredSentence:
    unit: Unit
    passage: ContextSection
    # Its passage's cosine similarity to the question, or the blend with its own sentence's
    # where that is higher.
    similarity: float
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
def name_words(text: str) -> frozenset[str]:
    """The stemmed words of the identifiers a text writes ("with_suffix": with, suffix;
    "TemporaryDirectory": temporary, directory): what a name says in the question's words."""
    parts = [
        word
        for name in identifiers(text)
        for piece in NAME_SEPARATOR.split(name)
        for word in NAME_WORD_PART.findall(piece)
    ]
    return term_set(" ".join(parts))


def score_sentences(
    question: str,
    passages: list[ContextSection],
    idf: Callable[[str], float] | None = None,
    meaning: WordVectors | None = None,
    sentence_weight: float = 0.0,
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
    wanted = term_set(question)
    if not seen or not wanted:
        return []
    spelled = question_terms(question)  # each term with the word the question writes
    units = list(seen)
    found = [term_set(u.text) & wanted for u in units]
    # A code block's words count half: the lead-in says what the code is for.
    led = [term_set(u.sentence) & wanted for u in units]
    if idf is None:
        frequency = Counter(t for f in found for t in f)
        weight = {t: math.log(1 + len(units) / (1 + frequency[t])) for t in wanted}
    else:
        weight = {t: idf(t) for t in wanted}
    asked = term_set(asking_part(question))
    weight = {t: w * (ASKED_WEIGHT if t in asked else 1.0) for t, w in weight.items()}
    total = sum(weight.values()) or 1.0
    kind = answer_kind(question)
    names = names_written(tuple(u.text for u in units)) if kind == "name" else frozenset()
    series = series_named(question)
    # The terms of the one of a series asked ("Lakeside Regatta 7"): its words and its number.
    series_terms = term_set(" ".join(s.written for s in series)) & wanted
    scored = []
    for unit, matched, lead in zip(units, found, led, strict=True):
        if not term_set(unit.subject) - wanted:
            continue  # it only restates the question
        # Which one of the series asked the unit speaks of (retrieval.series), or the sentence
        # before it, which it goes on from.
        this_one, another = speaks_of(unit.text, series)
        before_this_one, before_another = speaks_of(unit.before, series)
        before = "" if before_another and not before_this_one else unit.before
        typed = kind is not None and holds_answer(kind, unit.subject, question)
        typed = typed or (kind == "name" and opens_with_a_name(unit.sentence, names, question))
        # A release note answers when something came or changed, not what it does: it holds
        # the kind of answer of another question.
        note = kind not in ("version", "date") and bool(VERSION_NOTE.match(unit.sentence))
        credit = {t: weight[t] * (1.0 if t in lead else 0.5) for t in matched}
        # The sentence before it ("These methods will raise ..."), the definition it explains
        # and the words of the names it writes say what it is about: their terms at half
        # weight.
        about = (
            term_set(before)
            | term_set(unit.signature)
            | name_words(unit.subject)
            | term_set(seen[unit].title)
        )
        context = about & wanted - matched
        for t in context:
            credit[t] = CONTEXT_SHARE * weight[t]
        # A unit that writes the one of a series asked, or goes on from the sentence that does
        # ("The Lakeside Regatta 7 was sailed in fog. Brill's crew won it."), is about that
        # one: the series' words and number count in full, whichever of them it writes; one
        # that only writes the series' words ("every Lakeside Regatta") is about the series.
        # One that writes another one and not that one ("Lakeside Regatta VI, won by the home
        # crew") is about the other one, whatever the sentence before says: the series' words
        # and number earn it nothing, not even from its title or by meaning.
        if this_one or (before_this_one and not another):
            for t in series_terms:
                credit[t] = weight[t]
        elif another:
            for t in series_terms:
                credit[t] = 0.0
        unmatched = wanted - set(credit)
        if meaning is not None and unmatched:
            # By the words the question writes: a stem's word pieces ("separ", "heavi") mean
            # less than the word's ("separate").
            closeness = meaning.closeness(tuple(spelled[t] for t in sorted(unmatched)), unit.text)
            for t in unmatched:
                if spelled[t] in closeness:
                    credit[t] = MEANING_SHARE * weight[t] * closeness[spelled[t]]
        coverage = sum(credit.values()) / total
        similarity = max(
            seen[unit].similarity,
            vector_score(
                seen[unit].similarity, sentence_similarity(unit, seen[unit]), sentence_weight
            ),
        )
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


def sentence_similarity(unit: Unit, passage: ContextSection) -> float | None:
    """The similarity to the question of the passage's indexed sentence that holds the unit
    (a unit may be part of one: the index keeps a definition line with the sentence after
    it); None when none does."""
    words = quoted_words(unit.sentence)
    return next((similarity for text, similarity in passage.sentences if words in text), None)


def names_written(texts: tuple[str, ...]) -> frozenset[str]:
    """The words the texts write as names, lower case: capitalised inside a sentence
    (key_items.NAME) and never written in lower case."""
    inside = {name.lower() for text in texts for name in NAME.findall(text)}
    lower = {word for text in texts for word in LOWER_WORD.findall(text)}
    return frozenset(inside - lower)


def opens_with_a_name(sentence: str, names: frozenset[str], question: str) -> bool:
    """True when the sentence's first word is a name the passages write (``names``) and the
    question does not: key_items.NAME skips a sentence's first word, which is capitalised
    whatever it is, so "Brill won the final." would hold no name."""
    first = CAPITALISED.match(sentence)
    word = first.group(0).lower() if first else ""
    return word in names and word not in question.lower()


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
