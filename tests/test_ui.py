"""`kpack ui`: the Dagster webserver and daemon (dagster dev) live and die with it."""

from __future__ import annotations

import signal
import socket
import time

import psutil

from cli.build import UI_STOP_GRACE_S
from tests.dagster_ui import kpack_ui


def test_sigterm_stops_kpack_ui_with_its_webserver_and_daemon(workspace):
    with kpack_ui(workspace / "ui.log") as (ui, port):
        started = psutil.Process(ui.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in started]
        assert any("dagster_webserver" in c for c in commands), commands
        assert any("dagster._daemon" in c for c in commands), commands

        ui.send_signal(signal.SIGTERM)  # a service manager stopping it, say
        stopped_at = time.monotonic()
        assert ui.wait(timeout=UI_STOP_GRACE_S + 30) == 0
        _, left = psutil.wait_procs(started, timeout=5)
        took = time.monotonic() - stopped_at

    assert left == [], [p.cmdline() for p in left]
    assert took < 10, took  # promptly: a service manager or a user waits on it (it was 20 s)
    said = (workspace / "ui.log").read_text()
    assert "stopping the Dagster UI" in said and "the Dagster UI has stopped" in said
    with socket.socket() as client:
        assert client.connect_ex(("127.0.0.1", port)) != 0  # nothing answers there
    with socket.socket() as server:  # and nothing holds the port (TIME_WAIT aside)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
