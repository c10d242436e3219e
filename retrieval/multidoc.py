"""MultiDocSynthesizer (seed 004): context from the top articles, not one.

Articles are ranked by the cumulative score of their retrieved passages; the best
``num_docs`` (5) are kept and, from each, the ``sections_per_doc`` (3) sections most similar to
the question. When retrieval found fewer articles than that, LINKS_TO neighbours of the
retrieved articles (highest PageRank first) fill the remaining places.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from retrieval.query import Candidate, ContextSection, Query
from retrieval.reader import PackReader


@dataclass
class MultiDocContext:
    articles: list[str] = field(default_factory=list)
    sections: list[ContextSection] = field(default_factory=list)


class MultiDocSynthesizer:
    """As a stage it replaces the passages of the context with whole sections of up to
    ``num_docs`` articles (the query's settings)."""

    name, phase, toggle = "multidoc", "context", "enable_multidoc"

    def __init__(self, num_docs: int = 5, sections_per_doc: int = 3) -> None:
        self.num_docs, self.sections_per_doc = num_docs, sections_per_doc

    def retrieve(
        self, reader: PackReader, question_vector: np.ndarray, candidates: list[Candidate]
    ) -> MultiDocContext:
        totals: dict[str, float] = {}
        for candidate in candidates:
            score = candidate.combined if candidate.combined is not None else candidate.relevance
            totals[candidate.article_url] = totals.get(candidate.article_url, 0.0) + score
        ranked = sorted(totals, key=lambda url: -totals[url])[: self.num_docs]
        via = dict.fromkeys(ranked, "retrieved")
        if ranked and len(ranked) < self.num_docs:
            for url in self._linked(reader, ranked):
                if len(via) >= self.num_docs:
                    break
                via.setdefault(url, "linked")
        context = MultiDocContext(articles=list(via))
        for url in via:
            context.sections.extend(self._best_sections(reader, url, question_vector, via[url]))
        return context

    def __call__(self, query: Query) -> None:
        settings = query.settings
        synthesizer = MultiDocSynthesizer(settings.num_docs, settings.sections_per_doc)
        query.context = synthesizer.retrieve(query.reader, query.vector, query.candidates).sections

    def _linked(self, reader: PackReader, urls: list[str]) -> list[str]:
        linked = {n for url in urls for n in reader.neighbors.get(url, []) if n not in urls}
        return sorted(linked, key=lambda u: (-reader.articles[u].pagerank, u))[: self.num_docs]

    def _best_sections(
        self, reader: PackReader, url: str, question_vector: np.ndarray, via: str
    ) -> list[ContextSection]:
        indexes = reader.sections_of.get(url, [])
        if not indexes:
            return []
        similarities = reader.section_vectors[indexes] @ question_vector
        order = np.argsort(-similarities)[: self.sections_per_doc]
        article = reader.articles[url]
        chosen = []
        for position in order:
            section = reader.sections[reader.section_ids[indexes[position]]]
            chosen.append(
                ContextSection(
                    section.section_id,
                    url,
                    article.title,
                    section.heading,
                    reader.section_text[section.section_id],
                    float(similarities[position]),
                    article.pagerank,
                    via,
                    anchor=section.anchor,
                )
            )
        return chosen
