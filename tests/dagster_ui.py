"""`kpack ui` in a child process, for the tests that need the Dagster webserver and daemon
running (tests/test_ui.py, tests/test_locking.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

from tests.celery_cluster import free_port

UP_TIMEOUT_S = 300  # dagster dev loads the code location twice (webserver, daemon)


@contextmanager
def kpack_ui(log: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """`kpack ui` on a free loopback port, over the packs folder and DAGSTER_HOME of the
    environment, once its webserver answers; the process and the port. Its output goes to
    ``log``. Whatever of it still runs at the end is killed, by the ids it had."""
    port = free_port()
    kpack = Path(sys.executable).with_name("kpack")
    with open(log, "w") as output:
        ui = subprocess.Popen(
            [str(kpack), "ui", "--port", str(port)],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while not answers(port):
            assert ui.poll() is None, f"kpack ui exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, (
                f"no answer from kpack ui: {log.read_text()[-3000:]}"
            )
            time.sleep(1)
        started = family(ui.pid)
        yield ui, port
    finally:
        for process in [*started, *family(ui.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()  # psutil checks that the id is still that process's
        ui.wait(timeout=60)


def family(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and its descendants (none once it is gone)."""
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def answers(port: int) -> bool:
    """Whether the Dagster webserver on ``port`` answers."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
