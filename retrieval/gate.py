"""ConfidenceGate (seed 002): pack content is used only when a passage is similar enough.

When the best cosine similarity of all candidates is below ``context_confidence_threshold``
(kg_config.json's, else the one calibrated when the pack was built, else the embedding model's
default: kpack.gate), the passages are probably off-topic, and handing them to a model makes
it invent connections and cite unrelated sources: the gate drops every candidate and the
query falls back to an answer without pack content (``confidence_gated_fallback``). A query
that found no passage at all falls back the same way (``vector_fallback``).

The words are the other evidence (kpack.gate.coverage): a question that clears the threshold
is refused all the same when its specific words are not in the passages the search found (the
less of the question the best passage covers, the higher the similarity it must reach), and
one whose specific words the best passage holds nearly all needs a little less. A question
that names, as code, an API the pack defines is never refused, and a word naming one whose
entry reads like the question lowers the bar by API_WORD_MARGIN; the words the gate asks the
passages to cover are the question's prose (retrieval.coding_questions). A threshold of 0
switches the gate off, lexical evidence included. The trace's ``gate`` says why a question was
refused, or how close it came ("'ingress' appears in no passage of this pack; ...").
"""

from __future__ import annotations

from kpack.gate import COVERAGE_PASSAGES, Vocabulary, coverage
from retrieval.query import GATED, NOTHING_FOUND, Query
from retrieval.reader import PackReader


def pack_vocabulary(reader: PackReader) -> Vocabulary:
    """The version's passage frequency of every search term: its keyword index's."""
    return Vocabulary(reader.keywords.passages, reader.keywords.frequency)


# A word of the question that names an API the pack defines in few places (retrieval.api_search),
# whose entry reads like the question as much as a passage must (similarity >= the threshold),
# is keyword evidence the similarity alone misses in a terse intent: the question then needs
# this much less. Chosen on the development half of conala_dev (odd lines: 8 of 73 refused
# before, 6 after) with bench/everyday_questions.jsonl (20 questions about everyday topics,
# written for this) all still refused.
API_WORD_MARGIN = 0.1


def searched_words(query: Query) -> str:
    """The words the gate asks the passages to cover: the question's prose, without the
    asker's own variables and values or a problem's code and data, which no page holds."""
    reading = query.reading
    return reading.prose if reading is not None and reading.prose else query.text


class ConfidenceGate:
    name, phase, toggle = "gate", "gate", None

    def __init__(self, refuse: bool = True) -> None:
        # False: the verdict is only recorded (notes["gate"]), as a search does: it keeps its
        # passages and says whether a query would be refused.
        self.refuse = refuse

    def __call__(self, query: Query) -> None:
        threshold = query.settings.context_confidence_threshold
        source = f" ({query.gate.source})" if query.gate else ""
        best = query.max_similarity
        if not query.candidates:
            query.query_type = NOTHING_FOUND
            return
        apis = query.notes.get("apis", {})
        defined = [name for name, as_code in apis.items() if as_code]
        if defined:
            names = ", ".join(defined[:3])
            query.notes["gate"] = {
                "gated": False,
                "why": f"the pack defines {names}",
                "defines": defined,
            }
            return
        # Keyword evidence for a terse intent: a word naming an API the pack defines in few
        # places, whose entry reads like the question (retrieval.api_search).
        words = query.notes.get("api_words", {})
        named = sorted(
            (w for w, entry in words.items() if entry >= threshold),
            key=lambda w: -words[w],
        )
        margin = API_WORD_MARGIN if named else 0.0
        evidence_note = (
            f"; the question names {', '.join(named[:3])}, defined by an entry that reads like "
            f"it (similarity {words[named[0]]:.3f}), so the gate asks {margin} less"
            if named
            else ""
        )
        if best is None:
            why = f"no passage has a similarity to the question (threshold {threshold}{source})"
            query.notes["gate"] = {"gated": True, "why": why}
            self._refuse(query, why)
            return
        if threshold <= 0:
            return
        # The words are evidence both ways (kpack.gate.coverage): a question the best passages
        # do not cover must reach more than the threshold, one they cover nearly whole less.
        vocabulary = pack_vocabulary(query.reader)
        passages = [c.text for c in query.candidates[:COVERAGE_PASSAGES]]
        evidence = coverage(searched_words(query), passages, vocabulary, threshold)
        gated = best < evidence.required - margin
        why = evidence.explain(vocabulary.passages, best, source) + evidence_note
        query.notes["gate"] = {
            "gated": gated,
            "why": why,
            **evidence.as_dict(),
            "api_margin": margin,
        }
        if gated:
            self._refuse(query, why)

    def _refuse(self, query: Query, why: str) -> None:
        if not self.refuse:
            return
        query.drop(list(query.candidates), "confidence gate")
        for candidate in query.considered:
            candidate.reasons.append(f"gate: {why}")
        query.query_type = GATED
