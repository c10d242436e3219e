"""Build benchmark (issue 24): what a first build costs today and with the new defaults, in one run.

Per pack (``squad_wiki6``, ``python_docs``, ``hotpotqa_100``; ``--only`` picks some):

1. A cold first build per path, one after the other from the same served pages (so the same
   URLs), each in a fresh child process (Python start-up, imports and the model load included)
   and a workspace of its own with empty caches:

   * ``today``: ``embedding_precision: fp32``, ``section_vectors: embedded`` and
     ``sentence_vectors: none``, what every build did before issue 24 (sentence-transformers
     fp32 embeds every section text too, and no sentence apart);
   * ``default``: the settings' defaults as kpack/config.py declares them now;
   * ``fp32`` and ``int8`` (``--paths``): the defaults with that precision, for the int8 rule.

   ``default`` builds in ``WS`` itself, so the other benchmarks run on it as before
   (``bench/eval_bench.py --workdir WS``); every other path in ``WS/paths/<path>``.
2. Today's texts (every distinct section and chunk text) embedded alone by plain
   sentence-transformers fp32 in a fresh child: the cost no build could go below before.
3. The physical limit (bench/limits.py): each path's texts times MiniLM's FLOPs per text over
   the measured peak of this machine's cores in that path's arithmetic.

Targets: python_docs, the default's first build at most 0.6 of today's wall time; hotpotqa_100,
the default's cold build in less time than embedding today's texts alone takes (both child
processes from spawn to exit).

Usage (from the project root; an idle machine for timings that mean anything)::

    .venv/bin/python bench/build_bench.py --workdir /tmp/build-ws      # all packs, today/default
    .venv/bin/python bench/build_bench.py --only hotpotqa_100 --paths today,fp32,int8
    .venv/bin/python bench/build_bench.py --only python_docs --python-pages 40   # quick check

Results: Markdown on stdout and in bench/out/build_bench.md, JSON in bench/out/build_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corpora import (
    DEFAULT_HOTPOTQA,
    DEFAULT_SQUAD,
    ensure_python_docs,
    make_pack,
    page_urls,
    python_doc_pages,
    render_hotpotqa,
    render_squad,
    serve,
)
from harness import OFFLINE_ENV, OUT_DIR, STAGES, build_here, emit, peak_rss_mib, run_child
from limits import flops_per_text, higher_peaks, int8_export, peaks

os.environ.update(OFFLINE_ENV)  # the build and the embedding-only children inherit it

HERE = Path(__file__).resolve()
PACKS = ("squad_wiki6", "python_docs", "hotpotqa_100")
# Each path's kg_config.json settings on top of the benchmark's own (offline extraction).
PATHS: dict[str, dict[str, str]] = {
    "today": {
        "embedding_precision": "fp32",
        "section_vectors": "embedded",
        "sentence_vectors": "none",
    },
    "default": {},
    "fp32": {"embedding_precision": "fp32"},
    "int8": {"embedding_precision": "int8"},
}
DEFAULT_PATHS = ("today", "default")
BUILD_RATIO_TARGET = ("python_docs", 0.6)  # default / today, first build wall time
EMBED_ALONE_TARGET = "hotpotqa_100"  # default's cold build < today's texts embedded alone


# --- Children (each runs in a fresh process) -----------------------------------------------


def child_build(pack: str, workspace: Path) -> dict[str, Any]:
    """Build one pack in-process, the way `kpack build` does, with a throwaway Dagster instance."""
    build = build_here(pack, workspace)
    result = build.result
    return {
        "pack": pack,
        "success": result.success,
        "run_id": result.run_id,
        "failed_steps": result.failed_steps,
        "failed_checks": result.failed_checks,
        "manifest": result.manifest,
        "import_s": build.import_s,
        "build_pack_s": build.build_pack_s,
        "peak_rss_mib": peak_rss_mib(),
    }


def child_embed(texts_file: Path) -> dict[str, Any]:
    """Load the model and encode the given texts: the cost no build could go below before."""
    texts = json.loads(texts_file.read_text(encoding="utf-8"))
    started = time.perf_counter()
    from kpack.embedding import encode, load_model

    imported = time.perf_counter()
    model = load_model("default")
    loaded = time.perf_counter()
    vectors = encode(model, texts)
    encoded = time.perf_counter()
    return {
        "texts": len(texts),
        "dimension": int(vectors.shape[1]),
        "import_s": round(imported - started, 3),
        "model_load_s": round(loaded - imported, 3),
        "encode_s": round(encoded - loaded, 3),
        "texts_per_second": round(len(texts) / (encoded - loaded), 1) if texts else 0.0,
        "peak_rss_mib": peak_rss_mib(),
    }


# --- Corpora -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """A folder to serve and the pages of it that make up the pack."""

    name: str
    root: Path
    pages: list[Path]


def squad_corpus(args: argparse.Namespace, workspace: Path) -> Corpus:
    if not args.squad.is_file():
        sys.exit(f"{args.squad}: no such file (pass --squad PATH to squad_wiki6.json)")
    root = workspace / "corpora" / "squad_wiki6"
    return Corpus("squad_wiki6", root, render_squad(args.squad, root))


def python_docs_corpus(args: argparse.Namespace, workspace: Path) -> Corpus:
    root = ensure_python_docs()
    pages = python_doc_pages(root, args.python_pages)
    if not pages:
        sys.exit(f"{root}: no HTML pages under its library/tutorial/reference/howto/faq folders")
    return Corpus("python_docs", root, pages)


def hotpotqa_corpus(args: argparse.Namespace, workspace: Path) -> Corpus:
    corpus_file = args.hotpotqa / "hotpotqa_100_corpus.json"
    if not corpus_file.is_file():
        sys.exit(f"{corpus_file}: no such file (pass --hotpotqa FOLDER)")
    root = workspace / "corpora" / "hotpotqa_100"
    return Corpus("hotpotqa_100", root, render_hotpotqa(corpus_file, root)["pages"])


CORPORA: dict[str, Callable[[argparse.Namespace, Path], Corpus]] = {
    "squad_wiki6": squad_corpus,
    "python_docs": python_docs_corpus,
    "hotpotqa_100": hotpotqa_corpus,
}


# --- One pack ------------------------------------------------------------------------------


def path_workspace(workspace: Path, path: str) -> Path:
    """Where a path's packs, storage and Dagster home live (the default's: the workspace)."""
    return workspace if path == "default" else workspace / "paths" / path


def forget_previous_build(workspace: Path, pack: str) -> None:
    """Drop this pack's intermediates and caches so every measured build is a cold one.

    The embedding cache would otherwise make a rebuild embed nothing and the comparison with
    embedding alone meaningless. Other packs' files are left alone.
    """
    storage = workspace / "storage"
    if storage.is_dir():
        for stale in storage.rglob(f"{pack}.parquet"):
            stale.unlink()


def embedded_texts(workspace: Path, pack: str) -> list[str]:
    """The texts the pack's last build embedded (cold), in its order, rebuilt from its Parquet
    intermediates and the section_vectors and sentence_vectors its manifest records."""
    import pyarrow.parquet as pq

    from kpack.ingest.vectors import distinct_texts

    storage = workspace / "storage"
    sections = pq.read_table(storage / "sections" / f"{pack}.parquet")
    chunks = pq.read_table(storage / "chunks" / f"{pack}.parquet")
    manifest = json.loads((workspace / "packs" / pack / "manifest.json").read_text())
    embed_sections = manifest["embedding"].get("section_vectors", "embedded") == "embedded"
    embed_sentences = manifest["embedding"].get("sentence_vectors", "none") == "embedded"
    return list(distinct_texts(sections, chunks, embed_sections, embed_sentences).values())


def build_paths(corpus: Corpus, workspace: Path, paths: list[str]) -> dict[str, dict]:
    """A cold build of the pack per path, from one server (the same URLs for every path)."""
    builds = {}
    with serve(corpus.root) as base_url:
        urls = page_urls(base_url, corpus.root, corpus.pages)
        for path in paths:
            folder = path_workspace(workspace, path)
            forget_previous_build(folder, corpus.name)
            make_pack(folder, corpus.name, urls, {"extraction": "offline", **PATHS[path]})
            print(f"[{corpus.name}] {path}: cold build of {len(urls)} pages ...", flush=True)
            build = run_child(HERE, ["--_child-build", corpus.name, "--workdir", str(folder)])
            if not build["success"] or build["manifest"] is None:
                sys.exit(
                    f"[{corpus.name}] {path} build failed: steps {build['failed_steps']}, "
                    f"checks {build['failed_checks']}"
                )
            texts = embedded_texts(folder, corpus.name)
            builds[path] = {**build, "flops_per_text": flops_per_text(texts)}
            embedding = build["manifest"]["embedding"]
            print(
                f"[{corpus.name}] {path}: {build['process_s']:.1f} s, "
                f"{embedding['embedded_this_build']} texts at {embedding['texts_per_second']}/s",
                flush=True,
            )
    return builds


def embed_alone(corpus: Corpus, built: Path) -> dict[str, Any]:
    """Today's texts (every distinct section and chunk text, read from the intermediates of a
    build in ``built``) through plain sentence-transformers fp32."""
    import pyarrow.parquet as pq

    from kpack.ingest.vectors import distinct_texts

    storage = built / "storage"
    texts = list(
        distinct_texts(
            pq.read_table(storage / "sections" / f"{corpus.name}.parquet"),
            pq.read_table(storage / "chunks" / f"{corpus.name}.parquet"),
            embed_sentences=False,
        ).values()
    )
    texts_file = built / "bench" / f"{corpus.name}.texts.json"
    texts_file.parent.mkdir(parents=True, exist_ok=True)
    texts_file.write_text(json.dumps(texts), encoding="utf-8")
    print(f"[{corpus.name}] embedding today's {len(texts)} texts alone ...", flush=True)
    return run_child(HERE, ["--_child-embed", str(texts_file)])


def summarize(build: dict[str, Any], machine_peaks: dict) -> dict[str, Any]:
    """One path's build: stage seconds, texts, throughput and its share of the CPU limit."""
    manifest = build["manifest"]
    embedding = manifest["embedding"]
    stages = {s: manifest["stage_seconds"].get(s) for s in STAGES}
    stage_sum = sum(v for v in stages.values() if v is not None)
    embedded = embedding["embedded_this_build"]
    peak = machine_peaks["fp32_gflops" if embedding["precision"] == "fp32" else "int8_gops"]
    limit = peak * 1e9 / build["flops_per_text"] if build["flops_per_text"] else None
    embed_s = stages["embeddings"] or 0.0
    on_cpu = embedding.get("device") in (None, "cpu")
    return {
        "build_s": build["process_s"],
        "build_pack_s": build["build_pack_s"],
        "import_s": build["import_s"],
        "peak_rss_mib": build["peak_rss_mib"],
        "stage_seconds": stages,
        # What build_pack spends outside the stages' own timers (Dagster, IO managers, checks).
        "outside_stages_s": round(build["build_pack_s"] - stage_sum, 3),
        "precision": embedding["precision"],
        "section_vectors": embedding.get("section_vectors", "embedded"),
        "device": embedding.get("device"),
        "texts_embedded": embedded,
        "texts_per_second": embedding.get("texts_per_second"),
        "limit_texts_per_second": round(limit, 1) if limit and on_cpu else None,
        "embed_stage_s": embed_s,
        "not_embedding_s": round(build["process_s"] - embed_s, 3),
        "gate": {k: manifest["gate"].get(k) for k in ("threshold", "seconds")},
        "counts": manifest["counts"],
    }


