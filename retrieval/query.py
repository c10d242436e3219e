"""The Query value and the stage protocol: what flows through a profile's stages.

A question is answered by running the stages of a profile (retrieval.profiles), in order, over
one :class:`Query`. Each stage reads what the earlier ones left in it and adds its part
(phrasings, vectors, candidates, context, answer), and every candidate keeps each stage's
reason for where it ranks, so the trace can say why a passage was used or dropped. The runner
(:func:`run`) times the stages; no stage is handed a clock or a trace of its own.

A stage is any callable ``stage(query) -> None`` with three attributes:

- ``name``: its key in ``timings_ms``;
- ``phase``: ``retrieve``, ``gate``, ``rank``, ``context`` or ``answer``. ``search`` runs the
  retrieve, gate (refusing nothing) and rank stages only; after the confidence gate fired only ``answer`` stages run;
- ``toggle``: the ``kg_config.json`` switch (``enable_reranker`` ...) that removes it from a
  profile or adds it to one, or None for the stages every profile needs.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from kpack.contracts import section_url
from kpack.errors import PackError

if TYPE_CHECKING:
    from kpack.config import QueryConfig
    from kpack.gate import GateThreshold
    from kpack.llm import ClaudeClient
    from retrieval.coding_questions import QuestionReading
    from retrieval.reader import PackReader

Phase = Literal["retrieve", "gate", "rank", "context", "answer"]
# The limits of a question, wherever it comes from (the Python API, the CLI, an eval's question
# file, the HTTP API and the MCP server all check it here).
MAX_QUESTION_CHARS = 8000
MAX_K = 1000  # passages one call may ask for
# What a network client may ask for (serving/: the HTTP API and the MCP server). Retrieval's
# work grows with k (each index returns k, the cross-encoder scores twice k pairs, the trace
# lists every candidate), and a request holds one of the server's retrieval threads meanwhile;
# 50 passages is more than a reader or a model reads.
MAX_SERVED_K = 50
MAX_TOKENS = 100_000  # a search's token budget: more than any model's context needs
# Lone surrogates: what Python makes of bytes that are not UTF-8 in argv or a decoded file.
SURROGATES = re.compile("[\ud800-\udfff]")
GATED = "confidence_gated_fallback"
NOTHING_FOUND = "vector_fallback"


class QuestionError(PackError):
    """The question itself is unusable (empty, too long) or asks for an impossible number of
    passages: the caller's mistake, not the pack's (the HTTP API answers it with 422)."""


class Stage(Protocol):
    name: str
    phase: Phase
    toggle: str | None

    def __call__(self, query: Query) -> None: ...


@dataclass(frozen=True)
class FunctionStage:
    """A plain function as a stage (see :func:`stage`)."""

    run: Callable[[Query], None]
    name: str
    phase: Phase
    toggle: str | None = None

    def __call__(self, query: Query) -> None:
        self.run(query)


def stage(
    name: str, phase: Phase, toggle: str | None = None
) -> Callable[[Callable[[Query], None]], FunctionStage]:
    """Declare a function ``f(query) -> None`` as a stage."""

    def declare(run: Callable[[Query], None]) -> FunctionStage:
        return FunctionStage(run, name, phase, toggle)

    return declare


@dataclass
class ContextSection:
    """A section (or passage) handed to synthesis."""

    section_id: str
    article_url: str
    title: str
    heading: str
    text: str
    similarity: float
    pagerank: float
    via: str  # retrieved | linked | passage
    quality: float | None = None
    anchor: str | None = None  # the section's place in its page (kpack.contracts.section_url)
    # Its sentences as the sentence index embedded them (kpack.sentence_index), each as a unit
    # quotes it (retrieval.answer_units.quoted_words) with its similarity to the question:
    # what an offline answer knows of each sentence's meaning (retrieval.unit_scoring).
    sentences: tuple[tuple[str, float], ...] = ()

    @property
    def url(self) -> str:
        """The section's deep link: its page's URL and the section's anchor."""
        return section_url(self.article_url, self.anchor)


