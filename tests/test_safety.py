"""Safety: killed builds, secrets, parameterized Cypher and pack names."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance

import retrieval
from kpack.packs import PackError
from pipelines.build import build_pack
from resources.llm import ClaudeResource
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import fake_anthropic_server

PROJECT = Path(__file__).resolve().parent.parent
PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
CHANGING = "/live/changing/killed.html"
QUESTION = "Which environment variable sets where the sprocket cache lives?"

# A build in another process that stops for good inside one stage, for the test to kill it:
# it writes the marker file, then sleeps. "embeddings": while embedding; "pack_graph": right
# after creating the staging folder; "publish": before the staged folder is renamed.
KILLABLE_BUILD = """
import sys, time
from pathlib import Path
from dagster import DagsterInstance
from pipelines.build import build_pack
from resources.embedder import EmbedderResource
from resources.fetcher import FetcherResource
from resources.pack_store import PackStore

stage, packs, storage, marker = sys.argv[1:5]

def stop_here():
    Path(marker).write_text(stage)
    time.sleep(600)

class StuckEmbedder(EmbedderResource):
    def embed(self, texts, name=None, precision="fp32"):
        stop_here()

class StuckStore(PackStore):
    def new_staging(self, pack, run_id):
        staging = super().new_staging(pack, run_id)
        if stage == "pack_graph":
            stop_here()
        return staging

    def publish(self, pack, version, staging):
        stop_here()

overrides = {"fetcher": FetcherResource(backoff_s=0.05), "pack_store": StuckStore(packs_dir=packs)}
if stage == "embeddings":
    overrides["embedder"] = StuckEmbedder()
build_pack("killed", packs_dir=Path(packs), storage=storage,
           instance=DagsterInstance.ephemeral(), resource_overrides=overrides)
