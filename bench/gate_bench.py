"""The confidence gate on the shared benchmarks, in one run (baseline and balanced, no key).

For each profile and pack, every question runs the profile's retrieve and gate stages, as a query does,
and the table counts the questions the gate refused: in-domain and out-of-domain questions of
the demo pack and the Python docs pack, near-miss unanswerable questions (refused by the gate
here; `kpack eval` also counts offline answers that decline), on the Python docs pack also
conala_dev's intents (by half: odd lines develop, even lines report) and
bench/everyday_questions.jsonl (out of domain), and on SQuAD the answerable questions
(eval_bench's sample of about 500, by half: even positions develop) and the 702 unanswerable
ones. It also prints the gate's reason for every refused out-of-domain and in-domain question
of the two docs packs, and how the counts move with the lexical rule's constants
(kpack.gate.COVERAGE_WEIGHT, COVERAGE_TARGET and COVERAGE_RELIEF; weight and relief 0 are the
similarity threshold alone), from the same run: each question's best similarity, coverage and
API-word margin do not depend on them. Last, how they move with the build calibration's
in-domain refusal limit (kpack.ingest.gate_calibration.IN_DOMAIN_REFUSAL_LIMIT): each pack's
probe similarities are measured again from the build's stored tables and probe cache, and
each question's verdict follows from its threshold at every limit (an API word counts where
its entry reaches that threshold).

    .venv/bin/python bench/gate_bench.py --demo /tmp/gate-demo/packs/demo \\
        --workdir /work/bench-ws      # or --python-docs PACK --squad PACK
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

from bench.corpora import BENCHMARKS  # noqa: E402
from bench.eval_bench import squad_questions  # noqa: E402
from kpack.embedding import effective_precision  # noqa: E402
from kpack.gate import (  # noqa: E402
    COVERAGE_PASSAGES,
    COVERAGE_RELIEF,
    COVERAGE_TARGET,
    COVERAGE_WEIGHT,
    coverage,
    required_similarity,
)
from kpack.ingest.gate_calibration import (  # noqa: E402
    IN_DOMAIN_REFUSAL_LIMIT,
    PROBE_CACHE_COLUMNS,
    choose_threshold,
    pack_probes,
    passage_vectors,
    probe_cache_namespace,
    probe_similarities,
)
from resources.storage import ContentCacheResource, ParquetStore  # noqa: E402
from retrieval.agent import KnowledgeGraphAgent  # noqa: E402
from retrieval.gate import API_WORD_MARGIN, pack_vocabulary, searched_words  # noqa: E402
from retrieval.query import GATED, run  # noqa: E402
from retrieval.registry import reading  # noqa: E402

GATE_PHASES = ("retrieve", "gate")
PROFILES = ("baseline", "balanced")
WEIGHTS = (0.0, 0.25, 0.3, 0.35, 0.4, 0.5)
TARGETS = (0.4, 0.5, 0.6)
RELIEFS = (0.0, 0.05, 0.08, 0.1, 0.12, 0.15)
LIMITS = (0.05, 0.04, 0.03, 0.02, 0.01)


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
                    "api_words": query.notes.get("api_words", {}),
                }
            )
    return rows


def gated_under(
    row: dict,
    weight: float = COVERAGE_WEIGHT,
    target: float = COVERAGE_TARGET,
    relief: float = COVERAGE_RELIEF,
    threshold: float | None = None,
) -> bool:
    """Whether the gate would refuse the question with these constants and threshold (the
    row's own when None; retrieval.gate's rule: a question that names an API the pack defines
    is never refused)."""
    gate = row["gate"]
    if "coverage" not in gate:
        return bool(gate.get("gated"))  # the pack defines an API it names, or nothing found
    if threshold is None:
        threshold, margin = row["threshold"], gate.get("api_margin", 0.0)
    else:
        named = any(entry >= threshold for entry in row["api_words"].values())
        margin = API_WORD_MARGIN if named else 0.0
    required = required_similarity(threshold, row["coverage"], weight, target, relief)
    return row["similarity"] < required - margin


def kind(item: dict) -> str:
    if item.get("out_of_domain"):
        return "out_of_domain"
    if item.get("unanswerable"):
        return "unanswerable"
    return f"in_domain {item['half']}" if item.get("half") else "in_domain"


KINDS = ("in_domain", "in_domain dev", "in_domain report", "out_of_domain", "unanswerable")


def counts(rows: list[dict], **rule: float) -> str:
    parts = []
    for label in KINDS:
        group = [r for r in rows if kind(r) == label]
        if group:
            gated = sum(gated_under(r, **rule) for r in group)
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
            cells = " | ".join(
                counts(rows, weight=weight, target=target) for rows in packs.values()
            )
            lines.append(f"| {weight} | {target if weight else '-'} | {cells} |")
    lines += [
        f"\n## Gated per pack as the relief varies (weight {COVERAGE_WEIGHT}, target "
        f"{COVERAGE_TARGET}; chosen: relief {COVERAGE_RELIEF})\n",
        "| relief | " + " | ".join(packs) + " |",
        "|---|" + "---|" * len(packs),
    ]
    for relief in RELIEFS:
        cells = " | ".join(counts(rows, relief=relief) for rows in packs.values())
        lines.append(f"| {relief} | {cells} |")
    lines.append(
        "\nThe weights that refuse every out-of-domain question and lose no in-domain one:"
    )
    lines += [f"- {feasible_weights(packs, target)}" for target in TARGETS]
    return lines


def limit_thresholds(pack: Path) -> dict[float, float]:
    """The threshold the build would calibrate for ``pack`` at each in-domain refusal limit,
    from its stored sections, chunks and vectors and its probe cache: in a bench workspace's
    storage/ beside its packs/, else the checkout's .kpack_storage."""
    workspace = pack.resolve().parents[1]
    storage = workspace / "storage"
    if not storage.is_dir():
        storage = workspace / ".kpack_storage"
    manifest = json.loads((pack / "manifest.json").read_text())
    embedding = manifest["embedding"]
    tables = {
        name: ParquetStore(str(storage)).read_cache(name, f"{pack.name}.parquet")
        for name in ("sections", "chunks", "embeddings")
    }
    namespace = probe_cache_namespace(
        embedding["model"], effective_precision(embedding["precision"])
    )
    cached = ContentCacheResource(base_path=str(storage)).load(
        namespace, pack.name, PROBE_CACHE_COLUMNS
    )

    def uncached(texts: list[str]) -> None:
        raise SystemExit(f"{pack.name}: {len(texts)} probes are not in the probe cache")

    measured = probe_similarities(
        pack_probes(tables["sections"], tables["chunks"]),
        passage_vectors(tables["sections"], tables["chunks"], tables["embeddings"]),
        uncached,
        cached,
    )
    return {
        limit: choose_threshold(measured.inside, measured.outside, limit)[0] for limit in LIMITS
    }


