"""Opt-in distributed execution of a pack build: each step a task on a worker.

The build_pack job runs in one process (pipelines.jobs). ``build_pack_celery`` is the same
asset selection with dagster-celery's executor: the orchestrating process puts each step
(fetch, parse, ..., each embedding shard, the Kuzu load, publish) on a Celery queue (Redis as
broker and result backend), and ``dagster-celery`` workers, on this machine or others, run
them. What makes that work:

* every step reads and writes its inputs through the shared store (KPACK_STORAGE: a folder
  all workers see, or s3://..., see resources.storage), and the embedding is split into shards
  (assets.embed) that run as separate steps, on as many workers;
* the Kuzu load (pack_graph) and the publish stay one step each: one writer per database;
* workers load the job from this module (``reconstructable(celery_build_job)``), so they need
  the project installed and the same KPACK_PACKS_DIR, KPACK_STORAGE, KPACK_EMBED_SHARDS and
  DAGSTER_HOME (a shared instance) as the launcher;
* the run's build lifecycle (the pack's build lock, the cleanup of its staging folder; see
  resources.pack_store.build_lifecycle) is held by the process that orchestrates the run, for
  the whole run, however it was launched: ``with_build_lifecycle`` wraps the executor, and
  every run of the job carries ``DISTRIBUTED_TAG`` so the workers' PackStore resources leave
  the lifecycle alone (a step on a worker cannot hold a lock across steps).

docs/deployment.md has the configuration: Redis, the workers, and the Kubernetes variant.
"""

from __future__ import annotations

from typing import Any

from dagster import (
    DagsterInstance,
    Definitions,
    JobDefinition,
    execute_job,
    reconstructable,
)
from dagster._core.execution.execution_result import ExecutionResult
from dagster_celery import celery_executor

from kpack import settings
from pipelines.jobs import build_job
from resources.pack_store import DISTRIBUTED_TAG, with_build_lifecycle

CELERY_JOB_NAME = "build_pack_celery"

build_pack_celery_job = build_job(
    CELERY_JOB_NAME,
    with_build_lifecycle(celery_executor),
    "build_pack, each step a task for dagster-celery workers (opt-in).",
    tags={DISTRIBUTED_TAG: "celery"},
)


def distributed_definitions() -> Definitions:
    """The project's definitions (pipelines.definitions) plus the Celery build job, over this
    process's folders; ``dagster dev -m pipelines.executors`` serves them."""
    from pipelines.definitions import make_definitions

    return Definitions.merge(
        make_definitions(settings.packs_dir(), settings.storage_base()),
        Definitions(jobs=[build_pack_celery_job]),
    )


def celery_build_job() -> JobDefinition:
    """The Celery build job: what the launcher and every worker reconstruct."""
    return distributed_definitions().resolve_job_def(CELERY_JOB_NAME)


def execute_distributed(
    instance: DagsterInstance,
    executor: dict[str, Any],
    run_config: dict[str, Any],
    tags: dict[str, str],
) -> ExecutionResult:
    """Run the Celery build job for the partition in ``tags`` and wait for it; this process
    orchestrates the run and holds its build lifecycle.

    ``executor`` is dagster-celery's executor config (``broker``, ``backend``, ...). The
    instance must be persistent (DAGSTER_HOME), since the workers record their steps' events
    in it.
    """
    with execute_job(
        reconstructable(celery_build_job),
        instance=instance,
        run_config={**run_config, "execution": {"config": executor}},
        tags=tags,
        raise_on_error=False,
    ) as result:
        return result


defs = distributed_definitions()
