"""Serving benchmark: `kpack serve` under concurrent HTTP clients, next to the same calls in-process.

On the Python documentation pack (Debian's python3.11-doc, built here unless --pack names a
built one, or --workdir holds one from an earlier run), without an LLM, for
``POST /packs/NAME/search`` and ``POST /packs/NAME/query``, with one client and then CLIENTS
concurrent clients, N requests each on each side:

- in-process: ``retrieval.search`` / ``retrieval.query(use_llm=False)`` from as many threads
  of this process;
- over HTTP: ``kpack serve`` as a subprocess on a loopback port, each client on its own
  keep-alive connection (http.client by default: the least a Python client spends per
  request; --client httpx for the client the documentation shows).

The two sides run in --rounds alternating blocks asking the same questions with the same k,
so a shared machine's load, which drifts over minutes, weighs on both alike. Reported: errors
(anything but 200, or a transport error), p50/p95 latency in ms and requests per second for
each side, and what HTTP adds at p50 two ways: HTTP p50 minus in-process p50 (with the spread
of that difference over the rounds, a measure of the noise), and the p50 of what HTTP's own
machinery took of each request: its latency minus the server's wait for a retrieval thread and
the retrieval itself (its Server-Timing header), split into the event loop's part, the JSON
encoding and the transport. The wait for a thread is reported beside it, not counted: the
server runs one retrieval per core and queues the rest, where in-process threads all run at
once and wait for the cores inside their retrievals instead. GET /healthz
from one client of each kind gives the HTTP round trip alone; the load average is recorded.
Target: 0 errors, and at most 5 ms added at p50 by both measures, for each endpoint and
client count.

    .venv/bin/python bench/serve_bench.py                       # build (or reuse) in bench/out
    .venv/bin/python bench/serve_bench.py --python-pages 60 --n 200
    .venv/bin/python bench/serve_bench.py --pack packs/mypack   # any built pack
    .venv/bin/python bench/serve_bench.py --in-process-limit 2  # in-process bounded as the server

Results: a Markdown report on stdout and bench/out/serve_bench.{json,md}.

--during-publish measures instead what a publish of one pack costs the others (issue 20): the
pack is copied into OTHERS + 1 packs under one `kpack serve`; CLIENTS clients search the
other packs for --window seconds before, then for --window seconds during which the last pack
publishes a new version every --publish-every seconds. Each version is staged and sealed
before the window, as a build leaves it (the build's own CPU is not part of the figure), and
published in the window by kpack.store (the rename and the ``current`` swap); one more client
asks the publishing pack every PUBLISHER_PAUSE_S, before and during, and sees when the new
version answers (the server opens and warms it meanwhile).
Reported: p50/p95 of the other packs' searches before, and of those in flight while a
version was published and opened (from the publish until the new version answered), with the
rise of p95 (target: under 20%); the same over the whole window; and the server's resident
memory with every pack open, before and after (target for 20 Python-docs-sized packs: at
most 2 GB).

    .venv/bin/python bench/serve_bench.py --pack packs/mypack --during-publish
    .venv/bin/python bench/serve_bench.py --pack WS/packs/python_docs --during-publish \
        --others 19 --window 30        # issue 20: 20 packs
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("ANTHROPIC_API_KEY", None)  # no LLM on either side

from bench.corpora import (  # noqa: E402
    PYTHON_DOC_ROOT,
    ensure_python_docs,
    make_pack,
    page_urls,
    python_doc_pages,
    serve,
)
from bench.harness import build_here, emit, run_child  # noqa: E402

HERE = Path(__file__).resolve()
OUT_DIR = HERE.parent / "out"
PACK = "python_docs"
QUESTIONS_FILE = HERE.parent / "python_docs_questions.jsonl"
TARGET_OVERHEAD_MS = 5.0
Reply = tuple[int, str, bytes]  # status, Server-Timing header, body


# --- the pack ------------------------------------------------------------------------------


def child_build(workspace: Path) -> dict[str, Any]:
    """Build the pack in a fresh process (what `kpack build` does), with a throwaway instance."""
    result = build_here(PACK, workspace).result
    return {"success": result.success, "manifest": result.manifest}


def ensure_pack(args: argparse.Namespace) -> Path:
    """The folder of a built pack: --pack, a pack built earlier in --workdir, or a new build."""
    if args.pack:
        folder = args.pack.resolve()
        if not (folder / ".versions" / "current").exists():
            sys.exit(f"{folder}: not a built pack (no published version)")
        return folder
    workspace = args.workdir.resolve()
    folder = workspace / "packs" / PACK
    if (folder / ".versions" / "current").exists():
        print(f"reusing {folder}", flush=True)
        return folder
    root = ensure_python_docs(PYTHON_DOC_ROOT)
    pages = python_doc_pages(root, args.python_pages)
    with serve(root) as base_url:
        make_pack(workspace, PACK, page_urls(base_url, root, pages), {"extraction": "offline"})
        print(f"building {PACK} from {len(pages)} pages into {workspace} ...", flush=True)
        started = time.perf_counter()
        built = run_child(HERE, ["--_child-build", "--workdir", str(workspace)])
    if not built["success"]:
        sys.exit(f"the build of {PACK} failed; see the output above")
    print(f"built in {time.perf_counter() - started:.0f}s", flush=True)
    return folder


def questions_for(folder: Path, wanted: int) -> list[str]:
    """The Python docs questions when the pack is the Python docs, then questions written from
    section headings (as query_bench does), for at least ``wanted`` distinct ones."""
    import retrieval

    questions = []
    if folder.name == PACK and QUESTIONS_FILE.is_file():
        lines = QUESTIONS_FILE.read_text().splitlines()
        questions = [json.loads(line)["question"] for line in lines if line.strip()]
    with retrieval.reading(folder) as reader:
        titles = sorted({s.title for s in reader.sections.values() if len(s.title.split()) >= 2})
    step = max(1, len(titles) // max(1, wanted - len(questions)))
    questions += [f"What does the documentation say about {t}?" for t in titles[::step]]
    return questions[: max(wanted, 1)]


# --- measuring -----------------------------------------------------------------------------


@dataclass
class Sample:
    """One answered request: its latency as the caller saw it and, over HTTP, the server's
    Server-Timing entries (queue, retrieval, encode, app; ms) and the query's pipeline time."""

    latency_ms: float
    server: dict[str, float] = field(default_factory=dict)
    pipeline_ms: float | None = None


