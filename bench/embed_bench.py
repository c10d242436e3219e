"""Embedding benchmark (issue 24): today's embedding path against the int8 path, in one run.

Per pack (hotpotqa_100, squad_wiki6, python_docs; ``--only`` picks some):

1. A cold build per precision (``embedding_precision`` fp32: sentence-transformers on the
   machine's device; int8: the int8 export through onnxruntime on the CPU), each in a fresh
   child process and in a workspace of its own (``WS/<precision>``), kept for the retrieval
   benchmarks (``bench/eval_bench.py --workdir WS/<precision>``, ``bench/multihop_bench.py``).
2. The texts those builds embedded, embedded alone in one fresh child by each path: today's
   path (sentence-transformers fp32 on the CPU, batch 64), fp32 on the machine's default
   device when that is not the CPU (a GPU), and int8. Each path has a worker process of its
   own, and the workers take turns on slices of the texts (embed_alone), so on a shared
   machine a change of load falls on all of them alike; texts per second count encoding only
   (the model load is reported apart).
3. Mean and least cosine of each path's vectors with today's.
4. The physical limit of the machine for these texts: FLOPs per text (MiniLM's matrix
   products at each text's token count) over the measured peak of a large fp32 matrix product
   (numpy's BLAS on every core: the FMA throughput) and of an int8 one (onnxruntime's dynamic
   quantized MatMul, what the int8 path runs).

The int8 export is made once before any timing (``export`` in the JSON: its seconds, and
whether this run made it), as it is once per machine.

Usage (from the project root)::

    .venv/bin/python bench/embed_bench.py --workdir /tmp/embed-ws                # all three
    .venv/bin/python bench/embed_bench.py --only hotpotqa_100 --only squad_wiki6
    .venv/bin/python bench/embed_bench.py --only python_docs --python-pages 60

Results: Markdown on stdout and in bench/out/embed_bench.md, JSON in bench/out/embed_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from build_bench import (
    Corpus,
    child_build,
    embedded_texts,
    forget_previous_build,
    hotpotqa_corpus,
    machine,
    markdown_table,
    python_docs_corpus,
    squad_corpus,
)
from corpora import DEFAULT_HOTPOTQA, DEFAULT_SQUAD, make_pack, page_urls, serve
from harness import OFFLINE_ENV, OUT_DIR, RESULT_MARK, emit, peak_rss_mib, run_child
from limits import flops_per_text, higher_peaks, int8_export, peaks

os.environ.update(OFFLINE_ENV)

HERE = Path(__file__).resolve()
PACKS = ("hotpotqa_100", "squad_wiki6", "python_docs")
PRECISIONS = ("fp32", "int8")
TODAY = "today: sentence-transformers fp32, cpu"
SLICES = 8  # the texts embedded alone are cut into slices that the paths take in turns


# --- Children (each runs in a fresh process) -----------------------------------------------


def child_worker(texts_file: Path, precision: str, device: str, vectors_file: Path) -> dict:
    """One path's worker: load its model, then encode the slices of the texts the parent
    names on stdin, one index a line, answering each with its seconds on stdout; at the end
    of stdin, write the vectors to ``vectors_file`` (in the texts' order)."""
    os.environ["KPACK_EMBED_DEVICE"] = device
    texts = json.loads(texts_file.read_text(encoding="utf-8"))
    started = time.perf_counter()
    from kpack.embedders import embedder_for

    embedder = embedder_for("default", precision)
    embedder.encode(texts[:8])  # warm-up: first-call allocations
    load_s = time.perf_counter() - started
    vectors = np.zeros((len(texts), embedder.dimension()), dtype=np.float32)
    print("ready", flush=True)
    for line in sys.stdin:
        rows = np.arange(len(texts))[int(line) :: SLICES]
        began = time.perf_counter()
        vectors[rows] = embedder.encode([texts[i] for i in rows])
        print(f"{time.perf_counter() - began:.6f}", flush=True)
    np.save(vectors_file, vectors)
    return {
        "precision": precision,
        "device": embedder.device,
        "batch_size": embedder.batch_size,
        "load_s": round(load_s, 3),
        "peak_rss_mib": peak_rss_mib(),
    }


# --- Corpora -------------------------------------------------------------------------------


CORPORA = {
    "hotpotqa_100": hotpotqa_corpus,
    "squad_wiki6": squad_corpus,
    "python_docs": python_docs_corpus,
}


# --- One pack ------------------------------------------------------------------------------


def build_both(corpus: Corpus, workspace: Path) -> dict[str, dict]:
    """A cold build of the pack per precision, each in WS/<precision>."""
    builds = {}
    with serve(corpus.root) as base_url:
        urls = page_urls(base_url, corpus.root, corpus.pages)
        for precision in PRECISIONS:
            folder = workspace / precision
            forget_previous_build(folder, corpus.name)
            config = {"extraction": "offline", "embedding_precision": precision}
            make_pack(folder, corpus.name, urls, config)
            print(f"[{corpus.name}] {precision} build of {len(urls)} pages ...", flush=True)
            build = run_child(HERE, ["--_child-build", corpus.name, "--workdir", str(folder)])
            if not build["success"]:
                sys.exit(f"[{corpus.name}] {precision} build failed: {build['failed_steps']}")
            embedding = build["manifest"]["embedding"]
            builds[precision] = {
                "build_s": build["process_s"],
                "build_pack_s": build["build_pack_s"],
                "stage_seconds": build["manifest"]["stage_seconds"],
                "embedding": embedding,
                "peak_rss_mib": build["peak_rss_mib"],
            }
            print(
                f"[{corpus.name}] {precision}: {build['process_s']:.1f} s, "
                f"{embedding['texts_per_second']} texts/s on {embedding['device']}",
                flush=True,
            )
    return builds


def embed_alone(corpus: Corpus, workspace: Path, default_device: str, sample: int | None) -> dict:
    """The builds' texts through each path, one worker process per path, taking turns slice
    by slice (the order rotating), so a change of the machine's load falls on every path
    alike and no path's threads compete with another's in one process. Cosines against
    today's vectors."""
    texts = embedded_texts(workspace / PRECISIONS[0], corpus.name)
    if sample is not None and sample < len(texts):
        texts = texts[:: -(-len(texts) // sample)]  # evenly spread, in the builds' order
    folder = workspace / "bench" / corpus.name
    folder.mkdir(parents=True, exist_ok=True)
    texts_file = folder / "texts.json"
    texts_file.write_text(json.dumps(texts), encoding="utf-8")
    paths = {TODAY: ("fp32", "cpu")}
    if default_device != "cpu":
        paths[f"fp32, {default_device} (the default device)"] = ("fp32", "auto")
    paths["int8: onnxruntime, cpu"] = ("int8", "cpu")
    print(f"[{corpus.name}] {len(texts)} texts alone, in turns: {', '.join(paths)}", flush=True)
    workers = {}
    for index, (name, (precision, device)) in enumerate(paths.items()):
        vectors_file = folder / f"{index}.npy"
        command = [sys.executable, str(HERE), "--_child-worker", str(texts_file)]
        workers[name] = subprocess.Popen(
            [*command, precision, device, str(vectors_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for worker in workers.values():  # every model loaded before the first slice
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    seconds = dict.fromkeys(paths, 0.0)
    names = list(paths)
    for index in range(SLICES):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            worker = workers[name]
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(f"{index}\n")
            worker.stdin.flush()
            seconds[name] += float(worker.stdout.readline())
    runs = {}
    for name, worker in workers.items():
        out, _ = worker.communicate()
        lines = [line for line in out.splitlines() if line.startswith(RESULT_MARK)]
        if worker.returncode != 0 or not lines:
            sys.exit(f"[{corpus.name}] the {name} worker failed (exit status {worker.returncode})")
        runs[name] = {
            **json.loads(lines[-1][len(RESULT_MARK) :]),
            "texts": len(texts),
            "encode_s": round(seconds[name], 3),
            "texts_per_second": round(len(texts) / seconds[name], 1),
        }
    today = np.load(folder / "0.npy")
    for index, run in enumerate(runs.values()):
        cosines = (np.load(folder / f"{index}.npy") * today).sum(1)
        run["cosine_mean"] = round(float(cosines.mean()), 5)
        run["cosine_min"] = round(float(cosines.min()), 5)
    for run in runs.values():
        run["speedup_vs_today"] = round(
            run["texts_per_second"] / runs[TODAY]["texts_per_second"], 3
        )
    return {"texts": len(texts), "flops_per_text": flops_per_text(texts), "paths": runs}


# --- Report --------------------------------------------------------------------------------


def report(results: dict[str, dict], machine_peaks: dict, export: dict) -> str:
    builds = markdown_table(
        ["pack", "precision", "build s", "texts", "embedding s", "texts/s (embedding)"],
        [
            [
                pack,
                precision,
                b["build_s"],
                b["embedding"]["embedded_this_build"],
                round(
                    b["embedding"]["embedded_this_build"] / b["embedding"]["texts_per_second"], 1
                ),
                b["embedding"]["texts_per_second"],
            ]
            for pack, r in results.items()
            for precision, b in r["builds"].items()
        ],
    )
    alone_rows = []
    for pack, r in results.items():
        mflop = r["alone"]["flops_per_text"] / 1e6
        limits = {
            "fp32": machine_peaks["fp32_gflops"] * 1e9 / r["alone"]["flops_per_text"],
            "int8": machine_peaks["int8_gops"] * 1e9 / r["alone"]["flops_per_text"],
        }
        for name, run in r["alone"]["paths"].items():
            limit = limits[run["precision"]] if run["device"] == "cpu" else None
            alone_rows.append(
                [
                    pack,
                    name,
                    run["texts"],
                    round(mflop),
                    run["encode_s"],
                    run["texts_per_second"],
                    run["speedup_vs_today"],
                    f"{run['cosine_mean']:.4f}",
                    f"{run['cosine_min']:.4f}",
                    round(limit, 1) if limit else None,
                    round(run["texts_per_second"] / limit, 2) if limit else None,
                ]
            )
    alone = markdown_table(
        [
            "pack",
            "path",
            "texts",
            "MFLOP/text",
            "encode s",
            "texts/s",
            "x today",
            "mean cos",
            "min cos",
            "CPU limit texts/s",
            "share of limit",
        ],
        alone_rows,
    )
    hotpot = results.get("hotpotqa_100")
    lines = [
        "## Cold builds (one child process each, imports and model load included)",
        "",
        builds,
        "",
        "## The same texts embedded alone, the paths interleaved (encoding only)",
        "",
        alone,
        "",
        f"CPU limit: FLOPs per text over the measured peak on {machine_peaks['cores']} cores: "
        f"fp32 {machine_peaks['fp32_gflops']} GFLOP/s (numpy matmul {machine_peaks['matrix']}^3), int8 "
        f"{machine_peaks['int8_gops']} GOP/s (onnxruntime dynamic-quantized MatMul, same size).",
        f"int8 export: {export['seconds']} s "
        f"({'made in this run' if export['exported'] else 'reused from this machine'}).",
    ]
    if hotpot is not None:
        today_alone = hotpot["alone"]["paths"][TODAY]["encode_s"]
        lines.append(
            "hotpotqa_100 target (a cold build in less time than today's path takes to "
            f"embed its texts, {today_alone} s here): "
            + ", ".join(
                f"{p} build {b['build_s']} s ({'met' if b['build_s'] < today_alone else 'not met'})"
                for p, b in hotpot["builds"].items()
            )
        )
    return "\n".join(lines)


# --- Entry point ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=PACKS, help="a pack (repeatable)")
    parser.add_argument("--python-pages", type=int, metavar="N", help="first N Python pages")
    parser.add_argument("--squad", type=Path, default=DEFAULT_SQUAD, help="squad_wiki6.json")
    parser.add_argument(
        "--hotpotqa", type=Path, default=DEFAULT_HOTPOTQA, help="the hotpotqa folder"
    )
    parser.add_argument("--workdir", type=Path, help="workspace (default: a new temporary one)")
    parser.add_argument(
        "--alone-sample",
        type=int,
        metavar="N",
        help="embed about N of the builds' texts alone (evenly spread), not all of them",
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR / "embed_bench.json")
    parser.add_argument("--_child-build", metavar="PACK", help=argparse.SUPPRESS)
    parser.add_argument("--_child-worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--_child-export", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_child-peaks", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._child_build:
        emit(child_build(args._child_build, args.workdir.resolve()))
        return
    if args._child_worker:
        texts, precision, device, vectors = args._child_worker
        emit(child_worker(Path(texts), precision, device, Path(vectors)))
        return
    if args._child_export:
        emit(int8_export())
        return
    if args._child_peaks:
        emit(peaks())
        return

    workspace = (args.workdir or Path(tempfile.mkdtemp(prefix="kpack-embed-bench-"))).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"workspace: {workspace}", flush=True)
    export = run_child(HERE, ["--_child-export"])
    first_peaks = run_child(HERE, ["--_child-peaks"])
    print(f"peaks: {first_peaks}; int8 export: {export}", flush=True)
    results = {}
    for name in args.only or PACKS:
        corpus = CORPORA[name](args, workspace)
        builds = build_both(corpus, workspace)
        device = builds["fp32"]["embedding"]["device"] or "cpu"
        alone = embed_alone(corpus, workspace, device, args.alone_sample)
        results[name] = {"builds": builds, "alone": alone}
    # The peaks again at the end, keeping the higher: a shared machine lowers them at times.
    machine_peaks = higher_peaks(first_peaks, run_child(HERE, ["--_child-peaks"]))
    table = report(results, machine_peaks, export)
    print()
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "embed",
        "started_at": started_at,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "workspace": str(workspace),
        "peaks": machine_peaks,
        "export": export,
        "packs": results,
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(table + "\n")
    print(f"\nresults: {args.out}; packs kept in {workspace}/<precision>/packs")


if __name__ == "__main__":
    main()
