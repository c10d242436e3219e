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
    asset,
    asset_check,
)

from assets.partitions import packs_partitions
from resources.pack_store import PackStore

PROFILES = ["baseline", "balanced", "max"]
GATE_WARNING_SHARE = 0.4  # seed 001: above this the pack does not cover the questions


@asset(
    partitions_def=packs_partitions,
    group_name="evaluate",
    deps=["pack_manifest"],
    description="Retrieval and answer metrics of eval/questions.jsonl under each profile.",
)
def eval_results(context: AssetExecutionContext, pack_store: PackStore) -> MaterializeResult:
    from retrieval.evaluation import (
        evaluate,
        load_questions,
        markdown_summary,
        png_markdown,
        write_results,
    )

    folder = pack_store.folder(context.partition_key)
    questions, problems = load_questions(folder / "eval" / "questions.jsonl", folder)
    for problem in problems:
        context.log.warning(problem)
    results = evaluate(folder, questions, PROFILES)
    paths = write_results(results, folder / "eval" / "results")
    balanced = results["summary"]["balanced"]
    return MaterializeResult(
        metadata={
            "questions": len(questions),
            "invalid_lines": MetadataValue.json(problems),
            "summary": MetadataValue.md(markdown_summary(results)),
            "chart": MetadataValue.md(png_markdown(paths["png"].read_bytes())),
            "results": MetadataValue.path(str(paths["json"])),
            "hit@5": balanced["hit@5"],
            "accuracy": balanced["accuracy"]
            if balanced["accuracy"] is not None
            else balanced["containment"],
            "gate_rate_in_domain": balanced["gate_rate_in_domain"],
            "best_threshold": results["calibration"]["best_threshold"],
        }
    )


def _latest_two(pack_store: PackStore, pack: str) -> list[dict]:
    folder = pack_store.folder(pack) / "eval" / "results"
    runs = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return [json.loads(p.read_text()) for p in runs[-2:]]


@asset_check(asset=eval_results, partitions_def=packs_partitions,
             description="The gate refuses at most 40% of in-domain questions (balanced).")  # fmt: skip
def gate_rarely_refuses_in_domain(
    context: AssetCheckExecutionContext, pack_store: PackStore
) -> AssetCheckResult:
    runs = _latest_two(pack_store, context.partition_key)
    summary = runs[-1]["summary"] if runs else {}
    row = summary.get("balanced") or next(iter(summary.values()), {})
    share = row.get("gate_rate_in_domain")
    return AssetCheckResult(
        passed=share is not None and share <= GATE_WARNING_SHARE,
        severity=AssetCheckSeverity.WARN,
        description="a high share means the pack does not cover the questions, or the threshold "
        "needs calibrating (kpack eval --write-config)",
        metadata={"gate_rate_in_domain": share, "limit": GATE_WARNING_SHARE},
    )


@asset_check(asset=eval_results, partitions_def=packs_partitions,
             description="Answer quality did not drop against the previous evaluation.")  # fmt: skip
def accuracy_not_dropped(
    context: AssetCheckExecutionContext, pack_store: PackStore
) -> AssetCheckResult:
    runs = _latest_two(pack_store, context.partition_key)

    def score(run: dict) -> float:
        row = run["summary"].get("balanced") or run["summary"][run["conditions"][0]]
        return row["accuracy"] if row["accuracy"] is not None else (row["containment"] or 0.0)

    if len(runs) < 2:
        return AssetCheckResult(
            passed=True, metadata={"note": "first evaluation: nothing to compare"}
        )
    before, now = score(runs[0]), score(runs[1])
    return AssetCheckResult(
        passed=now >= before,
        severity=AssetCheckSeverity.WARN,
        metadata={"previous": before, "current": now},
    )
