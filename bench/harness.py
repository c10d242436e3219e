"""What the benchmark scripts share: each measured run is a fresh child process of the script.

A child prints one marked JSON line (``emit``); the parent runs it, times it from spawn to exit
and parses that line (``run_child``). Fresh processes make every figure include interpreter
start-up, imports and the model load, and keep one run's caches out of the next.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULT_MARK = "BENCH_RESULT "
STAGES = (
    "fetched_pages",
    "articles",
    "chunks",
    "entities",
    "embeddings",
    "pagerank",
    "pack_graph",
    "pack_manifest",
)


def peak_rss_mib() -> float:
    """Peak resident memory of this process (ru_maxrss is KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def emit(result: dict[str, Any]) -> None:
    """A child's answer: one marked JSON line, so stray output on stdout cannot be mistaken."""
    print(RESULT_MARK + json.dumps(result, default=str), flush=True)


def run_child(script: Path, args: list[str]) -> dict[str, Any]:
    """Run ``script`` with child arguments; its result plus its wall time from spawn."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        sys.stdout.write(proc.stdout)
        raise SystemExit(f"child {' '.join(args)} failed (exit status {proc.returncode})")
    return {**json.loads(lines[-1][len(RESULT_MARK) :]), "process_s": round(elapsed, 3)}
