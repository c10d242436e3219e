"""Driving the Dagster UI the way a user does, for the UI benchmark and the docs screenshots.

:class:`DagsterUI` starts ``kpack ui`` (``dagster dev`` with the project's workspace.yaml:
webserver, daemon and code server) on 127.0.0.1 over the folders named by the environment
(KPACK_PACKS_DIR, KPACK_STORAGE, DAGSTER_HOME), waits until the code location has loaded, and
stops every process it started. :meth:`DagsterUI.materialize` sends the same GraphQL requests
as the UI's "Materialize" button for one partition: the partition's tags and run config
(``ConfigPartitionForAssetJobQuery``), then ``launchPipelineExecution`` with the job's assets,
its asset checks and the ``dagster/partition`` tag.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness import workspace_env

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOCATION = "knowledge_packs"  # workspace.yaml's location_name
REPOSITORY = "__repository__"  # the repository a Definitions object becomes
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
DEMO = PROJECT_ROOT / "packs" / "demo"
KPACK = str(Path(sys.executable).parent / "kpack")  # the console script a user runs

ASSETS_OF_JOB = """
query AssetsOfJob($selector: PipelineSelector!) {
  assetNodes(pipeline: $selector) {
    assetKey { path }
    assetChecksOrError { ... on AssetChecks { checks { name jobNames } } }
  }
}"""

PARTITION_CONFIG = """
query ConfigPartitionForAssetJobQuery($repositoryName: String!,
    $repositoryLocationName: String!, $jobName: String!, $partitionName: String!,
    $assetKeys: [AssetKeyInput!]!) {
  pipelineOrError(params: {pipelineName: $jobName, repositoryName: $repositoryName,
      repositoryLocationName: $repositoryLocationName}) {
    __typename
    ... on Pipeline {
      partition(partitionName: $partitionName, selectedAssetKeys: $assetKeys) {
        runConfigOrError { ... on PartitionRunConfig { yaml } }
        tagsOrError { ... on PartitionTags { results { key value } } }
      }
    }
  }
}"""

LAUNCH = """
mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
    ... on PipelineNotFoundError { message }
  }
}"""

RUN = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { runId status startTime endTime tags { key value } }
  }
}"""

LATEST_RUN = """
query LatestRun($partition: String!) {
  runsOrError(filter: {tags: [{key: "dagster/partition", value: $partition}]}, limit: 1) {
    ... on Runs { results { runId } }
  }
}"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def prepare(work: Path, packs: list[str], with_eval: bool = False) -> dict[str, str]:
    """Copies of the demo pack named ``packs`` under ``work``, and the environment to use them.

    docs/ is copied beside the packs folder (the demo's urls.txt reads ``../../docs/*.md``), so
    the pages stay fixed while someone edits docs/. ``with_eval`` copies its questions too.
    """
    shutil.copytree(PROJECT_ROOT / "docs", work / "docs", ignore=shutil.ignore_patterns("*.ipynb"))
    for pack in packs:
        folder = work / "packs" / pack
        folder.mkdir(parents=True)
        for name in ("urls.txt", "kg_config.json"):
            if (DEMO / name).exists():
                shutil.copy2(DEMO / name, folder / name)
        if with_eval:
            (folder / "eval").mkdir()
            shutil.copy2(DEMO / "eval" / "questions.jsonl", folder / "eval" / "questions.jsonl")
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # as kpack writes it
    return {**os.environ, **workspace_env(work)}


def add_partitions(packs: list[str]) -> None:
    """What pack_sources_sensor does for new pack folders, done up front so no run waits."""
    from dagster import DagsterInstance

    from assets.partitions import packs_partitions

    DagsterInstance.get().add_dynamic_partitions(packs_partitions.name, packs)


def seed_caches(source_storage: Path, storage: Path, source: str, pack: str) -> None:
    """Copy pack ``source``'s caches (embeddings, gate probes; per model) to ``pack``."""
    for cached in sorted((source_storage / "_cache").glob(f"*/{source}.parquet")):
        target = storage / "_cache" / cached.parent.name
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cached, target / f"{pack}.parquet")


