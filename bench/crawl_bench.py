"""Crawl benchmark: a docs site of 316 pages built from one seed line vs its explicit URL list.

The site is tests/docsite.py's generated documentation (15 chapters of 20 pages, an index per
chapter and one for the site, with robots.txt, a sitemap index, canonical links, an alias page,
loops, off-scope links and non-page links), served from 127.0.0.1 with ETags. Builds, each in a
fresh process (as `kpack build` runs), offline extractor, default embedding model:

1. crawl, first: ``urls.txt`` is the one line ``<site>/docs/ depth=2``;
2. crawl, no change: the same pack rebuilt. Target (issue 12): at most 10% of the first build;
3. list, first: another pack whose ``urls.txt`` lists the 316 pages one by one.

The two packs must hold the same contents: the same pages (compared by kpack.ingest.crawl's
page_key, since the crawl names a chapter index ``chapter-00/`` where the list names it
``chapter-00/index.html``), titles, section and chunk texts, and links between pages.

``fetch.per_host_delay_s`` is 0 for both packs (a loopback server needs no politeness); with the
default 0.2 s a crawl of N pages spends about N x 0.2 s waiting, first build and rebuild alike.

Usage (from the project root)::

    .venv/bin/python bench/crawl_bench.py                # 15 chapters x 20 pages
    .venv/bin/python bench/crawl_bench.py --chapters 3   # quick check

Results: a Markdown table on stdout, JSON in bench/out/crawl_bench.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import OFFLINE_ENV, OUT_DIR, build_here, emit, run_child

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from tests.docsite import bench_site, serve  # noqa: E402

os.environ.update(OFFLINE_ENV)  # the build children inherit it

NO_CHANGE_TARGET = 0.10
FETCH = {"allow_private_hosts": True, "per_host_delay_s": 0.0, "timeout_s": 10.0}
CRAWL_STAGE_KEYS = (
    "crawl_pages",
    "crawl_max_depth",
    "crawl_requests",
    "crawl_sitemaps",
    "crawl_robots_refused",
    "crawl_off_scope_links",
    "crawl_aliases",
    "crawl_not_text",
    "not_modified",
    "duration_s",
)


def pack_contents(db: Path) -> dict[str, Any]:
    """What a reader of the pack sees, independent of how its pages were named."""
    from kpack.graphdb import opened
    from kpack.packs import page_key

    with opened(db, read_only=True) as conn:
        articles = conn.execute("MATCH (a:Article) RETURN a.url, a.title").get_all()
        sections = conn.execute(
            "MATCH (a:Article)-[:HAS_SECTION]->(s:Section) "
            "RETURN a.url, s.section_index, s.heading_path, s.content"
        ).get_all()
        chunks = conn.execute("MATCH (c:Chunk) RETURN c.content").get_all()
        links = conn.execute("MATCH (a:Article)-[:LINKS_TO]->(b:Article) RETURN a.url, b.url")
        links = links.get_all()
    parts = {
        "articles": sorted((page_key(u), t) for u, t in articles),
        "sections": sorted((page_key(u), i, h, c) for u, i, h, c in sections),
        "chunks": sorted(c for (c,) in chunks),
        "links": sorted((page_key(a), page_key(b)) for a, b in links),
    }
    return {
        "counts": {name: len(rows) for name, rows in parts.items()},
        "digest": hashlib.sha256(json.dumps(parts).encode()).hexdigest(),
    }


def child_build(workspace: Path, pack: str) -> dict[str, Any]:
    from kpack.packs import current_version

    build = build_here(pack, workspace)
    result = build.result
    fetched = result.stage_metadata.get("fetched_pages", {})
    version = current_version(workspace / "packs" / pack)
    return {
        "outcome": result.outcome,
        "cause": result.cause,
        "build_pack_s": build.total_s,
        "fetch": {key: fetched.get(key) for key in CRAWL_STAGE_KEYS},
        "embedded": result.stage_metadata.get("embeddings", {}).get("embedded"),
        "changes": (result.manifest or {}).get("changes"),
        "contents": pack_contents(version / "pack.db") if version else None,
    }


def write_pack(workspace: Path, name: str, lines: list[str]) -> None:
    folder = workspace / "packs" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "urls.txt").write_text("\n".join(lines) + "\n")
    (folder / "kg_config.json").write_text(json.dumps({"fetch": FETCH}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", type=int, default=15)
    parser.add_argument("--pages-per-chapter", type=int, default=20)
    parser.add_argument("--child", nargs=2, metavar=("WORKSPACE", "PACK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        emit(child_build(Path(args.child[0]), args.child[1]))
        return

    with (
        tempfile.TemporaryDirectory(prefix="crawl_bench_") as tmp,
        serve(bench_site(args.chapters, args.pages_per_chapter)) as site,
    ):
        workspace = Path(tmp)
        write_pack(workspace, "crawled", [f"{site.base}/docs/ depth=2"])
        write_pack(workspace, "listed", site.page_urls())
        runs = {}
        for label, pack in (
            ("crawl, first", "crawled"),
            ("crawl, no change", "crawled"),
            ("list, first", "listed"),
        ):
            before = site.full_answers
            runs[label] = run_child(HERE, ["--child", str(workspace), pack])
            runs[label]["pages_downloaded"] = site.full_answers - before
            print(f"{label}: {runs[label]['outcome']} in {runs[label]['process_s']} s", flush=True)

    first, again, listed = runs["crawl, first"], runs["crawl, no change"], runs["list, first"]
    ratio = again["process_s"] / first["process_s"]
    same = first["contents"]["digest"] == listed["contents"]["digest"]
    table = [
        "| build | outcome | pages | depth | requests | 304 | downloaded | robots refused "
        "| off-scope links | aliases | fetch s | texts embedded | process s | / first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, run in runs.items():
        fetch = run["fetch"]
        table.append(
            f"| {label} | {run['outcome']} | {fetch['crawl_pages']} | {fetch['crawl_max_depth']} "
            f"| {fetch['crawl_requests']} | {fetch['not_modified']} | {run['pages_downloaded']} "
            f"| {fetch['crawl_robots_refused']} | {fetch['crawl_off_scope_links']} "
            f"| {fetch['crawl_aliases']} | {fetch['duration_s']} | {run['embedded']} "
            f"| {run['process_s']} | {run['process_s'] / first['process_s']:.3f} |"
        )
    summary = [
        "",
        f"Same contents as the explicit list: {'yes' if same else 'NO'} "
        f"({first['contents']['counts']} vs {listed['contents']['counts']})",
        f"No-change rebuild / first build: {ratio:.3f} (target <= {NO_CHANGE_TARGET}): "
        f"{'met' if ratio <= NO_CHANGE_TARGET else 'NOT met'}",
    ]
    print("\n".join(table + summary))
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / "crawl_bench.json").write_text(
        json.dumps(
            {
                "date": datetime.now(UTC).isoformat(),
                "machine": f"{platform.node()} {os.cpu_count()} cores",
                "site_pages": len(site.page_paths()),
                "runs": runs,
                "same_contents": same,
                "no_change_ratio": ratio,
            },
            indent=2,
        )
    )
    if not same or ratio > NO_CHANGE_TARGET:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
