"""Candidate retrieval stages: embed the question, find passages by meaning (the nearest of
the pack's vectors: an exact scan, or the faiss index of a pack above the ANN crossover,
kpack.vector_index) and by words (BM25 over the passages, kpack.keyword_index), and fuse the
lists into one ranking.

Every candidate is a passage (a Chunk) and keeps the scores and reasons each stage gives it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kpack.contracts import chunk_id, section_of_chunk
from retrieval.coding_questions import read_question
from retrieval.query import Candidate, Query, stage
from retrieval.reader import PackReader

# Reciprocal rank fusion's rank constant: a passage at rank r of a list gains
# weight / (RRF_K + r). Smaller than the customary 60, so a list's first places count more than
# its tail: swept on the development halves (conala_dev and ds1000_pandas_dev odd lines,
# python_docs_qa odd lines, SQuAD even positions; bench/HISTORY.md, stop 48), 10 to 20 raised
# conala_dev's hit@1 and MRR and python_docs_qa's hit@1 and lost nothing elsewhere except at 10
# (a ds1000 problem); 15 was best there.
RRF_K = 15
# Vector search ranks a passage by its similarity blended with its best sentence's
# (settings.sentence_weight, kpack.sentence_index) among this many of the passages nearest by
# their own vectors: chosen with the weight on the development halves (bench/HISTORY.md, stop
# 49), where 30, 50 and 100 did about as well as rescoring every passage.
SENTENCE_POOL = 50
# The lists whose presence makes fuse a reciprocal rank fusion (else the vector hits of every
# phrasing are merged by similarity): keyword search and the two API searches.
FUSED_SOURCES = ("bm25", "api", "definition")


def passage(
    reader: PackReader, passage_id: str, section_id: str, phrasing: str
) -> Candidate | None:
    """A passage (chunk) with its article's title, heading and PageRank, read from memory."""
    section = reader.sections.get(section_id)
    if section is None:
        return None
    article = reader.articles[section.article_url]
    return Candidate(
        passage_id=passage_id,
        section_id=section_id,
        article_url=article.url,
        title=article.title,
        heading=section.heading,
        text=reader.chunk_text.get(passage_id, ""),
        pagerank=article.pagerank,
        found_by=phrasing,
        anchor=section.anchor,
    )


def nearest_passages(
    reader: PackReader,
    phrasing: str,
    vector: np.ndarray,
    k: int,
    labels: tuple[str, ...] = ("Chunk", "Section"),
    scanned_chunks: np.ndarray | None = None,
    sentence_weight: float = 0.0,
) -> list[Candidate]:
    """The k nearest vectors per table as passages, best first (``scanned_chunks``: the
    vector's similarity with every chunk, when the caller has it).

    A section-level hit stands for the section's first chunk: the model embedded the section
    truncated to its first ~256 tokens, which is that chunk. Results stay passages (not one hit
    per section) because long sections matter: a Wikipedia article is one section of fifty
    paragraphs, and the passage that answers is rarely its first.

    With ``sentence_weight`` and a version that has a sentence index, the passages are ranked
    by :func:`vector_score` among the SENTENCE_POOL nearest by their own vectors.
    """
    found = []
    for label in labels:
        blended = label == "Chunk" and sentence_weight > 0 and reader.sentences is not None
        nearest = reader.nearest(
            label,
            vector,
            max(k, SENTENCE_POOL) if blended else k,
            scanned_chunks if label == "Chunk" else None,
        )
        best_sentence = (
            reader.sentences.best_similarity(
                np.asarray([reader.chunk_row[node_id] for node_id, _ in nearest], np.int64),
                vector,
            )
            if blended and nearest
            else np.full(len(nearest), np.nan)
        )
        scored = [
            (node_id, similarity, None if np.isnan(sentence) else float(sentence))
            for (node_id, similarity), sentence in zip(nearest, best_sentence, strict=True)
        ]
        # Stable: ties keep the table's order. Only the k kept become candidates.
        scored.sort(key=lambda hit: -vector_score(hit[1], hit[2], sentence_weight))
        for rank, (node_id, similarity, sentence) in enumerate(scored[:k], start=1):
            if label == "Section":
                section_id, passage_id = node_id, chunk_id(node_id, 0)
            else:
                section_id, passage_id = section_of_chunk(node_id), node_id
            candidate = passage(reader, passage_id, section_id, phrasing)
            if candidate:
                candidate.similarity = similarity
                candidate.sentence_similarity = sentence
                candidate.vector_score = vector_score(similarity, sentence, sentence_weight)
                candidate.reasons.append(
                    f"vector #{rank} of {label}s ({_vector_reason(candidate)})"
                )
                found.append(candidate)
    return deduplicate(found)


