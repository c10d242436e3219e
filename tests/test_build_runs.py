"""Every build is a run of the build_pack job, tagged with its outcome, whoever started it."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
    build_run_status_sensor_context,
)
from dagster._core.definitions.data_version import CODE_VERSION_TAG, DATA_VERSION_TAG, StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from assets.fetch import FORCE_TAG
from assets.partitions import BUILD_CODE_VERSION
from kpack.graph_evidence import EVIDENCE_FILE
from pipelines.definitions import make_definitions
from pipelines.instance import open_instance
from pipelines.jobs import BUILD_GROUPS, JOB_NAME
from pipelines.outcomes import (
    OUTCOME_TAG,
    build_failure_sensor,
    build_outcome_sensor,
    run_summary,
)
from pipelines.status import pack_status
from tests.conftest import TEST_FETCH, build, write_pack

PAGES = ["/docs/index.html", "/docs/guide.html"]


def site_pack(workspace: Path, site, name: str, pages=PAGES) -> Path:
    return write_pack(workspace, name, [site.url(p) for p in pages], {"fetch": TEST_FETCH})


def outcome_tags(instance: DagsterInstance) -> list[str]:
    runs = instance.get_runs(RunsFilter(job_name=JOB_NAME))
    return [run.tags.get(OUTCOME_TAG) for run in reversed(runs)]


def daemon_context(sensor, result, instance: DagsterInstance):
    """The context the Dagster daemon gives a run status sensor when ``result``'s run ends."""
    ended = ("PIPELINE_SUCCESS", "PIPELINE_FAILURE")
    return build_run_status_sensor_context(
        sensor_name=sensor.name,
        dagster_event=next(e for e in result.all_events if e.event_type_value in ended),
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(result.run_id),
    )


def test_cli_builds_are_build_pack_runs_tagged_with_their_outcome(workspace, site, site_fetcher):
    site_pack(workspace, site, "tagged")
    instance = DagsterInstance.ephemeral()
    first = build(workspace, "tagged", fetcher=site_fetcher, instance=instance)
    second = build(workspace, "tagged", fetcher=site_fetcher, instance=instance)
    assert (first.outcome, second.outcome) == ("published", "unchanged")
    assert outcome_tags(instance) == ["published v0001", "unchanged since v0001"]
    assert [run.job_name for run in instance.get_runs()] == [JOB_NAME, JOB_NAME]


def test_the_ui_shows_a_no_change_build_as_fresh_stages_and_an_unchanged_data_version(
    workspace, site, site_fetcher
):
    site_pack(workspace, site, "versioned")
    instance = DagsterInstance.ephemeral()
    first = build(workspace, "versioned", fetcher=site_fetcher, instance=instance)
    second = build(workspace, "versioned", fetcher=site_fetcher, instance=instance)
    assert (first.outcome, second.outcome) == ("published", "unchanged")

    # fetched_pages: the sources fingerprint the version records is its data version, and the
    # no-change build's observation carries the same one (the UI lists it with its events).
    fetched = AssetRecordsFilter(AssetKey("fetched_pages"), asset_partitions=["versioned"])
    [materialized] = instance.fetch_materializations(fetched, limit=5).records
    [observed] = instance.fetch_observations(fetched, limit=5).records
    assert observed.run_id == second.run_id
    data_versions = {
        materialized.asset_materialization.tags[DATA_VERSION_TAG],
        observed.asset_observation.tags[DATA_VERSION_TAG],
    }
    assert data_versions == {first.manifest["sources_fingerprint"]}
    assert materialized.asset_materialization.tags[CODE_VERSION_TAG] == BUILD_CODE_VERSION

    # What the UI's asset graph shows: every stage fresh, none stale for code or data.
    stages = [
        asset
        for asset in make_definitions(workspace / "packs", str(workspace / "storage")).assets
        if set(asset.group_names_by_key.values()) <= set(BUILD_GROUPS)
    ]
    resolver = get_stale_status_resolver(instance, stages)
    keys = [key for asset in stages for key in asset.keys]
    assert len(keys) > 10
    assert {resolver.get_status(key, "versioned") for key in keys} == {StaleStatus.FRESH}


