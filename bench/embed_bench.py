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
import logging
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from build_bench import (
    Corpus,
    child_build,
    embedded_texts,
    forget_previous_build,
    machine,
    markdown_table,
    python_docs_corpus,
    squad_corpus,
)
from corpora import DEFAULT_HOTPOTQA, DEFAULT_SQUAD, make_pack, page_urls, render_hotpotqa, serve
from harness import OFFLINE_ENV, OUT_DIR, RESULT_MARK, emit, peak_rss_mib, run_child

os.environ.update(OFFLINE_ENV)

HERE = Path(__file__).resolve()
PACKS = ("hotpotqa_100", "squad_wiki6", "python_docs")
PRECISIONS = ("fp32", "int8")
TODAY = "today: sentence-transformers fp32, cpu"
PEAK_SIZE = 2048  # square matrices of the peak measurements
PEAK_REPEATS = 5
SLICES = 8  # the texts embedded alone are cut into slices that the paths take in turns


# --- Children (each runs in a fresh process) -----------------------------------------------


def child_worker(texts_file: Path, precision: str, device: str, vectors_file: Path) -> dict:
    """One path's worker: load its model, then encode the slices of the texts the parent
    names on stdin, one index a line, answering each with its seconds on stdout; at the end
    of stdin, write the vectors to ``vectors_file`` (in the texts' order)."""
    os.environ["KPACK_EMBED_DEVICE"] = device
    texts = json.loads(texts_file.read_text(encoding="utf-8"))
    started = time.perf_counter()
    from kpack.embedding import embedder_for

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


def child_export() -> dict:
    """The int8 export of the packaged model, made here unless this machine has it."""
    started = time.perf_counter()
    from kpack.quantized import ensure_export

    folder, exported = ensure_export("default")
    record = json.loads((folder / "export.json").read_text())
    return {
        "folder": str(folder),
        "exported": exported,
        "seconds": round(time.perf_counter() - started, 3),
        "int8_cosine_to_fp32_on_probes": record["int8_cosine_to_fp32"],
    }


def child_peaks() -> dict:
    """Measured peak throughput of a large fp32 and int8 matrix product on every core."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on every call
    rng = np.random.default_rng(0)
    n = PEAK_SIZE
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)

    def best_seconds(run: Any) -> float:
        run()  # warm-up
        times = []
        for _ in range(PEAK_REPEATS):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return min(times)

    fp32_s = best_seconds(lambda: a @ b)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "peak",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        [numpy_helper.from_array(b, "w")],
    )
    with tempfile.TemporaryDirectory() as folder:
        fp32_model, int8_model = Path(folder, "fp32.onnx"), Path(folder, "int8.onnx")
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        onnx.save(model, fp32_model)
        quantize_dynamic(fp32_model, int8_model, weight_type=QuantType.QInt8, per_channel=True)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = len(os.sched_getaffinity(0))
        session = onnxruntime.InferenceSession(
            str(int8_model), options, providers=["CPUExecutionProvider"]
        )
        int8_s = best_seconds(lambda: session.run(None, {"x": a}))
    flops = 2.0 * n**3
    return {
        "cores": len(os.sched_getaffinity(0)),
        "matrix": n,
        "fp32_gflops": round(flops / fp32_s / 1e9, 1),
        "int8_gops": round(flops / int8_s / 1e9, 1),
    }


# --- The physical limit --------------------------------------------------------------------


def flops_per_text(texts: list[str]) -> float:
    """Mean FLOPs of MiniLM's matrix products per text, at each text's own token count: per
    layer and token the four attention projections and the two feed-forward ones, plus the
    attention's two products over the text's tokens."""
    from tokenizers import Tokenizer

    from kpack.embedding import resolve_model_path

    folder = Path(resolve_model_path("default"))
    config = json.loads((folder / "config.json").read_text())
    max_tokens = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_tokens)
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    per_token = 2 * (4 * hidden * hidden + 2 * hidden * inner)
    total = 0.0
    for encoding in tokenizer.encode_batch(texts):
        tokens = len(encoding.ids)
        total += config["num_hidden_layers"] * (tokens * per_token + 4 * tokens * tokens * hidden)
    return total / max(len(texts), 1)


# --- Corpora -------------------------------------------------------------------------------


def hotpotqa_corpus(args: argparse.Namespace, workspace: Path) -> Corpus:
    corpus_file = args.hotpotqa / "hotpotqa_100_corpus.json"
    if not corpus_file.is_file():
        sys.exit(f"{corpus_file}: no such file (pass --hotpotqa FOLDER)")
    root = workspace / "corpora" / "hotpotqa_100"
    return Corpus("hotpotqa_100", root, render_hotpotqa(corpus_file, root)["pages"])


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


def report(results: dict[str, dict], peaks: dict, export: dict) -> str:
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
            "fp32": peaks["fp32_gflops"] * 1e9 / r["alone"]["flops_per_text"],
            "int8": peaks["int8_gops"] * 1e9 / r["alone"]["flops_per_text"],
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
        f"CPU limit: FLOPs per text over the measured peak on {peaks['cores']} cores: "
        f"fp32 {peaks['fp32_gflops']} GFLOP/s (numpy matmul {peaks['matrix']}^3), int8 "
        f"{peaks['int8_gops']} GOP/s (onnxruntime dynamic-quantized MatMul, same size).",
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
        emit(child_export())
        return
    if args._child_peaks:
        emit(child_peaks())
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
    last_peaks = run_child(HERE, ["--_child-peaks"])
    peaks = {
        **first_peaks,
        **{k: max(first_peaks[k], last_peaks[k]) for k in ("fp32_gflops", "int8_gops")},
    }
    table = report(results, peaks, export)
    print()
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "embed",
        "started_at": started_at,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "workspace": str(workspace),
        "peaks": peaks,
        "export": export,
        "packs": results,
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(table + "\n")
    print(f"\nresults: {args.out}; packs kept in {workspace}/<precision>/packs")


if __name__ == "__main__":
    main()
