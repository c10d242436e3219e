"""After a publish: the graph stages' evidence (graph_evidence, part of the build), and the pack's
own question set run under the compared profiles (eval_results, baseline, balanced, max:
retrieval.eval.COMPARED_PROFILES).

graph_evidence measures the graph stages against baseline on the pack's questions, or on a
self-check made from its headings (retrieval.eval.evidence), and records in the published
version which of them its queries run by default (kpack.graph_evidence). It never fails the
build: a measurement that cannot run records the graph off and why. The record names the code
that measured it (EVIDENCE_CODE_VERSION): the build's and the retrieval stages' it compares. A
rebuild that finds the sources unchanged publishes nothing, so when the retrieval code changed
since (an upgrade of kpack), a run of this asset alone follows it (pipelines.outcomes.
evidence_follows, by :func:`evidence_is_current`), and the Dagster UI shows the asset's new
code version.

eval_results is not part of the build job (it can cost LLM calls): materialize it from the UI,
or run the same code with ``kpack eval``. Results land in ``eval/results/`` of the pack folder
and the summary table and chart show in the asset's metadata.
"""

import json
from pathlib import Path

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
)

from assets.partitions import BUILD_CODE_VERSION, build_stage, pack_check, packs_partitions
from kpack.graph_evidence import CROWDING, GRAPH_TOGGLES, read_record, write_evidence
from resources.pack_store import PackStore
from retrieval.eval import (
    COMPARED_PROFILES,
    PIPELINE_CODE_VERSION,
    answer_score,
    evaluate,
    headline,
    load_questions,
    pack_evidence,
    write_results,
)
from retrieval.eval.report import SUMMARY_COLUMNS

PLOTTED_METRICS = (
    "hit@1",
    "hit@5",
    "mrr",
    "containment",
    "judge_accuracy",
    "gate_rate_in_domain",
    "gate_rate_out_of_domain",
    "refusal_rate_unanswerable",
)
GATE_WARNING_SHARE = 0.4  # seed 001: above this the pack does not cover the questions
# The code a version's graph evidence is measured with: the build's, and the retrieval stages
# it compares, whose change alone leaves the sources unchanged (module docstring).
EVIDENCE_CODE_VERSION = f"{BUILD_CODE_VERSION}+{PIPELINE_CODE_VERSION}"
CODE_VERSION_KEY = "code_version"  # where the record names it


@build_stage(
    group_name="publish",
    deps=["pack_manifest"],
    code_version=EVIDENCE_CODE_VERSION,
    description="Which graph stages and page crowding the published version runs by default, on "
    "its own evidence.",
)
def graph_evidence(context: AssetExecutionContext, pack_store: PackStore) -> MaterializeResult:
    pack = context.partition_key
    version = pack_store.current(pack)
    if version is None:  # rolled back to nothing meanwhile: nothing to measure
        return MaterializeResult(metadata={"measured": False})
    try:
        record = pack_evidence(pack_store.folder(pack), version)
    except Exception as exc:  # a published version keeps its build: the graph stays off
        context.log.warning(f"the graph evidence of {pack} could not be measured: {exc}")
        record = {
            "source": "nothing",
            "questions": 0,
            **dict.fromkeys(GRAPH_TOGGLES, False),
            CROWDING: 0,
            "chosen": "baseline",
            "why": f"the measurement failed ({type(exc).__name__}: {exc})",
            "configurations": {},
        }
    write_evidence(version, {**record, CODE_VERSION_KEY: EVIDENCE_CODE_VERSION})
    return MaterializeResult(
        metadata={
            "chosen": record["chosen"],
            "why": record["why"],
            "source": record["source"],
            **{toggle: record[toggle] for toggle in GRAPH_TOGGLES},
            CROWDING: record[CROWDING],
            "configurations": MetadataValue.json(record["configurations"]),
        }
    )


def evidence_is_current(version_dir: Path) -> bool:
    """Whether the version's graph evidence was measured by this code (a version without a
    record, or with an unreadable one, has none to keep)."""
    record = read_record(version_dir)
    return record is not None and record.get(CODE_VERSION_KEY) == EVIDENCE_CODE_VERSION