class DagsterUI:
    """``kpack ui`` as a child process group; use as a context manager."""

    def __init__(self, env: dict[str, str], log_path: Path, port: int | None = None) -> None:
        self.env = env
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> DagsterUI:
        self.log = self.log_path.open("w")
        # A new session: `dagster dev` starts the webserver, the daemon and a code server as
        # its children, and stopping the group stops them all.
        self.process = subprocess.Popen(
            [KPACK, "ui", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=PROJECT_ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_until_loaded()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGINT)  # dagster dev shuts its children down on Ctrl-C
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait()
        self.log.close()

    def wait_until_loaded(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"kpack ui exited early; see {self.log_path}")
            try:
                answer = self.graphql(
                    'query { pipelineOrError(params: {pipelineName: "build_pack", '
                    f'repositoryName: "{REPOSITORY}", repositoryLocationName: "{LOCATION}"}})'
                    " { __typename } }"
                )
                if answer["pipelineOrError"]["__typename"] == "Pipeline":
                    return
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit(
            f"the Dagster UI did not load within {timeout_s:.0f}s; see {self.log_path}"
        )

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
        if body.get("errors"):
            raise RuntimeError(f"GraphQL error: {body['errors']}")
        return body["data"]

    def materialize(self, job: str, partition: str, asset_names: list[str] | None = None) -> str:
        """Launch ``job`` (its assets, or ``asset_names`` of it) for one partition; the run id."""
        selector = {"pipelineName": job, "repositoryName": REPOSITORY}
        selector["repositoryLocationName"] = LOCATION
        nodes = self.graphql(ASSETS_OF_JOB, {"selector": selector})["assetNodes"]
        if asset_names is not None:
            nodes = [n for n in nodes if n["assetKey"]["path"][-1] in asset_names]
        asset_keys = [{"path": n["assetKey"]["path"]} for n in nodes]
        checks = [
            {"assetKey": {"path": n["assetKey"]["path"]}, "name": check["name"]}
            for n in nodes
            for check in n["assetChecksOrError"].get("checks", [])
            if job in check["jobNames"]
        ]
        config = self.graphql(
            PARTITION_CONFIG,
            {
                "repositoryName": REPOSITORY,
                "repositoryLocationName": LOCATION,
                "jobName": job,
                "partitionName": partition,
                "assetKeys": asset_keys,
            },
        )["pipelineOrError"]["partition"]
        tags = [*config["tagsOrError"]["results"], {"key": "dagster/from_ui", "value": "true"}]
        params = {
            "mode": "default",
            "executionMetadata": {"tags": tags},
            "runConfigData": config["runConfigOrError"].get("yaml") or "{}",
            "selector": {**selector, "assetSelection": asset_keys, "assetCheckSelection": checks},
        }
        launched = self.graphql(LAUNCH, {"executionParams": params})["launchPipelineExecution"]
        if launched["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launch failed: {launched}")
        return launched["run"]["runId"]

    def run(self, run_id: str) -> dict[str, Any]:
        run = self.graphql(RUN, {"runId": run_id})["runOrError"]
        run["tags"] = {t["key"]: t["value"] for t in run.get("tags", [])}
        return run

    def wait_for_run(self, run_id: str, timeout_s: float = 600, poll_s: float = 0.25) -> dict:
        """Poll until the run ends; the run plus ``seen_end``, the epoch second it was seen."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if run["status"] in TERMINAL:
                return {**run, "seen_end": time.time()}
            time.sleep(poll_s)
        raise SystemExit(f"run {run_id} did not end within {timeout_s:.0f}s")

    def latest_run_id(self, partition: str) -> str:
        return self.graphql(LATEST_RUN, {"partition": partition})["runsOrError"]["results"][0][
            "runId"
        ]
