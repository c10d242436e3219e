"""What hostile or unlucky clients get from the servers (issue 21, items 4 and 11), through the
real transports: `kpack serve` as a subprocess on a loopback port (under a lowered open-file
limit), `kpack query`, and `kpack mcp` over stdio.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kpack.packs import current_version
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import wait_until_serving
from tests.test_serving_http import PAGES, QUESTION

KPACK = Path(sys.executable).with_name("kpack")
OPEN_FILES = 256  # the server's RLIMIT_NOFILE, as in the issue
SLOW_CLIENTS = 300
LINE_EVERY_S = 5.0
MISSING_MODEL = "kpack-tests/an-embedding-model-not-on-this-machine"


@pytest.fixture(scope="module")
def packs(site, tmp_path_factory) -> Path:
    workspace = tmp_path_factory.mktemp("limits")
    write_pack(workspace, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert build(workspace, "widgets").published
    # A copy whose manifest names a model this machine does not have (as a pack built
    # elsewhere, with another model, would).
    foreign = workspace / "packs" / "foreign"
    shutil.copytree(workspace / "packs" / "widgets", foreign, symlinks=True)
    manifest_path = current_version(foreign) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["embedding"]["model"] = MISSING_MODEL
    manifest_path.write_text(json.dumps(manifest))
    return workspace / "packs"


def environment(packs: Path) -> dict[str, str]:
    env = {**os.environ, "KPACK_PACKS_DIR": str(packs), "HF_HUB_OFFLINE": "1"}
    env.pop("ANTHROPIC_API_KEY", None)
    return env


def fewer_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


@pytest.fixture(scope="module")
def server(packs) -> Iterator[str]:
    """`kpack serve` with its defaults, allowed OPEN_FILES descriptors."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [str(KPACK), "serve", "--port", str(port)],
        env=environment(packs),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=fewer_open_files,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(process, url, 180)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert "Too many open files" not in stderr, stderr[-3000:]


class SlowClient:
    """A connection that sends a request line, then one header line every LINE_EVERY_S."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        self.answer = b""
        self.done = False

    def drip(self) -> None:
        """Read what the server said, if anything; else send the next header line."""
        self.collect()
        if not self.done:
            try:
                self.sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                self.done = True

    def collect(self) -> None:
        if self.done:
            return
        self.sock.setblocking(False)
        try:
            self.answer = self.sock.recv(4096)
        except BlockingIOError:
            return  # still open, nothing said
        except OSError:
            pass
        finally:
            self.sock.setblocking(True)
        self.done = True

    @property
    def status(self) -> str:
        return self.answer.split(b" ", 2)[1].decode() if self.answer else "reset"


def test_slow_clients_leave_a_normal_client_answered(server):
    """300 connections that send one header line every 5 s (the issue's attack) against a
    server allowed 256 open files: normal searches keep being answered, the slow connections
    are displaced (503) or timed out (408), and the server never runs out of descriptors."""
    port = int(server.rsplit(":", 1)[1])
    started = time.monotonic()
    slow = [SlowClient(port) for _ in range(SLOW_CLIENTS)]
    opened_in = time.monotonic() - started
    latencies: list[float] = []
    statuses: list[int] = []
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(LINE_EVERY_S):
            for client in slow:
                client.drip()

    dripping = threading.Thread(target=drip, daemon=True)
    dripping.start()
    try:
        with httpx.Client(base_url=server, timeout=30) as normal:
            while time.monotonic() - started < 13:  # past the 10 s header timeout
                began = time.perf_counter()
                response = normal.post("/packs/widgets/search", json={"question": QUESTION, "k": 3})
                latencies.append(time.perf_counter() - began)
                statuses.append(response.status_code)
                time.sleep(0.5)
    finally:
        stop.set()
        dripping.join(timeout=30)
    for client in slow:
        client.collect()
    outcome: dict[str, int] = {}
    for client in slow:
        outcome[client.status] = outcome.get(client.status, 0) + 1
        client.sock.close()
    print(
        f"\n{SLOW_CLIENTS} slow connections opened in {opened_in:.2f} s; normal searches: "
        f"{len(statuses)}, statuses {sorted(set(statuses))}, latency max "
        f"{max(latencies) * 1000:.0f} ms, median {sorted(latencies)[len(latencies) // 2] * 1000:.0f}"
        f" ms; slow connections' answers: {outcome}"
    )
    assert statuses and set(statuses) == {200}, statuses
    assert max(latencies) < 5, latencies
    # Every slow connection got an answer: displaced at the cap, or timed out after 10 s.
    assert set(outcome) <= {"503", "408"}, outcome
    assert outcome.get("503", 0) >= SLOW_CLIENTS - OPEN_FILES // 2, outcome
    assert outcome.get("408", 0) >= 1, outcome


def test_a_missing_embedding_model_is_a_409_and_one_line(server, packs):
    response = httpx.post(
        f"{server}/packs/foreign/search", json={"question": QUESTION}, timeout=120
    )
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert MISSING_MODEL in detail and "not on this machine" in detail, detail
    # The pack next to it is untouched.
    assert httpx.post(f"{server}/packs/widgets/search", json={"question": QUESTION}).is_success

    cli = subprocess.run(
        [str(KPACK), "query", "foreign", QUESTION, "--no-llm"],
        env=environment(packs),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode != 0
    said = " ".join(cli.stderr.split())  # one message, however the terminal wraps it
    assert said.startswith("error:") and said.count("error:") == 1, cli.stderr
    assert MISSING_MODEL in said and "not on this machine" in said, cli.stderr
    assert "Traceback" not in cli.stderr + cli.stdout


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"question": "caf\xe9"}', "not UTF-8"),
        (b'{"question": ' + b"[" * 20000 + b"]" * 20000 + b"}", "nested too deeply"),
    ],
    ids=["latin-1", "deep"],
)
def test_unparseable_bodies_get_a_documented_400(server, body, detail):
    response = httpx.post(
        f"{server}/packs/widgets/query",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert detail in response.json()["detail"]


# An MCP client's first message.
INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 8,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
)
# Lines that are not JSON-RPC messages, then a message; the (id, error code) of each reply.
NOT_JSON_RPC = [
    "hello, is this thing on?",
    json.dumps({"question": "not a JSON-RPC message"}),
    json.dumps({"jsonrpc": "2.0", "id": 7, "method": 42}),
    INITIALIZE,
]
NOT_JSON_RPC_REPLIES = [(None, -32700), (None, -32600), (7, -32600), (8, None)]


def test_mcp_answers_lines_that_are_not_json_rpc(packs):
    process = subprocess.run(
        [str(KPACK), "mcp"],
        input="\n".join(NOT_JSON_RPC) + "\n",
        env=environment(packs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    replies = [json.loads(line) for line in process.stdout.splitlines()]
    replied = [(r["id"], r.get("error", {}).get("code")) for r in replies]
    assert replied == NOT_JSON_RPC_REPLIES, replies
    assert replies[-1]["result"]["serverInfo"]["name"] == "kpack"
