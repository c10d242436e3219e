"""The packs folder as a Dagster resource: a thin shell over kpack.store, and the build
lifecycle every run that builds a pack goes through.

:func:`build_lifecycle` is the one owner of a run's build: it takes the pack's build lock
(kpack.store.PackStoreOps.begin_build, which also drops the staging folders of runs that died),
reports the runs of the pack whose process died as failed, and at the end removes the run's
staging folder when the run did not publish and releases the lock. Whoever launched the run
(``kpack build``, the UI, the sensor, the schedule) and wherever its steps run, the process that
orchestrates the run holds it:

* a ``build_pack`` run executes its steps in one process (pipelines.jobs), so the PackStore
  resource enters the lifecycle when the run's resources are set up and leaves it when they are
  torn down: set-up and tear-down bracket the whole run;
* a run whose steps execute on workers (dagster-celery, pipelines.executors) carries
  ``DISTRIBUTED_TAG``; its executor, wrapped by :func:`with_build_lifecycle`, holds the
  lifecycle in the orchestrating process, and the workers' resources leave it alone.

A run killed with its process (SIGKILL, power loss) stays STARTED in the Dagster instance for
good. Each build run is tagged with the process that holds its lock; the next build of the
pack, holding the lock itself, reports the started runs whose process is gone as failed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import (
    ConfigurableResource,
    DagsterEvent,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Executor,
    ExecutorDefinition,
    InitResourceContext,
    RunsFilter,
)
from pydantic import PrivateAttr

from kpack import settings
from kpack.store import PackStore as FolderPackStore
from kpack.store import PackStoreOps

if TYPE_CHECKING:
    from dagster._core.execution.context.system import PlanOrchestrationContext
    from dagster._core.execution.plan.plan import ExecutionPlan
    from dagster._core.execution.retries import RetryMode
    from dagster._core.execution.step_dependency_config import StepDependencyConfig

PARTITION_TAG = "dagster/partition"
PROCESS_TAG = "kpack/build_process"  # host:pid:start time of the process holding the lock
# A job whose steps execute on workers (pipelines.executors) carries this tag: its executor
# holds the build lifecycle in the orchestrating process, so no step's resource does.
DISTRIBUTED_TAG = "kpack/distributed"
# Steps that only read the published pack: a run of nothing else builds nothing and takes no lock.
READ_ONLY_STEPS = ("eval_results",)


class PackStore(ConfigurableResource, PackStoreOps):
    """Reads pack definitions and stages/publishes pack databases under ``packs_dir``."""

    packs_dir: str
    _run_build: ExitStack | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        run = context.dagster_run
        if run is None or DISTRIBUTED_TAG in run.tags:
            return
        stack = ExitStack()
        # raises "already being built" when another process holds the lock
        stack.enter_context(build_lifecycle(self, context.instance, run))
        self._run_build = stack

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._run_build is not None:
            self._run_build.close()
            self._run_build = None


@contextmanager
def build_lifecycle(
    store: PackStoreOps, instance: DagsterInstance | None, run: DagsterRun
) -> Iterator[None]:
    """The build of ``run``'s pack, from taking its lock to releasing it (see the module
    docstring); a run of no pack, or of read-only steps only, builds nothing and passes."""
    pack = run.tags.get(PARTITION_TAG)
    if pack is None or not builds(run.step_keys_to_execute):
        yield
        return
    if instance is not None:  # first, so that a run killed from now on is known dead
        instance.add_run_tags(run.run_id, {PROCESS_TAG: process_identity()})
    lock = store.begin_build(pack)
    try:
        if instance is not None:
            fail_dead_builds(instance, pack, run.run_id)
        yield
    finally:
        store.end_build(pack, run.run_id, lock)


class _BuildLifecycleExecutor(Executor):
    """An executor whose run holds the build lifecycle around the steps it hands out."""

    def __init__(self, inner: Executor) -> None:
        self._inner = inner

    @property
    def retries(self) -> RetryMode:
        return self._inner.retries

    @property
    def step_dependency_config(self) -> StepDependencyConfig:
        return self._inner.step_dependency_config

    def __getattr__(self, name: str) -> Any:
        # The inner executor's own API (dagster-celery's loop reads its app_args()).
        return getattr(self._inner, name)

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Iterator[DagsterEvent]:
        store = FolderPackStore(settings.packs_dir())  # the folder the workers use
        with build_lifecycle(store, plan_context.instance, plan_context.dagster_run):
            yield from self._inner.execute(plan_context, execution_plan)


def with_build_lifecycle(inner: ExecutorDefinition) -> ExecutorDefinition:
    """``inner`` (an executor that runs steps in other processes) holding each run's build
    lifecycle in the orchestrating process, where a lock can span the whole run."""
    return ExecutorDefinition(
        name=inner.name,
        config_schema=inner.config_schema,
        requirements=inner.get_requirements,
        executor_creation_fn=lambda init: _BuildLifecycleExecutor(inner.executor_creation_fn(init)),
        description=inner.description,
    )


def builds(step_keys: list[str] | None) -> bool:
    """Whether a run of these steps (None: the whole job) writes anything of a pack."""
    return step_keys is None or any(not s.startswith(READ_ONLY_STEPS) for s in step_keys)


def fail_dead_builds(instance: DagsterInstance, pack: str, current_run_id: str) -> list[str]:
    """Report the started build runs of ``pack`` whose process is gone as failed; their ids.

    Called with the pack's build lock held, so no other build of it is running; a run with no
    process tag never began its build (build_lifecycle tags a run first), and is left alone.
    """
    runs = instance.get_runs(
        RunsFilter(statuses=[DagsterRunStatus.STARTED], tags={PARTITION_TAG: pack})
    )
    dead = [
        run
        for run in runs
        if run.run_id != current_run_id
        and PROCESS_TAG in run.tags
        and not process_alive(run.tags[PROCESS_TAG])
    ]
    for run in dead:
        instance.report_run_failed(
            run,
            f"the process running this build of {pack} ({run.tags[PROCESS_TAG]}) is gone, "
            f"killed before the run finished; reported by the next build, {current_run_id}",
        )
    return [run.run_id for run in dead]


def process_identity() -> str:
    """host:pid:start time of this process (the start time tells a reused pid apart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def process_alive(identity: str) -> bool:
    """Whether the process ``identity`` names still runs; a process of another host is
    assumed to (its liveness cannot be seen from here)."""
    host, pid, started = identity.rsplit(":", 2)
    if host != socket.gethostname():
        return True
    return _start_time(int(pid)) == started


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc), "" when it is not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces; the fields after it are space-separated.
    return stat.rsplit(")", 1)[1].split()[19]
