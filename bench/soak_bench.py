"""Soak: long-lived query processes while the pack is rebuilt and republished under them.

Builds a pack once (the demo pack, copied with its docs into the work folder, or Debian's Python
documentation served on loopback), then, for each thread setting, starts ``--readers`` query
processes that each ask ``--queries`` questions through the public API (``retrieval.query``
with ``use_llm=False``, the confidence gate on, alternating with ``retrieval.search``) while the
parent runs ``--rebuilds`` forced rebuilds (``kpack build --force`` in child processes), each of
which publishes a new version under the readers.

Reported per thread setting: errors (must be 0), versions published while the readers ran, the
resident memory growth of each reader from after its warm-up to its end (target <= 50 MB), and
the latency p50/p95 over all readers. Thread settings: ``limited`` is the reader's default
(``KPACK_READER_THREADS`` unset, i.e. 1, and ``OMP_NUM_THREADS=1``); ``unlimited`` gives every
reader one thread per core (``KPACK_READER_THREADS=<cores>``, no OMP limit), which is what
Kuzu and torch do when nobody sizes them.

    .venv/bin/python bench/soak_bench.py                           # demo pack, 4 x 2,000, 3 rebuilds
    .venv/bin/python bench/soak_bench.py --corpus python_docs --workdir /work/soak
    .venv/bin/python bench/soak_bench.py --queries 500 --settings limited   # a shorter run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.corpora import (  # noqa: E402
    ensure_python_docs,
    make_pack,
    page_urls,
    python_doc_pages,
    serve,
)
from bench.harness import OUT_DIR, RESULT_MARK, emit, workspace_env  # noqa: E402
from retrieval.eval.metrics import percentile  # noqa: E402

QUESTION_FILES = {
    "demo": REPO / "packs" / "demo" / "eval" / "questions.jsonl",
    "python_docs": REPO / "bench" / "python_docs_questions.jsonl",
}
RSS_TARGET_MB = 50.0
WARMUP_QUERIES = 20  # every question path (and both APIs) once before the baseline RSS
RSS_EVERY = 100
SETTINGS = ("limited", "unlimited")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


# --- the reader child ----------------------------------------------------------------------


def rss_mb() -> float:
    """Resident memory of this process now, in MB (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def reader(args: argparse.Namespace) -> None:
    """Ask questions until ``--queries`` are answered; time each, count every error."""
    import retrieval

    lines = Path(args.questions_file).read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines if line.strip()]
    errors: dict[str, int] = {}

    def ask(i: int) -> tuple[str, float]:
        question = questions[(i + args.offset) % len(questions)]
        api = "search" if i % 2 else "query"
        started = time.perf_counter()
        try:
            if api == "search":
                retrieval.search(args.pack, question, k=5)
            else:
                retrieval.query(args.pack, question, use_llm=False)
        except Exception as exc:  # every failure is a finding; the soak goes on
            key = f"{type(exc).__name__}: {exc}"[:300]
            errors[key] = errors.get(key, 0) + 1
        return api, (time.perf_counter() - started) * 1000

    for i in range(WARMUP_QUERIES):
        ask(i)
    warm_errors = sum(errors.values())
    errors.clear()
    Path(args.ready_file).write_text(str(os.getpid()))
    while not Path(args.go_file).exists():
        time.sleep(0.05)
    rss_start = rss_mb()
    samples = [rss_start]
    latencies: dict[str, list[float]] = {"query": [], "search": []}
    started = time.time()
    for i in range(args.queries):
        api, ms = ask(WARMUP_QUERIES + i)
        latencies[api].append(round(ms, 2))
        if (i + 1) % RSS_EVERY == 0:
            samples.append(rss_mb())
    emit(
        {
            "pid": os.getpid(),
            "started": started,
            "finished": time.time(),
            "warmup_errors": warm_errors,
            "errors": errors,
            "rss_start_mb": round(rss_start, 1),
            "rss_end_mb": round(samples[-1], 1),
            "rss_max_mb": round(max(samples), 1),
            "rss_samples_mb": [round(mb, 1) for mb in samples],  # every RSS_EVERY queries
            "latencies_ms": latencies,
        }
    )


# --- the parent ----------------------------------------------------------------------------


