"""Shard benchmark: in-process vs 1 and 2 Celery workers on one machine, and per-shard scaling.

One pack (tests/docsite.py's generated site, crawled from one seed line) is built twice, each
build in a fresh process, offline extractor, default embedding model, KPACK_EMBED_SHARDS
shards (default 4):

1. in-process: `build_pack` as `kpack build` runs it;
2. celery, once per worker count (``--workers``, default 1 and 2): `build_pack(executor=...)`,
   every step a task for dagster-celery workers (one process each) with a redis-server on
   127.0.0.1 as broker and result backend (tests/celery_cluster.py, the configuration of
   docs/deployment.md).

The packs must all hold the same contents (bench/crawl_bench.py's pack_contents). On a 2-core
machine two workers cannot be faster; the comparison shows the overhead (task dispatch, a
model load per worker, Parquet through the store between steps). The per-shard figures of the
in-process build (texts, seconds in the model) and the per-page time of the other stages give
an estimate of a 10,000-page pack with N workers, each a machine like this one and one shard
each (KPACK_EMBED_SHARDS = N): serial stages + the largest shard's embedding + a model load.

Usage (from the project root)::

    .venv/bin/python bench/shard_bench.py                  # 4 chapters x 10 pages
    .venv/bin/python bench/shard_bench.py --chapters 2     # quick check
    .venv/bin/python bench/shard_bench.py --workers 2      # in-process against 2 workers only

Results: Markdown tables on stdout, JSON in bench/out/shard_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# crawl_bench puts the project root on sys.path (for tests.*) and sets the offline variables.
from crawl_bench import FETCH, pack_contents
from harness import OUT_DIR, build_here, emit, run_child

from kpack.ingest.shards import SHARDS_VARIABLE
from tests.celery_cluster import celery_workers, redis_server
from tests.docsite import bench_site, serve

HERE = Path(__file__).resolve()
DEFAULT_SHARDS = 4  # embedding shards, unless KPACK_EMBED_SHARDS says otherwise
PACK = "shards"
TARGET_PAGES = 10_000
SERIAL_STAGES = (
    "fetched_pages",
    "articles",
    "chunks",
    "entities",
    "pagerank",
    "pack_graph",
    "pack_manifest",
)


def child_build(workspace: Path, executor: dict | None) -> dict[str, Any]:
    from kpack.packs import current_version

    build = build_here(PACK, workspace, executor)
    result = build.result
    version = current_version(workspace / "packs" / PACK)
    return {
        "outcome": result.outcome,
        "cause": result.cause,
        "build_pack_s": build.total_s,
        "stages": result.stage_metadata,
        "contents": pack_contents(version / "pack.db") if version else None,
    }


def write_pack(workspace: Path, seed: str) -> None:
    folder = workspace / "packs" / PACK
    folder.mkdir(parents=True)
    (folder / "urls.txt").write_text(f"{seed} depth=2\n")
    (folder / "kg_config.json").write_text(json.dumps({"fetch": FETCH}))


def estimate(local: dict, pages: int) -> tuple[float, float, list[dict]]:
    """Seconds for a TARGET_PAGES pack with N workers, from the in-process build's figures:
    (seconds per text, model load seconds, one row per N).

    In one process the first shard loads the model (inside its embedding time) and the others
    reuse it, so the others give the time per text and the first one, less that, the load.
    """
    stages = local["stages"]
    shards = [stages[f"embeddings_shard_{i}"] for i in range(len(shard_names(stages)))]
    warm = shards[1:] or shards
    per_text = sum(s["embed_seconds"] for s in warm) / max(sum(s["texts"] for s in warm), 1)
    model_load = max(0.0, shards[0]["embed_seconds"] - per_text * shards[0]["texts"])
    texts = sum(s["texts"] for s in shards)
    serial_per_page = sum(stages.get(s, {}).get("duration_s", 0) for s in SERIAL_STAGES) / pages
    serial = serial_per_page * TARGET_PAGES
    target_texts = texts / pages * TARGET_PAGES
    rows = []
    for workers in (1, 2, 4, 8, 16, 32):
        # Equal hash ranges hold equal shares of the texts; each worker loads the model once.
        embed = target_texts / workers * per_text + model_load
        rows.append({"workers": workers, "serial_s": serial, "embed_s": embed})
    for row in rows:
        row["total_s"] = row["serial_s"] + row["embed_s"]
        row["speedup"] = rows[0]["total_s"] / row["total_s"]
    return per_text, model_load, rows


def shard_names(stages: dict) -> list[str]:
    return sorted(name for name in stages if name.startswith("embeddings_shard_"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", type=int, default=4)
    parser.add_argument("--pages-per-chapter", type=int, default=10)
    parser.add_argument(
        "--workers", default="1,2", help="Celery worker counts, joined by commas (default 1,2)"
    )
    parser.add_argument("--child", nargs=2, metavar=("WORKSPACE", "EXECUTOR"))
    args = parser.parse_args()
    if args.child:
        emit(child_build(Path(args.child[0]), json.loads(args.child[1])))
        return

    worker_counts = [int(n) for n in args.workers.split(",") if n.strip()]
    # Shards for the workers to share (the builds, children and workers, inherit it).
    os.environ.setdefault(SHARDS_VARIABLE, str(DEFAULT_SHARDS))
    with (
        tempfile.TemporaryDirectory(prefix="shard_bench_") as tmp,
        serve(bench_site(args.chapters, args.pages_per_chapter)) as site,
    ):
        local = Path(tmp) / "local"
        write_pack(local, f"{site.base}/docs/")
        runs = {"in-process": run_child(HERE, ["--child", str(local), "null"])}
        print(f"in-process: {runs['in-process']['process_s']} s", flush=True)
        with redis_server(Path(tmp)) as redis_url:
            for database, workers in enumerate(worker_counts):
                label = f"celery, {workers} worker{'s' if workers > 1 else ''}"
                distributed = Path(tmp) / f"celery{workers}"
                write_pack(distributed, f"{site.base}/docs/")
                env = {
                    "KPACK_PACKS_DIR": str(distributed / "packs"),
                    "KPACK_STORAGE": str(distributed / "storage"),
                    "DAGSTER_HOME": str(distributed / "dagster_home"),
                }
                os.environ.update(env)
                # Each run its own broker and backend databases: no task of one meets another.
                executor = {
                    "broker": f"{redis_url}/{2 * database}",
                    "backend": f"{redis_url}/{2 * database + 1}",
                }
                with celery_workers(distributed, executor, env, workers):
                    runs[label] = run_child(
                        HERE, ["--child", str(distributed), json.dumps(executor)]
                    )
                print(f"{label}: {runs[label]['process_s']} s", flush=True)

    pages = runs["in-process"]["stages"]["fetched_pages"]["crawl_pages"]
    digests = {run["contents"]["digest"] for run in runs.values() if run["contents"]}
    same = len(digests) == 1 and all(run["contents"] for run in runs.values())
    lines = [
        f"Pack: {pages} pages, {runs['in-process']['contents']['counts']}",
        "",
        "| build | outcome | process s | build_pack s | embedding shards (s each) |",
        "|---|---|---|---|---|",
    ]
    for label, run in runs.items():
        # A step a worker ran may come back without its timing: "-".
        shard_times = [run["stages"][name].get("duration_s") for name in shard_names(run["stages"])]
        lines.append(
            f"| {label} | {run['outcome']} | {run['process_s']} | {run['build_pack_s']} "
            f"| {', '.join('-' if t is None else f'{t:.1f}' for t in shard_times)} |"
        )
    alone = runs["in-process"]["process_s"]
    lines += [
        "",
        f"Same contents: {'yes' if same else 'NO'}; against in-process on this machine: "
        + ", ".join(
            f"{label} {run['process_s'] - alone:+.1f} s ({run['process_s'] / alone:.2f}x)"
            for label, run in runs.items()
            if label != "in-process"
        ),
        "",
        "| shard | texts | embedded | model s | texts/s |",
        "|---|---|---|---|---|",
    ]
    stages = runs["in-process"]["stages"]
    for name in shard_names(stages):
        meta = stages[name]
        lines.append(
            f"| {meta['shard']} | {meta['texts']} | {meta['embedded']} | {meta['embed_seconds']} "
            f"| {meta['texts_per_second']} |"
        )
    per_text, model_load, table = estimate(runs["in-process"], pages)
    lines += [
        "",
        f"Estimate for {TARGET_PAGES:,} pages ({per_text * 1000:.0f} ms per text, model load "
        f"{model_load:.1f} s per worker; one shard per worker, each a machine like this one):",
        "",
        "| workers | serial stages s | embedding s | total s | speedup |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['workers']} | {r['serial_s']:.0f} | {r['embed_s']:.0f} | {r['total_s']:.0f} "
        f"| {r['speedup']:.2f} |"
        for r in table
    ]
    print("\n".join(lines))
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / "shard_bench.json").write_text(
        json.dumps(
            {
                "date": datetime.now(UTC).isoformat(),
                "machine": f"{platform.node()} {os.cpu_count()} cores",
                "pages": pages,
                "runs": {k: {**v, "stages": v["stages"]} for k, v in runs.items()},
                "same_contents": same,
                "estimate": table,
            },
            indent=2,
            default=str,
        )
    )
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
