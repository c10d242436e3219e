"""One pack's state as data (``kpack status`` and its --json): the published version and
whether it verifies, what its build changed, the latest build's outcome, whether a build holds
the lock now, and when pack_refresh_schedule rebuilds it next."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

from dagster import DagsterInstance

from kpack.config import load_config
from kpack.errors import PackError, PackNotReady
from kpack.gate import configured_threshold
from kpack.packs import pack_dir, read_manifest, time_ago
from kpack.store import PackStore, build_running, verify_version, version_number
from pipelines.instance import ensure_dagster_home
from pipelines.schedules import TIMEZONE, next_tick, schedule_running


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
    ensure_dagster_home()
    running = schedule_running(DagsterInstance.get())
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
        "gate": asdict(configured_threshold(manifest)) if manifest else None,
        "last_build": store.last_build(name),
        "build_running": build_running(folder),
        "schedule": {
            "cron": cron,
            "timezone": TIMEZONE,
            "next": upcoming.isoformat() if upcoming else None,
            "running": running,
            "error": schedule_error,
        },
    }
