"""What a build run came to, said once: published vN, unchanged since vN, or failed: cause.

Every run of ``build_pack`` (from ``kpack build``, the UI, the sensor or the schedule) ends in
one of three outcomes. This module derives it from the run's own events, so there is one
writer of the record whoever started the run:

* the run is tagged ``kpack/outcome`` ("published v0003", "unchanged since v0002",
  "failed: <cause>"), which the UI's run list shows;
* ``.versions/last_build.json`` (kpack.store) is written for ``kpack status``.

``kpack build`` calls :func:`record_outcome` when its in-process run ends; runs launched
through the Dagster daemon are recorded by :data:`build_outcome_sensor` and
:data:`build_failure_sensor`. A run whose process died (SIGKILL, power loss) is never finished
by Dagster; the next build of the pack reports it failed (resources.pack_store.build_lifecycle).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunStatusSensorContext,
    SensorDefinition,
    run_status_sensor,
)

from kpack import settings
from kpack.packs import read_manifest
from kpack.store import PackStore
from pipelines.jobs import build_pack_job
from resources.pack_store import PARTITION_TAG

OUTCOME_TAG = "kpack/outcome"


def _metadata(event) -> dict:
    return {k: getattr(v, "value", v) for k, v in event.metadata.items()}


def run_summary(instance: DagsterInstance, run: DagsterRun) -> dict:
    """The outcome record of a finished run, from its event log."""
    published = unchanged = None
    failed_steps: list[str] = []
    causes: list[str] = []
    failed_checks: list[str] = []
    for record in instance.all_logs(run.run_id):
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            if materialization.asset_key.path[-1] == "pack_manifest":
                published = _metadata(materialization)
        elif event.event_type == DagsterEventType.ASSET_OBSERVATION:
            # fetched_pages found nothing changed (assets.partitions.observe_unchanged)
            metadata = _metadata(event.asset_observation_data.asset_observation)
            if metadata.get("unchanged"):
                unchanged = metadata
        elif event.event_type == DagsterEventType.STEP_FAILURE and event.step_key:
            failed_steps.append(event.step_key)
            error = event.step_failure_data.error
            if error is not None:
                causes.append(_cause(error))
        elif event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.event_specific_data
            if not evaluation.passed:
                failed_checks.append(evaluation.check_name)
                description = evaluation.description or ""
                causes.append(f"check {evaluation.check_name} failed {description}".strip())
    checked_at = datetime.now(UTC).isoformat(timespec="seconds")
    base = {"run_id": run.run_id, "checked_at": checked_at}
    if run.status == DagsterRunStatus.SUCCESS and not failed_checks and published:
        manifest = published.get("manifest") or {}
        return {
            **base,
            "outcome": "published",
            "version": published.get("version"),
            "previous_version": manifest.get("previous_version"),
            "changes": manifest.get("changes"),
            "failures": manifest.get("sources", {}).get("failures", []),
        }
    if run.status == DagsterRunStatus.SUCCESS and not failed_checks and unchanged:
        return {
            **base,
            "outcome": "unchanged",
            "version": unchanged.get("current_version"),
            "changes": unchanged.get("changes"),
            "failures": unchanged.get("failures", []),
        }
    if run.status == DagsterRunStatus.CANCELED:
        causes.append("the run was canceled")
    return {
        **base,
        "outcome": "failed",
        "failed_steps": failed_steps,
        "failed_checks": failed_checks,
        "cause": causes[0] if causes else "the run did not finish",
    }


def _cause(error) -> str:
    """The user-facing cause: the innermost error's message, first line only."""
    while error.cause is not None and not error.message.strip():
        error = error.cause
    message = error.message.strip().splitlines()[0] if error.message.strip() else error.cls_name
    # Dagster wraps an op's exception as "dagster._core.errors.X: Error occurred while ...":
    # the user's own error is the cause.
    if error.cause is not None and "Error occurred while" in message:
        return _cause(error.cause)
    return message.split(": ", 1)[1] if message.startswith(("dagster.", "kpack.")) else message


def outcome_label(summary: dict) -> str:
    version = summary.get("version")
    label = f"v{version:04d}" if isinstance(version, int) else "no version"
    if summary["outcome"] == "published":
        return f"published {label}"
    if summary["outcome"] == "unchanged":
        return f"unchanged since {label}"
    return f"failed: {summary.get('cause', '')}"[:200]


def record_outcome(instance: DagsterInstance, run: DagsterRun, packs_dir: Path) -> dict:
    """Tag the run with its outcome and write the pack's last_build.json; returns the record."""
    pack = run.tags.get(PARTITION_TAG)
    summary = run_summary(instance, run)
    instance.add_run_tags(run.run_id, {OUTCOME_TAG: outcome_label(summary)})
    if pack:
        store = PackStore(packs_dir)
        try:
            folder = store.folder(pack)
        except ValueError:  # the pack folder was deleted meanwhile: nothing to record in
            return summary
        if summary["outcome"] == "failed":
            current = read_manifest(folder)
            summary["version"] = current["version"] if current else None
        store.record_build(pack, summary)
    return summary


def _outcome_sensor(name: str, status: DagsterRunStatus, description: str) -> SensorDefinition:
    """A sensor that records each build_pack run that ends in ``status``, unless ``kpack build``
    recorded it already (its run has the outcome tag)."""

    @run_status_sensor(
        name=name,
        run_status=status,
        monitored_jobs=[build_pack_job],
        default_status=DefaultSensorStatus.RUNNING,
        description=description,
    )
    def record_unless_recorded(context: RunStatusSensorContext) -> None:
        if OUTCOME_TAG not in context.dagster_run.tags:
            record_outcome(context.instance, context.dagster_run, settings.packs_dir())

    return record_unless_recorded


build_outcome_sensor = _outcome_sensor(
    "build_outcome_sensor",
    DagsterRunStatus.SUCCESS,
    "Records the outcome (published / unchanged) of build_pack runs.",
)
build_failure_sensor = _outcome_sensor(
    "build_failure_sensor",
    DagsterRunStatus.FAILURE,
    "Records failed build_pack runs, whoever started them, for `kpack status`.",
)
