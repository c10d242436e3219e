"""Intermediates, caches and published packs on an S3-compatible server on 127.0.0.1.

The server is moto's server mode (a real HTTP S3 API, started by the fixture), reached through
s3fs exactly as a deployment reaches AWS S3 or MinIO: only the AWS_* variables differ.
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest
from dagster import DagsterInstance
from moto.server import ThreadedMotoServer
from s3fs import S3FileSystem

import retrieval
from cli.main import main
from kpack import remote
from kpack.packs import PackError, current_version
from pipelines.build import BuildResult, build_pack
from resources.fetcher import FetcherResource
from tests.conftest import TEST_FETCH, write_pack
from tests.docsite import DocSite, serve

BUCKET = "kpack-test"
QUESTION = "How do I calibrate the sprocket and tighten the flange?"


@pytest.fixture(scope="module")
def s3():
    """An S3 server on 127.0.0.1 with one bucket; the AWS_* variables point at it."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client
    server.stop()


@pytest.fixture(scope="module")
def docsite():
    with serve(DocSite(chapters=2, pages_per_chapter=2)) as site:
        yield site


def answer(pack: str | Path) -> tuple:
    result = retrieval.query(pack, QUESTION, use_llm=False)
    return result["answer"], result["sources"]


@pytest.fixture(scope="module")
def packs(tmp_path_factory, s3, docsite):
    """The same pack built twice: intermediates on local disk, and on the S3 server."""
    built = {}
    for label, storage in (("local", None), ("s3", f"s3://{BUCKET}/builds")):
        workspace = tmp_path_factory.mktemp(label)
        (workspace / "packs").mkdir()
        write_pack(workspace, "widgets", [f"{docsite.base}/docs/ depth=2"], {"fetch": TEST_FETCH})
        result = build_on(workspace, storage)
        assert result.outcome == "published", result.cause
        built[label] = (workspace, result)
    return built


def build_on(workspace: Path, storage: str | None) -> BuildResult:
    """conftest's build, with the intermediates under ``storage`` (None: the workspace)."""
    return build_pack(
        "widgets",
        packs_dir=workspace / "packs",
        storage=storage or str(workspace / "storage"),
        instance=DagsterInstance.ephemeral(),
        resource_overrides={"fetcher": FetcherResource(backoff_s=0.05)},
    )


def keys(s3, prefix: str) -> set[str]:
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {item["Key"] for item in listing.get("Contents", [])}


def test_a_build_keeps_its_intermediates_and_caches_on_s3_and_answers_the_same(packs, s3):
    workspace, _ = packs["s3"]
    stored = keys(s3, "builds/")
    assert {"builds/fetched_pages/widgets.parquet", "builds/embeddings/widgets.parquet"} <= stored
    assert any(key.startswith("builds/_cache/embeddings") for key in stored)
    assert not (workspace / "storage").exists()  # nothing of the build went to local disk
    local_pack = packs["local"][0] / "packs" / "widgets"
    s3_pack = workspace / "packs" / "widgets"
    assert answer(s3_pack) == answer(local_pack)


def test_a_rebuild_reads_the_previous_fetch_from_s3(packs):
    workspace, _ = packs["s3"]
    again = build_on(workspace, f"s3://{BUCKET}/builds")
    assert again.outcome == "unchanged"
    fetched = again.stage_metadata["fetched_pages"]
    assert fetched["not_modified"] == fetched["urls"] == 7


def test_push_then_query_elsewhere_pulls_the_published_pack(packs, tmp_path, monkeypatch, s3):
    workspace, _ = packs["local"]
    store = f"s3://{BUCKET}/team"
    monkeypatch.setenv("KPACK_STORAGE", store)
    monkeypatch.setenv("KPACK_PACKS_DIR", str(workspace / "packs"))
    assert main(["push", "widgets"]) == 0
    assert keys(s3, "team/published/widgets/") == {
        "team/published/widgets/current.json",
        "team/published/widgets/widgets-v0001.kpack",
    }
    # Another machine: an empty packs folder, the same store. A query pulls the pack first.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("KPACK_PACKS_DIR", str(elsewhere))
    assert answer("widgets") == answer(workspace / "packs" / "widgets")
    pulled = current_version(elsewhere / "widgets")
    assert pulled is not None and (pulled / "pack.db").exists()
    # Pulling again downloads nothing: the local pack is at the store's version.
    again = remote.pull("widgets")
    assert not again.downloaded and again.source_version == 1


def test_pulling_a_pack_the_store_does_not_have_is_one_clear_error(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("KPACK_STORAGE", f"s3://{BUCKET}/team")
    monkeypatch.setenv("KPACK_PACKS_DIR", str(tmp_path))
    with pytest.raises(PackError, match=r"is not in the shared store .*kpack push nothing"):
        remote.pull("nothing")
    assert main(["pull", "nothing"]) == 2
    with pytest.raises(PackError, match="unknown pack 'nothing'"):
        retrieval.search("nothing", QUESTION)
    assert "AWS_ENDPOINT_URL" in os.environ


def test_the_store_may_be_a_local_folder_shared_by_machines(packs, tmp_path, monkeypatch):
    workspace, _ = packs["local"]
    monkeypatch.setenv("KPACK_STORAGE", str(tmp_path / "store"))
    remote.push("widgets", workspace / "packs")
    assert (tmp_path / "store" / "published" / "widgets" / "current.json").is_file()
    assert not list((tmp_path / "store").rglob("*.tmp-*"))  # written whole, then renamed
    pulled = remote.pull("widgets", tmp_path / "elsewhere")
    assert pulled.downloaded and pulled.version == 1
    assert answer(tmp_path / "elsewhere" / "widgets") == answer(workspace / "packs" / "widgets")


def test_an_unreachable_store_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    S3FileSystem.clear_instance_cache()  # fsspec reuses a client made for the moto server
    with pytest.raises(PackError, match=r"shared store s3://.*Could not connect"):
        remote.pull("widgets", tmp_path, base=f"s3://{BUCKET}/unreachable")
