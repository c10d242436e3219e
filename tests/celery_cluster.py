"""A Celery deployment on this machine, for tests/test_celery.py and bench/shard_bench.py:
Debian's redis-server on 127.0.0.1 and dagster-celery workers started the way
docs/deployment.md says (``dagster-celery worker start -A dagster_celery.app -y celery.yaml``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from celery import Celery
from dagster import DagsterInstance

from pipelines.instance import ensure_dagster_home


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    """End a process started here, with its children (it leads its own session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A throwaway redis-server (no persistence) on a free loopback port; its URL."""
    port = free_port()
    server = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(folder)),
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}"
    finally:
        stop(server)


@contextmanager
def celery_workers(
    root: Path, executor: dict, env: dict[str, str], count: int, timeout_s: float = 120.0
) -> Iterator[list[str]]:
    """``count`` workers with one process each, listening on the dagster queue until the
    block ends; their names. ``executor`` is the executor config the builds use."""
    (root / "celery.yaml").write_text(json.dumps({"execution": {"config": executor}}))
    # The instance's SQLite tables are created once here: workers starting together would
    # race to create them.
    home = Path(env["DAGSTER_HOME"])
    ensure_dagster_home(home)
    DagsterInstance.from_config(str(home)).dispose()
    bin_dir = str(Path(sys.executable).parent)  # dagster-celery runs `celery` from PATH
    worker_env = {
        **os.environ,
        **env,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    names = [f"kpack{n}" for n in range(count)]
    with ExitStack() as stack:
        for name in names:
            log = stack.enter_context(open(root / f"{name}.log", "w"))
            worker = subprocess.Popen(
                [
                    *(f"{bin_dir}/dagster-celery", "worker", "start", "-A", "dagster_celery.app"),
                    *("-y", str(root / "celery.yaml"), "-q", "dagster", "-n", f"{name}@%h"),
                    *("--loglevel", "WARNING", "--", "--concurrency", "1"),
                ],
                env=worker_env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
            stack.callback(stop, worker)
        app = Celery(broker=executor["broker"])
        deadline = time.monotonic() + timeout_s
        # A build sent to no worker would wait forever: wait until every worker answers.
        while len(app.control.ping(timeout=1.0)) < count:
            if time.monotonic() > deadline:
                logs = "\n".join((root / f"{n}.log").read_text()[-2000:] for n in names)
                raise RuntimeError(f"the Celery workers did not start in {timeout_s:g} s:\n{logs}")
        yield names
