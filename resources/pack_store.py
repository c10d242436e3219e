"""The packs folder as a Dagster resource: a thin shell over kpack.store.

It also makes every run that builds a pack hold the pack's build lock, whoever launched it
(``kpack build``, the UI, the sensor, the schedule): the lock is taken when the run's resources
are set up and released when they are torn down, and the run's staging folder goes with it when
the run did not publish. The build job runs in one process (pipelines.jobs), so set-up and
tear-down bracket the whole run.

A run killed with its process (SIGKILL, power loss) stays STARTED in the Dagster instance for
good. Each build run is tagged with the process that holds its lock; the next build of the
pack, holding the lock itself, reports the started runs whose process is gone as failed.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from dagster import (
    ConfigurableResource,
    DagsterInstance,
    DagsterRunStatus,
    InitResourceContext,
    RunsFilter,
)
from pydantic import PrivateAttr

from kpack.store import PackStoreOps

PARTITION_TAG = "dagster/partition"
PROCESS_TAG = "kpack/build_process"  # host:pid:start time of the process holding the lock
# A run whose steps execute on workers (pipelines.executors): its launcher holds the lock for
# the whole run and removes its staging folder, so no step does either.
DISTRIBUTED_TAG = "kpack/distributed"
# Steps that only read the published pack: a run of nothing else builds nothing and takes no lock.
READ_ONLY_STEPS = ("eval_results",)


class PackStore(ConfigurableResource, PackStoreOps):
    """Reads pack definitions and stages/publishes pack databases under ``packs_dir``."""

    packs_dir: str
    _building: str | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        run = context.dagster_run
        pack = run.tags.get(PARTITION_TAG) if run else None
        if pack is None or DISTRIBUTED_TAG in run.tags or not builds(run.step_keys_to_execute):
            return
        self.begin_build(pack)  # raises "already being built" when another process holds it
        self._building = pack
        if context.instance is not None:
            fail_dead_builds(context.instance, pack, run.run_id)
            context.instance.add_run_tags(run.run_id, {PROCESS_TAG: process_identity()})

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._building is not None:
            self.end_build(self._building, context.dagster_run.run_id)
            self._building = None


def builds(step_keys: list[str] | None) -> bool:
    """Whether a run of these steps (None: the whole job) writes anything of a pack."""
    return step_keys is None or any(not s.startswith(READ_ONLY_STEPS) for s in step_keys)


def fail_dead_builds(instance: DagsterInstance, pack: str, current_run_id: str) -> list[str]:
    """Report the started build runs of ``pack`` whose process is gone as failed; their ids.

    Called with the pack's build lock held, so no other build of it is running; a run with no
    process tag never reached its lock, and is left to the run that holds it.
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