def thread_env(setting: str) -> dict[str, str]:
    """The environment of a reader under a thread setting (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARS, "KPACK_READER_THREADS")}
    if setting == "limited":
        return {**env, **dict.fromkeys(THREAD_VARS, "1")}
    return {**env, "KPACK_READER_THREADS": str(os.cpu_count() or 1)}


def kpack_build(workdir: Path, pack: str, force: bool) -> dict[str, Any]:
    """One `kpack build` child process: its exit status, wall time and the version after it."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "build", pack, "--no-progress"]
        + (["--force"] if force else []),
        cwd=REPO,
        env={**os.environ, **workspace_env(workdir)},
        capture_output=True,
        text=True,
    )
    manifest = workdir / "packs" / pack / "manifest.json"
    version = json.loads(manifest.read_text())["version"] if manifest.exists() else None
    return {
        "rc": done.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "finished": time.time(),
        "version": version,
        "stderr_tail": done.stderr[-1500:] if done.returncode else "",
    }


def prepare_demo(workdir: Path) -> str:
    """packs/demo with the docs it reads (its urls.txt names them relative to the pack)."""
    folder = workdir / "packs" / "demo"
    if not (folder / "urls.txt").exists():
        folder.mkdir(parents=True)
        for name in ("urls.txt", "kg_config.json"):
            shutil.copy(REPO / "packs" / "demo" / name, folder / name)
        shutil.copytree(REPO / "docs", workdir / "docs", dirs_exist_ok=True)
    return "demo"


def prepare_python_docs(workdir: Path, base_url: str, pages: int | None) -> str:
    root = ensure_python_docs()
    urls = page_urls(base_url, root, python_doc_pages(root, pages))
    make_pack(workdir, "python_docs", urls, {"extraction": "offline"})
    return "python_docs"


