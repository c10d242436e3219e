"""Evaluation reports: the summary table (Markdown, DataFrame), the chart comparing the
conditions side by side, and the result files under ``eval/results/``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

SUMMARY_COLUMNS = (
    "hit@1",
    "hit@5",
    "hit@10",
    "mrr",
    "all_gold@5",
    "all_gold@10",
    "judge_accuracy",
    "containment",
    "answer_terms",
    "gold_span_top5",
    "citation_support",
    "token_f1",
    "gate_rate_in_domain",
    "gate_rate_out_of_domain",
    "refusal_rate_unanswerable",
    "citation_rate",
)
CHART_METRICS = (
    "hit@1",
    "hit@5",
    "mrr",
    "answer",
    "gate_rate_in_domain",
    "gate_rate_out_of_domain",
    "refusal_rate_unanswerable",
)
CHART_LABELS = {
    "mrr": "MRR",
    "gate_rate_in_domain": "gated\n(in domain)",
    "gate_rate_out_of_domain": "gated\n(out of domain)",
    "refusal_rate_unanswerable": "refused\n(near miss)",
}


def headline(results: dict) -> dict:
    """The summary row a run is judged by: balanced, else the first condition evaluated."""
    summary = results["summary"]
    return summary.get("balanced") or summary[results["conditions"][0]]


def answer_score(row: dict) -> float | None:
    """Judge accuracy when a judge ran, else answer containment (runs saved before the field
    was named judge_accuracy have containment only)."""
    judged = row.get("judge_accuracy")
    return judged if judged is not None else row["containment"]


def answer_score_name(results: dict) -> str:
    return "judge accuracy" if results["answer_scoring"].startswith("judge:") else "containment"


def markdown_summary(results: dict) -> str:
    head = "| condition | " + " | ".join(SUMMARY_COLUMNS) + " | p50 ms | p95 ms |"
    lines = [
        f"Evaluation of pack `{results['pack']}` v{results['pack_version']} "
        f"({results['answer_scoring']}), {results['evaluated_at']}",
        "",
        head,
        "|" + "---|" * (len(SUMMARY_COLUMNS) + 3),
    ]
    for condition in results["conditions"]:
        row = results["summary"][condition]
        total = row["latency_ms"].get("total", {"p50": 0.0, "p95": 0.0})
        cells = ["-" if row.get(c) is None else f"{row[c]:.3f}" for c in SUMMARY_COLUMNS]
        lines.append(
            f"| {condition} | "
            + " | ".join(cells)
            + f" | {total['p50']:.1f} | {total['p95']:.1f} |"
        )
    lines += graph_lines(results.get("graph_evidence"))
    calibration = results["calibration"]
    near_misses = [
        f"{c} {results['summary'][c]['unanswerable_refused']} of "
        f"{results['summary'][c]['unanswerable']}"
        for c in results["conditions"]
        if results["summary"][c].get("unanswerable")
    ]
    if near_misses:
        lines += [
            "",
            "Near-miss unanswerable questions refused (by the gate, or by an answer saying no "
            "passage answers): " + ", ".join(near_misses) + ".",
        ]
    lines += [
        "",
        f"Gate threshold: current {calibration['current_threshold']}"
        + (
            f" ({calibration['current_threshold_source']})"
            if calibration.get("current_threshold_source")
            else ""
        )
        + f", best on these questions "
        f"{calibration['best_threshold']} (balanced in-domain answered / out-of-domain refused).",
    ]
    return "\n".join(lines) + "\n"


GRAPH_COLUMNS = ("hit@1", "hit@5", "mrr", "all_gold@5")


def graph_lines(comparison: dict | None) -> list[str]:
    """The graph stages against baseline on the evaluated questions (retrieval.eval.evidence),
    and what the version runs by default and why."""
    if not comparison:
        return []
    measured = comparison["these_questions"]
    lines = ["", f"Graph stages (balanced's search; in force: {comparison['in_force']}):", ""]
    if not measured["configurations"]:
        return [*lines, measured["why"]]
    lines += [
        "| configuration | " + " | ".join(GRAPH_COLUMNS) + " |",
        "|" + "---|" * (len(GRAPH_COLUMNS) + 1),
    ]
    for name, row in measured["configurations"].items():
        cells = ["-" if row.get(c) is None else f"{row[c]:.3f}" for c in GRAPH_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, "", f"On these questions: {measured['chosen']} ({measured['why']})."]


def summary_frame(results: dict) -> pd.DataFrame:
    """The summary table as a DataFrame: one row per condition (``.plot.bar()`` draws it)."""
    import pandas as pd

    rows = {
        condition: {
            **{c: results["summary"][condition].get(c) for c in SUMMARY_COLUMNS},
            "p50_ms": results["summary"][condition]["latency_ms"].get("total", {}).get("p50"),
        }
        for condition in results["conditions"]
    }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("condition")


QUESTION_COLUMNS = (
    "id",
    "question",
    "out_of_domain",
    "unanswerable",
    "query_type",
    "gated",
    "refused",
    "max_similarity",
    "hit_rank",
    "all_gold_rank",
    "cited",
    "contains_answer",
    "token_f1",
    "judge_score",
    "answer",
)


def questions_frame(results: dict) -> pd.DataFrame:
    """One row per question and condition: where its first relevant passage ranked (NaN: not
    in the top 10), whether it was gated, its answer scores and its total milliseconds."""
    import pandas as pd

    rows = [
        [condition, *(record.get(c) for c in QUESTION_COLUMNS), record["timings_ms"].get("total")]
        for condition in results["conditions"]
        for record in results["questions"][condition]
    ]
    return pd.DataFrame(rows, columns=["condition", *QUESTION_COLUMNS, "total_ms"])


def load_results(path: str | Path) -> dict:
    """A saved results document (``eval/results/<time>.json``)."""
    return json.loads(Path(path).read_text())


def chart_png(results: dict) -> bytes:
    """The conditions side by side (retrieval, answers, gate rates), and their p50 latency."""
    # A Figure without pyplot: no global backend switch, which would stop a notebook's
    # plots from showing inline once results were written from it.
    from matplotlib.figure import Figure

    conditions = results["conditions"]
    summary = results["summary"]
    figure = Figure(figsize=(11, 4))
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(conditions)
    for offset, condition in enumerate(conditions):
        row = summary[condition]
        values = [
            (answer_score(row) if metric == "answer" else row.get(metric)) or 0.0
            for metric in CHART_METRICS
        ]
        positions = [i + (offset - (len(conditions) - 1) / 2) * width for i in range(len(values))]
        left.bar(positions, values, width, label=condition)
    labels = {**CHART_LABELS, "answer": answer_score_name(results)}
    left.set_xticks(range(len(CHART_METRICS)), [labels.get(m, m) for m in CHART_METRICS])
    left.set_ylim(0, 1.2)  # room above the bars for the legend
    left.legend(loc="upper center", ncol=len(conditions), fontsize="small", frameon=False)
    left.set_title("retrieval, answers and gate, per condition")
    latency = [summary[c]["latency_ms"].get("total", {}).get("p50", 0.0) for c in conditions]
    right.bar(conditions, latency, color="#DD8452")
    right.set_title("p50 latency (ms)")
    right.tick_params(axis="x", labelrotation=30)
    figure.suptitle(f"{results['pack']} v{results['pack_version']} ({results['answer_scoring']})")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def write_results(results: dict, folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = results["evaluated_at"].replace(":", "").replace("-", "").replace("+0000", "Z")
    paths = {
        "json": folder / f"{stamp}.json",
        "markdown": folder / f"{stamp}.md",
        "png": folder / f"{stamp}.png",
    }
    paths["json"].write_text(json.dumps(results, indent=2, default=str))
    paths["markdown"].write_text(markdown_summary(results))
    paths["png"].write_bytes(chart_png(results))
    return paths
