"""What a build run came to, said once: published vN, unchanged since vN, or failed: cause.

Every run of ``build_pack`` (from ``kpack build``, the UI, the sensor or the schedule) ends in
one of four outcomes: published, unchanged, failed, or interrupted (Ctrl-C or a terminate
request stopped it; the published version is untouched). This module derives it from the run's own events, so there is one
writer of the record whoever started the run:

* the run is tagged ``kpack/outcome`` ("published v0003", "unchanged since v0002",
  "failed: <cause>", "interrupted"), which the UI's run list shows;
* ``.versions/last_build.json`` (kpack.store) is written for ``kpack status``.

``kpack build`` calls :func:`record_outcome` when its in-process run ends; runs launched
through the Dagster daemon are recorded by :data:`build_outcome_sensor` and
:data:`build_failure_sensor`. A run whose process died (SIGKILL, power loss) is never finished
by Dagster; the next build of the pack reports it failed (resources.pack_store.build_lifecycle).

A build found unchanged whose version's graph evidence other code measured is followed by a
run of graph_evidence alone (:func:`evidence_follows`), tagged with the build's outcome so that
no sensor records it as a build: ``kpack build`` runs it in-process, and build_outcome_sensor
requests it after a run the daemon launched.
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
    RunRequest,
    RunStatusSensorContext,
    SensorDefinition,
    run_status_sensor,
)

from assets.evaluate import evidence_is_current, graph_evidence
from kpack import settings
from kpack.errors import PackError, disk_errors
from kpack.packs import current_version, read_manifest
from kpack.store import LAST_BUILD, PackStore
from pipelines.jobs import build_pack_job
from resources.pack_store import DISTRIBUTED_TAG, PARTITION_TAG, PROCESS_TAG

OUTCOME_TAG = "kpack/outcome"
# On a run that follows a build (graph_evidence measured again after it): the build's run id.
# It is part of that build: `kpack status` reads the build's run, and since it carries the
# build's outcome tag too, no sensor records it.
FOLLOWS_TAG = "kpack/follows_run"
# Errors Dagster records for a run stopped by SIGINT (Ctrl-C) or a terminate request.
INTERRUPTS = ("KeyboardInterrupt", "DagsterExecutionInterruptedError")
RUN_ERRORS = (DagsterEventType.RESOURCE_INIT_FAILURE, DagsterEventType.RUN_FAILURE)


def _metadata(event) -> dict:
    return {k: getattr(v, "value", v) for k, v in event.metadata.items()}


def run_summary(instance: DagsterInstance, run: DagsterRun) -> dict:
    """The outcome record of a finished run, from its event log."""
    published = unchanged = None
    failed_steps: list[str] = []
    causes: list[str] = []
    # Errors of the run before or around its steps: a resource that could not be set up (the
    # pack's build lock held by another build), the run's own failure.
    run_causes: list[str] = []
    failed_checks: list[str] = []
    interrupted = False
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
            interrupted |= _interrupt(error)
            if error is not None and not _interrupt(error):
                causes.append(_cause(error))
        elif event.event_type in RUN_ERRORS:
            error = getattr(event.event_specific_data, "error", None)
            interrupted |= _interrupt(error)
            if error is not None and not _interrupt(error):
                run_causes.append(_cause(error))
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
    if interrupted or run.status == DagsterRunStatus.CANCELED:
        return {**base, "outcome": "interrupted", "failed_steps": failed_steps}
    return {
        **base,
        "outcome": "failed",
        "failed_steps": failed_steps,
        "failed_checks": failed_checks,
        "cause": next(iter(causes + run_causes), "the run did not finish"),
    }


def _interrupt(error) -> bool:
    """Whether a recorded error (or one it wraps) is the run being interrupted."""
    while error is not None:
        if error.cls_name in INTERRUPTS:
            return True
        error = error.cause
    return False


def _cause(error) -> str:
    """The user-facing cause: the innermost error's message, first line only."""
    while error.cause is not None and not error.message.strip():
        error = error.cause
    message = error.message.strip().splitlines()[0] if error.message.strip() else error.cls_name
    # Dagster wraps an op's exception as "dagster._core.errors.X: Error occurred while ...":
    # the user's own error is the cause.
    if error.cause is not None and "Error occurred while" in message:
        return _cause(error.cause)
    qualified, separator, rest = message.partition(": ")
    # "kpack.errors.PackError: pack ... is already being built": the text after the class name
    if separator and qualified.startswith(("dagster.", "kpack.")) and " " not in qualified:
        return rest
    return message


