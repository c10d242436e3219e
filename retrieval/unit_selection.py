"""Which scored units an offline answer quotes, per kind of question (retrieval.extractive).

After the best unit, each further one is chosen for what it adds to the quoted ones, and each
part of a question of several parts gets the unit that holds its own terms
(:func:`answering_sentences`). A question that names API names ("shelf.open or
shelf.restore?") is answered from each definition it names as well
(:func:`with_named_definitions`). Multi-hop: a quoted sentence that names another of the top
passages by its title (the bridge the graph's second hop follows) is followed by that
passage's best sentence (the answer); a passage that came in through a bridge (the graph
stages: its ``via`` is ``bridge``) and names the best sentence's article adds its naming
sentence, first when it is strong enough to lead (``LEAD_SHARE``), else after the best
(:func:`chain`).
"""

from __future__ import annotations

import re
from itertools import pairwise

from kpack.text import normalize_entity, term_set, words
from retrieval.answer_type import Kind
from retrieval.key_items import defined_name, identifiers, same_name
from retrieval.query import ContextSection
from retrieval.unit_scoring import ScoredSentence, unit_score

# At most this many units answer a question of one part (one more per further part): a short
# paragraph an asker reads at a glance; the citations lead to the rest.
EXTRACTIVE_SENTENCES = 3
# Below this answer score the best unit is not taken for an answer. Measured, not tuned per
# question: the highest round score that wrongly refuses at most 1% of the answerable
# questions whose gold passage was retrieved, on SQuAD (0.7%) and on the demo pack's 32
# questions.
ANSWER_THRESHOLD = 0.3
# A further unit is quoted only when what it adds is worth this share of the best unit's
# score: a unit much weaker than the best is more often beside the point than a second fact.
FURTHER_SHARE = 0.6
# A further unit's coverage counts this share for the terms no quoted unit holds yet, the rest
# for all its terms (:func:`added_value`): enough that a sentence repeating the best one's
# words loses to one that holds what it lacks, not so much that a weak unit wins on one word.
NOVELTY_SHARE = 0.3
# The answer starts from the best-ranked passage whose best unit scores at least this share of
# the best unit's score (:func:`lead_first`). Chosen on bench/answer_dev_questions.jsonl only
# (answers holding every term group, with how-to code: 1.0 (off) 17, 0.9 17, 0.8 18, 0.7 17
# of 21), never on a graded set.
LEAD_SHARE = 0.8
# The kinds of answer that are one fact, which one sentence states (retrieval.answer_type):
# :func:`lead_first` leaves their best unit first. lead_first was chosen on how-to questions.
FACT_KINDS = frozenset({"name", "number", "date"})
# A multi-hop answer: at most this many units, from at most this many passages (a two-hop
# question needs two; a third passage is the bridge's own page).
MAX_CHAINED, MAX_SOURCES = 4, 3


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
    best unit that does is added; units that hold it go first."""
    if not scored or scored[0].score < ANSWER_THRESHOLD:
        return []
    picked = [scored[0]]
    earned = dict(scored[0].credit)
    parts = parts or []
    for terms in parts if len(parts) > 1 else []:
        if not any(earned.get(t, 0.0) for t in terms):
            best = _best_for(terms, scored)
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
    typed = [s for s in scored if s.typed and s.score >= ANSWER_THRESHOLD]
    if typed and not any(s.typed for s in picked):
        picked.append(typed[0])  # best first
    return sorted(picked, key=lambda s: not s.typed)


def _best_for(terms: frozenset[str], scored: list[ScoredSentence]) -> ScoredSentence | None:
    """The answering unit that holds most of a part's terms, or None when none holds any."""
    shares = {id(s): sum(c for t, c in s.credit if t in terms) for s in scored}
    held = [s for s in scored if s.score >= ANSWER_THRESHOLD and shares[id(s)] > 0]
    return max(held, key=lambda s: (shares[id(s)], s.score), default=None)


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
    terms = [term_set(question[a:b]) for a, b in pairwise(bounds)]
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
    article adds its naming unit before the best one when it scores as a lead must
    (``LEAD_SHARE`` of the best: a cross-reference in a documentation page that names the best
    page is no lead), else after it. A question that names two of the passages' articles
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
            # It leads the answer only as a unit may (lead_first): else it follows the best.
            before = naming[0].score >= LEAD_SHARE * best.score
            result.insert(result.index(best) + (0 if before else 1), naming[0])
    return result[:MAX_CHAINED]


def with_named_definitions(
    chosen: list[ScoredSentence], scored: list[ScoredSentence], question: str
) -> list[ScoredSentence]:
    """The chosen units after the best unit of each definition the question names and none
    of them explains: "should I use shelf.open or shelf.restore?" is answered by what each
    of the two definitions says, not by the best two sentences of one of them."""
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


def _names(text: str, title: str) -> bool:
    """True when ``text`` names the article ``title`` (its name without a qualifier)."""
    name = normalize_entity(title)
    return bool(name) and f" {name} " in f" {' '.join(words(text))} "


def lead_first(
    scored: list[ScoredSentence], passages: list[ContextSection], kind: Kind | None = None
) -> list[ScoredSentence]:
    """The scored units with the answer's first unit first: the best unit of the best-ranked
    passage that answers (its best unit scores at least ``LEAD_SHARE`` of the best unit's
    score, and the answer threshold), not the best unit of any passage. Ranking read the whole
    passage (its fused, reranked score); a unit's score reads one sentence, so a module's
    introduction, which names every term of the module, outscores the section that does
    what was asked. Not for a question asking a fact (the ``kind`` of answer a name, a number
    or a date): one sentence states it, and the best unit is the one that holds what the
    question asks; the best-ranked passage is only the one whose words are most like the
    question's, such as a passage that names the question's subject throughout and says
    something else of it."""
    if not scored or kind in FACT_KINDS:
        return scored
    floor = max(ANSWER_THRESHOLD, LEAD_SHARE * scored[0].score)
    best_of: dict[int, ScoredSentence] = {}
    for s in scored:  # best first
        best_of.setdefault(id(s.passage), s)
    lead = next(
        (best_of[id(p)] for p in passages if id(p) in best_of and best_of[id(p)].score >= floor),
        scored[0],
    )
    return [lead, *(s for s in scored if s is not lead)]


def with_code(chosen: list[ScoredSentence], scored: list[ScoredSentence]) -> list[ScoredSentence]:
    """The chosen units of a how-to answer with a code block: when none of them quotes one, the
    best lead-in with its code from the first quoted passage that has one (a how-to is answered
    by the code that does it, and the passage the answer quotes is where the asker will look)."""
    if not chosen or any(s.unit.code for s in chosen):
        return chosen
    quoted = list(dict.fromkeys(id(s.passage) for s in chosen))
    coded: dict[int, ScoredSentence] = {}
    for s in scored:  # best first
        if s.unit.code and s.score >= ANSWER_THRESHOLD:
            coded.setdefault(id(s.passage), s)
    example = next((coded[p] for p in quoted if p in coded), None)
    return chosen if example is None else [*chosen, example]
