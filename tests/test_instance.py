"""The Dagster instance kpack writes (pipelines/instance.py): its dagster.yaml, and a build
recorded through it in the pooled SQLite event log, as `kpack build` and `kpack ui` share it."""

from __future__ import annotations

from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus

from pipelines.instance import (
    WRITTEN_BY_KPACK,
    PooledSqliteEventLogStorage,
    ensure_dagster_home,
    kpack_config,
)
from tests.conftest import TEST_FETCH, build, write_pack


def test_dagster_yaml_is_written_upgraded_and_never_overwritten_when_the_user_wrote_it(
    tmp_path: Path,
):
    home = tmp_path / "home"
    ensure_dagster_home(home)
    config = (home / "dagster.yaml").read_text()
    assert config == kpack_config(home)

    older = f"{WRITTEN_BY_KPACK} Replace it.\ntelemetry:\n  enabled: false\n"
    (home / "dagster.yaml").write_text(older)
    ensure_dagster_home(home)
    assert (home / "dagster.yaml").read_text() == config  # an older kpack's file is upgraded

    mine = "telemetry:\n  enabled: true\nstorage:\n  sqlite:\n    base_dir: /srv/dagster\n"
    (home / "dagster.yaml").write_text(mine)
    ensure_dagster_home(home)
    assert (home / "dagster.yaml").read_text() == mine


def test_the_ui_of_a_fresh_instance_opens_without_the_community_pop_up(tmp_path: Path):
    home = ensure_dagster_home(tmp_path / "home")
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance.nux_enabled is False


def test_a_build_is_recorded_in_the_pooled_event_log_without_debug_rows(workspace: Path, site):
    home = ensure_dagster_home(workspace / "dagster_home")
    write_pack(workspace, "recorded", [site.url("/docs/guide.html")], {"fetch": TEST_FETCH})
    with DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        result = build(workspace, "recorded", instance=instance)
        assert result.published
        run = instance.get_run_by_id(result.run_id)
        assert run is not None and run.status == DagsterRunStatus.SUCCESS
        records = instance.all_logs(result.run_id)
        steps = {r.step_key for r in records if r.dagster_event and r.is_dagster_event}
        assert {"fetched_pages", "pack_graph", "pack_manifest"} <= steps
        assert not [r for r in records if "Writing file at" in (r.user_message or "")]
    # Another process (the UI) reads the same run from the files.
    with DagsterInstance.from_config(str(home)) as reader:
        assert reader.get_run_by_id(result.run_id).status == DagsterRunStatus.SUCCESS
