"""The sensor that follows the packs folder and the schedule that re-ingests packs on their cron."""

from __future__ import annotations

import json
from contextlib import ExitStack
from datetime import UTC, datetime

import pytest
from dagster import (
    AddDynamicPartitionsRequest,
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
)

from assets.partitions import packs_partitions
from kpack.config import load_config
from kpack.packs import PackError
from pipelines.schedules import due_tick, next_tick, pack_refresh_schedule
from pipelines.sensors import pack_sources_sensor
from tests.conftest import write_pack

MONDAY_3AM = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)


def tick(instance, cursor=None):
    return pack_sources_sensor(build_sensor_context(instance=instance, cursor=cursor))


def partitions(result, kind: type) -> list[str]:
    """The pack partitions a sensor tick asks to add or delete (``kind``: the request type)."""
    return [
        key
        for request in result.dynamic_partitions_requests
        if isinstance(request, kind)
        for key in request.partition_keys
    ]


def added(result) -> list[str]:
    return partitions(result, AddDynamicPartitionsRequest)


def deleted(result) -> list[str]:
    return partitions(result, DeleteDynamicPartitionsRequest)


def test_sensor_adds_partitions_and_builds_a_pack_whose_sources_change(workspace):
    folder = write_pack(workspace, "alpha", ["file:pages/a"])
    instance = DagsterInstance.ephemeral()

    first = tick(instance)
    assert added(first) == ["alpha"] and first.run_requests == []  # first tick: record only
    instance.add_dynamic_partitions(packs_partitions.name, added(first))

    quiet = tick(instance, first.cursor)
    assert quiet.run_requests == [] and added(quiet) == []

    (folder / "urls.txt").write_text("file:pages/a\nfile:pages/b\n")
    changed = tick(instance, quiet.cursor)
    assert [r.partition_key for r in changed.run_requests] == ["alpha"]
    run_key = changed.run_requests[0].run_key
    assert run_key.startswith("alpha:")

    (folder / "kg_config.json").write_text(json.dumps({"chunk_tokens": 300}))
    write_pack(workspace, "beta", ["file:pages/c"])
    again = tick(instance, changed.cursor)
    assert [r.partition_key for r in again.run_requests] == ["alpha"]
    assert again.run_requests[0].run_key != run_key  # a new fingerprint, a new run
    assert added(again) == ["beta"]  # a new pack becomes a partition, not a build
    assert pack_sources_sensor.default_status == DefaultSensorStatus.RUNNING


def test_a_pack_whose_pages_are_on_the_web_joins_the_ui_once_built(workspace):
    """ "Materialize all" in the UI builds every partition: on a fresh clone, the web-only
    example packs would fail offline, so they become partitions once built (kpack build)."""
    write_pack(workspace, "local", ["file:pages/a.md"])
    web = write_pack(workspace, "web", ["https://docs.example.org/a"])
    instance = DagsterInstance.ephemeral()
    first = tick(instance)
    assert added(first) == ["local"]
    instance.add_dynamic_partitions(packs_partitions.name, added(first))
    (web / ".versions" / "v0001").mkdir(parents=True)
    (web / ".versions" / "current").symlink_to("v0001")
    assert added(tick(instance, first.cursor)) == ["web"]


def test_sensor_ignores_schedule_query_and_comment_only_edits(workspace):
    folder = write_pack(workspace, "alpha", ["file:pages/a"], {"chunk_tokens": 200})
    instance = DagsterInstance.ephemeral()
    first = tick(instance)
    instance.add_dynamic_partitions(packs_partitions.name, added(first))
    config = {"chunk_tokens": 200, "schedule": "0 5 * * *"}
    (folder / "kg_config.json").write_text(json.dumps(config))
    after_schedule = tick(instance, first.cursor)
    assert after_schedule.run_requests == []
    config["query"] = {"context_confidence_threshold": 0.3, "profile": "baseline"}
    (folder / "kg_config.json").write_text(json.dumps(config, indent=4))
    after_query = tick(instance, after_schedule.cursor)
    assert after_query.run_requests == []
    urls = folder / "urls.txt"
    urls.write_text(f"# the pages of alpha\n\n{urls.read_text()}")  # a comment is no new URL
    after_comment = tick(instance, after_query.cursor)
    assert after_comment.run_requests == []
    config["chunk_tokens"] = 300
    (folder / "kg_config.json").write_text(json.dumps(config))
    after_build_setting = tick(instance, after_comment.cursor)
    assert [r.partition_key for r in after_build_setting.run_requests] == ["alpha"]