def verdicts(results: dict[str, dict]) -> list[str]:
    """The issue's two build-time targets, where this run measured them."""
    lines = []
    pack, most = BUILD_RATIO_TARGET
    paths = results.get(pack, {}).get("paths", {})
    if {"today", "default"} <= set(paths):
        ratio = paths["default"]["build_s"] / paths["today"]["build_s"]
        lines.append(
            f"{pack}: default first build {paths['default']['build_s']:.1f} s against today's "
            f"{paths['today']['build_s']:.1f} s = {ratio:.2f}x (target <= {most}): "
            f"{'met' if ratio <= most else 'NOT met'}."
        )
    hotpot = results.get(EMBED_ALONE_TARGET)
    if hotpot and "default" in hotpot["paths"]:
        build_s = hotpot["paths"]["default"]["build_s"]
        alone = hotpot["embed_alone"]
        lines.append(
            f"{EMBED_ALONE_TARGET}: default cold build {build_s:.1f} s against "
            f"sentence-transformers fp32 embedding today's {alone['texts']} texts alone "
            f"{alone['process_s']:.1f} s (process; of it {alone['encode_s']:.1f} s encoding): "
            f"{'met' if build_s < alone['process_s'] else 'NOT met'}."
        )
    return lines


# --- Report --------------------------------------------------------------------------------


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def report(results: dict[str, dict], machine_peaks: dict, export: dict) -> str:
    rows = [(pack, path, s) for pack, r in results.items() for path, s in r["paths"].items()]
    builds = markdown_table(
        [
            "pack",
            "path",
            "precision",
            "section vectors",
            "build s",
            "texts embedded",
            "embed stage s",
            "texts/s",
            "CPU limit texts/s",
            "share of limit",
            "rest of the build s",
            "peak RSS MiB",
        ],
        [
            [
                pack,
                path,
                s["precision"],
                s["section_vectors"],
                s["build_s"],
                s["texts_embedded"],
                s["embed_stage_s"],
                s["texts_per_second"],
                s["limit_texts_per_second"],
                (
                    round(s["texts_per_second"] / s["limit_texts_per_second"], 2)
                    if s["texts_per_second"] and s["limit_texts_per_second"]
                    else None
                ),
                s["not_embedding_s"],
                s["peak_rss_mib"],
            ]
            for pack, path, s in rows
        ],
    )
    stages = markdown_table(
        ["pack", "path", "import", *STAGES, "outside stages"],
        [
            [
                pack,
                path,
                s["import_s"],
                *(s["stage_seconds"][k] for k in STAGES),
                s["outside_stages_s"],
            ]
            for pack, path, s in rows
        ],
    )
    alone = markdown_table(
        ["pack", "texts", "process s", "import s", "model load s", "encode s", "texts/s"],
        [
            [
                pack,
                r["embed_alone"]["texts"],
                r["embed_alone"]["process_s"],
                r["embed_alone"]["import_s"],
                r["embed_alone"]["model_load_s"],
                r["embed_alone"]["encode_s"],
                r["embed_alone"]["texts_per_second"],
            ]
            for pack, r in results.items()
        ],
    )
    return "\n".join(
        [
            "## Cold first builds (one child process each, from spawn to exit)",
            "",
            builds,
            "",
            "## Stage seconds (manifest stage_seconds; import: Dagster and the pipeline)",
            "",
            stages,
            "",
            "## Today's texts embedded alone (sentence-transformers fp32, one child process)",
            "",
            alone,
            "",
            f"CPU limit: each path's texts' FLOPs over the measured peak on "
            f"{machine_peaks['cores']} cores: fp32 {machine_peaks['fp32_gflops']} GFLOP/s "
            f"(numpy matmul {machine_peaks['matrix']}^3), int8 {machine_peaks['int8_gops']} "
            f"GOP/s (onnxruntime dynamic-quantized MatMul).",
            f"int8 export: {export['seconds']} s "
            f"({'made in this run' if export['exported'] else 'reused from this machine'}), "
            "before any timing.",
            *verdicts(results),
        ]
    )


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
    }


