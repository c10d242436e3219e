"""Query decomposition: a question of several parts is retrieved part by part.

With a key, a question that asks several things ("What error is that, and what should I use
instead?": retrieval.unit_selection.question_parts) is split by Claude into sub-questions in one
Messages call that answers with JSON (``{"sub_questions": [...]}``, the expansion model).
Each sub-question becomes a phrasing of the query, so the retrieval stages embed it (in the
same batch as the question) and search it on its own, and the number of passages kept grows
with the number of parts (``PASSAGES_PER_PART`` each, at least the k asked for). After
ranking, :class:`SubQuestionCoverage` makes sure each sub-question's own best passage is among
those kept, and synthesis asks Claude to answer every part, citing each (the trace's
``sub_questions`` lists what each part found).

Without a key the graph stages stand in: the graph's bridge entities bring in the passage a
second part needs (retrieval.entity_graph), and the offline answer chains the bridge sentence
and the answer sentence (retrieval.unit_selection.chain). A failed call, or a reply that is not
the JSON asked for, leaves the question whole.
"""

from __future__ import annotations

import json
import re

from kpack.llm import LLMError
from retrieval.query import Query
from retrieval.unit_selection import question_parts

MAX_SUB_QUESTIONS = 3
PASSAGES_PER_PART = 3
DECOMPOSE_SYSTEM = (
    "You split questions into sub-questions for a search engine. Reply with JSON only, "
    'of the form {"sub_questions": ["...", "..."]}: one self-contained sub-question per thing '
    "the question asks, at most three; a question that asks one thing gets one."
)
JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def sub_questions(reply: str, question: str) -> list[str]:
    """The sub-questions of Claude's JSON reply; none unless it names two or more."""
    match = JSON_OBJECT.search(reply)
    if not match:
        return []
    try:
        data = json.loads(match.group(0))
    except json.JSONDecodeError:
        return []
    found = data.get("sub_questions") if isinstance(data, dict) else None
    if not isinstance(found, list):
        return []
    parts = [" ".join(s.split()) for s in found if isinstance(s, str) and s.strip()]
    parts = [p for p in dict.fromkeys(parts) if p.casefold() != question.casefold()]
    return parts[:MAX_SUB_QUESTIONS] if len(parts) >= 2 else []


class QueryDecomposer:
    """Stage: splits a multi-part question into sub-questions searched as phrasings (with a
    key and the ``decompose`` setting on; see the module docstring)."""

    name, phase, toggle = "decompose", "retrieve", None

    def __call__(self, query: Query) -> None:
        if not (query.llm.available and query.settings.decompose):
            return
        if question_parts(query.text) < 2:
            return
        try:
            reply = query.llm.complete(
                query.settings.expansion_model, DECOMPOSE_SYSTEM, f"Question: {query.text}", 512
            )
        except LLMError as exc:
            query.notes["decompose_error"] = str(exc)
            return
        parts = sub_questions(reply, query.text)
        if not parts:
            return
        query.phrasings += parts
        wanted = max(query.k, PASSAGES_PER_PART * len(parts))
        query.depth = query.depth * wanted // query.k
        query.k = wanted
        query.notes["sub_questions"] = [{"question": p} for p in parts]


class SubQuestionCoverage:
    """Stage (after top k): each sub-question's own best passage is kept, in place of the
    lowest-ranked passage that no sub-question found first."""

    name, phase, toggle = "sub_question_coverage", "rank", None

    def __call__(self, query: Query) -> None:
        parts = query.notes.get("sub_questions")
        if not parts:
            return
        kept = sorted((c for c in query.considered if c.rank is not None), key=lambda c: c.rank)
        for part in parts:
            own = [
                hits for _, hits in query.rankings if hits and hits[0].found_by == part["question"]
            ]
            best = [hits[0].passage_id for hits in own]
            part["passages"] = best
            if any(c.passage_id in best for c in kept):
                continue
            newcomer = next((c for c in query.considered if best and c.passage_id == best[0]), None)
            if newcomer is None or not kept:
                continue
            dropped = kept.pop()
            dropped.rank, dropped.dropped = None, "replaced by a sub-question's passage"
            newcomer.rank, newcomer.dropped = len(kept) + 1, None
            newcomer.reasons.append(f"best passage of the sub-question {part['question']!r}")
            kept.append(newcomer)
        query.candidates = kept
        query.context = [c.as_context() for c in kept]
        for part in parts:
            part["passages"] = [c.heading for c in kept if c.passage_id in part["passages"]]