@dataclass
class Measured:
    """The samples of one side (in-process or HTTP) of one endpoint and client count."""

    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def add(self, other: Measured) -> None:
        self.samples += other.samples
        self.errors += other.errors
        self.wall_s += other.wall_s

    @property
    def p50_ms(self) -> float:
        return percentile([s.latency_ms for s in self.samples], 0.5)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def run_clients(
    clients: int, n: int, questions: list[str], call: Callable[[int, str], Sample], offset: int
) -> Measured:
    """``clients`` threads, ``n`` calls each, client i asking question i * 7919 + offset + j:
    both sides of a round ask the same questions. ``call`` raises on an error; it times only
    the request itself, so decoding the JSON of the answer afterwards is not counted."""
    measured = Measured()
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def worker(index: int) -> None:
        start.wait()
        for i in range(n):
            question = questions[(index * 7919 + offset + i) % len(questions)]
            try:
                sample = call(index, question)
            except Exception as exc:  # counted and reported, never raised
                with lock:
                    measured.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            with lock:
                measured.samples.append(sample)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    measured.wall_s = time.perf_counter() - began
    return measured


def in_process(
    folder: Path, endpoint: str, k: int, limit: int | None = None
) -> Callable[[int, str], Sample]:
    """The call in this process; ``limit``: run by a pool of that many threads, first come
    first served (the wait is timed), as the server runs its retrievals. None: each client
    thread calls directly, all at once."""
    import retrieval

    def answer(question: str) -> None:
        if endpoint == "search":
            retrieval.search(folder, question, k=k)
        else:
            retrieval.query(folder, question, use_llm=False, max_results=k)

    # A pool, not a semaphore: a semaphore lets a releasing thread take its turn again at once,
    # so two clients would run while two starve, and the waits would hide in a few calls.
    pool = ThreadPoolExecutor(max_workers=limit) if limit else None

    def call(_: int, question: str) -> Sample:
        began = time.perf_counter()
        if pool is None:
            answer(question)
        else:
            pool.submit(answer, question).result()
        return Sample((time.perf_counter() - began) * 1000)

    return call


