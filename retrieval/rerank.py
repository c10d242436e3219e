"""Rerankers: authority from the link graph (GraphReranker) and joint scoring (CrossEncoderReranker)."""

from __future__ import annotations

import threading

from retrieval.candidates import Candidate

_cross_encoders: dict = {}
_cross_lock = threading.Lock()


class GraphReranker:
    """combined = alpha * relevance + beta * normalised PageRank (seed 004: 0.7 / 0.3).

    PageRank is computed at build time over LINKS_TO and stored on Article, so reranking is a
    lookup. Relevance is the cosine similarity, or the cross-encoder's score when it ran.
    """

    def __init__(self, alpha: float = 0.7, beta: float = 0.3):
        self.alpha, self.beta = alpha, beta

    def rerank(self, candidates: list[Candidate], top_k: int | None = None) -> list[Candidate]:
        for candidate in candidates:
            candidate.combined = self.alpha * candidate.relevance + self.beta * candidate.pagerank
        ranked = sorted(candidates, key=lambda c: -(c.combined or 0.0))
        return ranked[:top_k] if top_k else ranked


class CrossEncoderReranker:
    """Scores (question, passage) pairs jointly with a sentence-transformers CrossEncoder.

    Any CrossEncoder name or local path works; it is loaded once per process.
    """

    def __init__(self, model: str = "cross-encoder/ms-marco-MiniLM-L-12-v2"):
        self.model_name = model

    def _model(self):
        with _cross_lock:
            if self.model_name not in _cross_encoders:
                from sentence_transformers import CrossEncoder

                _cross_encoders[self.model_name] = CrossEncoder(self.model_name, device="cpu")
            return _cross_encoders[self.model_name]

    def rerank(self, question: str, candidates: list[Candidate], top_k: int) -> list[Candidate]:
        if not candidates:
            return []
        scores = self._model().predict([(question, c.text) for c in candidates])
        for candidate, score in zip(candidates, scores, strict=True):
            candidate.cross_encoder = float(score)
        ranked = sorted(candidates, key=lambda c: -(c.cross_encoder or 0.0))
        for dropped in ranked[top_k:]:
            dropped.dropped = "below the cross-encoder's top k"
        return ranked[:top_k]