def vector_score(similarity: float, sentence: float | None, sentence_weight: float) -> float:
    """What vector search ranks a passage by: its cosine ``similarity``, or, when its best
    sentence's is known, (1 - sentence_weight) x its own + sentence_weight x its best
    sentence's. A whole passage and its best part are each evidence (kpack.sentence_index)."""
    if sentence is None:
        return similarity
    return (1.0 - sentence_weight) * similarity + sentence_weight * sentence


def _vector_reason(candidate: Candidate) -> str:
    if candidate.sentence_similarity is None:
        return f"similarity {candidate.similarity:.3f}"
    return (
        f"similarity {candidate.similarity:.3f}, best sentence "
        f"{candidate.sentence_similarity:.3f}: scored {candidate.vector_score:.3f}"
    )


def keyword_passages(reader: PackReader, phrasing: str, k: int) -> list[Candidate]:
    """BM25 top-k passages for the words of a phrasing (none for a phrasing without words),
    from the version's keyword index (kpack.keyword_index)."""
    found = []
    for rank, (row, score) in enumerate(reader.keywords.search(phrasing, k), start=1):
        passage_id = reader.chunk_ids[row]
        candidate = passage(reader, passage_id, section_of_chunk(passage_id), phrasing)
        if candidate:
            candidate.bm25 = score
            candidate.reasons.append(f"bm25 #{rank} (score {candidate.bm25:.2f})")
            found.append(candidate)
    return found


def rrf_scores(
    rankings: Sequence[Sequence[str]], weights: Sequence[float] | None = None
) -> dict[str, float]:
    """Reciprocal rank fusion (k = RRF_K) of rankings of passage ids, each list's terms times its
    weight (1 when none is given): passage id -> score, best first (ties in the order the
    passages were first met)."""
    scores: dict[str, float] = {}
    for position, ranking in enumerate(rankings):
        weight = weights[position] if weights else 1.0
        for rank, passage_id in enumerate(ranking, start=1):
            scores[passage_id] = scores.get(passage_id, 0.0) + weight / (RRF_K + rank)
    return dict(sorted(scores.items(), key=lambda item: -item[1]))


def reciprocal_rank_fusion(
    *rankings: list[Candidate], weights: list[float] | None = None
) -> list[Candidate]:
    """:func:`rrf_scores` of candidate lists; a passage found by several lists keeps the best
    scores and every reason."""
    merged: dict[str, Candidate] = {}
    for ranking in rankings:
        for candidate in ranking:
            kept = merged.setdefault(candidate.passage_id, candidate)
            if candidate is not kept:
                _absorb(kept, candidate)
    scores = rrf_scores([[c.passage_id for c in ranking] for ranking in rankings], weights)
    for passage_id, score in scores.items():
        merged[passage_id].rrf = score
    return [merged[passage_id] for passage_id in scores]


def deduplicate(candidates: list[Candidate]) -> list[Candidate]:
    """One candidate per passage, the highest vector score winning (seed 002's dedupe step),
    best first."""
    best: dict[str, Candidate] = {}
    for candidate in candidates:
        held = best.get(candidate.passage_id)
        if held is None:
            best[candidate.passage_id] = candidate
        elif _ranked_by(candidate) > _ranked_by(held):
            _absorb(candidate, held)
            best[candidate.passage_id] = candidate
        else:
            _absorb(held, candidate)
    return sorted(best.values(), key=lambda c: -_ranked_by(c))


def _ranked_by(candidate: Candidate) -> float:
    """What vector search ranked a candidate by (its similarity when it gave no score)."""
    if candidate.vector_score is not None:
        return candidate.vector_score
    return candidate.similarity or 0.0


def _absorb(kept: Candidate, other: Candidate) -> None:
    kept.similarity = _best(kept.similarity, other.similarity)
    kept.sentence_similarity = _best(kept.sentence_similarity, other.sentence_similarity)
    kept.vector_score = _best(kept.vector_score, other.vector_score)
    kept.bm25 = _best(kept.bm25, other.bm25)
    kept.reasons.extend(r for r in other.reasons if r not in kept.reasons)


