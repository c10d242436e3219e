"""The pack's own evidence for its graph stages (issue 23) and page crowding (issue 32): which
of them run by default.

The graph stages help on some packs and cost on others (the entity graph lifts multi-hop
Wikipedia questions and cost documentation packs hit@5; the documentation graph needs section
links). So each pack measures them on its own questions: those of ``eval/questions.jsonl``,
or, without enough of them, a self-check on questions made offline from its headings and
section links (retrieval.eval.generate.offline_questions, none a probe of the gate's
calibration). Every question is searched under each configuration of the two toggles
(:data:`CONFIGURATIONS`: neither, which is baseline's ranking, the documentation graph, the
entity graph, and both), and both graphs run, as the balanced profile has them, unless a
cheaper configuration finds significantly more of the questions (a gold page in the top 5, every
gold page for a question with several): a one-sided sign test over the questions the two
disagree on (:data:`SIGNIFICANCE`). Of several such, the one finding the most more, the cheaper
on a tie. A self-check of 60 questions cannot tell near-equal configurations apart, and taking
the best of them by a point of MRR chose at random (bench/HISTORY.md, stop 49).

Page crowding (retrieval.crowding: one passage of a page before every other page's best) is
then measured with the chosen toggles: it helps where a question's answer may lie on any of
many pages, and costs where one page holds every passage a question needs (a pack of a few long
articles, whose self-check has too few questions to measure anything and so keeps it off). It
runs by default when it loses on none of hit@1, hit@5 and the share of several-page questions
with every page in the top 5, and finds more of the questions: a better MRR alone is one rank
swapped on a few dozen questions (the demo pack's own 32 chose it by an MRR of 0.0006),
not evidence for a stage the profile leaves off.

The build records the result beside the version it measured (kpack.graph_evidence, written by
assets.evaluate.graph_evidence); queries take its toggles as the pack's defaults,
``kpack status`` says which graph is on and why, and ``kpack eval`` shows the same comparison
on the questions it evaluates.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import retrieval
from kpack.changes import code_digest
from kpack.graph_evidence import CROWDING, GRAPH_TOGGLES
from retrieval.agent import KnowledgeGraphAgent
from retrieval.eval.generate import offline_questions
from retrieval.eval.metrics import all_gold_rank, first_hit_rank, hit_at, mean_reciprocal_rank
from retrieval.eval.questions import Question, load_questions
from retrieval.reader import QUESTIONS_FILE, PackReader

PROFILE = "balanced"  # the profile that has every graph stage
# The code that measures: the whole query pipeline, whose stages the configurations compare.
PIPELINE_CODE_VERSION = code_digest(retrieval)
DEPTH = 10
MIN_QUESTIONS = 10  # fewer: too few to show anything, the graph stays off
BASELINE = "baseline"
BOTH = "both graphs"
# Cheapest first: on a tie the cheaper configuration wins.
CONFIGURATIONS: dict[str, dict[str, bool]] = {
    BASELINE: {"enable_graph": False, "enable_doc_graph": False},
    "documentation graph": {"enable_graph": False, "enable_doc_graph": True},
    "entity graph": {"enable_graph": True, "enable_doc_graph": False},
    BOTH: {"enable_graph": True, "enable_doc_graph": True},
}
COMPARED = ("hit@1", "hit@5", "all_gold@5")  # a configuration may lose on none of these
CROWDED = 1  # passages of one page before every other page's best, where crowding is kept
UNCROWDED = {CROWDING: 0}
# The configurations are compared with vector search ranking passages by their own vectors,
# not blended with their best sentence's (retrieval.candidates.vector_score): the graph stages
# and page crowding are then chosen as in a version without a sentence index, so whether a
# pack has one does not change which of them run (bench/HISTORY.md, stop 49).
PASSAGES_ALONE = {"sentence_weight": 0.0}
FOUND = "found"  # a score's per-question outcomes, which the record does not keep
# A configuration without a graph stage replaces both graphs only when it finds more of the
# questions than both graphs by a one-sided sign test at this level, over the questions the two
# disagree on. Resampled self-checks of 60 questions chose among near-equal configurations at
# random (the Python docs pack: both graphs 54%, the documentation graph 46%; bench/HISTORY.md,
# stop 49), and which one ran decided conala_dev's hit@5 (0.678 or 0.557) and HotpotQA's
# recall@5 (0.94 or 0.81) where the self-check's questions could not tell them apart.
SIGNIFICANCE = 0.05


def score(reader: PackReader, questions: list[Question], settings: dict[str, Any]) -> dict:
    """hit@1, hit@5, MRR and (over questions with several gold pages) all_gold@5 of the
    balanced profile's search with these toggles and settings, no LLM, passages ranked by
    their own vectors (PASSAGES_ALONE); and, under FOUND, which questions it found (a gold page
    in the top 5; every gold page there for a question with several)."""
    agent = KnowledgeGraphAgent(
        reader, profile=PROFILE, use_llm=False, **(PASSAGES_ALONE | settings)
    )
    ranks, complete, found = [], [], []
    for question in questions:
        hits = agent.search(question.question, k=DEPTH)
        rank = first_hit_rank(hits, question)
        ranks.append(rank)
        if len(set(question.gold_urls)) > 1:
            complete.append(all_gold_rank(hits, question))
            rank = complete[-1]
        found.append(rank is not None and rank <= 5)
    return {
        "hit@1": round(hit_at(ranks, 1), 4),
        "hit@5": round(hit_at(ranks, 5), 4),
        "mrr": round(mean_reciprocal_rank(ranks), 4),
        "all_gold@5": round(hit_at(complete, 5), 4) if complete else None,
        "questions": len(ranks),
        "several_gold": len(complete),
        FOUND: found,
    }


def _loses(row: dict, baseline: dict) -> list[str]:
    return [m for m in COMPARED if (row[m] or 0.0) < (baseline[m] or 0.0)]


# The measures a why reports, as "before -> after".
REPORTED = ("all_gold@5", "hit@5", "mrr", "hit@1")


def found_at_5(row: dict) -> int:
    """The questions a configuration finds: those with a gold page in the top 5, and those
    with several gold pages that have every one there."""
    return round(row["hit@5"] * row["questions"]) + round(
        (row["all_gold@5"] or 0.0) * row["several_gold"]
    )


def _gains(row: dict, before: dict) -> str:
    return ", ".join(
        f"{m} {before[m]:.3f} -> {row[m]:.3f}"
        for m in REPORTED
        if row[m] is not None and row[m] != before[m]
    )


def sign_test(gained: int, lost: int) -> float:
    """The one-sided sign test's p-value of ``gained`` against ``lost`` questions: the chance
    of at least ``gained`` of ``gained + lost`` coin flips coming up heads."""
    flips = gained + lost
    return sum(math.comb(flips, k) for k in range(gained, flips + 1)) / 2**flips if flips else 1.0


def choose(rows: dict[str, dict]) -> tuple[str, str]:
    """(the configuration chosen, why), from each configuration's scores and outcomes (FOUND):
    both graphs, as the profile has them, unless a cheaper configuration finds significantly
    more of the questions (SIGNIFICANCE); of several, the one finding the most more, the
    cheaper on a tie."""
    full = rows[BOTH][FOUND]
    compared = {}
    for name, row in rows.items():
        if name == BOTH:
            continue
        gained = sum(mine and not theirs for mine, theirs in zip(row[FOUND], full, strict=True))
        lost = sum(theirs and not mine for mine, theirs in zip(row[FOUND], full, strict=True))
        compared[name] = (gained, lost, sign_test(gained, lost))
    better = [name for name, (_, _, p) in compared.items() if p < SIGNIFICANCE]
    tally = "; ".join(
        f"{name} finds {gained} that both graphs miss and misses {lost} they find (p {p:.2f})"
        for name, (gained, lost, p) in compared.items()
    )
    if not better:
        return (
            BOTH,
            f"no configuration finds significantly more questions than both graphs ({tally})",
        )
    best = max(
        better, key=lambda name: (compared[name][0] - compared[name][1], -list(rows).index(name))
    )
    return best, f"{best} finds significantly more questions than both graphs ({tally})"


def choose_crowding(crowded: dict, uncrowded: dict) -> tuple[int, str]:
    """(passages per page, why) from the chosen configuration's scores with page crowding and
    without: kept when it loses on none of COMPARED and finds more of the questions."""
    lost = _loses(crowded, uncrowded)
    if lost:
        return 0, f"page crowding off: it loses on {', '.join(lost)}"
    if found_at_5(crowded) <= found_at_5(uncrowded):
        return 0, "page crowding off: it finds no more of the questions"
    return CROWDED, f"page crowding on: {_gains(crowded, uncrowded)}"


def graph_evidence(reader: PackReader, questions: list[Question], source: str) -> dict[str, Any]:
    """The evidence record (see the module docstring): the questions' ``source`` in words,
    each configuration's scores, the toggles chosen and why."""
    asked = [q for q in questions if q.answerable and q.gold_urls]
    if len(asked) < MIN_QUESTIONS:
        return {
            "source": source,
            "questions": len(asked),
            **dict.fromkeys(GRAPH_TOGGLES, False),
            **UNCROWDED,
            "chosen": BASELINE,
            "why": f"{len(asked)} questions with gold pages are too few to show that a graph "
            f"stage or page crowding does not lose to baseline (at least {MIN_QUESTIONS} are "
            "needed)",
            "configurations": {},
        }
    started = time.perf_counter()
    rows: dict[str, dict] = {}
    for name, toggles in CONFIGURATIONS.items():
        rows[name] = score(reader, asked, toggles | UNCROWDED)
    chosen, why = choose(rows)
    crowded = score(reader, asked, CONFIGURATIONS[chosen] | {CROWDING: CROWDED})
    per_page, crowding_why = choose_crowding(crowded, rows[chosen])
    for row in (*rows.values(), crowded):
        del row[FOUND]
    return {
        "source": source,
        "questions": len(asked),
        **CONFIGURATIONS[chosen],
        CROWDING: per_page,
        "chosen": chosen,
        "why": f"{why}; {crowding_why}",
        "configurations": rows,
        "crowded": crowded,
        "seconds": round(time.perf_counter() - started, 3),
    }


SELF_CHECK_QUESTIONS = 60


def pack_evidence(folder: Path, version_dir: Path) -> dict[str, Any]:
    """The evidence record of one published version: measured on the pack's
    eval/questions.jsonl when it has at least MIN_QUESTIONS usable ones, else on a self-check
    of SELF_CHECK_QUESTIONS questions made offline from its headings."""
    with PackReader(folder, version_dir) as reader:
        path = folder / QUESTIONS_FILE
        own = load_questions(path, folder)[0] if path.is_file() else []
        asked = [q for q in own if q.answerable and q.gold_urls]
        if len(asked) >= MIN_QUESTIONS:
            return graph_evidence(reader, asked, f"the pack's {len(asked)} questions ({path.name})")
        made = offline_questions(reader, SELF_CHECK_QUESTIONS)
        checks = [
            Question(number, item["question"], item["id"], gold_urls=item["gold_urls"])
            for number, item in enumerate(made, start=1)
        ]
        return graph_evidence(
            reader,
            checks,
            f"a self-check of {len(checks)} questions made offline from its headings and "
            "section links",
        )