def test_a_failed_run_launched_through_dagster_shows_as_failed_in_status(workspace, site):
    # Every URL is a 404: the failed-URL check stops the run, as in a UI launch.
    site_pack(workspace, site, "broken", pages=["/missing-1.html", "/missing-2.html"])
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("packs", ["broken"])
    job = make_definitions(workspace / "packs", str(workspace / "storage")).resolve_job_def(
        JOB_NAME
    )
    result = job.execute_in_process(partition_key="broken", instance=instance, raise_on_error=False)
    run = instance.get_run_by_id(result.run_id)
    assert run.status == DagsterRunStatus.FAILURE

    # What the Dagster daemon does when a build_pack run fails, whoever launched it.
    context = daemon_context(build_failure_sensor, result, instance).for_run_failure()
    build_failure_sensor(context)

    status = pack_status("broken")
    last = status["last_build"]
    assert last["outcome"] == "failed" and last["run_id"] == run.run_id
    assert "2/2 URLs failed" in last["cause"] and "404" in last["cause"]
    assert instance.get_run_by_id(run.run_id).tags[OUTCOME_TAG].startswith("failed: ")


def test_a_daemon_build_found_unchanged_is_followed_by_graph_evidence_other_code_measured(
    workspace, site, site_fetcher
):
    site_pack(workspace, site, "measured")
    instance = open_instance()  # the one in DAGSTER_HOME, which `kpack status` reads
    assert build(workspace, "measured", fetcher=site_fetcher, instance=instance).published
    version = (workspace / "packs" / "measured" / ".versions" / "current").resolve()
    measured = json.loads((version / EVIDENCE_FILE).read_text())
    older = {k: v for k, v in measured.items() if k != "code_version"}  # an older kpack's
    (version / EVIDENCE_FILE).write_text(json.dumps(older))
    job = make_definitions(
        workspace / "packs", str(workspace / "storage"), {"fetcher": site_fetcher}
    ).resolve_job_def(JOB_NAME)
    # A run as the daemon launches one (the schedule, the UI), then what the daemon does when
    # it succeeds.
    result = job.execute_in_process(partition_key="measured", instance=instance)
    run = instance.get_run_by_id(result.run_id)
    context = daemon_context(build_outcome_sensor, result, instance)
    request = build_outcome_sensor(context)
    assert instance.get_run_by_id(run.run_id).tags[OUTCOME_TAG] == "unchanged since v0001"
    assert request.partition_key == "measured"
    assert request.asset_selection == [AssetKey("graph_evidence")]
    # The requested run measures the version again, and carries the build's outcome, so no
    # sensor records it as a build of its own.
    again = job.execute_in_process(
        partition_key="measured",
        instance=instance,
        asset_selection=request.asset_selection,
        tags=request.tags,
    )
    assert json.loads((version / EVIDENCE_FILE).read_text()) == measured
    assert instance.get_run_by_id(again.run_id).tags[OUTCOME_TAG] == "unchanged since v0001"
    last = pack_status("measured")["last_build"]
    assert (last["outcome"], last["run_id"]) == ("unchanged", result.run_id)
    # Measured by this code, the next unchanged build is followed by nothing.
    result = job.execute_in_process(partition_key="measured", instance=instance)
    context = daemon_context(build_outcome_sensor, result, instance)
    assert build_outcome_sensor(context) is None


def test_a_ui_run_forced_by_its_tag_publishes_and_a_misspelt_tag_is_refused(
    workspace, site, site_fetcher
):
    site_pack(workspace, site, "tagged")
    instance = DagsterInstance.ephemeral()
    assert build(workspace, "tagged", fetcher=site_fetcher, instance=instance).published
    definitions = make_definitions(
        workspace / "packs", str(workspace / "storage"), {"fetcher": site_fetcher}
    )
    job = definitions.resolve_job_def(JOB_NAME)

    def launch(force: str) -> dict:
        """A run as the UI's launchpad starts one, with the kpack/force tag."""
        result = job.execute_in_process(
            partition_key="tagged",
            instance=instance,
            tags={FORCE_TAG: force},
            raise_on_error=False,
        )
        return run_summary(instance, instance.get_run_by_id(result.run_id))

    assert launch("false")["outcome"] == "unchanged"
    assert (launch("True")["outcome"], launch("true")["version"]) == ("published", 3)
    refused = launch("yes")
    assert refused["outcome"] == "failed"
    assert refused["cause"] == "run tag kpack/force must be true or false, not 'yes'"


def test_kpack_build_in_a_terminal_shows_progress_rows_while_it_runs(workspace, site):
    site_pack(workspace, site, "watched")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "build", "watched"],
        stdin=child,
        stdout=child,
        stderr=child,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
    )
    os.close(child)
    output, first_row_at = b"", None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
            if first_row_at is None and b"fetched_pages" in output:
                first_row_at = time.monotonic()
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    finished_at = time.monotonic()
    os.close(main)
    text = output.decode(errors="replace")
    assert process.returncode == 0, text[-2000:]
    assert first_row_at is not None, text[-2000:]
    # The row was on screen while the build still ran (the model load alone takes seconds).
    assert finished_at - first_row_at > 0.5
    assert "watched v1 published" in text
