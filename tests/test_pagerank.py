"""Personalized PageRank by local push (kpack.graph, issue 20)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kpack import graph as kg
from kpack.graph import build_entity_graph, personalized_pagerank


def chain_graph(passages: int, generic_named_by: Iterable[int] = ()) -> kg.EntityGraph:
    """Passages p0..pN in a chain through entities e_i (p_i and p_i+1 both name e_i), and a
    "generic" entity that the passages ``generic_named_by`` also name."""
    ids = [(f"p{i}", f"a{i}") for i in range(passages)]
    entities = [(f"e{i}", f"E{i}") for i in range(passages)] + [("generic", "Generic")]
    mentions = [(f"p{i}", f"e{i}", True) for i in range(passages)]
    mentions += [(f"p{i + 1}", f"e{i}", True) for i in range(passages - 1)]
    mentions += [(f"p{i}", "generic", True) for i in generic_named_by]
    return build_entity_graph(ids, entities, mentions)


def whole_graph_pagerank(graph: kg.EntityGraph, seeds: dict[int, float], damping: float):
    """Personalized PageRank over every node, solved exactly (what the push approximates)."""
    transition = np.zeros((graph.size, graph.size))
    matrix = graph.transition
    for row in range(graph.size):
        columns, shares = matrix.row(row)
        transition[row, columns] = shares
    restart = np.zeros(graph.size)
    for node, weight in seeds.items():
        restart[node] = weight / sum(seeds.values())
    return np.linalg.solve(np.eye(graph.size) - damping * transition, (1 - damping) * restart)


def test_the_push_gives_the_whole_graphs_pagerank():
    graph = chain_graph(40, generic_named_by=range(10))
    seeds = {0: 1.0, graph.entity_node("e3"): 0.5}
    exact = whole_graph_pagerank(graph, seeds, 0.5)
    visits = personalized_pagerank(graph, seeds, 0.5, epsilon=1e-9)
    np.testing.assert_allclose(visits.of(np.arange(graph.size)), exact, atol=1e-6)
    assert np.isclose(visits.sum(), 1.0)
    # At the default precision the ranking of the passages the walk favours is the same.
    coarse = personalized_pagerank(graph, seeds, 0.5)
    best = np.argsort(-exact[: len(graph.passages)])[:5]
    assert list(np.argsort(-coarse.of(np.arange(len(graph.passages))))[:5]) == list(best)


def test_the_push_stays_near_its_seeds_and_does_not_pass_through_a_generic_entity():
    # p2, two hops from the seed, names the generic entity, and so do p20..p59.
    graph = chain_graph(60, generic_named_by=[2, *range(20, 60)])
    passage = graph.passages.index
    generic = graph.entity_node("generic")
    visits = personalized_pagerank(graph, {passage("p0"): 1.0}, 0.5, epsilon=1e-3)
    # Near passages along the chain are reached, far ones are not; the generic entity gets
    # its share but, named by 41 passages, holds too little of the walk to pass it on to them.
    assert visits[passage("p1")] > visits[passage("p2")] > 0
    assert visits[passage("p12")] == 0
    assert visits[generic] > 0 and visits[passage("p30")] == 0
    # Seeded itself, it is walked through like any other node.
    assert personalized_pagerank(graph, {generic: 1.0}, 0.5, epsilon=1e-3)[passage("p30")] > 0
