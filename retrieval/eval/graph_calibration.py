"""Calibrating the graph weights on a pack's own questions (issue 10, item 3).

The balanced profile's graph settings (the GraphReranker's PageRank weight ``reranker_beta``,
the fusion weight of the personalized PageRank list ``graph_weight`` and its ``graph_damping``,
the second hop's ``graph_expand`` and ``graph_bridge_threshold``, and whether the graph stages
run at all) have defaults: the weights chosen on the shared benchmarks, and the graph as it
runs by default on the version (retrieval.profiles.graph_defaults: the profile's stages and the
version's own evidence). ``kpack eval PACK --write-config`` tries a small grid of them on the
pack's in-domain questions, searching as the balanced profile does (the weights with the graph
on), and keeps the setting with the best mean reciprocal rank of the first relevant passage. A setting replaces the default only
when it is strictly better, and a pack with fewer than MIN_QUESTIONS questions keeps the
defaults: a handful of questions must not steer every later query.

The grid is walked coordinate by coordinate (the two weights together, then the expansion, the
threshold, the damping, and the graph switched the other way), so it costs at most nineteen searches
per question, not every combination.
"""

from __future__ import annotations

from itertools import product
from typing import Any

from retrieval.agent import KnowledgeGraphAgent
from retrieval.eval.metrics import first_hit_rank, hit_at, mean_reciprocal_rank
from retrieval.eval.questions import Question
from retrieval.profiles import graph_defaults, profile_named
from retrieval.reader import PackReader

PROFILE = "balanced"
MIN_QUESTIONS = 5
DEPTH = 10
BETAS = (0.0, 0.1, 0.3)
WEIGHTS = (0.0, 0.5, 1.0)
EXPANDS = (0, 1, 3)
THRESHOLDS = (0.0, 0.3, 0.5)
DAMPINGS = (0.3, 0.5, 0.7)
KEYS = (
    "reranker_beta",
    "graph_weight",
    "graph_damping",
    "graph_expand",
    "graph_bridge_threshold",
    "enable_graph",
)


def calibrate_graph(reader: PackReader, questions: list[Question]) -> dict[str, Any]:
    """The grid's rows (settings, hit@1, hit@5, MRR), the defaults, the chosen settings and
    why. Searches the version ``reader`` holds, with no LLM."""
    asked = [q for q in questions if not q.out_of_domain and (q.gold_urls or q.answers)]
    default = _defaults(reader)
    if len(asked) < MIN_QUESTIONS:
        return {
            "questions": len(asked),
            "default": default,
            "chosen": default,
            "why": f"fewer than {MIN_QUESTIONS} in-domain questions with answers or gold URLs: "
            "the defaults stay",
            "rows": [],
        }
    rows: dict[tuple, dict] = {}

    def score(settings: dict[str, Any]) -> dict:
        key = tuple(settings[k] for k in KEYS)
        if key not in rows:
            rows[key] = _score(reader, asked, settings)
        return rows[key]

    def best_of(candidates: list[dict[str, Any]], incumbent: dict[str, Any]) -> dict[str, Any]:
        best, best_mrr = incumbent, score(incumbent)["mrr"]
        for settings in candidates:
            if score(settings)["mrr"] > best_mrr:
                best, best_mrr = settings, score(settings)["mrr"]
        return best

    # The graph's settings are tried with the graph on, whatever runs by default.
    chosen = best_of(
        [
            default | {"reranker_beta": b, "graph_weight": w, "enable_graph": True}
            for b, w in product(BETAS, WEIGHTS)
        ],
        default,
    )
    chosen = best_of([chosen | {"graph_expand": x} for x in EXPANDS], chosen)
    chosen = best_of([chosen | {"graph_bridge_threshold": t} for t in THRESHOLDS], chosen)
    chosen = best_of([chosen | {"graph_damping": d} for d in DAMPINGS], chosen)
    chosen = best_of([chosen | {"enable_graph": not chosen["enable_graph"]}], chosen)
    changed = {k: v for k, v in chosen.items() if v != default[k]}
    return {
        "questions": len(asked),
        "default": default,
        "chosen": chosen,
        "why": (
            f"best MRR on {len(asked)} questions: {score(chosen)['mrr']:.3f} "
            f"(defaults: {score(default)['mrr']:.3f})"
            if changed
            else f"no setting beat the defaults' MRR {score(default)['mrr']:.3f} on "
            f"{len(asked)} questions"
        ),
        "rows": list(rows.values()),
    }


def _defaults(reader: PackReader) -> dict[str, Any]:
    """The settings a search of the profile uses on this version, the graph as it runs by
    default there (retrieval.profiles.graph_defaults, with the version's evidence)."""
    settings = KnowledgeGraphAgent(reader, profile=PROFILE, use_llm=False).settings
    runs = graph_defaults(profile_named(PROFILE), reader.graph_choice.toggles)["enable_graph"]
    return {k: settings[k] for k in KEYS if k != "enable_graph"} | {"enable_graph": runs}


def _score(reader: PackReader, questions: list[Question], settings: dict[str, Any]) -> dict:
    agent = KnowledgeGraphAgent(reader, profile=PROFILE, use_llm=False, **settings)
    ranks = [first_hit_rank(agent.search(q.question, k=DEPTH), q) for q in questions]
    return {
        "settings": dict(settings),
        "hit@1": hit_at(ranks, 1),
        "hit@5": hit_at(ranks, 5),
        "mrr": mean_reciprocal_rank(ranks),
    }
