"""ConfidenceGate (seed 002): pack content is used only when a passage is similar enough.

When the best cosine similarity of all candidates is below ``context_confidence_threshold``
(kg_config.json's, else the one calibrated when the pack was built, else the embedding model's
default: kpack.gate), the passages are probably off-topic, and handing them to a model makes
it invent connections and cite unrelated sources: the gate drops every candidate and the
query falls back to an answer without pack content (``confidence_gated_fallback``). A query
that found no passage at all falls back the same way (``vector_fallback``).

A question that clears the threshold is refused all the same when its specific words are not
in the passages the search found (kpack.gate.coverage): the less of the question the best
passage covers, the higher the similarity it must reach. A threshold of 0 switches the gate
off, lexical evidence included. The trace's ``gate`` says why a question was refused, or how
close it came ("'ingress' appears in no passage of this pack; ...").
"""

from __future__ import annotations

from kpack.gate import COVERAGE_PASSAGES, Vocabulary, coverage
from retrieval.query import GATED, NOTHING_FOUND, Query
from retrieval.reader import PackReader


def pack_vocabulary(reader: PackReader) -> Vocabulary:
    """The version's passage frequency of every search term: its keyword index's."""
    return Vocabulary(reader.keywords.passages, reader.keywords.frequency)


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
        if best is None or best < threshold:
            why = f"best similarity {best or 0.0:.3f} < threshold {threshold}{source}"
            query.notes["gate"] = {"gated": True, "why": why}
            self._refuse(query, why)
            return
        if threshold <= 0:
            return
        vocabulary = pack_vocabulary(query.reader)
        passages = [c.text for c in query.candidates[:COVERAGE_PASSAGES]]
        evidence = coverage(query.text, passages, vocabulary, threshold)
        gated = best < evidence.required
        why = evidence.explain(vocabulary.passages, best)
        query.notes["gate"] = {"gated": gated, "why": why, **evidence.as_dict()}
        if gated:
            self._refuse(query, why)

    def _refuse(self, query: Query, why: str) -> None:
        if not self.refuse:
            return
        query.drop(list(query.candidates), "confidence gate")
        for candidate in query.considered:
            candidate.reasons.append(f"gate: {why}")
        query.query_type = GATED
