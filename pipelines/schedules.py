"""Scheduled re-ingestion: every pack rebuilt on the cron in its own kg_config.json.

Packs are dynamic partitions, so there is no schedule per pack to declare in code (and
``build_schedule_from_partitioned_job`` only serves time-window and static partitions).
Instead one schedule, ``pack_refresh_schedule``, ticks every hour and, for every known pack,
asks whether the pack's own cron (``"schedule"`` in kg_config.json, ``"0 3 * * 1"`` = Mondays
03:00 UTC by default, ``""`` = never) had a tick in the hour that just ended; for each such
pack it requests a ``build_pack`` run of that partition. Dagster's cron utilities evaluate the
cron strings, so they mean what Dagster's own schedules mean. Pack crons are honoured to the
hour: a cron at 03:30 runs at the 04:00 tick. The run key names the pack and its cron tick, so
a tick evaluated twice never starts a second build.

The schedule is STOPPED by default: nothing rebuilds on its own until a user turns it on in
the Dagster UI (Automation). A scheduled build of a pack whose sources did not change costs
little and publishes nothing (see assets.graph).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dagster import (
    DagsterInstance,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)
from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType
from dagster._utils.schedules import get_latest_completed_cron_tick, get_next_cron_tick

from assets.partitions import packs_partitions
from kpack import settings
from kpack.config import load_config
from kpack.packs import PackError, list_packs
from pipelines.jobs import build_pack_job

EVALUATION_CRON = "0 * * * *"
EVALUATION_INTERVAL = timedelta(hours=1)
TIMEZONE = "UTC"
SCHEDULE_NAME = "pack_refresh_schedule"


def due_tick(cron: str, now: datetime, window: timedelta = EVALUATION_INTERVAL) -> datetime | None:
    """The tick of ``cron`` in (now - window, now], if there is one."""
    if not cron:
        return None
    latest = get_latest_completed_cron_tick(cron, now, TIMEZONE)
    return latest if now - window < latest <= now else None


def next_tick(cron: str, now: datetime) -> datetime | None:
    """When ``cron`` fires next after ``now`` (None for a pack that is never scheduled)."""
    return get_next_cron_tick(cron, now + timedelta(seconds=1), TIMEZONE) if cron else None


def schedule_running(instance: DagsterInstance) -> bool:
    """Whether pack_refresh_schedule has been turned on (it is STOPPED until a user does)."""
    return any(
        state.name == SCHEDULE_NAME and state.status == InstigatorStatus.RUNNING
        for state in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE)
    )


def due_packs(now: datetime, known: set[str]) -> tuple[list[tuple[str, datetime]], list[str]]:
    """(pack, cron tick) of every known pack whose cron fired in the last hour, and problems."""
    root = settings.packs_dir()
    due, problems = [], []
    for pack in list_packs(root):
        if pack not in known:
            continue  # pack_sources_sensor adds the partition first
        try:
            cron = load_config(root / pack).schedule
        except PackError as exc:
            problems.append(str(exc))
            continue
        tick = due_tick(cron, now)
        if tick is not None:
            due.append((pack, tick))
    return due, problems


@schedule(
    cron_schedule=EVALUATION_CRON,
    job=build_pack_job,
    name=SCHEDULE_NAME,
    execution_timezone=TIMEZONE,
    default_status=DefaultScheduleStatus.STOPPED,
    description="Hourly: rebuilds every pack whose kg_config.json 'schedule' cron is due "
    "(weekly, Mondays 03:00 UTC, by default). Off until turned on.",
)
def pack_refresh_schedule(context: ScheduleEvaluationContext):
    now = context.scheduled_execution_time or datetime.now(UTC)
    known = set(context.instance.get_dynamic_partitions(packs_partitions.name))
    due, problems = due_packs(now, known)
    for problem in problems:
        context.log.warning(f"not scheduled: {problem}")
    if not due:
        return SkipReason(f"no pack's schedule is due at {now.isoformat(timespec='minutes')}")
    return [
        RunRequest(
            partition_key=pack,
            run_key=f"{pack}:{tick.isoformat()}",
            tags={"kpack/trigger": "schedule", "kpack/cron_tick": tick.isoformat()},
        )
        for pack, tick in due
    ]