def test_sensor_removes_the_partition_of_a_deleted_pack_folder(workspace):
    import shutil

    folder = write_pack(workspace, "gone", ["file:pages/a"])
    write_pack(workspace, "kept", ["file:pages/b"])
    instance = DagsterInstance.ephemeral()
    first = tick(instance)
    instance.add_dynamic_partitions(packs_partitions.name, added(first))
    shutil.rmtree(folder)
    result = tick(instance, first.cursor)
    assert deleted(result) == ["gone"] and added(result) == []


def test_schedule_requests_runs_for_packs_whose_cron_is_due(workspace):
    with ExitStack() as stack:
        _schedule_scenario(workspace, stack)


def _schedule_scenario(workspace, stack):
    write_pack(workspace, "weekly", ["https://example.org/w"])  # default: Mondays 03:00
    write_pack(workspace, "daily", ["https://example.org/d"], {"schedule": "30 5 * * *"})
    write_pack(workspace, "never", ["https://example.org/n"], {"schedule": ""})
    write_pack(workspace, "broken", ["https://example.org/b"], {"schedule": 5})
    write_pack(workspace, "unregistered", ["https://example.org/u"])
    from pipelines.definitions import defs

    repository = defs.get_repository_def()  # to resolve the partitioned run requests
    instance = stack.enter_context(instance_for_test())  # schedules need an instance ref
    instance.add_dynamic_partitions(packs_partitions.name, ["weekly", "daily", "never", "broken"])

    def evaluate(when: datetime):
        context = build_schedule_context(
            instance=instance, scheduled_execution_time=when, repository_def=repository
        )
        return pack_refresh_schedule.evaluate_tick(context)

    monday = evaluate(MONDAY_3AM).run_requests
    assert [(r.partition_key, r.run_key) for r in monday] == [
        ("weekly", f"weekly:{MONDAY_3AM.isoformat()}")
    ]
    assert monday[0].tags["kpack/trigger"] == "schedule"
    # 05:30 is honoured at the 06:00 tick, once.
    six = evaluate(MONDAY_3AM.replace(hour=6)).run_requests
    assert [(r.partition_key, r.run_key) for r in six] == [
        ("daily", f"daily:{MONDAY_3AM.replace(hour=5, minute=30).isoformat()}")
    ]
    assert evaluate(MONDAY_3AM.replace(hour=7)).run_requests == []
    tuesday = evaluate(MONDAY_3AM.replace(day=24))
    assert not tuesday.run_requests and "no pack's schedule is due" in tuesday.skip_message

    assert pack_refresh_schedule.default_status == DefaultScheduleStatus.STOPPED
    assert pack_refresh_schedule.job_name == "build_pack"


def test_cron_helpers():
    assert due_tick("0 3 * * 1", MONDAY_3AM) == MONDAY_3AM
    assert due_tick("0 3 * * 1", MONDAY_3AM.replace(minute=59)) == MONDAY_3AM
    assert due_tick("0 3 * * 1", MONDAY_3AM.replace(hour=4, minute=1)) is None
    assert due_tick("", MONDAY_3AM) is None
    assert next_tick("0 3 * * 1", MONDAY_3AM) == MONDAY_3AM.replace(day=30)
    assert next_tick("", MONDAY_3AM) is None


@pytest.mark.parametrize("cron", ["every monday", "61 * * * *", "0 3 * *"])
def test_an_invalid_schedule_is_a_config_error(tmp_path, cron):
    (tmp_path / "kg_config.json").write_text(json.dumps({"schedule": cron}))
    with pytest.raises(PackError, match="schedule must be a cron string"):
        load_config(tmp_path)


def test_schedule_and_sensor_are_in_the_code_location():
    from pipelines.definitions import defs

    repository = defs.get_repository_def()
    assert repository.has_schedule_def("pack_refresh_schedule")
    assert repository.has_sensor_def("pack_sources_sensor")
