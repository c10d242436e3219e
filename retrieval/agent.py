"""KnowledgeGraphAgent: the query pipeline of seeds 000-004 over a published pack.

    question -> [multi-query] -> vector (+BM25) search -> dedupe -> confidence gate
             -> [cross-encoder] -> [GraphReranker] -> [MultiDocSynthesizer] -> quality filter
             -> [few-shot] -> synthesis (Claude, or extractive without a key)

Every stage is timed and every candidate keeps the scores each stage gave it (``trace``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kpack.config import load_config
from kpack.contracts import VECTOR_INDEXES
from kpack.embedding import model_label
from kpack.llm import EXPANSION_MODEL, SYNTHESIS_MODEL, ClaudeClient
from kpack.packs import PackError
from retrieval.candidates import Candidate, bm25_search, deduplicate, fuse, vector_search
from retrieval.fewshot import FewShotManager
from retrieval.multidoc import ContextSection, MultiDocSynthesizer
from retrieval.pack import OpenPack, open_pack
from retrieval.quality import QUALITY_THRESHOLD, quality_score
from retrieval.rerank import CrossEncoderReranker, GraphReranker
from retrieval.synthesis import (
    NO_CONTEXT_ANSWER,
    alternative_phrasings,
    extractive_answer,
    synthesize,
    synthesize_minimal,
)

MAX_QUESTION_CHARS = 8000
# What the response's cypher_query reports: the vector queries every question runs.
VECTOR_CYPHER_SUMMARY = "; ".join(
    f"CALL QUERY_VECTOR_INDEX('{label}', '{index}', $v, $k)"
    for label, index in VECTOR_INDEXES.items()
)
TOGGLES = (
    "use_enhancements",
    "enable_reranker",
    "enable_multidoc",
    "enable_fewshot",
    "enable_cross_encoder",
    "enable_multi_query",
    "enable_hybrid",
    "enable_quality_filter",
)
PROFILES: dict[str, dict[str, bool]] = {
    "baseline": dict.fromkeys(TOGGLES, False) | {"enable_hybrid": True},
    "balanced": dict.fromkeys(TOGGLES, True)
    | {"enable_cross_encoder": False, "enable_multi_query": False},
    "max": dict.fromkeys(TOGGLES, True),
}
PROFILE_ALIASES = {"maximum": "max", "max_quality": "max", "default": "balanced"}
SETTINGS = {  # kg_config.json "query" keys besides the toggles, with their defaults
    "profile": "balanced",
    "context_confidence_threshold": None,  # None: the class constant
    "reranker_alpha": 0.7,
    "reranker_beta": 0.3,
    "num_docs": 5,
    "sections_per_doc": 3,
    "few_shot_examples": 3,
    "cross_encoder_model": "cross-encoder/ms-marco-MiniLM-L-12-v2",
    "synthesis_model": SYNTHESIS_MODEL,
    "expansion_model": EXPANSION_MODEL,
}


def clean_question(question: object) -> str:
    if not isinstance(question, str) or not question.strip():
        raise PackError("the question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise PackError(
            f"the question is {len(question):,} characters long; the limit is {MAX_QUESTION_CHARS:,}"
        )
    return " ".join(question.split())


def query_config(pack: OpenPack) -> dict:
    config = load_config(pack.folder)
    configured = model_label(config.embedding_model)
    if configured != pack.model_name:
        raise PackError(
            f"pack {pack.name!r} was built with {pack.model_name} but kg_config.json names "
            f"{configured}: rebuild the pack (kpack build {pack.name}) or restore the setting"
        )
    return config.query.model_dump(exclude_none=True, exclude_unset=True)


class Stopwatch:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.started = time.perf_counter()
        self._last = self.started

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(self.timings.get(stage, 0.0) + (now - self._last) * 1000, 3)
        self._last = now

    def total(self) -> dict[str, float]:
        return {**self.timings, "total": round((time.perf_counter() - self.started) * 1000, 3)}


class KnowledgeGraphAgent:
    CONTEXT_CONFIDENCE_THRESHOLD = 0.5
    # Not applied by query(): kept for a retrieval-layer pre-filter (seed 001).
    VECTOR_CONFIDENCE_THRESHOLD = 0.6

    def __init__(
        self,
        db_path: str | Path,
        anthropic_api_key: str | None = None,
        profile: str | None = None,
        use_llm: bool = True,
        anthropic_base_url: str | None = None,
        **options,
    ):
        self.pack = open_pack(db_path)
        config = query_config(self.pack)
        name = PROFILE_ALIASES.get(
            profile or config.get("profile", "balanced"),
            profile or config.get("profile", "balanced"),
        )
        if name not in PROFILES:
            raise PackError(f"unknown profile {name!r} (use {', '.join(PROFILES)})")
        unknown = sorted(set(options) - set(SETTINGS) - set(TOGGLES))
        if unknown:
            raise PackError(f"unknown options {unknown}")
        self.profile = name
        self.settings = {**SETTINGS, **PROFILES[name], **config, **options}
        if self.settings["context_confidence_threshold"] is None:
            self.settings["context_confidence_threshold"] = type(self).CONTEXT_CONFIDENCE_THRESHOLD
        self.llm = ClaudeClient(anthropic_api_key, anthropic_base_url, enabled=use_llm)
        self.reranker = GraphReranker(
            self.settings["reranker_alpha"], self.settings["reranker_beta"]
        )
        self.multidoc = MultiDocSynthesizer(
            self.settings["num_docs"], self.settings["sections_per_doc"]
        )
        self.few_shot = FewShotManager(self.pack, self.settings["few_shot_examples"])
        self.cross_encoder = CrossEncoderReranker(self.settings["cross_encoder_model"])

    def on(self, toggle: str) -> bool:
        enhanced = self.settings["use_enhancements"] or toggle in (
            "enable_hybrid",
            "use_enhancements",
        )
        return bool(self.settings[toggle]) and enhanced

    # -- retrieval -------------------------------------------------------------------------

    def retrieve(
        self, question: str, k: int, clock: Stopwatch, trace: dict
    ) -> tuple[list[Candidate], np.ndarray, float | None]:
        """Ranked passages, the question's vector, and the best cosine similarity seen."""
        queries = [question]
        if self.on("enable_multi_query"):
            if self.llm.available:
                queries += alternative_phrasings(
                    self.llm, self.settings["expansion_model"], question
                )
            trace["queries"] = queries
            clock.lap("multi_query")
        vectors = self.pack.embed(queries)
        clock.lap("embed")
        depth = k * 2 if self.on("enable_cross_encoder") else k
        rankings: list[list[Candidate]] = []
        for text, vector in zip(queries, vectors, strict=True):
            rankings.append(vector_search(self.pack, text, vector, depth))
            clock.lap("vector_search")
            if self.on("enable_hybrid"):
                rankings.append(bm25_search(self.pack, text, depth))
                clock.lap("bm25_search")
        if self.on("enable_hybrid"):
            candidates = fuse(*rankings)
            self._fill_similarities(candidates, vectors[0])
            top = max((c.rrf or 0.0 for c in candidates), default=0.0) or 1.0
            for candidate in candidates:
                candidate.fused = (candidate.rrf or 0.0) / top
        else:
            candidates = deduplicate([c for ranking in rankings for c in ranking])
        clock.lap("dedupe")
        max_similarity = max(
            (c.similarity for c in candidates if c.similarity is not None), default=None
        )
        return candidates, vectors[0], max_similarity

    def _fill_similarities(self, candidates: list[Candidate], vector: np.ndarray) -> None:
        """BM25-only hits have no cosine similarity yet; the gate and reranker need one."""
        for candidate in candidates:
            if candidate.similarity is None:
                row = self.pack.chunk_row.get(candidate.passage_id)
                candidate.similarity = (
                    float(self.pack.chunk_vectors[row] @ vector) if row is not None else 0.0
                )

    def rank(
        self, question: str, candidates: list[Candidate], k: int, clock: Stopwatch, trace: dict
    ) -> list[Candidate]:
        if self.on("enable_cross_encoder"):
            try:
                candidates = self.cross_encoder.rerank(question, candidates, k)
            except (OSError, ValueError) as exc:
                trace["cross_encoder_error"] = f"{self.cross_encoder.model_name}: {exc}"[:300]
            clock.lap("cross_encoder")
        if self.on("enable_reranker"):
            candidates = self.reranker.rerank(candidates)
            clock.lap("graph_rerank")
        return candidates[:k]

    def search(self, question: str, k: int = 5) -> list[dict]:
        question = clean_question(question)
        clock, trace = Stopwatch(), {}
        candidates, _, _ = self.retrieve(question, k, clock, trace)
        ranked = self.rank(question, candidates, k, clock, trace)
        return [
            {
                "title": c.title,
                "url": c.article_url,
                "heading": c.heading,
                "text": c.text,
                "score": c.combined if c.combined is not None else (c.rrf or c.similarity),
                **{
                    f: getattr(c, f)
                    for f in (
                        "similarity",
                        "bm25",
                        "rrf",
                        "pagerank",
                        "cross_encoder",
                        "passage_id",
                    )
                },
            }
            for c in ranked
        ]

    # -- answering -------------------------------------------------------------------------

    def query(
        self,
        question: str,
        max_results: int = 5,
        exclude_examples: Callable[[dict], bool] | None = None,
    ) -> dict:
        question = clean_question(question)
        usage_before = self.llm.usage.as_dict()
        clock, trace = (
            Stopwatch(),
            {"profile": self.profile, "threshold": self.settings["context_confidence_threshold"]},
        )
        candidates, vector, max_similarity = self.retrieve(question, max_results, clock, trace)
        trace["max_similarity"] = max_similarity
        cypher = VECTOR_CYPHER_SUMMARY
        if not candidates:
            answer = self._synthesize_answer_minimal(question)
            return self._response(answer, [], "vector_fallback", cypher, clock, trace, usage_before)
        if max_similarity is None or max_similarity < self.settings["context_confidence_threshold"]:
            for candidate in candidates:
                candidate.dropped = "confidence gate"
            trace["candidates"] = [c.trace() for c in candidates]
            clock.lap("gate")
            answer = self._synthesize_answer_minimal(question)
            return self._response(
                answer, [], "confidence_gated_fallback", cypher, clock, trace, usage_before
            )
        clock.lap("gate")
        ranked = self.rank(question, candidates, max_results, clock, trace)
        kept = {c.passage_id for c in ranked}
        for candidate in candidates:
            if candidate.passage_id not in kept:
                candidate.dropped = candidate.dropped or "below top k"
        if self.on("enable_multidoc"):
            context = self.multidoc.retrieve(self.pack, vector, ranked).sections
            clock.lap("multidoc")
        else:
            context = [
                ContextSection(
                    c.section_id,
                    c.article_url,
                    c.title,
                    c.heading,
                    c.text,
                    c.similarity or 0.0,
                    c.pagerank,
                    "retrieved",
                )
                for c in ranked
            ]
        context = self._quality_filter(question, context, ranked, trace)
        clock.lap("quality_filter")
        examples = []
        if self.on("enable_fewshot"):
            examples = self.few_shot.get_examples(question, vector, exclude_examples)
            trace["few_shot_questions"] = [e["question"] for e in examples]
            clock.lap("few_shot")
        trace["candidates"] = [c.trace() for c in candidates]
        trace["context"] = [
            {
                "title": s.title,
                "heading": s.heading,
                "similarity": s.similarity,
                "quality": s.quality,
                "via": s.via,
            }
            for s in context
        ]
        if not context:
            answer = NO_CONTEXT_ANSWER
        elif self.llm.available:
            answer = synthesize(
                self.llm, self.settings["synthesis_model"], question, context, examples
            )
        else:
            answer = extractive_answer(question, context)
        clock.lap("synthesis")
        return self._response(answer, context, "vector_search", cypher, clock, trace, usage_before)

    def _quality_filter(
        self, question: str, context: list[ContextSection], ranked: list[Candidate], trace: dict
    ) -> list[ContextSection]:
        for section in context:
            section.quality = quality_score(section.text, question)
        for candidate in ranked:
            candidate.quality = quality_score(candidate.text, question)
        if not self.on("enable_quality_filter"):
            return context
        kept = [s for s in context if s.quality >= QUALITY_THRESHOLD]
        if not kept and context:
            # The filter removes noise around an answer; it must not remove the only answer
            # (a short section can be exactly what was asked: "Releases are cut every Tuesday").
            kept = [max(context, key=lambda s: s.similarity)]
        trace["quality_filtered"] = [f"{s.title} > {s.heading}" for s in context if s not in kept]
        return kept

    def _synthesize_answer_minimal(self, question: str) -> str:
        if not self.llm.available:
            return NO_CONTEXT_ANSWER
        return synthesize_minimal(self.llm, self.settings["synthesis_model"], question)

    def _response(
        self,
        answer: str,
        context: list[ContextSection],
        query_type: str,
        cypher: str,
        clock: Stopwatch,
        trace: dict,
        usage_before: dict,
    ) -> dict:
        sources = list(dict.fromkeys(s.title for s in context))
        urls = list(dict.fromkeys(s.article_url for s in context))
        section_ids = [s.section_id for s in context]
        entities = list(
            {e["name"]: e for url in urls for e in self.pack.article_entities.get(url, [])}.values()
        )[:10]
        facts = [fact for sid in section_ids for fact in self.pack.section_facts.get(sid, [])][:10]
        clock.lap("response")
        usage = {k: v - usage_before[k] for k, v in self.llm.usage.as_dict().items()}
        return {
            "answer": answer,
            "sources": sources,
            "entities": entities,
            "facts": facts,
            "cypher_query": cypher,
            "query_type": query_type,
            "token_usage": usage,
            "citations": [
                {"title": s.title, "url": s.article_url, "section": s.heading} for s in context
            ],
            "timings_ms": clock.total(),
            "trace": trace,
        }