@asset(
    partitions_def=packs_partitions,
    group_name="evaluate",
    deps=["pack_manifest"],
    description="Retrieval and answer metrics of eval/questions.jsonl under the compared profiles.",
)
def eval_results(context: AssetExecutionContext, pack_store: PackStore) -> MaterializeResult:
    folder = pack_store.folder(context.partition_key)
    questions, problems = load_questions(folder / "eval" / "questions.jsonl", folder)
    for problem in problems:
        context.log.warning(problem)
    results = evaluate(folder, questions, list(COMPARED_PROFILES))
    paths = write_results(results, folder / "eval" / "results")
    row = headline(results)
    return MaterializeResult(
        metadata={
            "questions": len(questions),
            "invalid_lines": MetadataValue.json(problems),
            # Both render inline on the asset page (a table, and Markdown under 1000 characters;
            # longer Markdown hides behind a "[Show Markdown]" dialog, so the chart is text).
            "summary_table": summary_table(results),
            "chart": MetadataValue.md(text_chart(results)),
            "results": MetadataValue.path(str(paths["json"])),
            "chart_png": MetadataValue.path(str(paths["png"])),
            "summary_md": MetadataValue.path(str(paths["markdown"])),
            "hit@1": row["hit@1"],
            "hit@5": row["hit@5"],
            "mrr": row["mrr"],
            "answer_scoring": results["answer_scoring"],
            "answer_score": answer_score(row),
            "gate_rate_in_domain": row["gate_rate_in_domain"],
            "gate_rate_out_of_domain": row["gate_rate_out_of_domain"],
            # Near-miss unanswerable questions the pack refused (gate, or "no passage answers").
            "unanswerable_refused": row.get("unanswerable_refused", 0),
            "unanswerable": row.get("unanswerable", 0),
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
    """One row per metric, one column per condition (baseline, balanced, ...).

    Metric by condition, not the other way round: the asset page gives a table about 450 px, so
    three or four condition columns fit where a dozen metric columns were cut off. A metric no
    condition measured (judge_accuracy without a judge) is left out.
    """
    conditions = results["conditions"]
    summary = results["summary"]
    columns = [TableColumn("metric", "string")] + [TableColumn(c, "float") for c in conditions]
    rows = [
        TableRecord({"metric": metric, **{c: _rounded(summary[c].get(metric)) for c in conditions}})
        for metric in SUMMARY_COLUMNS
        if any(summary[c].get(metric) is not None for c in conditions)
    ]
    rows.append(
        TableRecord(
            {
                "metric": "p50 ms",
                **{
                    c: _rounded(summary[c]["latency_ms"].get("total", {}).get("p50"), 1)
                    for c in conditions
                },
            }
        )
    )
    return MetadataValue.table(rows, schema=TableSchema(columns))


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


INLINE_MARKDOWN_LIMIT = 1000  # the Dagster UI shows shorter Markdown inline, longer in a dialog
BAR_BLOCKS = " ▏▎▍▌▋▊▉█"


def text_chart(results: dict) -> str:
    """The conditions' key metrics as bars of block characters, short enough to show inline.

    Every value is a share in [0, 1]: hit@1, hit@5, MRR, the answer score (judge accuracy when a
    judge ran, else containment), the gate's refusal rates in and out of domain, and the share
    of near-miss unanswerable questions refused ("near-miss"). The bars narrow as conditions are added, so
    the Markdown stays under the UI's inline limit.
    """
    conditions = results["conditions"]
    summary = results["summary"]
    judged = any(summary[c].get("judge_accuracy") is not None for c in conditions)
    metrics = {
        "hit@1": lambda row: row.get("hit@1"),
        "hit@5": lambda row: row.get("hit@5"),
        "MRR": lambda row: row.get("mrr"),
        "judge acc." if judged else "containment": answer_score,
        "gated in": lambda row: row.get("gate_rate_in_domain"),
        "gated out": lambda row: row.get("gate_rate_out_of_domain"),
        "near-miss": lambda row: row.get("refusal_rate_unanswerable"),
    }
    label_width = max(len(label) for label in metrics)
    name_width = max(len(c) for c in conditions)
    lines_count = len(metrics) * len(conditions)
    fixed = label_width + name_width + 4 + 4  # the value, three spaces and the newline
    width = min(20, (INLINE_MARKDOWN_LIMIT - 40) // lines_count - fixed)
    lines = []
    for label, value_of in metrics.items():
        for number, condition in enumerate(conditions):
            value = value_of(summary[condition])
            shown = "  - " if value is None else f"{value:.2f}"[-4:]
            bar = _bar(value or 0.0, width) if width > 0 else ""
            head = label if number == 0 else ""
            lines.append(f"{head:<{label_width}} {condition:<{name_width}} {bar} {shown}")
    return "```\n" + "\n".join(lines) + "\n```"


def _bar(share: float, width: int) -> str:
    """``share`` of ``width`` characters in eighth blocks, padded with spaces to ``width``."""
    eighths = round(max(0.0, min(1.0, share)) * width * 8)
    full, rest = divmod(eighths, 8)
    return (BAR_BLOCKS[-1] * full + (BAR_BLOCKS[rest] if rest else "")).ljust(width)


def _latest_two(pack_store: PackStore, pack: str) -> list[dict]:
    folder = pack_store.folder(pack) / "eval" / "results"
    runs = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return [json.loads(p.read_text()) for p in runs[-2:]]


@pack_check(eval_results, "The gate refuses at most 40% of in-domain questions (balanced).")
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


@pack_check(eval_results, "Answer quality did not drop against the previous evaluation.")
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
