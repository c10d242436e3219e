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
brings in or moves says which path did it ("via entity 'X' from passage Y"). The graph is
built once per pack version, on the first query that needs it, from the tables of the pack
(MENTIONS, LINKS_TO, ENTITY_RELATION); a pack built before MENTIONS existed has none, and the
stages then leave the ranking as it is and say so in the trace.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from kpack.contracts import section_of_chunk
from kpack.graph import (
    EntityGraph,
    build_entity_graph,
    linked_entities,
    personalized_pagerank,
    second_hop,
    strongest_path,
)
from kpack.text import normalize_entity
from retrieval.candidates import RRF_K, passage
from retrieval.quality import terms
from retrieval.query import Candidate, Query
from retrieval.reader import PackReader, best_rows

CACHE_KEY = "entity_graph"
NO_GRAPH = "this pack version has no entity graph (built before MENTIONS): rebuild it to use it"
# The method's constants (chosen on the shared benchmarks, not per pack).
SPECIFIC_ENTITY_PASSAGES = 5  # a question entity more passages name seeds nothing
SEED_PASSAGES = 3  # first-hop hits that seed PageRank, weighted 1/rank ...
PASSAGE_SEED_WEIGHT = 0.05  # ... times this (HippoRAG 2's passage node weight)
RELATION_WEIGHT = 0.5  # an ENTITY_RELATION edge, against 1 for a mention
RESIDUAL_WEIGHT = 0.5  # a bridge's share of the question's terms its passage lacks

_build_lock = threading.Lock()


@dataclass(frozen=True)
class GraphIndex:
    """What the graph stages read, per pack version: the graph (passage node i is row i of the
    reader's chunk vectors) and each passage's content terms with their idf."""

    graph: EntityGraph
    node_of: dict[str, int]  # passage id -> passage node
    terms: tuple[frozenset[str], ...]
    idf: dict[str, float]
    postings: dict[str, np.ndarray]  # term -> the passage nodes that hold it, ascending

    def weight(self, words: frozenset[str]) -> float:
        return sum(self.idf.get(w, 0.0) for w in words)

    def share(self, words: frozenset[str], passages: np.ndarray) -> np.ndarray:
        """Per passage node, the idf-weighted share of ``words`` it holds (0 without words)."""
        held = np.zeros(len(passages))
        for word in words:
            holders = self.postings.get(word)
            if holders is not None:
                at = np.minimum(np.searchsorted(holders, passages), len(holders) - 1)
                held += self.idf[word] * (holders[at] == passages)
        total = self.weight(words)
        return held / total if total else held


def graph_index(reader: PackReader) -> GraphIndex | None:
    """The reader's GraphIndex, built on first use; None for a pack without MENTIONS."""
    if CACHE_KEY not in reader.cache:
        with _build_lock:
            if CACHE_KEY not in reader.cache:
                reader.cache[CACHE_KEY] = _build_index(reader)
    index = reader.cache[CACHE_KEY]
    return index if isinstance(index, GraphIndex) else None


def _build_index(reader: PackReader) -> GraphIndex | None:
    try:
        mentions = reader.query(
            "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) RETURN c.chunk_id, e.entity_id"
        )
    except RuntimeError:  # Kuzu: the table does not exist in a pack built before it did
        return None
    entities = reader.query("MATCH (e:Entity) RETURN e.entity_id, e.name ORDER BY e.entity_id")
    links = reader.query("MATCH (a:Article)-[:LINKS_TO]->(b:Article) RETURN a.url, b.url")
    relations = reader.query(
        "MATCH (a:Entity)-[:ENTITY_RELATION]->(b:Entity) RETURN a.entity_id, b.entity_id"
    )
    passages = [
        (chunk, reader.sections[section_of_chunk(chunk)].article_url) for chunk in reader.chunk_row
    ]
    graph = build_entity_graph(
        passages,
        [(key, name) for key, name in entities],
        [(chunk, key) for chunk, key in mentions],
        titles={url: normalize_entity(a.title or "") for url, a in reader.articles.items()},
        links=[(a, b) for a, b in links],
        relations=[(a, b) for a, b in relations],
        relation_weight=RELATION_WEIGHT,
    )
    passage_terms = tuple(
        terms(f"{reader.sections[section_of_chunk(chunk)].heading}\n{reader.chunk_text[chunk]}")
        for chunk in reader.chunk_row
    )
    holders: dict[str, list[int]] = {}
    for node, words in enumerate(passage_terms):
        for word in words:
            holders.setdefault(word, []).append(node)
    total = len(passage_terms)
    return GraphIndex(
        graph=graph,
        node_of=reader.chunk_row,  # passage nodes are numbered as the reader's chunk rows
        terms=passage_terms,
        idf={word: math.log((total + 1) / (len(n) + 0.5)) for word, n in holders.items()},
        postings={word: np.array(nodes, dtype=np.int64) for word, nodes in holders.items()},
    )


def _first_hop(query: Query) -> list[str]:
    """Passage ids of the retrieval lists so far, by reciprocal rank fusion."""
    scores: dict[str, float] = {}
    for _, hits in query.rankings:
        for rank, hit in enumerate(hits, start=1):
            scores[hit.passage_id] = scores.get(hit.passage_id, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores, key=lambda p: -scores[p])


def _label(query: Query, graph: EntityGraph, node: int) -> str:
    """A passage node as a reader would name it: its heading path, under its article title."""
    section = query.reader.sections[section_of_chunk(graph.passages[node])]
    title = query.reader.articles[section.article_url].title
    return section.heading if section.heading.startswith(title) else f"{title} > {section.heading}"


class GraphRetriever:
    """Personalized PageRank from the question's specific entities and the first-hop hits;
    see the module docstring. Settings: ``graph_weight`` and ``graph_damping``."""

    name, phase, toggle = "graph_retrieval", "retrieve", "enable_graph"

    def __call__(self, query: Query) -> None:
        if query.settings.graph_weight <= 0:
            return
        index = graph_index(query.reader)
        if index is None:
            query.notes["graph"] = NO_GRAPH
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
        reached = np.flatnonzero(scores[: len(graph.passages)] > 0)
        if not len(reached):
            return
        similarity = query.passage_similarity[reached]
        ranking = scores[reached] * np.clip(similarity, 0.0, None)
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
        query: Query, graph: EntityGraph, scores: np.ndarray, seeds: dict[int, float], node: int
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
        index = graph_index(query.reader)
        if index is None:
            query.notes["graph"] = NO_GRAPH
            return
        asked = terms(query.text)
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
                moved.similarity = float(query.passage_similarity[other])
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
        score = query.passage_similarity[rows] + RESIDUAL_WEIGHT * index.share(
            asked - index.terms[node], rows
        )
        at = int(np.lexsort((np.arange(len(rows)), -score))[0])  # best, the first on a tie
        if score[at] < query.settings.graph_bridge_threshold:
            return None
        how = (
            f"via entity {graph.name_of(int(through[at]))!r} from passage "
            f"{_label(query, graph, node)!r}"
        )
        return int(rows[at]), float(score[at]), how
