"""ConfidenceGate (seed 002): pack content is used only when a passage is similar enough.

When the best cosine similarity of all candidates is below ``context_confidence_threshold``
(kg_config.json's, else the one calibrated when the pack was built, else the embedding model's
default: kpack.gate), the passages are probably off-topic, and handing them to a model makes
it invent connections and cite unrelated sources: the gate drops every candidate and the
query falls back to an answer without pack content (``confidence_gated_fallback``). A query that found no passage
at all falls back the same way (``vector_fallback``).
"""

from __future__ import annotations

from retrieval.query import GATED, NOTHING_FOUND, Query


class ConfidenceGate:
    name, phase, toggle = "gate", "gate", None

    def __call__(self, query: Query) -> None:
        threshold = query.settings.context_confidence_threshold
        source = f" ({query.gate.source})" if query.gate else ""
        best = query.max_similarity
        if not query.candidates:
            query.query_type = NOTHING_FOUND
        elif best is None or best < threshold:
            query.drop(list(query.candidates), "confidence gate")
            for candidate in query.considered:
                candidate.reasons.append(
                    f"gate: best similarity {best or 0.0:.3f} < threshold {threshold}{source}"
                )
            query.query_type = GATED
