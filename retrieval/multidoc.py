"""MultiDocSynthesizer (seed 004): context from the top articles, not one.

Articles are ranked by the cumulative score of their retrieved passages; the best
``num_docs`` (5) are kept and, from each, the ``sections_per_doc`` (3) sections most similar to
the question. When retrieval found fewer articles than that, LINKS_TO neighbours of the
retrieved articles (highest PageRank first) fill the remaining places.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from retrieval.candidates import Candidate
from retrieval.pack import OpenPack


@dataclass
class ContextSection:
    section_id: str
    article_url: str
    title: str
    heading: str
    text: str
    similarity: float
    pagerank: float
    via: str  # retrieved | linked
    quality: float | None = None


@dataclass
class MultiDocContext:
    articles: list[str] = field(default_factory=list)
    sections: list[ContextSection] = field(default_factory=list)


class MultiDocSynthesizer:
    def __init__(self, num_docs: int = 5, sections_per_doc: int = 3):
        self.num_docs, self.sections_per_doc = num_docs, sections_per_doc

    def retrieve(
        self, pack: OpenPack, question_vector: np.ndarray, candidates: list[Candidate]
    ) -> MultiDocContext:
        totals: dict[str, float] = {}
        for candidate in candidates:
            score = candidate.combined if candidate.combined is not None else candidate.relevance
            totals[candidate.article_url] = totals.get(candidate.article_url, 0.0) + score
        ranked = sorted(totals, key=lambda url: -totals[url])[: self.num_docs]
        via = dict.fromkeys(ranked, "retrieved")
        if ranked and len(ranked) < self.num_docs:
            for url in self._linked(pack, ranked):
                if len(via) >= self.num_docs:
                    break
                via.setdefault(url, "linked")
        context = MultiDocContext(articles=list(via))
        for url in via:
            context.sections.extend(self._best_sections(pack, url, question_vector, via[url]))
        return context

    def _linked(self, pack: OpenPack, urls: list[str]) -> list[str]:
        linked = {n for url in urls for n in pack.neighbors.get(url, []) if n not in urls}
        return sorted(linked, key=lambda u: (-pack.articles[u].pagerank, u))[: self.num_docs]

    def _best_sections(
        self, pack: OpenPack, url: str, question_vector: np.ndarray, via: str
    ) -> list[ContextSection]:
        indexes = pack.sections_of.get(url, [])
        if not indexes:
            return []
        similarities = pack.section_vectors[indexes] @ question_vector
        order = np.argsort(-similarities)[: self.sections_per_doc]
        article = pack.articles[url]
        chosen = []
        for position in order:
            section = pack.sections[pack.section_ids[indexes[position]]]
            chosen.append(
                ContextSection(
                    section.section_id,
                    url,
                    article.title,
                    section.heading,
                    section.content,
                    float(similarities[position]),
                    article.pagerank,
                    via,
                )
            )
        return chosen
