"""Incremental rebuild benchmark: first build vs a no-change rebuild vs a 5%-changed rebuild.

The Python 3.11 documentation (Debian's python3.11-doc, see corpora.py) is copied into the
workspace and served from 127.0.0.1 by Python's static file server, which sends Last-Modified
and answers If-Modified-Since with 304, like most documentation hosts. Three builds of the same
pack, each in a fresh process (as `kpack build` runs), with the offline extractor:

1. first: a cold build (empty storage, no published version);
2. no change: the same sources again. Target (issue 5): zero LLM calls, zero embedding calls,
   and at most 10% of the first build's time;
3. 5% changed: one sentence is added to the first paragraph of every 20th page (5% of the pages)
   between builds. Target: only those pages' sections and chunks are re-embedded. The script
   checks it: the texts that are new in the intermediates all belong to changed pages, and
   their number is the manifest's ``embedded_this_build``.

Timing: ``process_s`` is the wall time of the child process from spawn to exit (Python start-up,
imports and any model load included), ``build_pack_s`` the time inside build_pack.

Usage (from the project root)::

    .venv/bin/python bench/incremental_bench.py                     # all ~370 pages
    .venv/bin/python bench/incremental_bench.py --python-pages 30   # quick check

Results: a Markdown table on stdout, JSON in bench/out/incremental_bench.json (and the table in
bench/out/incremental_bench.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corpora import (
    ensure_python_docs,
    make_pack,
    page_urls,
    python_doc_pages,
    serve,
)
from harness import OFFLINE_ENV, OUT_DIR, STAGES, build_here, emit, run_child

os.environ.update(OFFLINE_ENV)  # the build children inherit it

HERE = Path(__file__).resolve()
PACK = "python_docs_incremental"
NO_CHANGE_TARGET = 0.10  # no-change rebuild time / first build time
# A body paragraph of a Sphinx page: starts a line (those inside the local table of contents,
# a <nav> the fetcher drops, are list items). Searched after the main landmark.
FIRST_PARAGRAPH = re.compile(r"^(<p>)(.*?)(</p>)", re.DOTALL | re.MULTILINE)
MAIN_LANDMARK = 'role="main"'
ASIDE = re.compile(r"<aside\b.*?</aside>", re.DOTALL)


def child_build(workspace: Path) -> dict[str, Any]:
    """One build in this (fresh) process, the way `kpack build` runs it."""
    build = build_here(PACK, workspace)
    result = build.result
    meta = result.stage_metadata
    return {
        "success": result.success,
        "outcome": result.outcome,
        "failed_steps": result.failed_steps,
        "failed_checks": result.failed_checks,
        "version": (result.manifest or {}).get("version"),
        "manifest": result.manifest if result.published else None,
        "embedded": meta.get("embeddings", {}).get("embedded"),
        "texts": meta.get("embeddings", {}).get("texts"),
        "llm_calls": meta.get("entities", {}).get("llm_calls"),
        "fetch": {
            k: meta.get("fetched_pages", {}).get(k)
            for k in (
                "urls",
                "failed",
                "not_modified",
                "change_new",
                "change_changed",
                "change_unchanged",
            )
        },
        "stage_seconds": {s: meta.get(s, {}).get("duration_s") for s in STAGES},
        "import_s": build.import_s,
        "build_pack_s": build.build_pack_s,
    }


def run_build(workspace: Path, label: str) -> dict[str, Any]:
    print(f"[{label}] building ...", flush=True)
    result = {"build": label, **run_child(HERE, ["--_child-build", "--workdir", str(workspace)])}
    elapsed = result["process_s"]
    if not result["success"]:
        raise SystemExit(f"[{label}] build did not succeed: {result['failed_steps']}")
    print(
        f"[{label}] {result['outcome']} in {elapsed:.1f}s: embedded {result['embedded']}, "
        f"LLM calls {result['llm_calls']}",
        flush=True,
    )
    return result


def copy_pages(source_root: Path, pages: list[Path], corpus: Path) -> list[Path]:
    """The pages copied under ``corpus`` with their relative paths (links keep working)."""
    copied = []
    for page in pages:
        target = corpus / page.relative_to(source_root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(page, target)
        copied.append(target)
    return copied


def change_pages(
    pages: list[Path], share: float, sentence: str = "Incremental benchmark edit"
) -> list[Path]:
    """Add a sentence to the first paragraph of every (1/share)-th page; return those pages."""
    step = max(1, round(1 / share))
    changed = []
    for index, page in enumerate(pages[::step]):
        html = page.read_text(encoding="utf-8")
        main = max(html.find(MAIN_LANDMARK), 0)
        asides = [m.span() for m in ASIDE.finditer(html)]  # dropped by the fetcher
        paragraph = next(
            (
                m
                for m in FIRST_PARAGRAPH.finditer(html, main)
                if not any(a <= m.start() < b for a, b in asides)
            ),
            None,
        )
        if paragraph is not None:
            at = paragraph.end(2)
            edited = f"{html[:at]} {sentence} {index}.{html[at:]}"
            page.write_text(edited, encoding="utf-8")
            stat = page.stat()  # a later mtime, whatever the file system's resolution
            os.utime(page, (stat.st_atime, stat.st_mtime + 2))
            changed.append(page)
    return changed


def passage_hashes(workspace: Path) -> dict[str, str]:
    """content hash -> article URL of every section and chunk text in the intermediates."""
    import pyarrow.parquet as pq

    storage = workspace / "storage"
    hashes: dict[str, str] = {}
    for asset in ("sections", "chunks"):
        table = pq.read_table(storage / asset / f"{PACK}.parquet")
        for row in table.select(["content_hash", "article_url"]).to_pylist():
            hashes.setdefault(row["content_hash"], row["article_url"])
    return hashes


def report(results: list[dict[str, Any]], check: dict[str, Any]) -> str:
    first = results[0]["process_s"]
    header = [
        "build",
        "outcome",
        "version",
        "process s",
        "build_pack s",
        "/ first",
        "fetched 304",
        "pages changed",
        "texts embedded",
        "LLM calls",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        lines.append(
            "| "
            + " | ".join(
                str(v)
                for v in (
                    r["build"],
                    r["outcome"],
                    r["version"],
                    f"{r['process_s']:.1f}",
                    f"{r['build_pack_s']:.1f}",
                    f"{r['process_s'] / first:.3f}",
                    r["fetch"]["not_modified"],
                    r["fetch"]["change_changed"],
                    r["embedded"],
                    r["llm_calls"],
                )
            )
            + " |"
        )
    stages = ["| build | " + " | ".join(STAGES) + " |", "|" + "---|" * (len(STAGES) + 1)]
    for r in results:
        cells = ["-" if r["stage_seconds"][s] is None else r["stage_seconds"][s] for s in STAGES]
        stages.append(f"| {r['build']} | " + " | ".join(str(c) for c in cells) + " |")
    no_change = results[1]
    ratio = no_change["process_s"] / first
    verdict = [
        "",
        f"no-change rebuild: {no_change['process_s']:.1f}s vs first build {first:.1f}s "
        f"= {ratio:.1%} of it (target <= {NO_CHANGE_TARGET:.0%}: "
        f"{'met' if ratio <= NO_CHANGE_TARGET else 'NOT met'}); LLM calls "
        f"{no_change['llm_calls']}, texts embedded {no_change['embedded']}.",
        f"5% changed: {check['changed_pages']} pages edited; {check['new_texts']} section/chunk "
        f"texts are new, all on edited pages: {check['all_on_changed_pages']}; embedded "
        f"{check['embedded']} (equal: {check['embedded'] == check['new_texts']}).",
    ]
    return "\n".join(["## Builds", "", *lines, "", "## Stage seconds", "", *stages, *verdict])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-pages", type=int, metavar="N", help="the first N pages only")
    parser.add_argument("--change-share", type=float, default=0.05, help="share of pages edited")
    parser.add_argument("--workdir", type=Path, help="workspace (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the workspace")
    parser.add_argument("--out", type=Path, default=OUT_DIR / "incremental_bench.json")
    parser.add_argument("--_child-build", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child_build:
        emit(child_build(args.workdir.resolve()))
        return

    own = args.workdir is None
    workspace = (Path(tempfile.mkdtemp(prefix="kpack-incr-")) if own else args.workdir).resolve()
    if (workspace / "storage").exists() or (workspace / "packs" / PACK).exists():
        raise SystemExit(f"{workspace} already holds a build: use an empty --workdir")
    print(f"workspace: {workspace}", flush=True)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    root = ensure_python_docs()
    corpus = workspace / "corpus"
    pages = copy_pages(root, python_doc_pages(root, args.python_pages), corpus)
    try:
        with serve(corpus) as base_url:
            make_pack(
                workspace,
                PACK,
                page_urls(base_url, corpus, pages),
                {"extraction": "offline", "fetch": {"per_host_delay_s": 0.0}},
            )
            results = [run_build(workspace, "first")]
            results.append(run_build(workspace, "no change"))
            before = passage_hashes(workspace)
            changed = change_pages(pages, args.change_share)
            changed_urls = set(page_urls(base_url, corpus, changed))
            results.append(run_build(workspace, f"{args.change_share:.0%} changed"))
            after = passage_hashes(workspace)
    finally:
        if own and not args.keep:
            shutil.rmtree(workspace, ignore_errors=True)
    new_texts = {h: url for h, url in after.items() if h not in before}
    check = {
        "changed_pages": len(changed),
        "new_texts": len(new_texts),
        "all_on_changed_pages": set(new_texts.values()) <= changed_urls,
        "embedded": results[2]["embedded"],
    }
    table = report(results, check)
    print()
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "incremental",
        "started_at": started_at,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "args": {"python_pages": args.python_pages, "change_share": args.change_share},
        "pages": len(pages),
        "no_change_ratio": round(results[1]["process_s"] / results[0]["process_s"], 4),
        "target": {"no_change_ratio_max": NO_CHANGE_TARGET},
        "check_5pct": check,
        "builds": results,
    }
    args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")
    args.out.with_suffix(".md").write_text(table + "\n")
    print(f"\nresults: {args.out}")


if __name__ == "__main__":
    main()