@dataclass
class Candidate:
    """A passage found for the question, with what each stage made of it."""

    passage_id: str  # a chunk_id: every hit is a passage of at most ~200 words
    section_id: str
    article_url: str
    title: str
    heading: str
    text: str
    similarity: float | None = None
    # Its best sentence's similarity (kpack.sentence_index), and what vector search ranked it
    # by: its similarity blended with that (retrieval.candidates.vector_score)
    sentence_similarity: float | None = None
    vector_score: float | None = None
    bm25: float | None = None
    rrf: float | None = None
    pagerank: float = 0.0
    fused: float | None = None  # RRF normalised to the best candidate's (hybrid search)
    cross_encoder: float | None = None
    quality: float | None = None
    combined: float | None = None
    found_by: str = ""  # the query phrasing that found it
    dropped: str | None = None  # why a later stage removed it
    rank: int | None = None  # its place among the passages kept (top_k), from 1
    reasons: list[str] = field(default_factory=list)  # each stage's word on its rank
    anchor: str | None = None  # its section's place in its page (kpack.contracts.section_url)
    # How sure the search is of it, comparable across questions and packs (retrieval.confidence)
    confidence: float | None = None

    @property
    def url(self) -> str:
        """The passage's deep link: its page's URL and its section's anchor."""
        return section_url(self.article_url, self.anchor)

    @property
    def relevance(self) -> float:
        """What rerankers blend with authority: the cross-encoder when it ran (squashed to
        0..1), else the fused rank of hybrid search, else cosine similarity."""
        if self.cross_encoder is not None:
            return 1.0 / (1.0 + math.exp(-self.cross_encoder))
        if self.fused is not None:
            return self.fused
        return self.similarity if self.similarity is not None else 0.0

    def as_context(self) -> ContextSection:
        """The passage as a section of the context."""
        return ContextSection(
            self.section_id,
            self.article_url,
            self.title,
            self.heading,
            self.text,
            self.similarity or 0.0,
            self.pagerank,
            "passage",
            anchor=self.anchor,
        )

    def trace(self) -> dict:
        # Shallow: asdict's deep copy of every candidate cost a millisecond per query.
        row = {name: getattr(self, name) for name in TRACED_FIELDS}
        row["text"] = self.text[:200]
        row["why"] = "; ".join(self.reasons)
        row["url"] = self.url
        return row


TRACED_FIELDS = tuple(f.name for f in fields(Candidate) if f.name != "reasons")