def soak(args: argparse.Namespace, workdir: Path, pack: str, setting: str) -> dict[str, Any]:
    """Readers under one thread setting while the rebuilds publish; the figures of the run."""
    control = workdir / "soak-control"
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir()
    go = control / "go"
    children = []
    for index in range(args.readers):
        argv = [
            str(Path(__file__).resolve()),
            "--reader",
            "--pack",
            pack,
            "--queries",
            str(args.queries),
            "--questions-file",
            str(QUESTION_FILES[args.corpus]),
            "--offset",
            str(index * 7),
            "--ready-file",
            str(control / f"ready-{index}"),
            "--go-file",
            str(go),
        ]
        env = {**thread_env(setting), **workspace_env(workdir)}
        children.append(
            subprocess.Popen(
                [sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
            )
        )
    while len(list(control.glob("ready-*"))) < args.readers:
        if any(child.poll() is not None for child in children):
            raise SystemExit("a reader exited during its warm-up")
        time.sleep(0.2)
    go.touch()
    started, load_before = time.time(), os.getloadavg()[0]
    rebuilds = []
    for _ in range(args.rebuilds):
        time.sleep(args.rebuild_gap_s)
        rebuilds.append(kpack_build(workdir, pack, force=True))
        print(f"  {setting}: rebuild -> {rebuilds[-1]}", file=sys.stderr)
    readers = []
    for child in children:
        out, _ = child.communicate()
        lines = [line for line in out.splitlines() if line.startswith(RESULT_MARK)]
        if child.returncode != 0 or not lines:
            raise SystemExit(f"a reader failed (exit status {child.returncode})")
        readers.append(json.loads(lines[-1][len(RESULT_MARK) :]))
    last_reader = max(r["finished"] for r in readers)
    all_ms = [ms for r in readers for values in r["latencies_ms"].values() for ms in values]
    by_api = {
        api: [ms for r in readers for ms in r["latencies_ms"][api]] for api in ("query", "search")
    }
    growth = [round(r["rss_end_mb"] - r["rss_start_mb"], 1) for r in readers]
    return {
        "setting": setting,
        "readers": args.readers,
        "queries_per_reader": args.queries,
        "errors": sum(sum(r["errors"].values()) for r in readers),
        "warmup_errors": sum(r["warmup_errors"] for r in readers),
        "error_messages": sorted({m for r in readers for m in r["errors"]}),
        "rebuilds": rebuilds,
        "published_during_reading": sum(
            1 for b in rebuilds if b["rc"] == 0 and b["finished"] <= last_reader
        ),
        "reading_s": round(last_reader - started, 1),
        # Other work on the machine shows here: the 1-minute load average around the run.
        "load_avg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "rss_start_mb": [r["rss_start_mb"] for r in readers],
        "rss_growth_mb": growth,
        "rss_max_growth_mb": [round(r["rss_max_mb"] - r["rss_start_mb"], 1) for r in readers],
        "p50_ms": round(percentile(all_ms, 0.50), 1),
        "p95_ms": round(percentile(all_ms, 0.95), 1),
        "p99_ms": round(percentile(all_ms, 0.99), 1),
        "mean_ms": round(statistics.fmean(all_ms), 1) if all_ms else 0.0,
        **{
            f"{api}_{name}_ms": round(percentile(values, share), 1)
            for api, values in by_api.items()
            for name, share in (("p50", 0.50), ("p95", 0.95))
        },
    }


def report(pack: str, runs: list[dict[str, Any]]) -> str:
    header = (
        "| threads | readers x queries | errors | rebuilds ok / published while reading "
        "| RSS growth per reader MB (max) | p50 ms | p95 ms | query p50 / p95 | "
        "search p50 / p95 | reading s | load avg |"
    )
    lines = [f"Pack: {pack}, {os.cpu_count()} cores", "", header, "|" + "---|" * 11]
    for run in runs:
        ok = sum(b["rc"] == 0 for b in run["rebuilds"])
        growth = ", ".join(f"{g:+.1f}" for g in run["rss_growth_mb"])
        lines.append(
            f"| {run['setting']} | {run['readers']} x {run['queries_per_reader']} "
            f"| {run['errors']} | {ok}/{len(run['rebuilds'])} / {run['published_during_reading']} "
            f"| {growth} ({max(run['rss_max_growth_mb']):+.1f}) | {run['p50_ms']} "
            f"| {run['p95_ms']} | {run['query_p50_ms']} / {run['query_p95_ms']} "
            f"| {run['search_p50_ms']} / {run['search_p95_ms']} | {run['reading_s']} "
            f"| {run['load_avg'][0]} -> {run['load_avg'][1]} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=sorted(QUESTION_FILES), default="demo")
    parser.add_argument("--workdir", type=Path, help="reused between runs (default: bench/out)")
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--queries", type=int, default=2000, help="per reader, after warm-up")
    parser.add_argument("--rebuilds", type=int, default=3)
    parser.add_argument("--rebuild-gap-s", type=float, default=5.0)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="limited,unlimited")
    parser.add_argument("--python-pages", type=int, help="cap the Python docs pages")
    # The reader child's arguments.
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pack", help=argparse.SUPPRESS)
    parser.add_argument("--questions-file", help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    parser.add_argument("--go-file", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.reader:
        return reader(args)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = set(settings) - set(SETTINGS)
    if unknown or not settings:
        raise SystemExit(f"--settings takes {', '.join(SETTINGS)}; got {args.settings!r}")
    workdir = (args.workdir or OUT_DIR / f"soak-{args.corpus}").resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    # The Python docs are served for the whole soak: every rebuild fetches them again.
    served = serve(ensure_python_docs()) if args.corpus == "python_docs" else nullcontext(None)
    with served as base_url:
        if base_url is not None:
            pack = prepare_python_docs(workdir, base_url, args.python_pages)
        else:
            pack = prepare_demo(workdir)
        first = kpack_build(workdir, pack, force=False)
        if first["rc"] != 0:
            raise SystemExit(f"the first build failed:\n{first['stderr_tail']}")
        print(f"built {pack} v{first['version']} ({first['seconds']} s)", file=sys.stderr)
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        out = OUT_DIR / f"soak_{args.corpus}.json"
        runs = []
        for setting in settings:  # saved after each setting: a long soak keeps what it measured
            runs.append(soak(args, workdir, pack, setting))
            out.write_text(json.dumps({"pack": pack, "runs": runs}, indent=2) + "\n")
            print(report(pack, runs[-1:]), file=sys.stderr)
    print(report(pack, runs))
    print(f"\nraw results: {out}")
    failures = [
        f"{run['setting']}: {run['errors']} errors"
        for run in runs
        if run["errors"] or run["warmup_errors"]
    ] + [
        f"{run['setting']}: RSS growth {max(run['rss_growth_mb'])} MB > {RSS_TARGET_MB}"
        for run in runs
        if max(run["rss_growth_mb"]) > RSS_TARGET_MB
    ]
    if failures:
        raise SystemExit("targets missed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
