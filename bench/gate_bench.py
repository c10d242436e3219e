"""The confidence gate on the shared benchmarks, in one run (baseline and balanced, no key).

For each profile and pack, every question runs the profile's retrieve and gate stages, as a query does,
and the table counts the questions the gate refused: in-domain and out-of-domain questions of
the demo pack and the Python docs pack, near-miss unanswerable questions (refused by the gate
here; `kpack eval` also counts offline answers that decline), and on SQuAD the answerable
questions (eval_bench's sample of about 500) and the 702 unanswerable ones. It also prints
the gate's reason for every refused out-of-domain and in-domain question of the two docs
packs, and how the counts move with the lexical rule's constants (kpack.gate.COVERAGE_WEIGHT
and COVERAGE_TARGET; weight 0 is the similarity threshold alone), from the same run: each
question's best similarity and coverage do not depend on them.

    .venv/bin/python bench/gate_bench.py --demo /tmp/gate-demo/packs/demo \\
        --workdir /work/bench-ws
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.eval_bench import squad_questions  # noqa: E402
from kpack.gate import COVERAGE_PASSAGES, COVERAGE_TARGET, COVERAGE_WEIGHT, coverage  # noqa: E402
from retrieval.agent import KnowledgeGraphAgent  # noqa: E402
from retrieval.gate import pack_vocabulary, searched_words  # noqa: E402
from retrieval.query import GATED, run  # noqa: E402
from retrieval.registry import reading  # noqa: E402

GATE_PHASES = ("retrieve", "gate")
PROFILES = ("baseline", "balanced")
WEIGHTS = (0.0, 0.25, 0.3, 0.35, 0.4, 0.5)
TARGETS = (0.4, 0.5, 0.6)


def gate_outcomes(pack: Path, questions: list[dict], profile: str) -> list[dict]:
    """Each question with whether the gate refused it and the gate's trace entry."""
    agent = KnowledgeGraphAgent(pack, profile=profile, use_llm=False)
    rows = []
    with reading(agent.source) as reader:
        stages = [s for s in agent._plan(reader).stages if s.phase in GATE_PHASES]
        vocabulary = pack_vocabulary(reader)
        for item in questions:
            query = run(agent._new_query(reader, item["question"], 5), stages)
            threshold = query.settings.context_confidence_threshold
            # The coverage of every question, also of those the similarity alone refused, of
            # the words the gate reads (the prose, without the asker's own names and values).
            passages = [c.text for c in query.considered[:COVERAGE_PASSAGES]]
            evidence = coverage(searched_words(query), passages, vocabulary, threshold)
            rows.append(
                item
                | {
                    "gated": query.query_type == GATED,
                    "similarity": query.max_similarity or 0.0,
                    "coverage": evidence.share,
                    "gate": query.notes.get("gate", {}),
                    "threshold": threshold,
                }
            )
    return rows


def gated_under(row: dict, weight: float, target: float) -> bool:
    """Whether the gate would refuse the question with these constants."""
    required = row["threshold"] + weight * max(0.0, target - row["coverage"])
    return row["similarity"] < row["threshold"] or row["similarity"] < required


def kind(item: dict) -> str:
    if item.get("out_of_domain"):
        return "out_of_domain"
    return "unanswerable" if item.get("unanswerable") else "in_domain"


def counts(rows: list[dict], weight: float, target: float) -> str:
    parts = []
    for label in ("in_domain", "out_of_domain", "unanswerable"):
        group = [r for r in rows if kind(r) == label]
        if group:
            gated = sum(gated_under(r, weight, target) for r in group)
            parts.append(f"{label} {gated}/{len(group)}")
    return ", ".join(parts)


def sensitivity(packs: dict[str, list[dict]]) -> list[str]:
    lines = [
        f"\n## Gated per pack as the constants vary (chosen: weight {COVERAGE_WEIGHT}, "
        f"target {COVERAGE_TARGET})\n",
        "| weight | target | " + " | ".join(packs) + " |",
        "|---|---|" + "---|" * len(packs),
    ]
    for weight in WEIGHTS:
        for target in TARGETS if weight else TARGETS[:1]:
            cells = " | ".join(counts(rows, weight, target) for rows in packs.values())
            lines.append(f"| {weight} | {target if weight else '-'} | {cells} |")
    lines.append(
        "\nThe weights that refuse every out-of-domain question and lose no in-domain one:"
    )
    lines += [f"- {feasible_weights(packs, target)}" for target in TARGETS]
    return lines


def feasible_weights(packs: dict[str, list[dict]], target: float) -> str:
    """At this target: the least weight that refuses every out-of-domain question, and per
    pack the most weight that refuses no in-domain question the similarity alone answers."""
    low, high = 0.0, {name: float("inf") for name in packs}
    for name, rows in packs.items():
        for row in rows:
            margin = row["similarity"] - row["threshold"]
            if margin < 0 or kind(row) == "unanswerable":
                continue  # refused by the similarity alone, or not a question of the rule
            # Covered at least to the target: no weight refuses it.
            bound = margin / (target - row["coverage"]) if row["coverage"] < target else math.inf
            if kind(row) == "out_of_domain":
                low = max(low, bound)
            else:
                high[name] = min(high[name], bound)
    most = ", ".join(f"{name} {bound:.3f}" for name, bound in high.items())
    return (
        f"target {target}: out-of-domain all refused above {low:.3f}; in-domain kept up to {most}"
    )


def table(name: str, rows: list[dict]) -> list[str]:
    lines = [f"\n## {name} (threshold {rows[0]['threshold']})\n"]
    for label in ("in_domain", "out_of_domain", "unanswerable"):
        group = [r for r in rows if kind(r) == label]
        if group:
            gated = sum(r["gated"] for r in group)
            lines.append(f"- {label}: gated {gated} of {len(group)} ({gated / len(group):.1%})")
    for row in rows:
        if row["gated"] and kind(row) != "unanswerable" and len(rows) < 200:
            lines.append(f"  - [{kind(row)}] {row['question']} -> {row['gate'].get('why')}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", type=Path, required=True, help="a built demo pack folder")
    parser.add_argument("--workdir", type=Path, required=True, help="build_bench's workspace")
    args = parser.parse_args()
    packs = args.workdir.resolve() / "packs"
    started = time.perf_counter()
    answerable, impossible = squad_questions()
    sample = answerable[:: max(1, len(answerable) // 500)]
    squad = [{"question": q.question} for q in sample] + [
        {"question": q.question, "unanswerable": True} for q in impossible
    ]
    demo = read_jsonl(args.demo / "eval" / "questions.jsonl")
    python = read_jsonl(REPO / "bench" / "python_docs_questions.jsonl")
    outcomes = {}
    for profile in PROFILES:
        outcomes[f"demo {profile}"] = gate_outcomes(args.demo, demo, profile)
        outcomes[f"python_docs {profile}"] = gate_outcomes(packs / "python_docs", python, profile)
        outcomes[f"squad_wiki6 {profile}"] = gate_outcomes(packs / "squad_wiki6", squad, profile)
    lines = [line for name, rows in outcomes.items() for line in table(name, rows)]
    print("\n".join(lines + sensitivity(outcomes)))
    print(f"\n({time.perf_counter() - started:.0f} s)")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()
