"""Graph retrieval (issue 10): the entity-passage graph takes part in ranking.

Two stages, switched together by ``enable_graph``:

- ``graph_retrieval`` (retrieve phase, before fuse) links the question to the pack's entities
  (their normalised names, kpack.graph.linked_entities). When it names a specific one (at most
  SPECIFIC_ENTITY_PASSAGES passages name it: "Grace Krilanovich", not "United States"), it
  runs personalized PageRank over the entity-passage graph (kpack.graph) seeded by those
  entities (each weighted by how specific it is: one over the passages that name it) and, at
  PASSAGE_SEED_WEIGHT, by the best first-hop hits of vector and keyword search, and ranks the
  passages it reaches by PageRank times their cosine similarity to the question. Its list
  joins the vector and BM25 lists in fuse's reciprocal rank fusion at ``graph_weight``.
- ``graph_second_hop`` (rank phase, after the rerankers, before top_k) places after each of the
  ``graph_expand`` best passages the best passage of another article whose title that passage
  names (kpack.graph.second_hop: what a link leads to). A bridge is scored by its similarity
  to the question plus RESIDUAL_WEIGHT times the share of the question's terms that the first
  passage lacks and the bridge has (what the question still asks, idf-weighted); it is placed
  only when that score reaches ``graph_bridge_threshold``. This is how "Who directed the film
  shot in Leland, North Carolina?" reaches the film's page, which the question's own words do
  not.

The method and its constants were chosen on the shared benchmarks, never per question:
HotpotQA (multi-hop), SQuAD and the demo pack (single-hop), where seeding PageRank with
generic entities or with the first-hop hits at full weight, or bridging through entities that
are not titles, cost single-hop hit@5. Every candidate a graph stage
brings in or moves says which path did it ("via entity 'X' from passage Y"). The graph
(MENTIONS, LINKS_TO, ENTITY_RELATION) is written by the build as CSR arrays
(kpack.entity_graph_files) and mapped on the first query that needs it; PageRank is a local push from
the seeds (kpack.graph.personalized_pagerank), whose cost is bounded whatever the pack's size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kpack.contracts import section_of_chunk
from kpack.entity_graph_files import load_entity_graph
from kpack.graph import (
    EntityGraph,
    Visits,
    linked_entities,
    personalized_pagerank,
    second_hop,
    sorted_lookup,
    strongest_path,
)
from kpack.index_files import GRAPH_INDPTR
from kpack.keyword_index import KeywordIndex
from kpack.packs import INDEX_DIR
from kpack.text import search_terms
from kpack.vector_index import best_rows
from retrieval.candidates import passage, rrf_scores
from retrieval.query import Candidate, Query
from retrieval.reader import PackReader

NO_GRAPH = "this pack version has no entity graph (built before MENTIONS): rebuild it to use it"
# The method's constants (chosen on the shared benchmarks, not per pack).
SPECIFIC_ENTITY_PASSAGES = 5  # a question entity more passages name seeds nothing
SEED_PASSAGES = 3  # first-hop hits that seed PageRank, weighted 1/rank ...
PASSAGE_SEED_WEIGHT = 0.05  # ... times this (HippoRAG 2's passage node weight)
RESIDUAL_WEIGHT = 0.5  # a bridge's share of the question's terms its passage lacks


@dataclass(frozen=True)
class GraphIndex:
    """What the graph stages read, per pack version: the graph (passage node i is row i of the
    reader's chunk vectors, kpack.entity_graph_files.load_entity_graph) and the version's keyword index,
    whose postings and passage frequencies (kpack.text's one analyzer) say which passage holds
    which of a question's terms and how rare each is."""

    graph: EntityGraph
    node_of: Mapping[str, int]  # passage id -> passage node
    keywords: KeywordIndex
    reader: PackReader

    def terms(self, node: int) -> frozenset[str]:
        """The search terms of a passage node: its heading path and its text."""
        passage_id = self.graph.passages[node]
        heading = self.reader.sections[section_of_chunk(passage_id)].heading
        return frozenset(search_terms(f"{heading}\n{self.reader.chunk_text[passage_id]}"))

    def idf(self, term: str) -> float:
        held = self.keywords.frequency.get(term, 0)
        return math.log((self.keywords.passages + 1) / (held + 0.5)) if held else 0.0

    def weight(self, words: frozenset[str]) -> float:
        return sum(self.idf(w) for w in words)

    def share(self, words: frozenset[str], passages: np.ndarray) -> np.ndarray:
        """Per passage node, the idf-weighted share of ``words`` it holds (0 without words)."""
        held = np.zeros(len(passages))
        for word in words:
            holders, _ = self.keywords.postings(word)
            held += self.idf(word) * sorted_lookup(holders, passages)[1]
        total = self.weight(words)
        return held / total if total else held


def load_graph_index(reader: PackReader) -> GraphIndex | None:
    """The version's GraphIndex (kept with the version: ``reader.memo(load_graph_index)``);
    None for a pack without one."""
    folder = reader.version_dir / INDEX_DIR
    if not (folder / GRAPH_INDPTR).is_file():
        return None
    return GraphIndex(
        graph=load_entity_graph(folder, reader.chunk_ids),
        node_of=reader.chunk_row,  # passage nodes are numbered as the reader's chunk rows
        keywords=reader.keywords,
        reader=reader,
    )


def _first_hop(query: Query) -> list[str]:
    """Passage ids of the retrieval lists so far, by reciprocal rank fusion."""
    return list(rrf_scores([[hit.passage_id for hit in hits] for _, hits in query.rankings]))


def _label(query: Query, graph: EntityGraph, node: int) -> str:
    """A passage node as a reader would name it: its heading path, under its article title."""
    section = query.reader.sections[section_of_chunk(graph.passages[node])]
    title = query.reader.articles[section.article_url].title
    return section.heading if section.heading.startswith(title) else f"{title} > {section.heading}"


def entity_graph(query: Query) -> GraphIndex | None:
    """The version's entity graph, or None with the note that tells the user why a graph
    stage did nothing."""
    index = query.reader.memo(load_graph_index)
    if index is None:
        query.notes["graph"] = NO_GRAPH
    return index


class GraphRetriever:
    """Personalized PageRank from the question's specific entities and the first-hop hits;
    see the module docstring. Settings: ``graph_weight`` and ``graph_damping``."""

    name, phase, toggle = "graph_retrieval", "retrieve", "enable_graph"

    def __call__(self, query: Query) -> None:
        if query.settings.graph_weight <= 0:
            return
        index = entity_graph(query)
        if index is None:
            return
        graph = index.graph
        linked = linked_entities(graph, query.text)
        seeds = {
            node: 1.0 / graph.mentions_of(node)
            for node, _ in linked
            if 0 < graph.mentions_of(node) <= SPECIFIC_ENTITY_PASSAGES
        }
        query.notes["graph"] = {"question_entities": [graph.name_of(node) for node, _ in linked]}
        if not seeds:
            return  # no specific entity: the graph knows nothing the two searches do not
        for rank, passage_id in enumerate(_first_hop(query)[:SEED_PASSAGES], start=1):
            node = index.node_of.get(passage_id)
            if node is not None:
                seeds[node] = seeds.get(node, 0.0) + PASSAGE_SEED_WEIGHT / rank
        query.notes["graph"]["seeds"] = len(seeds)
        scores = personalized_pagerank(graph, seeds, query.settings.graph_damping)
        passages = scores.nodes < len(graph.passages)
        reached = scores.nodes[passages]
        if not len(reached):
            return
        similarity = query.passage_similarity(reached)
        ranking = scores.scores[passages] * np.clip(similarity, 0.0, None)
        order = best_rows(ranking, query.depth)  # best first, ties by passage
        found = []
        for rank, at in enumerate(order, start=1):
            if ranking[at] <= 0:
                break
            node = int(reached[at])
            candidate = passage(
                query.reader,
                graph.passages[node],
                section_of_chunk(graph.passages[node]),
                query.text,
            )
            if candidate is None:
                continue
            candidate.similarity = float(similarity[at])
            candidate.reasons.append(
                f"graph #{rank} (pagerank {scores[node]:.4f} x similarity "
                f"{candidate.similarity:.3f}; {self._path(query, graph, scores, seeds, node)})"
            )
            found.append(candidate)
        query.rankings.append(("graph", found))

    @staticmethod
    def _path(
        query: Query, graph: EntityGraph, scores: Visits, seeds: dict[int, float], node: int
    ) -> str:
        if node in seeds:
            return "a first-hop hit"
        entity, source = strongest_path(graph, scores, node, seeds)
        if entity is None:
            return "reached through the graph"
        name = graph.name_of(entity)
        if entity in seeds:
            return f"via entity {name!r} named in the question"
        if source is None:
            return f"via entity {name!r}"
        return f"via entity {name!r} from passage {_label(query, graph, source)!r}"


class SecondHop:
    """Bridges after the best passages; see the module docstring. Settings: ``graph_expand``
    and ``graph_bridge_threshold``."""

    name, phase, toggle = "graph_second_hop", "rank", "enable_graph"

    def __call__(self, query: Query) -> None:
        index = entity_graph(query)
        if index is None:
            return
        asked = frozenset(search_terms(query.text))
        ranked: list[Candidate] = []
        placed: set[str] = set()
        waiting = {c.passage_id: c for c in query.candidates}
        for position, candidate in enumerate(query.candidates):
            # A passage already placed as a bridge keeps its place, and still gets its own
            # bridge when it is one of the best: the chains of a multi-hop question.
            if candidate.passage_id not in placed:
                ranked.append(candidate)
                placed.add(candidate.passage_id)
            node = index.node_of.get(candidate.passage_id)
            if position >= query.settings.graph_expand or node is None:
                continue
            bridge = self._best_bridge(query, index, node, asked, placed)
            if bridge is None:
                continue
            other, score, how = bridge
            passage_id = index.graph.passages[other]
            moved = waiting.get(passage_id)
            if moved is None:
                moved = passage(query.reader, passage_id, section_of_chunk(passage_id), query.text)
                if moved is None:
                    continue
                moved.similarity = float(query.passage_similarity(other)[0])
                query.considered.append(moved)
            # It ranks right after the passage it bridges from, so it shares its scores.
            moved.rrf, moved.fused, moved.combined = (
                candidate.rrf,
                candidate.fused,
                candidate.combined,
            )
            moved.reasons.append(f"second hop (score {score:.3f}): {how}")
            after = next(i for i, c in enumerate(ranked) if c is candidate)
            ranked.insert(after + 1, moved)
            placed.add(passage_id)
        query.candidates = ranked

    @staticmethod
    def _best_bridge(
        query: Query, index: GraphIndex, node: int, asked: frozenset[str], placed: set[str]
    ) -> tuple[int, float, str] | None:
        """(passage node, score, the path in words) of the best bridge from ``node``."""
        graph = index.graph
        bridges = second_hop(graph, node)
        taken = [index.node_of[p] for p in placed if p in index.node_of]
        open_ = ~np.isin(bridges.passages, taken)
        rows, through = bridges.passages[open_], bridges.entities[open_]
        if not len(rows):
            return None
        score = query.passage_similarity(rows) + RESIDUAL_WEIGHT * index.share(
            asked - index.terms(node), rows
        )
        at = int(np.lexsort((np.arange(len(rows)), -score))[0])  # best, the first on a tie
        if score[at] < query.settings.graph_bridge_threshold:
            return None
        how = (
            f"via entity {graph.name_of(int(through[at]))!r} from passage "
            f"{_label(query, graph, node)!r}"
        )
        return int(rows[at]), float(score[at]), how