# --- Entry point ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=PACKS, help="a pack (repeatable)")
    parser.add_argument(
        "--paths",
        default=",".join(DEFAULT_PATHS),
        help=f"comma list of {', '.join(PATHS)} (default: {','.join(DEFAULT_PATHS)})",
    )
    parser.add_argument(
        "--python-pages",
        type=int,
        metavar="N",
        help="cap the Python docs at their first N pages (sorted)",
    )
    parser.add_argument(
        "--squad", type=Path, default=DEFAULT_SQUAD, help=f"squad_wiki6.json ({DEFAULT_SQUAD})"
    )
    parser.add_argument(
        "--hotpotqa", type=Path, default=DEFAULT_HOTPOTQA, help="the hotpotqa folder"
    )
    parser.add_argument(
        "--workdir", type=Path, help="workspace folder, kept (default: a new temporary one)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep a temporary workspace for the other benchmarks"
    )
    parser.add_argument(
        "--out", type=Path, default=OUT_DIR / "build_bench.json", help="the JSON results"
    )
    parser.add_argument("--_child-build", metavar="PACK", help=argparse.SUPPRESS)
    parser.add_argument("--_child-embed", type=Path, metavar="TEXTS", help=argparse.SUPPRESS)
    parser.add_argument("--_child-export", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_child-peaks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.python_pages is not None and args.python_pages < 1:
        parser.error("--python-pages must be at least 1")
    unknown = set(args.paths.split(",")) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}: choose from {', '.join(PATHS)}")
    return args


