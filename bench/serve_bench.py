"""Serving benchmark: `kpack serve` under concurrent HTTP clients, next to the same calls in-process.

On the Python documentation pack (Debian's python3.11-doc, built here unless --pack names a
built one, or --workdir holds one from an earlier run), without an LLM:

1. in-process: ``retrieval.search`` / ``retrieval.query(use_llm=False)`` in this process, one
   caller and then CLIENTS threads;
2. over HTTP: ``kpack serve`` started as a subprocess on a loopback port, one client and then
   CLIENTS concurrent clients (httpx, keep-alive), N requests each, to
   ``POST /packs/NAME/search`` and ``POST /packs/NAME/query``.

Reported: errors (anything but 200, or a transport error), p50/p95 latency in ms and requests
per second for each, and the HTTP overhead at p50 two ways: HTTP p50 minus in-process p50 at
the same concurrency, and (query only) the p50 of each request's client latency minus the
pipeline time the server measured for it (``timings_ms.total``), which leaves exactly what
HTTP, JSON and the threadpool add (under CLIENTS concurrent clients this includes waiting for
the interpreter lock behind the other requests). GET /healthz from one client gives the HTTP
round trip alone, and the load average is recorded: on a shared machine it decides the figures.
Target: overhead <= 5 ms at p50 with CLIENTS clients, 0 errors.

    .venv/bin/python bench/serve_bench.py                       # build (or reuse) in bench/out
    .venv/bin/python bench/serve_bench.py --python-pages 60 --n 200
    .venv/bin/python bench/serve_bench.py --pack packs/mypack   # any built pack

Results: a Markdown table on stdout and bench/out/serve_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
from bench.harness import emit, run_child  # noqa: E402

HERE = Path(__file__).resolve()
OUT_DIR = HERE.parent / "out"
PACK = "python_docs"
QUESTIONS_FILE = HERE.parent / "python_docs_questions.jsonl"
TARGET_OVERHEAD_MS = 5.0
Timing = tuple[float, float | None]  # (latency ms, server-side pipeline ms)


# --- the pack ------------------------------------------------------------------------------


def child_build(workspace: Path) -> dict[str, Any]:
    """Build the pack in a fresh process (what `kpack build` does), with a throwaway instance."""
    from dagster import DagsterInstance

    from pipelines.build import build_pack

    with DagsterInstance.ephemeral() as instance:
        result = build_pack(
            PACK,
            packs_dir=workspace / "packs",
            storage=str(workspace / "storage"),
            instance=instance,
            log_level="WARNING",
        )
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = (len(ordered) - 1) * q
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def run_clients(
    clients: int, n: int, questions: list[str], call: Callable[[int, str], Timing]
) -> dict[str, Any]:
    """``clients`` threads, ``n`` calls each. ``call`` returns (latency ms, server-side
    pipeline ms or None) and raises on an error; it times only the request itself, so decoding
    the JSON of the answer afterwards is not counted as latency."""
    latencies: list[float] = []
    overheads: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def worker(index: int) -> None:
        start.wait()
        for i in range(n):
            question = questions[(index * 7919 + i) % len(questions)]
            try:
                elapsed, server_ms = call(index, question)
            except Exception as exc:  # counted and reported, never raised
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            with lock:
                latencies.append(elapsed)
                if server_ms is not None:
                    overheads.append(elapsed - server_ms)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    return {
        "clients": clients,
        "requests": clients * n,
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "p50_ms": round(percentile(latencies, 0.5), 2),
        "p95_ms": round(percentile(latencies, 0.95), 2),
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
        "per_second": round(len(latencies) / wall, 1),
        "overhead_p50_ms": round(percentile(overheads, 0.5), 2) if overheads else None,
        "overhead_p95_ms": round(percentile(overheads, 0.95), 2) if overheads else None,
    }


def in_process(folder: Path, endpoint: str, k: int) -> Callable[[int, str], Timing]:
    import retrieval

    def call(_: int, question: str) -> Timing:
        began = time.perf_counter()
        if endpoint == "search":
            retrieval.search(folder, question, k=k)
        else:
            retrieval.query(folder, question, use_llm=False, max_results=k)
        return (time.perf_counter() - began) * 1000, None

    return call


def over_http(url: str, name: str, endpoint: str, k: int, clients: int):
    import httpx

    sessions = [httpx.Client(base_url=url, timeout=60) for _ in range(clients)]
    body = {"k": k} if endpoint == "search" else {"k": k, "use_llm": False}

    def call(index: int, question: str) -> Timing:
        began = time.perf_counter()
        response = sessions[index].post(
            f"/packs/{name}/{endpoint}", json={**body, "question": question}
        )
        elapsed = (time.perf_counter() - began) * 1000  # the whole body has been received
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:120]}")
        if endpoint == "query":
            return elapsed, response.json()["timings_ms"]["total"]
        return elapsed, None

    return call, sessions


def healthz_floor(url: str, n: int) -> dict[str, Any]:
    """GET /healthz from one client: the round trip of HTTP alone, with no retrieval, on this
    machine as loaded as it is during the run."""
    import httpx

    with httpx.Client(base_url=url, timeout=60) as client:

        def call(_: int, __: str) -> Timing:
            began = time.perf_counter()
            response = client.get("/healthz")
            response.raise_for_status()
            return (time.perf_counter() - began) * 1000, None

        return run_clients(1, n, ["-"], call)


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


def table(results: dict[str, Any]) -> str:
    lines = [
        f"\n### {results['pack']} ({results['articles']} articles, {results['chunks']} chunks), "
        f"{results['questions']} distinct questions, k={results['k']}, no LLM\n",
        "| endpoint | where | clients | requests | errors | p50 ms | p95 ms | req/s | HTTP overhead p50 ms (client - server pipeline) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for endpoint, rows in results["endpoints"].items():
        for row in rows:
            overhead = row.get("overhead_p50_ms")
            lines.append(
                f"| {endpoint} | {row['where']} | {row['clients']} | {row['requests']} | "
                f"{row['errors']} | {row['p50_ms']:.2f} | {row['p95_ms']:.2f} | "
                f"{row['per_second']:.1f} | {'' if overhead is None else f'{overhead:.2f}'} |"
            )
    lines.append("")
    for endpoint, rows in results["endpoints"].items():
        by = {(r["where"], r["clients"]): r for r in rows}
        for clients in sorted({r["clients"] for r in rows}):
            local, http = by.get(("in-process", clients)), by.get(("HTTP", clients))
            if local and http:
                delta = http["p50_ms"] - local["p50_ms"]
                lines.append(
                    f"- {endpoint}, {clients} client(s): HTTP p50 - in-process p50 = "
                    f"{delta:+.2f} ms"
                )
    floor = results.get("healthz")
    if floor:
        lines.append(
            f"- GET /healthz (HTTP round trip, no retrieval), 1 client: p50 "
            f"{floor['p50_ms']:.2f} ms, p95 {floor['p95_ms']:.2f} ms"
        )
    load = results.get("load_average")
    if load:
        lines.append(f"- load average during the run: {load} on {results['machine']['cpus']} CPUs")
    verdicts = results["verdict"]
    lines.append(
        f"\nerrors: {verdicts['errors']} (target 0); HTTP overhead at p50: "
        f"{verdicts['overhead_p50_ms']:.2f} ms (target <= {TARGET_OVERHEAD_MS:.0f} ms: "
        f"{'met' if verdicts['met'] else 'NOT met'})"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", type=Path, help="a built pack folder to serve (skips the build)")
    parser.add_argument(
        "--workdir", type=Path, default=OUT_DIR / "serve_workspace", help="where to build/reuse"
    )
    parser.add_argument("--python-pages", type=int, help="build from the first N pages only")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--n", type=int, default=500, help="requests per client")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--endpoints", default="search,query")
    parser.add_argument("--_child-build", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child_build:
        emit(child_build(args.workdir.resolve()))
        return

    import retrieval

    folder = ensure_pack(args)
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
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "endpoints": {e: [] for e in endpoints},
    }
    for endpoint in endpoints:
        for clients in sorted({1, args.clients}):
            print(f"in-process {endpoint}: {clients} x {args.n} ...", flush=True)
            row = run_clients(clients, args.n, questions, in_process(folder, endpoint, args.k))
            results["endpoints"][endpoint].append({"where": "in-process", **row})
    server = Server(folder.parent)
    try:
        print(f"kpack serve on {server.url}: waiting for it (it warms up) ...", flush=True)
        results["server_ready_s"] = round(server.wait_ready(), 1)
        results["healthz"] = healthz_floor(server.url, args.n)
        for endpoint in endpoints:
            for clients in sorted({1, args.clients}):
                call, sessions = over_http(server.url, folder.name, endpoint, args.k, clients)
                run_clients(clients, 3, questions, call)  # connections opened, caches warm
                print(f"HTTP {endpoint}: {clients} x {args.n} ...", flush=True)
                row = run_clients(clients, args.n, questions, call)
                for session in sessions:
                    session.close()
                results["endpoints"][endpoint].append({"where": "HTTP", **row})
    finally:
        stderr = server.stop()
    if "Traceback" in stderr:
        print(stderr, file=sys.stderr)
    results["load_average"] = [round(x, 1) for x in os.getloadavg()]
    errors = sum(r["errors"] for rows in results["endpoints"].values() for r in rows)
    # The scenario: CLIENTS concurrent clients; the layer's cost is what a request's
    # latency adds to the pipeline time the server measured for it.
    overheads = [
        r["overhead_p50_ms"]
        for r in results["endpoints"].get("query", [])
        if r["where"] == "HTTP"
        and r["clients"] == args.clients
        and r["overhead_p50_ms"] is not None
    ]
    overhead = overheads[0] if overheads else float("nan")
    results["verdict"] = {
        "errors": errors,
        "overhead_p50_ms": overhead,
        "met": errors == 0 and overhead <= TARGET_OVERHEAD_MS,
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "serve_bench.json").write_text(json.dumps(results, indent=2))
    report = table(results)
    (OUT_DIR / "serve_bench.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