def outcome_label(summary: dict) -> str:
    version = summary.get("version")
    label = f"v{version:04d}" if isinstance(version, int) else "no version"
    if summary["outcome"] == "published":
        return f"published {label}"
    if summary["outcome"] == "unchanged":
        return f"unchanged since {label}"
    if summary["outcome"] == "interrupted":
        return "interrupted"
    return f"failed: {summary.get('cause', '')}"[:200]


def record_outcome(instance: DagsterInstance, run: DagsterRun, packs_dir: Path) -> dict:
    """Tag the run with its outcome and write the pack's last_build.json; returns the record.
    When the file cannot be written (a full disk), the record says why under
    ``not_recorded``: the build's outcome stands, and the run's tag still tells it."""
    pack = run.tags.get(PARTITION_TAG)
    summary = run_summary(instance, run)
    instance.add_run_tags(run.run_id, {OUTCOME_TAG: outcome_label(summary)})
    if pack:
        store = PackStore(packs_dir)
        try:
            folder = store.folder(pack)
        except ValueError:  # the pack folder was deleted meanwhile: nothing to record in
            return summary
        if summary["outcome"] in ("failed", "interrupted"):
            current = read_manifest(folder)
            summary["version"] = current["version"] if current else None
        try:
            with disk_errors(f"the outcome was not written to {pack}/.versions/{LAST_BUILD}"):
                store.record_build(pack, summary)
        except PackError as exc:  # a full disk, say: the run's outcome tag still records it
            summary["not_recorded"] = f"{exc} (kpack status reads it from the run)"
    return summary


def carried_tags(run: DagsterRun) -> dict[str, str]:
    """The tags of a build that a run following it carries: kpack's own (its build id, what
    triggered it), not those of the process that ran it (its lock holder, its executor)."""
    own = (PROCESS_TAG, DISTRIBUTED_TAG)
    return {k: v for k, v in run.tags.items() if k.startswith("kpack/") and k not in own}


def evidence_follows(summary: dict, folder: Path, run: DagsterRun) -> RunRequest | None:
    """The run of graph_evidence alone that follows a build found unchanged when the current
    version's evidence was measured by other code (assets.evaluate), else None; tagged like
    the build, with its outcome and FOLLOWS_TAG."""
    if summary["outcome"] != "unchanged":
        return None
    version = current_version(folder)
    if version is None or evidence_is_current(version):
        return None
    return RunRequest(
        partition_key=run.tags.get(PARTITION_TAG),
        asset_selection=[graph_evidence.key],
        tags={**carried_tags(run), OUTCOME_TAG: outcome_label(summary), FOLLOWS_TAG: run.run_id},
        run_key=f"{run.run_id}:graph_evidence",
    )


def _outcome_sensor(name: str, status: DagsterRunStatus, description: str) -> SensorDefinition:
    """A sensor that records each build_pack run that ends in ``status``, unless ``kpack build``
    recorded it already (its run has the outcome tag), and requests the run
    :func:`evidence_follows` gives."""

    @run_status_sensor(
        name=name,
        run_status=status,
        monitored_jobs=[build_pack_job],
        request_job=build_pack_job,
        default_status=DefaultSensorStatus.RUNNING,
        description=description,
    )
    def record_unless_recorded(context: RunStatusSensorContext) -> RunRequest | None:
        run = context.dagster_run
        if OUTCOME_TAG in run.tags:
            return None
        packs_dir = settings.packs_dir()
        summary = record_outcome(context.instance, run, packs_dir)
        if "not_recorded" in summary:
            context.log.warning(summary["not_recorded"])
        pack = run.tags.get(PARTITION_TAG)
        folder = packs_dir / pack if pack else None
        return evidence_follows(summary, folder, run) if folder and folder.is_dir() else None

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
