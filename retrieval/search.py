"""Passage search: HNSW vector search and BM25 full-text search, fused by reciprocal rank.

Both run over chunks (passages of about 200 words) with the pack's own embedding model.
"""

from __future__ import annotations

import re
from pathlib import Path

from kpack.contracts import FTS_INDEXES, VECTOR_INDEXES
from kpack.packs import PackError
from retrieval.pack import OpenPack, open_pack

RRF_K = 60
MAX_QUESTION_CHARS = 4000
FTS_TERM = re.compile(r"[A-Za-z0-9_]+")


def clean_question(question: str) -> str:
    if not isinstance(question, str) or not question.strip():
        raise PackError("the question is empty")
    # Embedding models read ~256 tokens; a longer question only costs time.
    return " ".join(question.split())[:MAX_QUESTION_CHARS]


def vector_hits(pack: OpenPack, question: str, k: int) -> list[tuple[str, float]]:
    """(chunk_id, cosine similarity), best first."""
    vector = pack.embed([question])[0].tolist()
    rows = pack.conn.execute(
        f"CALL QUERY_VECTOR_INDEX('Chunk', '{VECTOR_INDEXES['Chunk']}', $v, $k) "
        "RETURN node.chunk_id, distance ORDER BY distance",
        {"v": vector, "k": k},
    ).get_all()
    return [(chunk_id, 1.0 - distance) for chunk_id, distance in rows]


def bm25_hits(pack: OpenPack, question: str, k: int) -> list[tuple[str, float]]:
    """(chunk_id, BM25 score), best first."""
    terms = " ".join(FTS_TERM.findall(question))
    if not terms:
        return []
    rows = pack.conn.execute(
        f"CALL QUERY_FTS_INDEX('Chunk', '{FTS_INDEXES['Chunk']}', $q, top := $k) "
        "RETURN node.chunk_id, score ORDER BY score DESC",
        {"q": terms, "k": k},
    ).get_all()
    return [(chunk_id, score) for chunk_id, score in rows]


def reciprocal_rank_fusion(*rankings: list[tuple[str, float]]) -> dict[str, float]:
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, (key, _) in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (RRF_K + rank)
    return fused


def search(pack: str | Path, question: str, k: int = 5) -> list[dict]:
    """The k best passages for a question, each with its article, heading, url and scores."""
    question = clean_question(question)
    opened = open_pack(pack)
    depth = max(k * 4, 20)
    vector = vector_hits(opened, question, depth)
    bm25 = bm25_hits(opened, question, depth)
    fused = reciprocal_rank_fusion(vector, bm25)
    best = sorted(fused, key=lambda key: -fused[key])[:k]
    similarity, bm25_score = dict(vector), dict(bm25)
    rows = opened.conn.execute(
        "MATCH (a:Article)-[:HAS_CHUNK]->(c:Chunk) WHERE c.chunk_id IN $ids "
        "MATCH (s:Section {section_id: c.section_id}) "
        "RETURN c.chunk_id, a.title, a.url, s.heading_path, c.content, a.pagerank",
        {"ids": best},
    ).get_all()
    by_id = {row[0]: row for row in rows}
    return [
        {
            "chunk_id": key,
            "title": by_id[key][1],
            "url": by_id[key][2],
            "heading": by_id[key][3],
            "text": by_id[key][4],
            "score": round(fused[key], 6),
            "similarity": similarity.get(key),
            "bm25": bm25_score.get(key),
            "pagerank": by_id[key][5],
        }
        for key in best
        if key in by_id
    ]
