"""eval_results: the pack's own question set run under every profile, after each publish.

Not part of the build job (it can cost LLM calls): materialize it from the UI, or run the same
code with ``kpack eval``. Results land in ``eval/results/`` of the pack folder and the summary
table and chart show in the asset's metadata.
"""

import json

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
    asset_check,
)

from assets.partitions import packs_partitions
from resources.pack_store import PackStore
from retrieval.eval import (
    answer_score,
    evaluate,
    headline,
    load_questions,
    markdown_summary,
    png_markdown,
    write_results,
)
from retrieval.eval.report import SUMMARY_COLUMNS

PROFILES = ["baseline", "balanced", "max"]
PLOTTED_METRICS = ("hit@1", "hit@5", "mrr", "containment", "judge_accuracy", "gate_rate_in_domain")
GATE_WARNING_SHARE = 0.4  # seed 001: above this the pack does not cover the questions


@asset(
    partitions_def=packs_partitions,
    group_name="evaluate",
    deps=["pack_manifest"],
    description="Retrieval and answer metrics of eval/questions.jsonl under each profile.",
)
def eval_results(context: AssetExecutionContext, pack_store: PackStore) -> MaterializeResult:
    folder = pack_store.folder(context.partition_key)
    questions, problems = load_questions(folder / "eval" / "questions.jsonl", folder)
    for problem in problems:
        context.log.warning(problem)
    results = evaluate(folder, questions, PROFILES)
    paths = write_results(results, folder / "eval" / "results")
    row = headline(results)
    return MaterializeResult(
        metadata={
            "questions": len(questions),
            "invalid_lines": MetadataValue.json(problems),
            # A table renders inline on the asset page; the Markdown copy is what kpack eval
            # prints.
            "summary_table": summary_table(results),
            "summary": MetadataValue.md(markdown_summary(results)),
            "chart": MetadataValue.md(png_markdown(paths["png"].read_bytes())),
            "results": MetadataValue.path(str(paths["json"])),
            "hit@1": row["hit@1"],
            "hit@5": row["hit@5"],
            "mrr": row["mrr"],
            "answer_scoring": results["answer_scoring"],
            "answer_score": answer_score(row),
            "gate_rate_in_domain": row["gate_rate_in_domain"],
            "best_threshold": results["calibration"]["best_threshold"],
            # One number per condition and metric: the asset page plots each across
            # evaluations, so baseline vs balanced shows as lines without opening a dialog.
            **condition_metrics(results),
        }
    )


def condition_metrics(results: dict) -> dict[str, float]:
    return {
        f"{condition}/{metric}": value
        for condition in results["conditions"]
        for metric in PLOTTED_METRICS
        if isinstance(value := results["summary"][condition].get(metric), int | float)
    }


def summary_table(results: dict) -> MetadataValue:
    """One row per condition (baseline, balanced, ...), the summary's columns."""
    columns = [TableColumn("condition", "string")] + [
        TableColumn(name, "float") for name in SUMMARY_COLUMNS
    ]
    rows = [
        TableRecord(
            {
                "condition": condition,
                **{c: results["summary"][condition][c] for c in SUMMARY_COLUMNS},
            }
        )
        for condition in results["conditions"]
    ]
    return MetadataValue.table(rows, schema=TableSchema(columns))


def _latest_two(pack_store: PackStore, pack: str) -> list[dict]:
    folder = pack_store.folder(pack) / "eval" / "results"
    runs = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return [json.loads(p.read_text()) for p in runs[-2:]]


@asset_check(
    asset=eval_results,
    partitions_def=packs_partitions,
    description="The gate refuses at most 40% of in-domain questions (balanced).",
)
def gate_rarely_refuses_in_domain(
    context: AssetCheckExecutionContext, pack_store: PackStore
) -> AssetCheckResult:
    runs = _latest_two(pack_store, context.partition_key)
    share = headline(runs[-1])["gate_rate_in_domain"] if runs else None
    return AssetCheckResult(
        passed=share is not None and share <= GATE_WARNING_SHARE,
        severity=AssetCheckSeverity.WARN,
        description="a high share means the pack does not cover the questions, or the threshold "
        "needs calibrating (kpack eval --write-config)",
        metadata={"gate_rate_in_domain": share, "limit": GATE_WARNING_SHARE},
    )


@asset_check(
    asset=eval_results,
    partitions_def=packs_partitions,
    description="Answer quality did not drop against the previous evaluation.",
)
def accuracy_not_dropped(
    context: AssetCheckExecutionContext, pack_store: PackStore
) -> AssetCheckResult:
    runs = _latest_two(pack_store, context.partition_key)
    if len(runs) < 2:
        return AssetCheckResult(
            passed=True, metadata={"note": "first evaluation: nothing to compare"}
        )
    before, now = (answer_score(headline(run)) or 0.0 for run in runs)
    return AssetCheckResult(
        passed=now >= before,
        severity=AssetCheckSeverity.WARN,
        metadata={"previous": before, "current": now},
    )