@dataclass(eq=False)
class Query:
    """One question on its way through a profile's stages."""

    text: str
    k: int
    reader: PackReader
    settings: QueryConfig
    llm: ClaudeClient
    gate: GateThreshold | None = None  # where settings' gate threshold came from, and why
    exclude_examples: Callable[[dict], bool] | None = None
    depth: int = 0  # passages each index returns: k, or more for a reranker that cuts to k
    phrasings: list[str] = field(default_factory=list)
    reading: QuestionReading | None = None  # its prose, code and names (read_question)
    vectors: np.ndarray | None = None
    # The question's similarity with every passage, where the pack's passages are scanned
    # exactly (no ANN index): one scan serves vector search and every stage after it.
    chunk_similarity: np.ndarray | None = field(default=None, repr=False)
    rankings: list[tuple[str, list[Candidate]]] = field(default_factory=list)  # (source, hits)
    candidates: list[Candidate] = field(default_factory=list)  # alive, best first
    considered: list[Candidate] = field(default_factory=list)  # every fused candidate
    max_similarity: float | None = None
    context: list[ContextSection] = field(default_factory=list)
    cited: list[ContextSection] = field(default_factory=list)  # what the answer cites (<= k)
    examples: list[dict] = field(default_factory=list)
    answer: str | None = None
    # Streaming: on_text gets the answer's text as it is written (see write/finish_answer).
    on_text: Callable[[str], object] | None = None
    written: list[str] = field(default_factory=list)
    query_type: str = "vector_search"
    notes: dict = field(default_factory=dict)  # what stages add to the trace
    timings: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.phrasings = self.phrasings or [self.text]
        self.depth = self.depth or self.k

    @property
    def vector(self) -> np.ndarray:
        """The vector of the question as asked (not of an alternative phrasing)."""
        assert self.vectors is not None, "the embed stage has not run"
        return self.vectors[0]

    def passage_similarity(self, rows: np.ndarray | int) -> np.ndarray:
        """The question's cosine similarity with the passages at ``rows`` of the reader's
        chunk vectors. A pack scanned exactly has them all from one scan
        (:meth:`all_passage_similarity`): the stages ask for about 25 sets of rows a question,
        and gathering scattered rows cost 2.7 ms a search on the Python docs pack against one
        scan's 1 ms. A pack with an ANN index computes only the rows asked, never every
        passage."""
        rows = np.atleast_1d(rows)
        every = self.all_passage_similarity()
        if every is None:
            return self.reader.similarities("Chunk", self.vector, rows)
        return every[rows]

    def all_passage_similarity(self) -> np.ndarray | None:
        """The question's similarity with every passage, computed once, where the pack's
        passages are scanned exactly; None for a pack with an ANN index."""
        if self.chunk_similarity is None and self.reader.ann is None:
            self.chunk_similarity = self.reader.similarities("Chunk", self.vector)
        return self.chunk_similarity

    @property
    def fell_back(self) -> bool:
        """True once the pack has nothing to answer with (gate fired, or nothing found)."""
        return self.query_type in (GATED, NOTHING_FOUND)

    def drop(self, candidates: Sequence[Candidate], reason: str) -> None:
        for candidate in candidates:
            candidate.dropped = candidate.dropped or reason
        gone = {id(c) for c in candidates}
        self.candidates = [c for c in self.candidates if id(c) not in gone]

    def trace(self) -> dict:
        trace = {
            "profile": self.settings.profile,
            "threshold": self.settings.context_confidence_threshold,
            "threshold_source": self.gate.source if self.gate else None,
            "threshold_why": self.gate.why if self.gate else None,
            "max_similarity": self.max_similarity,
            "candidates": [c.trace() for c in self.considered],
        }
        if self.context:
            trace["context"] = [
                {
                    "title": s.title,
                    "heading": s.heading,
                    "similarity": s.similarity,
                    "quality": s.quality,
                    "via": s.via,
                }
                for s in self.context
            ]
        return trace | self.notes

    @property
    def text_sink(self) -> Callable[[str], None] | None:
        """What an answer stage hands Claude's client to stream through, or None when the
        query is not streamed (the answer then comes in one non-streaming call)."""
        return self.write if self.on_text is not None else None

    def write(self, text: str) -> None:
        """Pass on a piece of the answer as it is written."""
        self.written.append(text)
        if self.on_text is not None:
            self.on_text(text)

    def finish_answer(self) -> None:
        """Stream the part of the final answer that was not written piece by piece: all of
        it when no Claude call streamed it (offline, or refused before its first token). An
        answer that does not continue what was written (Claude failed part-way; the answer
        is then the offline one with the failure note) is not passed on: the caller reads
        it from the result."""
        written = "".join(self.written)
        answer = self.answer or ""
        if self.on_text is not None and answer.startswith(written) and answer != written:
            self.write(answer[len(written) :])

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 3)


def run(query: Query, stages: Sequence[Stage]) -> Query:
    """Run the stages in order, timing each; after a fallback only ``answer`` stages run."""
    for step in stages:
        if query.fell_back and step.phase != "answer":
            continue
        started = time.perf_counter()
        step(query)
        spent = (time.perf_counter() - started) * 1000
        query.timings[step.name] = round(query.timings.get(step.name, 0.0) + spent, 3)
    return query


def clean_question(question: object) -> str:
    """The question as written, without trailing spaces, carriage returns or blank lines
    around it; a QuestionError when it cannot be asked.

    Its lines and their spacing stay: a problem statement is read by its lines (indented code,
    rows of data aligned in columns; retrieval.coding_questions), and joining them would make
    its code and data rows steer keyword search and the gate. Bytes that are not UTF-8 (a
    shell passes them through as surrogates) become U+FFFD, so a mistyped byte costs one
    character, not the question.
    """
    if isinstance(question, bytes):
        question = question.decode("utf-8", "replace")
    if not isinstance(question, str) or not question.strip():
        raise QuestionError("the question is empty")
    question = SURROGATES.sub("\ufffd", question)
    if len(question) > MAX_QUESTION_CHARS:
        raise QuestionError(
            f"the question is {len(question):,} characters long; "
            f"the limit is {MAX_QUESTION_CHARS:,}"
        )
    return "\n".join(line.rstrip() for line in question.splitlines()).strip("\n")


def check_tokens(tokens: object) -> int | None:
    """A search's token budget: None (no budget) or a whole number from 1 to MAX_TOKENS."""
    if tokens is None:
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_TOKENS:
        raise QuestionError(
            f"tokens (--tokens) must be a whole number from 1 to {MAX_TOKENS:,}; got {tokens!r}"
        )
    return tokens


def check_k(k: object) -> int:
    """How many passages to return: a whole number from 1 to MAX_K."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise QuestionError(f"k (--k) must be a whole number from 1 to {MAX_K:,}; got {k!r}")
    return k
