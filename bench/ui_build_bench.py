"""UI build benchmark: a build launched from the Dagster UI vs `kpack build`, same pack.

Issue 13's target: a build launched the way the UI launches it takes at most 1.5x as long as
`kpack build` for the same pack, and runs in one process (in-process executor).

Set-up, all in a temporary folder so the user's packs, storage and run history are untouched:
the demo pack (packs/demo) is copied once per measured build into ``<work>/packs`` together with
a copy of docs/ (its urls.txt reads ``../../docs/*.md``, so the copy is frozen while someone
edits docs/), with KPACK_PACKS_DIR, KPACK_STORAGE and DAGSTER_HOME pointing into the folder, the
variables `kpack build` and `kpack ui` read. `kpack ui` is started on 127.0.0.1 over the same
folders, so both paths share one Dagster instance, one storage base and the background load of
a running webserver and daemon.

* CLI path: ``kpack build NAME --no-progress`` in a fresh process, timed from spawn to exit.
* UI path: the GraphQL requests of the UI's "Materialize" button for the pack's partition
  (bench/dagster_ui.py), timed from the first request to the run's end time as the instance
  records it (``submit_to_end_s``; it includes the run queue and the run worker's start).
* For both, the run's own start -> end from its record (``run_s``).

Each trial measures a first build of a new pack (``first``) and a no-change rebuild of it
(``rebuild``) on both paths, alternating which path goes first. The embedding cache is kept
per pack (``<storage>/_cache/embeddings_<model>/<pack>.parquet``, likewise the gate probes):
a warm-up build fills the caches once (seeded from the project's own caches of the demo pack
when there are any), and every measured pack starts from a copy of them, so both paths face
the same warm caches and the figures measure the pipeline and its launcher, not the model.

Checks on every UI run: one process ran all its steps (one pid in its step events; Dagster's
in-process executor), it carries the ``kpack/outcome`` tag (written by the run-status sensor,
so the script waits up to 90 s for it), and ``kpack status --json`` names the last UI run.

Usage (from the project root; about 4 minutes with the default 3 trials on 2 idle cores)::

    .venv/bin/python bench/ui_build_bench.py            # 3 trials
    .venv/bin/python bench/ui_build_bench.py --trials 1 --keep

Results: a Markdown table on stdout, raw JSON in bench/out/ui_build_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dagster_ui import KPACK, PROJECT_ROOT, DagsterUI, add_partitions, prepare, seed_caches

TARGET_RATIO = 1.5
JOB = "build_pack"
OUTCOME_TAG = "kpack/outcome"
WARMUP = "demo-warmup"
OUTCOME_WAIT_S = 90  # the run-status sensors tick every 30 s


def run_kpack(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """The kpack command as a user runs it, from the project root, its output captured."""
    return subprocess.run(
        [KPACK, *argv], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=False
    )


def cli_build(ui: DagsterUI, env: dict[str, str], pack: str) -> dict[str, Any]:
    started_at = time.time()
    started = time.perf_counter()
    proc = run_kpack(env, "build", pack, "--no-progress")
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"kpack build {pack} failed:\n{proc.stdout}\n{proc.stderr}")
    run = ui.run(ui.latest_run_id(pack))
    return {
        "path": "cli",
        "pack": pack,
        "run_id": run["runId"],
        "status": run["status"],
        "wall_s": round(wall, 3),
        "run_s": round(run["endTime"] - run["startTime"], 3),
        "launch_to_run_start_s": round(run["startTime"] - started_at, 3),
        "outcome": run["tags"].get(OUTCOME_TAG),
        "output": proc.stdout.strip().splitlines()[-1:],
    }


def ui_build(ui: DagsterUI, pack: str) -> dict[str, Any]:
    submitted = time.time()
    run_id = ui.materialize(JOB, pack)
    run = ui.wait_for_run(run_id)
    if run["status"] != "SUCCESS":
        raise SystemExit(f"UI run {run_id} of {pack} ended {run['status']}; see the UI")
    return {
        "path": "ui",
        "pack": pack,
        "run_id": run_id,
        "status": run["status"],
        "wall_s": round(run["endTime"] - submitted, 3),  # submit -> end
        "seen_end_s": round(run["seen_end"] - submitted, 3),
        "run_s": round(run["endTime"] - run["startTime"], 3),
        "launch_to_run_start_s": round(run["startTime"] - submitted, 3),
    }


def step_processes(run_id: str) -> dict[str, Any]:
    """The pids that ran the run's steps, and the executor's own words, from the event log."""
    from dagster import DagsterEventType, DagsterInstance

    instance = DagsterInstance.get()  # DAGSTER_HOME is the benchmark's
    pids, executor_messages = set(), []
    for record in instance.all_logs(run_id):
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type == DagsterEventType.STEP_START:
            pids.add(event.pid)
        elif event.event_type == DagsterEventType.ENGINE_EVENT and "xecut" in record.user_message:
            executor_messages.append(record.user_message)
    return {"step_pids": sorted(pids), "executor_messages": executor_messages[:2]}


def wait_for_outcome_tags(ui: DagsterUI, runs: list[dict[str, Any]]) -> None:
    deadline = time.monotonic() + OUTCOME_WAIT_S
    for record in runs:
        while True:
            record["outcome"] = ui.run(record["run_id"])["tags"].get(OUTCOME_TAG)
            if record["outcome"] or time.monotonic() > deadline:
                break
            time.sleep(2)


def kpack_status(env: dict[str, str], pack: str) -> dict[str, Any]:
    proc = run_kpack(env, "status", pack, "--json")
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr.strip()}


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def summarise(builds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    table = {}
    for kind in ("first", "rebuild"):
        by_path = {
            path: [b for b in builds if b["kind"] == kind and b["path"] == path]
            for path in ("cli", "ui")
        }
        cli_wall = median([b["wall_s"] for b in by_path["cli"]])
        ui_wall = median([b["wall_s"] for b in by_path["ui"]])
        table[kind] = {
            "cli_wall_s": cli_wall,
            "ui_submit_to_end_s": ui_wall,
            "ratio": round(ui_wall / cli_wall, 2),
            "cli_run_s": median([b["run_s"] for b in by_path["cli"]]),
            "ui_run_s": median([b["run_s"] for b in by_path["ui"]]),
            "ui_submit_to_run_start_s": median([b["launch_to_run_start_s"] for b in by_path["ui"]]),
            "n": len(by_path["ui"]),
        }
    return table


# The Markdown table's columns after the build kind: (heading, key in a row of the summary).
COLUMNS = (
    ("CLI wall s", "cli_wall_s"),
    ("UI submit->end s", "ui_submit_to_end_s"),
    ("UI/CLI", "ratio"),
    ("CLI run s", "cli_run_s"),
    ("UI run s", "ui_run_s"),
    ("UI submit->run start s", "ui_submit_to_run_start_s"),
    ("n", "n"),
)


def markdown(table: dict[str, dict[str, float]]) -> str:
    lines = [
        markdown_row(["build", *(heading for heading, _ in COLUMNS)]),
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for kind, row in table.items():
        lines.append(markdown_row([kind, *(row[key] for _, key in COLUMNS)]))
    return "\n".join(lines)


def markdown_row(cells: list[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--trials", type=int, default=3, help="builds per path and kind (N)")
    cli.add_argument("--workdir", type=Path, help="default: a new temporary folder")
    cli.add_argument("--keep", action="store_true", help="keep the temporary folder")
    cli.add_argument("--out", type=Path, default=PROJECT_ROOT / "bench/out/ui_build_bench.json")
    args = cli.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="ui_build_bench_"))
    trials = [(i, f"demo-cli-{i}", f"demo-ui-{i}") for i in range(args.trials)]
    packs = [WARMUP] + [p for _, *pair in trials for p in pair]
    env = prepare(work, packs)
    os.environ.update(env)  # the benchmark reads and writes its own instance only
    add_partitions(packs)
    storage = work / "storage"
    seed_caches(PROJECT_ROOT / ".kpack_storage", storage, "demo", WARMUP)
    load_before = os.getloadavg()
    started = time.perf_counter()
    builds: list[dict[str, Any]] = []
    try:
        with DagsterUI(env, work / "kpack_ui.log") as ui:
            print(f"kpack ui on {ui.url} after {time.perf_counter() - started:.0f}s; warm-up build")
            warmup = cli_build(ui, env, WARMUP)
            for i, cli_pack, ui_pack in trials:
                for pack in (cli_pack, ui_pack):
                    seed_caches(storage, storage, WARMUP, pack)
                order = [("cli", cli_pack), ("ui", ui_pack)]
                if i % 2:
                    order.reverse()
                for kind in ("first", "rebuild"):
                    for path, pack in order:
                        record = cli_build(ui, env, pack) if path == "cli" else ui_build(ui, pack)
                        builds.append({"trial": i, "kind": kind, **record})
                        print(
                            f"trial {i} {kind:7} {path:3} {record['wall_s']:6.1f}s "
                            f"(run {record['run_s']:.1f}s)",
                            flush=True,
                        )
            ui_runs = [b for b in builds if b["path"] == "ui"]
            wait_for_outcome_tags(ui, ui_runs)
            for record in ui_runs:
                record.update(step_processes(record["run_id"]))
            last_ui = ui_runs[-1]
            status = kpack_status(env, last_ui["pack"])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    table = summarise(builds)
    checks = {
        "ui_runs_in_one_process": all(len(r["step_pids"]) == 1 for r in ui_runs),
        "ui_runs_tagged_with_outcome": all(r["outcome"] for r in ui_runs),
        "status_names_last_ui_run": (status.get("last_build") or {}).get("run_id")
        == last_ui["run_id"],
        "ratio_within_target": all(row["ratio"] <= TARGET_RATIO for row in table.values()),
    }
    result = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "total_s": round(time.perf_counter() - started, 1),
        "trials": args.trials,
        "workdir": str(work) if args.keep else None,
        "warmup": warmup,
        "table": table,
        "checks": checks,
        "status_of_last_ui_pack": {k: status.get(k) for k in ("pack", "version", "last_build")},
        "builds": builds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(markdown(table))
    for name, passed in checks.items():
        print(f"{'ok  ' if passed else 'FAIL'} {name}")
    print(f"raw JSON: {args.out} ({result['total_s']}s in all)")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
