"""How sure a search is of each passage: a confidence comparable across questions and packs,
and a score that never rises down the ranking.

A passage's cosine similarity to the question means little on its own: MiniLM's similarities
run lower than BGE's, and each pack's gate threshold is calibrated on its own text
(kpack.gate). What is comparable is the similarity's margin over the line the gate draws for
this question: the threshold in force, raised when the best passages miss the question's
specific terms and lowered a little when one holds nearly all of them (the coverage rule,
``required_similarity`` in the gate's verdict). The
confidence is that margin on a logistic scale:

    confidence = 1 / (1 + exp(-(similarity - line) / CONFIDENCE_SPREAD))

0.5 at the gate's line, 0.88 a tenth of cosine above it, 0.12 a tenth below; the gate would
refuse the question exactly when its best passage is below 0.5. A search's ``score`` is the
passage's confidence capped by the score of the passage ranked above it: the ranking (fusion,
graph and rerank stages) decides the order, and the score shown never contradicts it.
"""

from __future__ import annotations

import math

import numpy as np

from kpack.gate import pack_threshold
from retrieval.query import Candidate, Query

# A tenth of cosine similarity across the gate's line moves the confidence from 0.5 to 0.88:
# on the calibrated MiniLM packs (kpack.gate) an on-topic passage lies 0.1 to 0.3 above the
# threshold and an off-topic question's best passage 0.1 or more below it.
CONFIDENCE_SPREAD = 0.05


def gate_line(query: Query) -> float:
    """The similarity the gate asks of this question: the coverage rule's when the gate ran,
    else the threshold in force; with the gate switched off (threshold 0), the threshold the
    version would have without the setting, so an off-topic passage still rates low."""
    threshold = query.settings.context_confidence_threshold
    if threshold <= 0:
        return pack_threshold(query.reader.manifest).threshold
    required = (query.notes.get("gate") or {}).get("required_similarity")
    return float(required) if required is not None else threshold


def confidence(similarity: float, line: float) -> float:
    """The logistic confidence of a similarity against the gate's line (module docstring)."""
    return 1.0 / (1.0 + math.exp(-(similarity - line) / CONFIDENCE_SPREAD))


def rate_passages(query: Query) -> list[float]:
    """Give each kept passage its cosine similarity (computed for one keyword search alone
    found) and its confidence; return the scores of the ranking (each passage's confidence,
    capped by the score above it)."""
    missing = [c for c in query.candidates if c.similarity is None]
    if missing and query.vectors is not None:
        rows = np.asarray([query.reader.chunk_row[c.passage_id] for c in missing])
        for candidate, similarity in zip(missing, query.passage_similarity(rows), strict=True):
            candidate.similarity = float(similarity)
    line = gate_line(query)
    scores: list[float] = []
    for candidate in query.candidates:
        candidate.confidence = round(confidence(_similarity(candidate), line), 4)
        scores.append(min(candidate.confidence, scores[-1]) if scores else candidate.confidence)
    return scores


def _similarity(candidate: Candidate) -> float:
    return candidate.similarity if candidate.similarity is not None else 0.0


def gate_verdict(query: Query) -> dict:
    """Whether the gate would refuse this question, at what line, and why (the search's own
    run of the gate, which refuses nothing: retrieval.gate); and how much of the question's
    specific words the pack's best passage holds (``coverage``: 1 for a question that names,
    as code, an API the pack defines; 0 when the gate measured nothing)."""
    verdict = query.notes.get("gate") or {}
    return {
        "refused": bool(verdict.get("gated")) or not query.candidates,
        "line": round(gate_line(query), 4),
        "threshold": query.settings.context_confidence_threshold,
        "why": verdict.get("why") or ("no passage found" if not query.candidates else ""),
        "coverage": 1.0 if verdict.get("defines") else verdict.get("coverage", 0.0),
    }
