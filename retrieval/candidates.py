"""Retrieval candidates: passages found by vector (and BM25) search, with every score they got.

A Candidate carries the scores each stage gives it, so the response's trace can show why a
passage was used or dropped.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

from kpack.contracts import FTS_INDEXES, VECTOR_INDEXES
from retrieval.pack import OpenPack

RRF_K = 60
FTS_TERM = re.compile(r"[A-Za-z0-9_]+")
VECTOR_CYPHER = (
    "CALL QUERY_VECTOR_INDEX('{label}', '{index}', $v, $k) "
    "RETURN node.{key} AS id, node.section_id AS sid, distance ORDER BY distance"
)
FTS_CYPHER = (
    "CALL QUERY_FTS_INDEX('{label}', '{index}', $q, top := $k) "
    "RETURN node.{key} AS id, node.section_id AS sid, score ORDER BY score DESC"
)
KEYS = {"Chunk": "chunk_id", "Section": "section_id"}


@dataclass
class Candidate:
    passage_id: str  # a chunk_id: every hit is a passage of at most ~200 words
    section_id: str
    article_url: str
    title: str
    heading: str
    text: str
    similarity: float | None = None
    bm25: float | None = None
    rrf: float | None = None
    pagerank: float = 0.0
    fused: float | None = None  # RRF normalised to the best candidate's (hybrid search)
    cross_encoder: float | None = None
    quality: float | None = None
    combined: float | None = None
    found_by: str = ""  # the query phrasing that found it
    dropped: str | None = None  # why a later stage removed it

    @property
    def relevance(self) -> float:
        """What rerankers blend with authority: the cross-encoder when it ran, else the fused
        rank of hybrid search, else cosine similarity."""
        if self.cross_encoder is not None:
            return 1.0 / (1.0 + float(np.exp(-self.cross_encoder)))
        if self.fused is not None:
            return self.fused
        return self.similarity if self.similarity is not None else 0.0

    def trace(self) -> dict:
        row = asdict(self)
        row["text"] = self.text[:200]
        return row


def _candidate(pack: OpenPack, passage_id: str, section_id: str, query: str) -> Candidate | None:
    """A passage (chunk) with its article's title, heading and PageRank, read from memory."""
    section = pack.sections.get(section_id)
    if section is None:
        return None
    article = pack.articles[section.article_url]
    return Candidate(
        passage_id=passage_id,
        section_id=section_id,
        article_url=article.url,
        title=article.title,
        heading=section.heading,
        text=pack.chunk_text.get(passage_id, ""),
        pagerank=article.pagerank,
        found_by=query,
    )


def first_chunk_id(section_id: str) -> str:
    """Chunk ids are ``<section_id>-<index:03d>`` (assets.chunk)."""
    return f"{section_id}-000"


def vector_search(
    pack: OpenPack,
    query: str,
    vector: np.ndarray,
    k: int,
    labels: tuple[str, ...] = ("Chunk", "Section"),
) -> list[Candidate]:
    """HNSW top-k per table as passages, best cosine similarity first.

    A section-level hit stands for the section's first chunk: the model embedded the section
    truncated to its first ~256 tokens, which is that chunk. Results stay passages (not one hit
    per section) because long sections matter: a Wikipedia article is one section of fifty
    paragraphs, and the passage that answers is rarely its first.
    """
    found = []
    for label in labels:
        cypher = VECTOR_CYPHER.format(label=label, index=VECTOR_INDEXES[label], key=KEYS[label])
        for passage_id, section_id, distance in pack.query(cypher, {"v": vector.tolist(), "k": k}):
            if label == "Section":
                passage_id = first_chunk_id(section_id)
            candidate = _candidate(pack, passage_id, section_id, query)
            if candidate:
                candidate.similarity = 1.0 - float(distance)
                found.append(candidate)
    return deduplicate(found)


def bm25_search(pack: OpenPack, query: str, k: int, label: str = "Chunk") -> list[Candidate]:
    terms = " ".join(FTS_TERM.findall(query))
    if not terms:
        return []
    cypher = FTS_CYPHER.format(label=label, index=FTS_INDEXES[label], key=KEYS[label])
    found = []
    for passage_id, section_id, score in pack.query(cypher, {"q": terms, "k": k}):
        candidate = _candidate(pack, passage_id, section_id, query)
        if candidate:
            candidate.bm25 = float(score)
            found.append(candidate)
    return found


def fuse(*rankings: list[Candidate]) -> list[Candidate]:
    """Reciprocal rank fusion (k=60); a passage found by several lists keeps the best scores."""
    merged: dict[str, Candidate] = {}
    for ranking in rankings:
        for rank, candidate in enumerate(ranking, start=1):
            kept = merged.setdefault(candidate.passage_id, candidate)
            kept.rrf = (kept.rrf or 0.0) + 1.0 / (RRF_K + rank)
            if candidate is not kept:
                kept.similarity = _best(kept.similarity, candidate.similarity)
                kept.bm25 = _best(kept.bm25, candidate.bm25)
    return sorted(merged.values(), key=lambda c: -(c.rrf or 0.0))


def _best(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def deduplicate(candidates: list[Candidate]) -> list[Candidate]:
    """One candidate per passage, the highest similarity winning (seed 002's dedupe step)."""
    best: dict[str, Candidate] = {}
    for candidate in candidates:
        held = best.get(candidate.passage_id)
        if held is None or (candidate.similarity or 0.0) > (held.similarity or 0.0):
            best[candidate.passage_id] = candidate
    return sorted(best.values(), key=lambda c: -(c.similarity or 0.0))