def _best(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@stage("embed", "retrieve")
def embed_question(query: Query) -> None:
    """Vectors of the question and of its alternative phrasings, if any, each as written.

    A problem statement is embedded whole, its code and data with its prose: its prose alone
    (retrieval.coding_questions) found fewer of the pages wanted on the development half of
    ds1000_pandas_dev (hit@5 0.250 -> 0.167, bench/HISTORY.md, stop 46)."""
    query.vectors = query.reader.embed(query.phrasings)


@stage("vector_search", "retrieve")
def vector_search(query: Query) -> None:
    assert query.vectors is not None, "embed_question must run before vector_search"
    for position, (phrasing, vector) in enumerate(zip(query.phrasings, query.vectors, strict=True)):
        # The question as asked (the first phrasing) is scanned once for every stage.
        scanned = query.all_passage_similarity() if position == 0 else None
        query.rankings.append(
            (
                "vector",
                nearest_passages(
                    query.reader,
                    phrasing,
                    vector,
                    query.depth,
                    scanned_chunks=scanned,
                    sentence_weight=query.settings.sentence_weight,
                ),
            )
        )


@stage("read_question", "retrieve")
def read_the_question(query: Query) -> None:
    """The question's prose apart from its code, data and the asker's own names, and the APIs
    it names (retrieval.coding_questions); the trace's ``question`` says how it was read
    when the reading changed what is searched."""
    reading = query.reading = read_question(query.text)
    if reading.changed:
        query.notes["question"] = {
            "problem_statement": reading.problem_statement,
            "searched_words": reading.prose,
            "askers_names": list(reading.asker_names),
            "api_names": list(reading.api_names),
        }


def keyword_text(query: Query, phrasing: str) -> str:
    """What keyword search looks for: the question's prose, without the asker's variables and
    values or a problem's code and data rows (they match pages by accident); other phrasings
    as written."""
    if phrasing == query.text and query.reading is not None and query.reading.prose:
        return query.reading.prose
    return phrasing


@stage("bm25_search", "retrieve", toggle="enable_hybrid")
def bm25_search(query: Query) -> None:
    for phrasing in query.phrasings:
        words = keyword_text(query, phrasing)
        query.rankings.append(("bm25", keyword_passages(query.reader, words, query.depth)))


def source_weight(query: Query, source: str) -> float:
    """A ranking's weight in the fusion: vector search counts 1, the others at their setting
    (API and definition search at their problem statement's when the question is one)."""
    settings = query.settings
    problem = query.reading is not None and query.reading.problem_statement
    weights = {
        "graph": settings.graph_weight,
        "bm25": settings.keyword_weight,
        "api": settings.problem_api_weight if problem else settings.api_weight,
        "definition": (
            settings.problem_definition_weight if problem else settings.definition_weight
        ),
    }
    weight = weights.get(source)
    return 1.0 if weight is None else weight


@stage("dedupe", "retrieve", toggle=None)
def fuse(query: Query) -> None:
    """One ranking from all lists: RRF when keyword or API search took part, else the best
    similarity per passage; the trace's ``fusion_weights`` give each list's weight. Every
    candidate gets a cosine similarity, which the gate and the reports compare: a BM25-only
    hit's is computed from its stored vector."""
    lists = [hits for _, hits in query.rankings]
    if any(source in FUSED_SOURCES for source, _ in query.rankings):
        # The graph list (retrieval.entity_graph) counts at its calibrated weight.
        weights = [source_weight(query, source) for source, _ in query.rankings]
        query.notes["fusion_weights"] = {
            source: weight for (source, _), weight in zip(query.rankings, weights, strict=True)
        }
        candidates = reciprocal_rank_fusion(*lists, weights=weights)
        top = max((c.rrf or 0.0 for c in candidates), default=0.0) or 1.0
        for rank, candidate in enumerate(candidates, start=1):
            if candidate.similarity is None:
                row = query.reader.chunk_row.get(candidate.passage_id)
                candidate.similarity = (
                    float(query.passage_similarity(row)[0]) if row is not None else 0.0
                )
                candidate.reasons.append(
                    f"similarity {candidate.similarity:.3f} from its stored vector"
                )
            candidate.fused = (candidate.rrf or 0.0) / top
            candidate.reasons.append(f"fused #{rank} (rrf {candidate.rrf:.4f})")
    else:
        candidates = deduplicate([c for hits in lists for c in hits])
    query.candidates = candidates
    query.considered = list(candidates)
    query.max_similarity = max(
        (c.similarity for c in candidates if c.similarity is not None), default=None
    )
