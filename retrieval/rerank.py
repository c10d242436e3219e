"""Ranking stages: joint scoring (CrossEncoderReranker), authority from the link graph
(GraphReranker), and the cut to the k best passages (top_k), which become the context."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from retrieval.query import Candidate, Query, stage

log = logging.getLogger(__name__)
DEFAULT_CROSS_ENCODER = "cross-encoder/ms-marco-MiniLM-L-12-v2"
HUB_PROBE_TIMEOUT_S = 3.0
CROSS_ENCODER_CUT = "below the cross-encoder's top k"
NO_AUTHORITY = "reranker_beta is 0: PageRank has no weight, the passages keep relevance's order"

_cross_encoders: dict[str, Any] = {}
_load_failures: dict[str, str] = {}  # model -> why it could not be loaded (tried once)
_cross_lock = threading.Lock()


class ModelUnavailable(Exception):
    """A model could not be loaded; the message says why."""


def _hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached from here, or None when it can."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parts = urlsplit(endpoint)
    host, port = (
        parts.hostname or "huggingface.co",
        parts.port or (443 if parts.scheme == "https" else 80),
    )
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        return f"{host} cannot be reached ({exc.strerror or exc})"
    return None


def _local_copy(name: str) -> str | None:
    """A local path of the model: the name itself, or its snapshot in the Hugging Face cache."""
    if Path(name).exists():
        return name
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, local_files_only=True)
    except Exception:  # not cached (the hub library raises several kinds for that)
        return None


def load_cross_encoder(name: str) -> Any:
    """The CrossEncoder, loaded once per process; a model that cannot be loaded is tried once.

    A cached or local model is loaded without any network call. One that is not cached is
    downloaded only when the hub can be reached at all: offline it fails in seconds with the
    reason, instead of retrying every question for minutes.
    """
    with _cross_lock:
        if name in _cross_encoders:
            return _cross_encoders[name]
        if name in _load_failures:
            raise ModelUnavailable(_load_failures[name])
        try:
            source = _local_copy(name)
            if source is None:
                offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
                unreachable = "HF_HUB_OFFLINE is set" if offline else _hub_unreachable()
                if unreachable:
                    raise ModelUnavailable(
                        f"{name} is not in the local Hugging Face cache and {unreachable}: "
                        "download it once with network access, or set cross_encoder_model to "
                        "a local path"
                    )
                source = name
            from sentence_transformers import CrossEncoder

            _cross_encoders[name] = CrossEncoder(source, device="cpu")
        except Exception as exc:  # any load failure: remembered, reported once, not retried
            reason = str(exc) if isinstance(exc, ModelUnavailable) else f"{name}: {exc}"
            _load_failures[name] = reason[:500]
            log.warning("cross-encoder unavailable, ranking without it: %s", _load_failures[name])
            raise ModelUnavailable(_load_failures[name]) from None
        return _cross_encoders[name]


class CrossEncoderReranker:
    """Scores (question, passage) pairs jointly and keeps the best k (seed 002, opt-in).

    Retrieval fetches ``widens`` times k candidates for it to choose from. As a stage it uses
    the query's ``cross_encoder_model``; when that cannot be loaded, ranking goes on without it
    and the trace says why.
    """

    name, phase, toggle = "cross_encoder", "rank", "enable_cross_encoder"
    widens = 2

    def __init__(self, model: str = DEFAULT_CROSS_ENCODER) -> None:
        self.model_name = model

    def rerank(self, question: str, candidates: list[Candidate], top_k: int) -> list[Candidate]:
        if not candidates:
            return []
        model = load_cross_encoder(self.model_name)
        scores = model.predict([(question, c.text) for c in candidates], show_progress_bar=False)
        for candidate, score in zip(candidates, scores, strict=True):
            candidate.cross_encoder = float(score)
        ranked = sorted(candidates, key=lambda c: -(c.cross_encoder or 0.0))
        for rank, candidate in enumerate(ranked, start=1):
            candidate.reasons.append(f"cross-encoder #{rank} ({candidate.cross_encoder:.2f})")
        for dropped in ranked[top_k:]:
            dropped.dropped = CROSS_ENCODER_CUT
        return ranked[:top_k]

    def __call__(self, query: Query) -> None:
        reranker = CrossEncoderReranker(query.settings.cross_encoder_model)
        try:
            kept = reranker.rerank(query.text, query.candidates, query.k)
        except ModelUnavailable as exc:
            query.notes["cross_encoder_error"] = str(exc)
            return
        kept_ids = {id(c) for c in kept}
        query.drop([c for c in query.candidates if id(c) not in kept_ids], CROSS_ENCODER_CUT)
        query.candidates = kept


class GraphReranker:
    """combined = alpha * relevance + beta * normalised PageRank (seed 004: 0.7 / 0.3).

    PageRank is computed at build time over LINKS_TO and stored on Article, so reranking is a
    lookup. Relevance is the cross-encoder's score when it ran, else the fused rank of hybrid
    search, else the cosine similarity.

    As a stage, with no weight on PageRank (``reranker_beta`` 0: the graph profiles' default,
    retrieval.profiles.GRAPH_SETTINGS) there is nothing to blend: alpha x relevance would order
    the passages exactly as the stages before left them (by relevance), so the stage leaves
    them, gives no combined score, and says why in the trace. It stays in those profiles as the
    place where a pack's own weight applies (``kpack eval --write-config`` calibrates it).
    """

    name, phase, toggle = "graph_rerank", "rank", "enable_reranker"

    def __init__(self, alpha: float = 0.7, beta: float = 0.3) -> None:
        self.alpha, self.beta = alpha, beta

    def rerank(self, candidates: list[Candidate], top_k: int | None = None) -> list[Candidate]:
        for candidate in candidates:
            candidate.combined = self.alpha * candidate.relevance + self.beta * candidate.pagerank
        ranked = sorted(candidates, key=lambda c: -(c.combined or 0.0))
        for rank, c in enumerate(ranked, start=1):
            c.reasons.append(
                f"graph rerank #{rank}: {self.alpha:g} x relevance {c.relevance:.3f} + "
                f"{self.beta:g} x pagerank {c.pagerank:.3f} = {c.combined:.3f}"
            )
        return ranked[:top_k] if top_k else ranked

    def __call__(self, query: Query) -> None:
        """As a stage: the weights are the query's reranker_alpha and reranker_beta."""
        settings = query.settings
        if not settings.reranker_beta:
            query.notes["graph_rerank"] = NO_AUTHORITY
            return
        reranker = GraphReranker(settings.reranker_alpha, settings.reranker_beta)
        query.candidates = reranker.rerank(query.candidates)


@stage("top_k", "rank")
def top_k(query: Query) -> None:
    """Keep the k best passages; they are the context unless a context stage widens it."""
    kept = query.candidates[: query.k]
    query.drop(query.candidates[query.k :], "below top k")
    for rank, candidate in enumerate(kept, start=1):
        candidate.rank = rank
    query.context = [c.as_context() for c in kept]