def server_timing(header: str) -> dict[str, float]:
    """``queue;dur=0.05, retrieval;dur=81.2, app;dur=82.0`` -> {"queue": 0.05, ...}."""
    timings = {}
    for entry in header.split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur":
                timings[name] = float(value)
    return timings


class StdlibClient:
    """One keep-alive HTTP/1.1 connection with the standard library's http.client: the least
    a Python client can spend per request, so the figures are the server's."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    def request(self, method: str, path: str, payload: dict | None = None) -> Reply:
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            return self._exchange(method, path, body, headers)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # uvicorn closes a connection idle for 5 s (an in-process round lasts longer):
            # open a new one and ask again, as httpx does.
            self.connection.close()
            return self._exchange(method, path, body, headers)

    def _exchange(self, method: str, path: str, body: bytes | None, headers: dict) -> Reply:
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        return response.status, response.getheader("server-timing", ""), response.read()

    def close(self) -> None:
        self.connection.close()


class HttpxClient:
    """An httpx.Client (the client the documentation shows), keep-alive as well."""

    def __init__(self, url: str) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, timeout=60)

    def request(self, method: str, path: str, payload: dict | None = None) -> Reply:
        response = self.client.request(method, path, json=payload)
        return response.status_code, response.headers.get("server-timing", ""), response.content

    def close(self) -> None:
        self.client.close()


CLIENTS = {"http.client": StdlibClient, "httpx": HttpxClient}


def over_http(
    url: str, name: str, endpoint: str, k: int, clients: list[StdlibClient | HttpxClient]
) -> Callable[[int, str], Sample]:
    """The same call over HTTP, client i on its own keep-alive connection."""
    payload = {"k": k} if endpoint == "search" else {"k": k, "use_llm": False}

    def call(index: int, question: str) -> Sample:
        began = time.perf_counter()
        status, timing, body = clients[index].request(
            "POST", f"/packs/{name}/{endpoint}", {**payload, "question": question}
        )
        elapsed = (time.perf_counter() - began) * 1000  # the whole body has been received
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:120]!r}")
        pipeline = json.loads(body)["timings_ms"]["total"] if endpoint == "query" else None
        return Sample(elapsed, server_timing(timing), pipeline)

    return call


def reopen(connections: list[StdlibClient | HttpxClient]) -> None:
    """One GET /healthz on each connection: it reconnects one the server closed while idle."""
    for connection in connections:
        connection.request("GET", "/healthz")


def compare(
    clients: int,
    n: int,
    rounds: int,
    questions: list[str],
    local: Callable[[int, str], Sample],
    remote: Callable[[int, str], Sample],
    reconnect: Callable[[], None],
) -> tuple[Measured, Measured, list[float]]:
    """In-process and HTTP in alternating blocks of n / rounds calls per client (in-process
    first in even rounds, HTTP first in odd ones), so the load of a shared machine, which
    drifts over minutes, weighs on both sides alike. Also returns each round's HTTP p50 minus
    in-process p50: their spread shows how much of the difference is noise. ``reconnect()``
    runs before each HTTP block, untimed: the server has closed connections idle meanwhile."""
    both = {"in-process": Measured(), "HTTP": Measured()}
    deltas = []
    for r in range(rounds):
        per_client = n // rounds + (1 if r < n % rounds else 0)
        offset = r * (n // rounds) + min(r, n % rounds)
        blocks = {}
        for where in ("in-process", "HTTP") if r % 2 == 0 else ("HTTP", "in-process"):
            if where == "HTTP":
                reconnect()
            call = local if where == "in-process" else remote
            blocks[where] = run_clients(clients, per_client, questions, call, offset)
            both[where].add(blocks[where])
        deltas.append(blocks["HTTP"].p50_ms - blocks["in-process"].p50_ms)
    return both["in-process"], both["HTTP"], deltas


def summary(where: str, clients: int, measured: Measured) -> dict[str, Any]:
    latencies = [s.latency_ms for s in measured.samples]
    row: dict[str, Any] = {
        "where": where,
        "clients": clients,
        "requests": len(measured.samples) + len(measured.errors),
        "errors": len(measured.errors),
        "error_samples": sorted(set(measured.errors))[:5],
        "p50_ms": round(percentile(latencies, 0.5), 2),
        "p95_ms": round(percentile(latencies, 0.95), 2),
        "per_second": round(len(latencies) / measured.wall_s, 1) if measured.wall_s else None,
    }
    timed = [s for s in measured.samples if "retrieval" in s.server and "app" in s.server]
    if timed:
        # Where a request's time went beyond the wait for a core and the retrieval call (what
        # in-process pays for both, inside its retrieval call): HTTP's own machinery.
        parts = {
            "http_own": [s.latency_ms - s.server["queue"] - s.server["retrieval"] for s in timed],
            "queue": [s.server["queue"] for s in timed],
            "encode": [s.server["encode"] for s in timed],
            "event_loop": [
                s.server["app"] - s.server["queue"] - s.server["retrieval"] - s.server["encode"]
                for s in timed
            ],
            "transport": [s.latency_ms - s.server["app"] for s in timed],
        }
        piped = [s.latency_ms - s.pipeline_ms for s in timed if s.pipeline_ms is not None]
        if piped:
            parts["beyond_pipeline"] = piped
        for name, values in parts.items():
            row[f"{name}_p50_ms"] = round(percentile(values, 0.5), 2)
        row["http_own_p95_ms"] = round(percentile(parts["http_own"], 0.95), 2)
    return row


def healthz_floor(url: str, n: int, kind: str) -> dict[str, Any]:
    """GET /healthz from one client: the round trip of HTTP alone, with no retrieval, on this
    machine as loaded as it is during the run."""
    client = CLIENTS[kind](url)

    def call(_: int, __: str) -> Sample:
        began = time.perf_counter()
        status, _, body = client.request("GET", "/healthz")
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:120]!r}")
        return Sample((time.perf_counter() - began) * 1000)

    try:
        return summary("HTTP", 1, run_clients(1, n, ["-"], call, 0))
    finally:
        client.close()


class Server:
    """`kpack serve` as a subprocess on a free loopback port, stopped with SIGINT."""

    def __init__(self, packs_dir: Path) -> None:
        probe = socket.create_server(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "KPACK_PACKS_DIR": str(packs_dir)}
        kpack = Path(sys.executable).with_name("kpack")
        self.process = subprocess.Popen(
            [str(kpack), "serve", "--port", str(self.port)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self, timeout_s: float = 600) -> float:
        import httpx

        began = time.perf_counter()
        while time.perf_counter() - began < timeout_s:
            if self.process.poll() is not None:
                sys.exit(f"kpack serve exited: {self.process.stderr.read()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return time.perf_counter() - began
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        sys.exit("kpack serve did not answer /healthz in time")

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        try:
            _, stderr = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, stderr = self.process.communicate()
        return stderr


# --- report --------------------------------------------------------------------------------


def verdicts(results: dict[str, Any]) -> list[tuple[str, float, bool]]:
    """(what, figure, met) for each target: no errors, and for every endpoint and client count
    both measures of what HTTP adds at p50 within TARGET_OVERHEAD_MS."""
    errors = sum(r["errors"] for rows in results["endpoints"].values() for r in rows)
    checks = [("errors", float(errors), errors == 0)]
    for endpoint, rows in results["endpoints"].items():
        for row in rows:
            if row["where"] != "HTTP":
                continue
            label = f"{endpoint}, {row['clients']} client(s)"
            for key, what in (
                ("vs_in_process_p50_ms", "HTTP p50 - in-process p50"),
                (
                    "http_own_p50_ms",
                    "p50 of (client latency - server's queue and retrieval time)",
                ),
            ):
                figure = row.get(key, float("nan"))
                checks.append((f"{label}: {what}", figure, figure <= TARGET_OVERHEAD_MS))
    return checks


def table(results: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    lines = [
        f"\n### {results['pack']} ({results['articles']} articles, {results['chunks']} chunks), "
        f"{results['questions']} distinct questions, k={results['k']}, no LLM\n",
        f"In-process and HTTP measured in {results['rounds']} alternating rounds of the same "
        f"questions; the server works on {results['server_threads']} questions at once, "
        + (
            f"in-process callers on at most {results['in_process_limit']}.\n"
            if results.get("in_process_limit")
            else "in-process callers all at once.\n"
        ),
        "| endpoint | clients | where | requests | errors | p50 ms | p95 ms | req/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for endpoint, rows in results["endpoints"].items():
        for row in rows:
            lines.append(
                f"| {endpoint} | {row['clients']} | {row['where']} | {row['requests']} | "
                f"{row['errors']} | {ms(row['p50_ms'])} | {ms(row['p95_ms'])} | "
                f"{row['per_second']} |"
            )
    lines += [
        "\nWhat HTTP adds, ms at p50 (the server's Server-Timing header splits a request: "
        "queue = waiting for a retrieval thread, event loop = FastAPI and uvicorn in the server, "
        "encode = the response's JSON, transport = client - server app time: sockets, uvicorn's "
        f"HTTP parsing, the {results['client']} client):\n",
        "| endpoint | clients | HTTP p50 - in-process p50 | per round (min .. max) | "
        "client - server queue and retrieval (p95) | queue | event loop | encode | transport | "
        "client - pipeline total |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for endpoint, rows in results["endpoints"].items():
        for row in rows:
            if row["where"] != "HTTP":
                continue
            spread = row["per_round_deltas_ms"]
            lines.append(
                f"| {endpoint} | {row['clients']} | {row['vs_in_process_p50_ms']:+.2f} | "
                f"{min(spread):+.1f} .. {max(spread):+.1f} | "
                f"{ms(row.get('http_own_p50_ms'))} "
                f"({ms(row.get('http_own_p95_ms'))}) | {ms(row.get('queue_p50_ms'))} | "
                f"{ms(row.get('event_loop_p50_ms'))} | {ms(row.get('encode_p50_ms'))} | "
                f"{ms(row.get('transport_p50_ms'))} | {ms(row.get('beyond_pipeline_p50_ms'))} |"
            )
    lines.append("")
    for kind, floor in results["healthz"].items():
        lines.append(
            f"- GET /healthz (the HTTP round trip alone, no retrieval), 1 {kind} client: "
            f"p50 {floor['p50_ms']:.2f} ms, p95 {floor['p95_ms']:.2f} ms"
        )
    lines += [
        f"- load average at the start and the end: {results['load_average']['start']}, "
        f"{results['load_average']['end']} on {results['machine']['cpus']} CPUs",
        "- client - pipeline total (query only) also counts what the in-process call pays "
        "outside the pipeline's own clock (the cached agent, opening the reader, the trace)",
        "",
    ]
    for what, figure, met in results["verdict"]["checks"]:
        target = "0" if what == "errors" else f"<= {TARGET_OVERHEAD_MS:.0f} ms"
        shown = f"{figure:.0f}" if what == "errors" else f"{figure:+.2f} ms"
        lines.append(f"- {what}: {shown} (target {target}): {'met' if met else 'NOT met'}")
    missed = results["verdict"]["missed"]
    lines.append(f"\nverdict: {'all targets met' if not missed else f'{missed} target(s) NOT met'}")
    return "\n".join(lines)


def stage_versions(folder: Path, count: int) -> list[Path]:
    """``count`` copies of the pack's current version, each staged and sealed as a build leaves
    its version before publishing (kpack.store.seal_version hashes the files and records them):
    the build's own work is done here, before the measured window."""
    import shutil

    from kpack.store import PackStore, seal_version

    current = (folder / ".versions" / "current").resolve()
    first = PackStore(folder.parent).next_version(folder.name)
    staged = []
    for i in range(count):
        target = folder / ".versions" / f".bench-staged-{i}"
        shutil.copytree(current, target, symlinks=True)
        manifest = json.loads((target / "manifest.json").read_text())
        manifest["version"], manifest["previous_version"] = first + i, first + i - 1
        (target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        seal_version(target)
        staged.append(target)
    os.sync()  # the copies' writeback is the build's cost too, not the publish's
    return staged


def process_memory(pid: int) -> dict[str, float]:
    """Resident MiB of a process (smaps_rollup): all of it, and the anonymous part (its own
    memory; the rest is mapped files, the packs' index pages, which the page cache holds once
    for every process that maps them)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0]) / 1024
    return {"rss": round(fields["Rss"], 1), "anonymous": round(fields["Anonymous"], 1)}


PUBLISHER_PAUSE_S = 0.2


def during_publish(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """p50/p95 of searches to the other packs, before and while one pack publishes."""
    import shutil
    import tempfile

    from kpack.store import PackStore

    packs = Path(tempfile.mkdtemp(prefix="kpack-publish-bench-")) / "packs"
    names = [f"other{i}" for i in range(args.others)] + ["publisher"]
    for name in names:
        shutil.copytree(folder, packs / name, symlinks=True)
    store = PackStore(packs)
    staged = stage_versions(packs / "publisher", max(1, round(args.window / args.publish_every)))
    questions = questions_for(folder, 200)
    server = Server(packs)
    print(f"kpack serve on {server.url} with {len(names)} packs: warming up ...", flush=True)
    server.wait_ready()
    stop = threading.Event()
    latencies: list[tuple[float, float]] = []  # (started at, finished at)
    errors: list[str] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        connection = StdlibClient(server.url)
        i = 0
        while not stop.is_set():
            pack = names[(index + i) % args.others]
            question = questions[(index * 7919 + i) % len(questions)]
            began = time.perf_counter()
            status, _, _ = connection.request(
                "POST", f"/packs/{pack}/search", {"question": question, "k": args.k}
            )
            with lock:
                if status != 200:
                    errors.append(str(status))
                latencies.append((began, time.perf_counter()))
            i += 1
        connection.close()

    answered: dict[int, float] = {}  # version of the publisher -> when it first answered

    def asks_publisher() -> None:
        # The publishing pack is asked at the same pace before and during the publishes (the
        # first request after a publish starts the new version's open).
        connection = StdlibClient(server.url)
        while not stop.is_set():
            status, _, body = connection.request(
                "POST", "/packs/publisher/search", {"question": questions[0], "k": args.k}
            )
            if status != 200:
                errors.append(f"publisher: {status}")
            else:
                answered.setdefault(int(json.loads(body)["version"]), time.perf_counter())
            time.sleep(PUBLISHER_PAUSE_S)
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=asks_publisher))
    for thread in threads:
        thread.start()
    opens: list[tuple[float, float]] = []  # (published at, the new version answered at)
    try:
        time.sleep(args.window)
        memory_before = process_memory(server.process.pid)  # every pack open and warm
        split = time.perf_counter()
        for version_dir in staged:
            number = store.next_version("publisher")
            published = time.perf_counter()
            store.publish("publisher", number, version_dir)
            while number not in answered:
                if time.perf_counter() - published > 120:
                    raise SystemExit(f"version {number} of the publisher never answered")
                time.sleep(0.01)
            opens.append((published, answered[number]))
            time.sleep(max(0.0, published + args.publish_every - time.perf_counter()))
        end = time.perf_counter()
        memory_after = process_memory(server.process.pid)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        server.stop()
        shutil.rmtree(packs.parent, ignore_errors=True)

    def overlaps(began: float, finished: float) -> bool:
        return any(began < answered and finished > published for published, answered in opens)

    before = [f - b for b, f in latencies if f < split]
    during = [f - b for b, f in latencies if overlaps(b, f)]
    window = [f - b for b, f in latencies if split <= f <= end]
    result = {
        "packs": len(names),
        "clients": args.clients,
        "publishes": len(opens),
        "publish_every_s": args.publish_every,
        "new_version_answers_after_s_p50": percentile([a - p for p, a in opens], 0.5),
        "errors": errors,
        **{
            f"{label}_{q}_ms": percentile(values, q / 100) * 1000
            for label, values in (("before", before), ("during", during), ("window", window))
            for q in (50, 95)
        },
        "requests": {"before": len(before), "during": len(during), "window": len(window)},
        "server_memory_mib": {"before": memory_before, "after": memory_after},
    }
    result["p95_rise"] = result["during_95_ms"] / result["before_95_ms"] - 1
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", type=Path, help="a built pack folder to serve (skips the build)")
    parser.add_argument(
        "--workdir", type=Path, default=OUT_DIR / "serve_workspace", help="where to build/reuse"
    )
    parser.add_argument("--python-pages", type=int, help="build from the first N pages only")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--n", type=int, default=500, help="requests per client and side")
    parser.add_argument("--rounds", type=int, default=10, help="alternating in-process/HTTP blocks")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument(
        "--client", choices=sorted(CLIENTS), default="http.client", help="the HTTP client"
    )
    parser.add_argument("--endpoints", default="search,query")
    parser.add_argument(
        "--in-process-limit",
        type=int,
        help="in-process: at most N retrievals at once, as the server runs (default: no bound)",
    )
    parser.add_argument(
        "--during-publish",
        action="store_true",
        help="p95 of the other packs' requests before and while one pack publishes (issue 20)",
    )
    parser.add_argument("--others", type=int, default=3, help="--during-publish: other packs")
    parser.add_argument("--window", type=float, default=20, help="--during-publish: seconds each")
    parser.add_argument(
        "--publish-every",
        type=float,
        default=3.0,
        help="--during-publish: seconds from one publish to the next",
    )
    parser.add_argument("--_child-build", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child_build:
        emit(child_build(args.workdir.resolve()))
        return
    if not 1 <= args.rounds <= args.n:
        sys.exit(f"--rounds must be between 1 and --n ({args.n})")

    import retrieval
    from serving.pools import retrieval_pool_size

    folder = ensure_pack(args)
    if args.during_publish:
        print(json.dumps(during_publish(args, folder), indent=2))
        return
    manifest = json.loads((folder / "manifest.json").read_text())
    questions = questions_for(folder, 200)
    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    print(f"{folder.name}: {len(questions)} questions; warming up in-process ...", flush=True)
    for question in questions[:5]:
        retrieval.query(folder, question, use_llm=False, max_results=args.k)
    results: dict[str, Any] = {
        "pack": folder.name,
        "articles": manifest["counts"]["Article"],
        "chunks": manifest["counts"]["Chunk"],
        "questions": len(questions),
        "k": args.k,
        "rounds": args.rounds,
        "client": args.client,
        "server_threads": retrieval_pool_size(),
        "in_process_limit": args.in_process_limit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": {"start": [round(x, 1) for x in os.getloadavg()]},
        "endpoints": {e: [] for e in endpoints},
    }
    server = Server(folder.parent)
    try:
        print(f"kpack serve on {server.url}: waiting for it (it warms up) ...", flush=True)
        results["server_ready_s"] = round(server.wait_ready(), 1)
        results["healthz"] = {kind: healthz_floor(server.url, args.n, kind) for kind in CLIENTS}
        for endpoint in endpoints:
            for clients in sorted({1, args.clients}):
                local = in_process(folder, endpoint, args.k, args.in_process_limit)
                connections = [CLIENTS[args.client](server.url) for _ in range(clients)]
                remote = over_http(server.url, folder.name, endpoint, args.k, connections)
                reconnect = partial(reopen, connections)
                print(f"{endpoint}: {clients} client(s) x {args.n}, each side ...", flush=True)
                here, there, deltas = compare(
                    clients, args.n, args.rounds, questions, local, remote, reconnect
                )
                for connection in connections:
                    connection.close()
                over = summary("HTTP", clients, there)
                over["vs_in_process_p50_ms"] = round(there.p50_ms - here.p50_ms, 2)
                over["per_round_deltas_ms"] = [round(d, 2) for d in deltas]
                results["endpoints"][endpoint] += [summary("in-process", clients, here), over]
    finally:
        stderr = server.stop()
    if "Traceback" in stderr:
        print(stderr, file=sys.stderr)
    results["load_average"]["end"] = [round(x, 1) for x in os.getloadavg()]
    checks = verdicts(results)
    results["verdict"] = {
        "checks": checks,
        "missed": sum(not met for _, _, met in checks),
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "serve_bench.json").write_text(json.dumps(results, indent=2))
    report = table(results)
    (OUT_DIR / "serve_bench.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
