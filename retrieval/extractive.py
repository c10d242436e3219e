"""The offline answer: the sentences of the top passages that answer the question, quoted.

Without a Claude key the answer is made of the pack's own sentences, so it can only say what
the pack says. The steps, each in a module of its own:

1. Each passage kept for the answer (the k best, in ranking order) is read with what its
   section holds around it that its units need (retrieval.passage_context: the entry opening,
   the code a lead-in introduces, the release notes at an entry's end, cut off by chunking)
   and cut into units (retrieval.answer_units: sentences, lead-ins with their code blocks,
   list items and table rows, each with the definition line it explains).
2. The answer says plainly that the passages do not answer when the question names something
   none of them mentions (retrieval.missing_names).
3. Each unit is scored against the question (retrieval.unit_scoring: its passage's similarity
   blended with its own sentence's, as vector search blends them, its coverage of the
   question's terms by word, context and meaning, and the kind of answer the question asks
   for).
4. The units to quote are chosen (retrieval.unit_selection): the answer starts from the
   best-ranked passage that answers (from the best unit, for a question asking a fact), then
   adds what each further unit adds, a unit for each part of a question of several parts, the
   definitions the question names, and the hops of a multi-hop answer. For a how-to question
   the code block of a quoted passage that shows how is quoted too (:func:`with_code`).
5. The units are written out passage by passage (:func:`render`): the units of one passage
   together, in the order the passage was first quoted, its definition line once as code,
   its code blocks verbatim with their newlines, and ONE ``[Source: title]`` after them.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from retrieval.answer_type import answer_kind
from retrieval.meaning import WordVectors
from retrieval.missing_names import DECLINED, missing_names
from retrieval.query import ContextSection
from retrieval.unit_scoring import ScoredSentence, score_sentences
from retrieval.unit_selection import (
    answering_sentences,
    chain,
    lead_first,
    part_terms,
    with_code,
    with_named_definitions,
)

NO_SENTENCE_ANSWER = (
    f"{DECLINED} answer this question: none of their sentences says what was asked."
)


def extractive_answer(
    question: str,
    passages: list[ContextSection],
    idf: Callable[[str], float] | None = None,
    meaning: WordVectors | None = None,
    known_identifiers: Container[str] | None = None,
    sentence_weight: float = 0.0,
) -> tuple[str, list[ContextSection]]:
    """The quoted answer, each passage's units followed by one [Source: title], and the
    passages quoted; a plain statement that the passages do not answer, and no passage, when
    none does."""
    missing = missing_names(question, passages, known_identifiers)
    if missing:
        return f"{DECLINED} mention {', '.join(missing)}, so they do not answer this question.", []
    kind = answer_kind(question)
    scored = lead_first(
        score_sentences(question, passages, idf, meaning, sentence_weight), passages, kind
    )
    chosen = chain(answering_sentences(scored, part_terms(question)), scored, passages, question)
    chosen = with_named_definitions(chosen, scored, question)
    if kind == "identifier":
        chosen = with_code(chosen, scored)
    if not chosen:
        return NO_SENTENCE_ANSWER, []
    return render(chosen), list({id(s.passage): s.passage for s in chosen}.values())


def render(chosen: list[ScoredSentence]) -> str:
    """The answer's text: the units of each passage together (passages in the order first
    quoted, units in the order chosen), each unit after its definition line as code unless an
    earlier unit showed it, code blocks on lines of their own, and one citation per passage
    after its units, so the statement a citation check reads is all the passage said."""
    by_passage: dict[int, list[ScoredSentence]] = {}
    for s in chosen:
        by_passage.setdefault(id(s.passage), []).append(s)
    shown: set[str] = set()
    paragraphs = []
    for units in by_passage.values():
        text = ""
        for s in units:
            sentence = s.unit.sentence
            if s.unit.signature and s.unit.signature not in shown:
                sentence = f"`{s.unit.signature}`: {sentence}"
            shown.add(s.unit.signature)
            joint = "" if not text else "\n" if text.endswith("\n") else " "
            text += joint + sentence
            if s.unit.code:
                text += f"\n\n{s.unit.code}\n"
        title = units[0].passage.title
        paragraphs.append(
            f"{text}[Source: {title}]" if text.endswith("\n") else f"{text} [Source: {title}]"
        )
    return "\n\n".join(paragraphs)
