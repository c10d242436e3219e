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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULT_MARK = "BENCH_RESULT "
OUT_DIR = Path(__file__).resolve().parent / "out"  # every benchmark's JSON and Markdown
# The packaged model loads from disk, so no run waits on the hub, and tokenizers' own thread
# pool would compete with torch's for the same cores. Set before huggingface_hub and torch are
# imported (they read them then); child processes inherit them.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
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


def workspace_env(workdir: Path) -> dict[str, str]:
    """The variables that point a kpack child process (build, query, Dagster) at ``workdir``'s
    packs/, storage/ and dagster_home/, offline (OFFLINE_ENV)."""
    return {
        "KPACK_PACKS_DIR": str(workdir / "packs"),
        "KPACK_STORAGE": str(workdir / "storage"),
        "DAGSTER_HOME": str(workdir / "dagster_home"),
        **OFFLINE_ENV,
    }


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


@dataclass(frozen=True)
class TimedBuild:
    result: Any  # pipelines.build.BuildResult
    import_s: float  # importing Dagster and the pipeline
    build_pack_s: float  # build_pack itself

    @property
    def total_s(self) -> float:
        return round(self.import_s + self.build_pack_s, 3)


def build_here(pack: str, workspace: Path, executor: dict | None = None) -> TimedBuild:
    """Build ``pack`` of ``workspace`` (its packs/ and storage/) in this process, the way
    `kpack build` runs it, with a throwaway Dagster instance; with an ``executor`` (Celery),
    the DAGSTER_HOME instance its workers share."""
    started = time.perf_counter()
    from dagster import DagsterInstance

    from pipelines.build import build_pack

    imported = time.perf_counter()
    instance = DagsterInstance.get() if executor else DagsterInstance.ephemeral()
    with instance:
        result = build_pack(
            pack,
            packs_dir=workspace / "packs",
            storage=str(workspace / "storage"),
            instance=instance,
            log_level="WARNING",
            executor=executor,
        )
    built = time.perf_counter()
    return TimedBuild(result, round(imported - started, 3), round(built - imported, 3))


@dataclass
class CitationTally:
    """What the citation check made of the statements of a benchmark's answers."""

    checked: int = 0
    supported: int = 0
    kept_below_threshold: int = 0  # kept (supported) with a support under the threshold

    def add(self, result: dict[str, Any]) -> None:
        """Count the checks of one ``retrieval.query`` result (its trace's ``citations``)."""
        from retrieval.citations import SUPPORT_THRESHOLD

        checks = result["trace"].get("citations") or []
        self.checked += len(checks)
        self.supported += sum(c["supported"] for c in checks)
        self.kept_below_threshold += sum(
            c["supported"] and c["support"] < SUPPORT_THRESHOLD for c in checks
        )

    def as_row(self) -> dict[str, Any]:
        rate = round(self.supported / self.checked, 3) if self.checked else None
        return {
            "statements_checked": self.checked,
            "statements_supported": self.supported,
            "support_rate": rate,
            "kept_below_threshold": self.kept_below_threshold,
        }