def limit_sensitivity(packs: dict[str, list[dict]], thresholds: dict[str, dict]) -> list[str]:
    lines = [
        "\n## Gated per pack as the build's in-domain refusal limit varies (chosen: "
        f"{IN_DOMAIN_REFUSAL_LIMIT}; each pack's threshold at the limit in brackets)\n",
        "| limit | " + " | ".join(packs) + " |",
        "|---|" + "---|" * len(packs),
    ]
    for limit in LIMITS:
        cells = " | ".join(
            f"({thresholds[name][limit]}) {counts(rows, threshold=thresholds[name][limit])}"
            for name, rows in packs.items()
        )
        lines.append(f"| {limit} | {cells} |")
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
    for label in KINDS:
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
    parser.add_argument("--workdir", type=Path, help="build_bench's workspace (its packs/)")
    parser.add_argument("--python-docs", type=Path, help="default: WORKDIR/packs/python_docs")
    parser.add_argument("--squad", type=Path, help="default: WORKDIR/packs/squad_wiki6")
    parser.add_argument(
        "--conala", type=Path, default=BENCHMARKS / "conala_dev" / "questions.jsonl"
    )
    args = parser.parse_args()
    if args.workdir is None and not (args.python_docs and args.squad):
        parser.error("give --workdir, or --python-docs and --squad")
    packs = args.workdir.resolve() / "packs" if args.workdir else Path()
    python_docs = args.python_docs or packs / "python_docs"
    squad_pack = args.squad or packs / "squad_wiki6"
    started = time.perf_counter()
    answerable, impossible = squad_questions()
    sample = answerable[:: max(1, len(answerable) // 500)]
    squad = [
        {"question": q.question, "half": "dev" if position % 2 == 0 else "report"}
        for position, q in enumerate(sample)
    ] + [{"question": q.question, "unanswerable": True} for q in impossible]
    demo = read_jsonl(args.demo / "eval" / "questions.jsonl")
    python = read_jsonl(REPO / "bench" / "python_docs_questions.jsonl")
    intents = [
        {**row, "half": "dev" if line % 2 else "report"}
        for line, row in enumerate(read_jsonl(args.conala), start=1)
        if row.get("gold_pages")
    ]
    everyday = [
        {**row, "out_of_domain": True}
        for row in read_jsonl(REPO / "bench" / "everyday_questions.jsonl")
    ]
    outcomes, thresholds = {}, {}
    for profile in PROFILES:
        outcomes[f"demo {profile}"] = gate_outcomes(args.demo, demo, profile)
        outcomes[f"python_docs {profile}"] = gate_outcomes(python_docs, python, profile)
        outcomes[f"conala_dev and everyday {profile}"] = gate_outcomes(
            python_docs, intents + everyday, profile
        )
        outcomes[f"squad_wiki6 {profile}"] = gate_outcomes(squad_pack, squad, profile)
    at_limit = {
        "demo": limit_thresholds(args.demo),
        "python_docs": limit_thresholds(python_docs),
        "conala_dev": limit_thresholds(python_docs),
        "squad_wiki6": limit_thresholds(squad_pack),
    }
    for name in outcomes:
        thresholds[name] = at_limit[name.split()[0]]
    lines = [line for name, rows in outcomes.items() for line in table(name, rows)]
    print("\n".join(lines + sensitivity(outcomes) + limit_sensitivity(outcomes, thresholds)))
    print(f"\n({time.perf_counter() - started:.0f} s)")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()