"""


def answer(folder: Path) -> dict:
    """An extractive answer read from disk afresh (the per-process caches dropped)."""
    retrieval.close_all()
    result = retrieval.query(folder, QUESTION, use_llm=False)
    return {k: result[k] for k in ("answer", "sources", "entities", "facts", "query_type")}


def kill_build_in(stage: str, workspace: Path, tmp_path: Path) -> None:
    marker = tmp_path / f"reached-{stage}"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLABLE_BUILD,
            stage,
            str(workspace / "packs"),
            str(workspace / "storage"),
            str(marker),
        ],
        cwd=PROJECT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert child.poll() is None, child.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, f"the build never reached {stage}"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL


def test_a_killed_build_leaves_the_pack_queryable_and_the_next_one_resumes(
    workspace, site, tmp_path
):
    folder = write_pack(
        workspace, "killed", [site.url(p) for p in [*PAGES, CHANGING]], {"fetch": TEST_FETCH}
    )
    first = build(workspace, "killed")
    assert first.published
    before = answer(folder)
    assert "WIDGET_HOME" in before["answer"]

    site.revisions[CHANGING] = 2  # the next builds have one new text to embed
    for stage in ("embeddings", "pack_graph", "publish"):
        kill_build_in(stage, workspace, tmp_path)
        assert os.readlink(folder / ".versions" / "current") == "v0001", stage
        assert json.loads((folder / "manifest.json").read_text())["version"] == 1
        assert answer(folder) == before, stage
        # A killed build records nothing: the last record is still the first build's.
        last = json.loads((folder / ".versions" / "last_build.json").read_text())
        assert (last["outcome"], last["run_id"]) == ("published", first.run_id)

    # The next build resumes: the killed pack_graph run had embedded and cached the new text.
    resumed = build(workspace, "killed")
    assert resumed.published and resumed.manifest["version"] == 2
    assert resumed.manifest["embedding"]["embedded_this_build"] == 0
    assert resumed.manifest["changes"]["changed"] == 1  # compared with v1, not the killed runs
    assert not list((folder / ".versions").glob("staging*"))  # the killed runs' are removed
    assert answer(folder)["answer"] == before["answer"]


def test_the_api_key_never_appears_in_logs_manifests_parquet_or_errors(
    workspace, site, monkeypatch, capfd
):
    key = f"sk-ant-api03-LEAKCHECK-{uuid.uuid4().hex}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    folder = write_pack(workspace, "secret", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    instance = DagsterInstance.ephemeral()
    runs = []
    with fake_anthropic_server() as fake:
        result = build(
            workspace, "secret", instance=instance, claude=ClaudeResource(base_url=fake.base)
        )
        assert result.published and result.manifest["extraction"]["llm_calls"] > 0
        runs.append(result.run_id)
        headers = fake.requests[0]["headers"]
        sent = headers.get("x-api-key") or headers.get("authorization", "")
        assert sent.removeprefix("Bearer ") == key  # the key was used, and sent
    # A server that fails and echoes the key back in its error message: a failing section
    # falls back to the offline extractor (500), a refused key (401) fails the build.
    (folder / "kg_config.json").write_text(
        json.dumps({"fetch": TEST_FETCH, "extraction_model": "claude-sonnet-4-5"})
    )
    for status, pages in ((500, list(reversed(PAGES))), (401, PAGES)):
        (folder / "urls.txt").write_text("".join(site.url(p) + "\n" for p in pages))
        with fake_anthropic_server(fail_with=status, echo_key=True) as failing:
            failed = build(
                workspace,
                "secret",
                instance=instance,
                claude=ClaudeResource(base_url=failing.base, max_retries=0),
            )
        runs.append(failed.run_id)
        if status == 500:
            assert failed.success and failed.manifest["extraction"]["llm_failures"] > 0
        else:
            assert not failed.success and "was refused (401)" in failed.cause

    logged = []
    for run_id in runs:
        run = instance.get_run_by_id(run_id)
        logged.append(json.dumps(run.run_config, default=str) + json.dumps(run.tags))
        for record in instance.all_logs(run_id):
            logged.append(record.message or "")
            logged.append(repr(record.dagster_event))
    logs = "\n".join(logged)
    assert "[redacted API key]" in logs  # the echoed key reached the warning, scrubbed
    assert key not in logs
    captured = capfd.readouterr()
    assert key not in captured.out + captured.err
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md"):
            assert key not in path.read_text(), path
    parquet = list((workspace / "storage").rglob("*.parquet"))
    assert len(parquet) > 10
    for path in parquet:
        assert key.encode() not in path.read_bytes(), path
        assert key not in json.dumps(pq.read_table(path).to_pylist(), default=str), path
    # The error a failed extraction raises is scrubbed too.
    claude = ClaudeResource(base_url="http://127.0.0.1:9", max_retries=0)
    assert key not in claude.redact(f"boom {key} boom")


# Names that may be interpolated into Cypher: schema constants from kpack.contracts and module
# constants, never values that come from a user, a page or a pack.
CYPHER_CONSTANTS = re.compile(
    r"^((table|t)\.name|label|index|extension|columns|[A-Z][A-Z0-9_]*|"
    r"(VECTOR|FTS)_INDEXES\['[A-Za-z]+'\]|"
    r"self\.(name|source|target)|cols|props|self\.columns\[0\]\[0\])$"
)
CYPHER_WORDS = re.compile(r"\b(MATCH|CALL|CREATE|COPY|LOAD|RETURN|MERGE|SET|DELETE)\b")


def cypher_fstrings() -> list[tuple[str, int, str]]:
    """(file, line, expression) of every value interpolated into an f-string that is Cypher."""
    found = []
    for folder in ("assets", "resources", "kpack", "pipelines", "retrieval"):
        for path in sorted((PROJECT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, ast.JoinedStr):
                    continue
                literal = "".join(
                    v.value for v in node.values if isinstance(v, ast.Constant)
                ).strip()
                if not CYPHER_WORDS.match(literal):
                    continue
                for value in node.values:
                    if isinstance(value, ast.FormattedValue):
                        found.append((path.name, node.lineno, ast.unparse(value.value)))
    return found


def test_cypher_interpolates_only_schema_constants():
    interpolated = cypher_fstrings()
    assert interpolated, "the scan found no Cypher f-string at all: is it still looking?"
    offending = [f for f in interpolated if not CYPHER_CONSTANTS.match(f[2])]
    assert offending == [], "user values must be $parameters, not f-string interpolation"


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".hidden", "x" * 65, "a\nb"])
def test_a_pack_name_that_could_leave_the_packs_folder_is_refused(workspace, name):
    with pytest.raises(PackError, match="invalid pack name"):
        build_pack(name, packs_dir=workspace / "packs", instance=DagsterInstance.ephemeral())
    with pytest.raises(PackError):  # retrieval also takes a folder path: never a pack of it
        retrieval.query(name, QUESTION, use_llm=False)


def test_a_version_orphaned_by_a_kill_mid_publish_is_never_current_and_is_pruned(workspace):
    from tests.test_cli import publish_fake_version

    folder = write_pack(workspace, "orphan", ["https://docs.example.org/a"])
    publish_fake_version(workspace, "orphan")
    publish_fake_version(workspace, "orphan")
    # Killed after renaming staging to v0003 but before flipping `current`.
    (folder / ".versions" / "v0003").mkdir()
    assert os.readlink(folder / ".versions" / "current") == "v0002"
    assert publish_fake_version(workspace, "orphan") == 4
    assert sorted(p.name for p in (folder / ".versions").glob("v*")) == ["v0002", "v0004"]
