"""One pack's state as data (``kpack status`` and its --json): the published version and
whether it verifies, what its build changed, the latest build's outcome, whether a build holds
the lock now, and when pack_refresh_schedule rebuilds it next.

The published version is read from the store (its ``current`` link), and the latest build from
the Dagster instance's newest ``build_pack`` run of the pack, whoever launched it: a run started
outside ``kpack build`` with no daemon to record it, or one killed just after it published,
leaves ``last_build.json`` naming an older build, so that file is used only for the run it
names."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from kpack.config import load_config
from kpack.errors import PackError, PackNotReady
from kpack.gate import threshold_in_force
from kpack.graph_evidence import CROWDING, GRAPH_TOGGLES, read_choice
from kpack.packs import pack_dir, read_manifest, time_ago
from kpack.store import PackStore, build_running, verify_version, version_number
from pipelines.instance import open_instance
from pipelines.jobs import JOB_NAME
from pipelines.outcomes import FOLLOWS_TAG, run_summary
from pipelines.schedules import TIMEZONE, next_tick, schedule_running
from resources.pack_store import PARTITION_TAG


def pack_status(name: str) -> dict:
    """Everything `kpack status` shows, as one dict. An unknown pack is a PackError; a
    malformed kg_config.json is reported under ``schedule.error``, a damaged version under
    ``damaged``."""
    folder = pack_dir(name)
    store = PackStore(packs_dir=str(folder.parent))
    manifest = read_manifest(folder)
    current, previous = store.current(name), store.previous_version(name)
    try:
        cron, schedule_error = load_config(folder).schedule, None
    except PackError as exc:
        cron, schedule_error = None, str(exc)
    instance = open_instance()
    running = schedule_running(instance)
    upcoming = next_tick(cron, datetime.now(UTC)) if cron and running else None
    rolled_back_from = store.rolled_back_from(name)
    try:
        damage = verify_version(current) if current else None
    except PackNotReady as exc:
        damage = str(exc)
    return {
        "pack": name,
        "published": manifest is not None,
        "version": version_number(current) if current else None,
        "previous_version": version_number(previous) if previous else None,
        "rolled_back_from": rolled_back_from.name if rolled_back_from else None,
        # newer versions no rollback left: a publish killed before flipping `current`
        "unpublished_versions": [v.name for v in store.unpublished_versions(name)],
        "damaged": damage,
        "built_at": manifest["built_at"] if manifest else None,
        "age": time_ago(manifest["built_at"]) if manifest else None,
        "changes": manifest.get("changes") if manifest else None,
        "failures": manifest["sources"]["failures"] if manifest else [],
        "extraction": manifest["extraction"] if manifest else None,
        "gate": asdict(threshold_in_force(manifest)) if manifest else None,
        "graph": graph_status(current, manifest) if manifest else None,
        "last_build": latest_build(instance, store, name, current),
        "build_running": build_running(folder),
        "schedule": {
            "cron": cron,
            "timezone": TIMEZONE,
            "next": upcoming.isoformat() if upcoming else None,
            "running": running,
            "error": schedule_error,
        },
    }


def graph_status(version: Path, manifest: dict) -> dict:
    """Which graph stages the version's default profile runs, whether it crowds pages, and
    why: its own evidence (kpack.graph_evidence), unless the kg_config.json it was built with
    sets one."""
    choice = read_choice(version)
    configured = (manifest.get("config") or {}).get("query") or {}
    decided = (*GRAPH_TOGGLES, CROWDING)
    set_by_config = {t: configured[t] for t in decided if configured.get(t) is not None}
    return {
        "toggles": {**choice.toggles, **choice.settings, **set_by_config},
        "why": choice.summary(),
        "set_in_config": set_by_config,
    }


ENDED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def latest_build(instance: DagsterInstance, store: PackStore, name: str, current) -> dict | None:
    """The outcome record of the pack's newest build_pack run: last_build.json when it names
    that run, else derived from the run's events (pipelines.outcomes). A run that never
    finished while no build holds the lock died (SIGKILL, power loss): outcome "killed"."""
    recorded = store.last_build(name)
    runs = instance.get_runs(RunsFilter(job_name=JOB_NAME, tags={PARTITION_TAG: name}), limit=2)
    # A run that follows a build is part of it (pipelines.outcomes.FOLLOWS_TAG), and a build
    # is followed by one run at most.
    runs = [run for run in runs if FOLLOWS_TAG not in run.tags][:1]
    if not runs or (recorded and recorded.get("run_id") == runs[0].run_id):
        return recorded
    run = runs[0]
    version = version_number(current) if current else None
    if run.status in ENDED:
        summary = run_summary(instance, run)
        if summary["outcome"] in ("failed", "interrupted"):
            summary["version"] = version
    elif build_running(store.folder(name)):
        return recorded  # that run is the build in progress; "build running" says so
    else:
        summary = {"run_id": run.run_id, "outcome": "killed", "version": version}
    record = instance.get_run_record_by_id(run.run_id)
    changed = record.end_time or record.start_time if record else None
    summary["checked_at"] = (
        datetime.fromtimestamp(changed, UTC).isoformat(timespec="seconds") if changed else None
    )
    return summary
