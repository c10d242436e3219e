"""Personalized PageRank on the seeds' neighbourhood (kpack.graph, issue 20)."""

from __future__ import annotations

import math

import numpy as np

from kpack import graph as kg
from kpack.graph import build_entity_graph, personalized_pagerank, walk_nodes


def chain_graph(passages: int, generic_mentions: int = 0) -> kg.EntityGraph:
    """Passages p0..pN in a chain through entities e_i (p_i and p_i+1 both name e_i), and a
    "generic" entity that the first ``generic_mentions`` passages also name."""
    ids = [(f"p{i}", f"a{i}") for i in range(passages)]
    entities = [(f"e{i}", f"E{i}") for i in range(passages)] + [("generic", "Generic")]
    mentions = [(f"p{i}", f"e{i}", True) for i in range(passages)]
    mentions += [(f"p{i + 1}", f"e{i}", True) for i in range(passages - 1)]
    mentions += [(f"p{i}", "generic", True) for i in range(generic_mentions)]
    return build_entity_graph(ids, entities, mentions)


def whole_graph_pagerank(graph: kg.EntityGraph, seeds: dict[int, float], damping: float):
    """The power iteration over every node, as queries ran it before it was bounded."""
    restart = np.zeros(graph.size, dtype=np.float32)
    for node, weight in seeds.items():
        restart[node] = weight / sum(seeds.values())
    scores = restart.copy()
    steps = math.ceil(math.log(kg.PAGERANK_TOLERANCE) / math.log(damping))
    for _ in range(steps):
        scores = damping * (graph.transition @ scores) + (1 - damping) * restart
    return scores


def test_the_bounded_walk_gives_the_whole_graphs_pagerank_when_the_neighbourhood_fits():
    graph = chain_graph(40)
    seeds = {0: 1.0, graph.entity_node("e3"): 0.5}
    np.testing.assert_allclose(
        personalized_pagerank(graph, seeds, 0.5),
        whole_graph_pagerank(graph, seeds, 0.5),
        atol=1e-6,
    )


def test_the_walk_stays_near_its_seeds_and_does_not_pass_through_a_generic_entity(monkeypatch):
    graph = chain_graph(60, generic_mentions=30)
    passage = graph.passages.index
    generic = graph.entity_node("generic")
    monkeypatch.setattr(kg, "MAX_EXPANDED_PASSAGES", 10)
    near = walk_nodes(graph, [passage("p0")], 4)
    # p0 -> e0 -> p1 -> e1 -> p2 along the chain: nothing farther than 4 edges, and the
    # generic entity is reached but not walked through to the 30 passages that name it.
    assert passage("p2") in near and passage("p3") not in near
    assert generic in near and passage("p29") not in near
    monkeypatch.setattr(kg, "MAX_EXPANDED_PASSAGES", 1000)
    assert passage("p29") in walk_nodes(graph, [passage("p0")], 4)
