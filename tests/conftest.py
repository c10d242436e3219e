"""Shared fixtures: the loopback site, packs in a temporary folder, and building them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from dagster import DagsterInstance

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("ANTHROPIC_API_KEY", None)

from pipelines.build import BuildResult, build_pack
from resources.fetcher import FetcherResource
from tests.loopback import LoopbackServer, SiteHandler

TEST_FETCH = {
    "allow_private_hosts": True,
    "timeout_s": 1.0,
    "retries": 2,
    "max_bytes": 200_000,
    "per_host_delay_s": 0.0,
}


@pytest.fixture(scope="session")
def site():
    with LoopbackServer(SiteHandler) as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with an empty packs folder, used by the CLI and retrieval too."""
    packs = tmp_path / "packs"
    packs.mkdir()
    monkeypatch.setenv("KPACK_PACKS_DIR", str(packs))
    monkeypatch.setenv("KPACK_STORAGE", str(tmp_path / "storage"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    return tmp_path


def write_pack(workspace: Path, name: str, urls: list[str], config: dict | None = None) -> Path:
    folder = workspace / "packs" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "urls.txt").write_text("\n".join(urls) + "\n")
    if config is not None:
        (folder / "kg_config.json").write_text(json.dumps(config))
    return folder


def build(
    workspace: Path,
    name: str,
    fetcher: FetcherResource | None = None,
    force: bool = False,
    instance: DagsterInstance | None = None,
    **resources,
) -> BuildResult:
    """Materialize the whole asset graph for one pack against an ephemeral Dagster instance."""
    overrides = {"fetcher": fetcher or FetcherResource(backoff_s=0.05), **resources}
    return build_pack(
        name,
        packs_dir=workspace / "packs",
        storage=str(workspace / "storage"),
        instance=instance or DagsterInstance.ephemeral(),
        resource_overrides=overrides,
        force=force,
    )


@pytest.fixture
def site_fetcher(site: LoopbackServer) -> FetcherResource:
    """A fetcher that treats the loopback site as GitHub, for the blob-URL rewrite."""
    host = site.base.removeprefix("http://")
    return FetcherResource(backoff_s=0.05, github_host=host, github_raw_base=f"{site.base}/raw")


# The pack the archive tests export and install (tests/test_archive*.py), built once.
ARCHIVE_PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
ARCHIVE_EVAL = [
    {"id": "q1", "question": "How do I install the toolkit?", "ground_truth": "pip install"}
]
# A query setting the installed pack must carry along to answer the same.
ARCHIVE_CONFIG = {"fetch": TEST_FETCH, "query": {"context_confidence_threshold": 0.3}}


@pytest.fixture(scope="session")
def built(site, tmp_path_factory) -> Path:
    """packs/widgets (built, with kg_config.json and eval questions) and packs/unbuilt."""
    workspace = tmp_path_factory.mktemp("archive")
    folder = write_pack(workspace, "widgets", [site.url(p) for p in ARCHIVE_PAGES], ARCHIVE_CONFIG)
    (folder / "eval").mkdir()
    questions = "".join(json.dumps(q) + "\n" for q in ARCHIVE_EVAL)
    (folder / "eval" / "questions.jsonl").write_text(questions)
    write_pack(workspace, "unbuilt", [site.url("/docs/index.html")])
    assert build(workspace, "widgets").published
    return workspace / "packs"


@pytest.fixture(scope="session")
def archive(built, tmp_path_factory) -> Path:
    """The archive of packs/widgets (kpack export)."""
    from kpack.archive import export_pack

    return export_pack("widgets", tmp_path_factory.mktemp("out") / "widgets-v1.kpack", built).path