def run_children(args: argparse.Namespace) -> bool:
    """Answer as a child, when this process is one; whether it was."""
    if args._child_build:
        emit(child_build(args._child_build, args.workdir.resolve()))
    elif args._child_embed:
        emit(child_embed(args._child_embed))
    elif args._child_export:
        emit(int8_export())
    elif args._child_peaks:
        emit(peaks())
    else:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if run_children(args):
        return
    paths = args.paths.split(",")
    own_workspace = args.workdir is None
    workspace = (
        Path(tempfile.mkdtemp(prefix="kpack-bench-")) if own_workspace else args.workdir
    ).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"workspace: {workspace}", flush=True)
    export = run_child(HERE, ["--_child-export"])
    first_peaks = run_child(HERE, ["--_child-peaks"])
    print(f"peaks: {first_peaks}; int8 export: {export}", flush=True)
    raw = {}
    try:
        for name in args.only or PACKS:
            corpus = CORPORA[name](args, workspace)
            raw[name] = {
                "pages": len(corpus.pages),
                "builds": build_paths(corpus, workspace, paths),
                "embed_alone": embed_alone(corpus, path_workspace(workspace, paths[0])),
            }
    finally:
        if own_workspace and not args.keep:
            shutil.rmtree(workspace, ignore_errors=True)
    # The peaks again at the end, keeping the higher: a shared machine lowers them at times.
    machine_peaks = higher_peaks(first_peaks, run_child(HERE, ["--_child-peaks"]))
    results = {
        name: {
            "pages": r["pages"],
            "paths": {p: summarize(b, machine_peaks) for p, b in r["builds"].items()},
            "embed_alone": r["embed_alone"],
        }
        for name, r in raw.items()
    }
    table = report(results, machine_peaks, export)
    print()
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "build",
        "started_at": started_at,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "paths": {p: PATHS[p] for p in paths},
        "peaks": machine_peaks,
        "export": export,
        "workspace": str(workspace) if (args.keep or not own_workspace) else None,
        "timing": "build s = child wall time from spawn to exit; imports and model load "
        "included on both sides",
        "targets": verdicts(results),
        "packs": results,
        "manifests": {
            name: {p: b["manifest"] for p, b in r["builds"].items()} for name, r in raw.items()
        },
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(table + "\n")
    print(f"\nresults: {args.out}")
    if args.keep or not own_workspace:
        print(f"workspace kept: {workspace} (the default path's packs in {workspace / 'packs'})")


if __name__ == "__main__":
    main()
