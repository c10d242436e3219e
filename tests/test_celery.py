"""A real build through the Celery executor: Redis on 127.0.0.1 and two dagster-celery workers.

The workers are started exactly as docs/deployment.md says (``dagster-celery worker start``
with the executor's YAML), in their own processes; the pack they build must answer exactly as
the same pack built in-process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, EventRecordsFilter

import retrieval
from kpack.ingest.shards import shard_count
from kpack.packs import current_version
from pipelines.build import build_pack
from resources.pack_store import DISTRIBUTED_TAG, PROCESS_TAG, process_identity
from tests.celery_cluster import celery_workers, redis_server
from tests.conftest import TEST_FETCH, write_pack
from tests.docsite import DocSite, serve

QUESTION = "How do I calibrate the sprocket and tighten the flange?"
WORKERS = 2
pytestmark = [
    pytest.mark.skipif(
        shutil.which("redis-server") is None,
        reason="redis-server is not installed (make test installs Debian's redis-server)",
    ),
    # dagster-celery registers its task again on every run it launches in one process.
    pytest.mark.filterwarnings("ignore:Task name 'execute_plan' is already registered"),
]


@pytest.fixture(scope="module")
def docsite():
    with serve(DocSite(chapters=2, pages_per_chapter=2)) as site:
        yield site


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """One machine's worth of a Celery deployment: a shared packs folder, store and Dagster
    instance, Redis, and two workers listening on the dagster queue."""
    root = tmp_path_factory.mktemp("celery")
    env = {
        "KPACK_PACKS_DIR": str(root / "packs"),
        "KPACK_STORAGE": str(root / "storage"),
        "DAGSTER_HOME": str(root / "dagster_home"),
    }
    (root / "packs").mkdir()
    with redis_server(root) as redis_url:
        executor = {"broker": f"{redis_url}/0", "backend": f"{redis_url}/1"}
        with (
            celery_workers(root, executor, env, WORKERS) as names,
            pytest.MonkeyPatch.context() as patch,
        ):
            for key, value in env.items():
                patch.setenv(key, value)
            yield root, executor, names


def answer(folder: Path) -> tuple:
    result = retrieval.query(folder, QUESTION, use_llm=False)
    return result["answer"], result["sources"]


def test_a_build_on_two_celery_workers_answers_like_an_in_process_build(
    deployment, docsite, tmp_path
):
    root, executor, workers = deployment
    urls = [f"{docsite.base}/docs/ depth=2"]
    write_pack(root, "widgets", urls, {"fetch": TEST_FETCH})
    instance = DagsterInstance.get()
    distributed = build_pack("widgets", instance=instance, executor=executor)
    assert distributed.outcome == "published", (distributed.cause, distributed.failed_steps)
    # This process orchestrated the run and held its build lock throughout; the workers did not.
    tags = instance.get_run_by_id(distributed.run_id).tags
    assert tags[PROCESS_TAG] == process_identity() and tags[DISTRIBUTED_TAG] == "celery"

    # Every step ran on a worker, and both workers took some.
    records = instance.get_event_records(
        EventRecordsFilter(event_type=DagsterEventType.ENGINE_EVENT)
    )
    hosts = {
        record.event_log_entry.dagster_event.event_specific_data.metadata["Celery worker"].value
        for record in records
        if record.event_log_entry.run_id == distributed.run_id
        and "Celery worker" in record.event_log_entry.dagster_event.event_specific_data.metadata
    }
    assert {host.split("@")[0] for host in hosts} == set(workers)
    shards = [name for name in distributed.stage_metadata if name.startswith("embeddings_shard")]
    assert len(shards) == shard_count()

    # The same pack built in this process, in another folder.
    local = tmp_path / "local"
    write_pack(local, "widgets", urls, {"fetch": TEST_FETCH})
    in_process = build_pack(
        "widgets",
        packs_dir=local / "packs",
        storage=str(local / "storage"),
        instance=DagsterInstance.ephemeral(),
    )
    assert in_process.outcome == "published"
    assert answer(root / "packs" / "widgets") == answer(local / "packs" / "widgets")
    assert current_version(root / "packs" / "widgets").name == "v0001"
    assert not list((root / "packs" / "widgets" / ".versions").glob("staging*"))
