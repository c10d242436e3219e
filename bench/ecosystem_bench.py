"""Ecosystem benchmark (issue 34): each library's pack and the combined pack, built from their
seed lines (packs/<library>/urls.txt, packs/ecosystem/urls.txt) off Debian's documentation
packages served on 127.0.0.1, and what a reader of each costs.

1. The sites: Debian's python3.11-doc, python-pandas-doc, python-sklearn-doc, python-scipy-doc,
   python-django-doc, python-flask-doc, python-werkzeug-doc and rust-doc (the Rust standard
   library, the book, the reference and six more books: packs/rust/urls.txt) (``apt-get install`` them;
   ``dpkg -L`` shows their HTML under /usr/share/doc), served from /usr/share/doc on 127.0.0.1
   as a user would (``python3 -m http.server``). The packs' seed lines name port 8765; the
   benchmark serves on a free port and writes that port into its copies of the packs.
2. Builds: each library's pack, then the combined pack, each in a fresh child process with
   the packs' own settings (the CPU default precision, int8 without a GPU). Per pack: the
   pages the crawl found, kept, skipped (404, excluded, redirect stub, duplicate) and capped;
   chunks; each stage's seconds; texts per second of the embedding.
3. Embedding: int8 against fp32 on the same texts (the combined pack's, evenly sampled), in
   one child process taking turns slice by slice, so a change of load falls on both alike.
4. Per pack, the figures of issue 34 item 4, each in fresh child processes on one thread
   (KPACK_READER_THREADS=1): the first search and the first query, each in its own process,
   cold (after ``sync; echo 3 > /proc/sys/vm/drop_caches`` on a quiet disk, when this process
   may write it; the JSON says whether it could) and warm; search and query p50/p95; memory from
   /proc/self/smaps_rollup (Anonymous, Private_Clean + Private_Dirty, Rss) and the mapped
   working set by file (/proc/self/smaps); ANN recall@10 of the chunk and the section index
   against the exact scan (packs above the ANN threshold only); keyword hit@10 with the
   per-term cap (kpack.keyword_index.KEYWORD_TERM_CANDIDATES) against without it; how many
   questions reach the graph stages (PageRank's reranking and the second hop).
5. The library packs asked together (retrieval.multipack) against the combined pack on the
   combined pack's questions (hit@5 of each), and whether find_packs (serving.resolve) ranks
   each library's own pack first for the library's name.

Questions: ``--questions FILE`` (JSON lines with ``question`` and ``gold_pages``, page paths a
result URL ends with, as bench/python_docs_qa and conala_dev give them); without one, each
pack is asked about its own section headings ("What does the documentation say about X?",
the heading's page as the gold page), as bench/query_bench.py does.

    .venv/bin/python bench/ecosystem_bench.py --libraries flask,werkzeug --workdir /tmp/eco
    .venv/bin/python bench/ecosystem_bench.py --workdir /tmp/eco-all \\
        --questions ../shared/benchmarks/python_docs_qa/questions.jsonl

A run stopped part way goes on with ``--keep-built`` and the same ``--workdir``: the packs it
published are kept as they are (their build time shows as "built before"), the others built.

Results: Markdown on stdout and in bench/out/ecosystem_bench.md, JSON in
bench/out/ecosystem_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from build_bench import child_build, machine, markdown_table  # noqa: E402
from corpora import serve  # noqa: E402
from harness import OFFLINE_ENV, OUT_DIR, RESULT_MARK, STAGES, emit, workspace_env  # noqa: E402
from incremental_bench import change_pages  # noqa: E402

os.environ.update(OFFLINE_ENV)

DOC_ROOT = Path("/usr/share/doc")
# Each library's pack, the Debian package that ships its documentation, and that HTML's folder.
LIBRARIES = {
    "python": ("python3.11-doc", "python3.11/html"),
    "pandas": ("python-pandas-doc", "python-pandas-doc/html"),
    "scikit-learn": ("python-sklearn-doc", "python-sklearn-doc/html"),
    "scipy": ("python-scipy-doc", "python-scipy-doc/html"),
    "django": ("python-django-doc", "python-django-doc/html"),
    "flask": ("python-flask-doc", "python-flask-doc/html"),
    "werkzeug": ("python-werkzeug-doc", "python-werkzeug-doc/html"),
    # Two more sites of the Debian archive, since the eight above came to 98,909 chunks with
    # all of rust-doc's books, short of the 100,000 issue 34's combined pack is measured at:
    # Jinja (Flask's templates) and Celery (the task queue Django and Flask apps run).
    "jinja": ("python-jinja2-doc", "python-jinja2-doc/html"),
    "celery": ("python-celery-doc", "python-celery-doc/html"),
    # The eighth site: the seven Python sites come to about 40,000 chunks by issue 34's count,
    # short of the 100,000 its combined pack is measured at.
    "rust": ("rust-doc", "rust-doc/html"),
}
COMBINED = "ecosystem"
# The page edited between the combined pack's rebuilds (a path under /usr/share/doc).
EDITED_PAGE = "python-flask-doc/html/quickstart.html"
SEED_HOST = "127.0.0.1:8765"  # the host and port the packs' seed lines name
HEADING_QUESTIONS = 40  # questions made from a pack's headings, without --questions
HEADING_PROBE_QUESTIONS = 300  # ... and for ANN recall by probed lists
PROBES_COMPARED = (32, 64, 96, 128)  # probed lists of the chunk ANN index, recall compared
EMBED_SAMPLE = 600  # texts embedded by both precisions
EMBED_SLICES = 6
ROUNDS = 2  # rounds of the questions for p50/p95
K = 10
# Topic phrases an agent might send find_packs, each with the library whose pack should come
# first among the libraries' packs. Written for this benchmark, from what each project's
# documentation is known for; no question set's wording.
TOPICS = {
    "reshaping tables with pivot and melt": "pandas",
    "reading CSV files into data frames": "pandas",
    "gradient boosting and random forest estimators": "scikit-learn",
    "hyperparameter search with cross-validation": "scikit-learn",
    "solving ordinary differential equations numerically": "scipy",
    "sparse matrices and eigenvalue solvers": "scipy",
    "database models, querysets and migrations": "django",
    "blueprints and the application factory": "flask",
    "WSGI request and response objects, routing maps": "werkzeug",
    "ownership, borrowing and lifetimes": "rust",
    "asyncio event loops and coroutines": "python",
    "template inheritance and filters": "jinja",
    "periodic tasks and retrying failed tasks in workers": "celery",
}


# --- Packs ---------------------------------------------------------------------------------


def missing_packages(libraries: list[str]) -> list[str]:
    return [
        LIBRARIES[lib][0]
        for lib in libraries
        if not (DOC_ROOT / LIBRARIES[lib][1] / "index.html").is_file()
    ]


def seed_lines(pack: str, libraries: list[str]) -> list[str]:
    """The URL lines of a pack's urls.txt in the repository; of the combined pack, those of
    the libraries chosen."""
    lines = [
        line.strip()
        for line in (REPO / "packs" / pack / "urls.txt").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if pack == COMBINED:
        lines = [
            line for line in lines if any(f"/{LIBRARIES[lib][1]}/" in line for lib in libraries)
        ]
    return lines


def content_pages(pack: str, libraries: list[str]) -> int:
    """The HTML pages under the folders of the pack's seed lines that its crawl may keep: not
    excluded by its crawl.exclude and not a redirect stub (what "90% of its content pages"
    counts against; a page no link reaches counts too)."""
    from fnmatch import fnmatchcase

    from kpack.ingest.crawl import refresh_target

    exclude = json.loads((REPO / "packs" / pack / "kg_config.json").read_text())["crawl"]["exclude"]
    folders = {
        line.split()[0].split(SEED_HOST + "/", 1)[1].rsplit("/", 1)[0]
        for line in seed_lines(pack, libraries)
    }
    count = 0
    for folder in sorted(folders):
        for page in (DOC_ROOT / folder).rglob("*.html"):
            url = f"http://{SEED_HOST}/{page.relative_to(DOC_ROOT).as_posix()}"
            if any(fnmatchcase(url, pattern) for pattern in exclude):
                continue
            if refresh_target(page.read_text(errors="replace"), url) is None:
                count += 1
    return count


def copy_pack(pack: str, libraries: list[str], workspace: Path, host: str) -> None:
    """The repository's pack folder in the workspace, its seed lines on ``host``."""
    folder = workspace / "packs" / pack
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    urls = [line.replace(SEED_HOST, host) for line in seed_lines(pack, libraries)]
    (folder / "urls.txt").write_text("\n".join(urls) + "\n")
    shutil.copy(REPO / "packs" / pack / "kg_config.json", folder / "kg_config.json")


def run_child(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """A child of this script; its marked JSON line, with its wall time from spawn."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(HERE), *args],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        sys.stdout.write(proc.stdout[-4000:])
        raise SystemExit(f"child {' '.join(args)} failed (exit status {proc.returncode})")
    return {
        **json.loads(lines[-1][len(RESULT_MARK) :]),
        "process_s": round(time.perf_counter() - started, 3),
    }


def kept_build(pack: str, libraries: list[str], workspace: Path, host: str) -> dict | None:
    """The published build of ``pack`` in the workspace when its urls.txt holds today's seed
    lines on ``host`` or on the port an earlier run served them from (the server's port
    changes between runs); None when it must be built."""
    folder = workspace / "packs" / pack
    manifest = folder / ".versions" / "current" / "manifest.json"
    if not manifest.is_file():
        return None
    written = (folder / "urls.txt").read_text().split()
    wanted = seed_lines(pack, libraries)
    same = len(written) == len(" ".join(wanted).split()) and all(
        re.sub(r"127\.0\.0\.1:\d+", SEED_HOST, w) == x
        for w, x in zip(written, " ".join(wanted).split(), strict=True)
    )
    if not same:
        return None
    print(f"[{pack}] kept: published before (--keep-built), not built again", flush=True)
    return {"process_s": None, "manifest": json.loads(manifest.read_text())}


def earlier_port(workspace: Path) -> int:
    """The port the combined pack's seed lines name in the workspace (the run that built it
    served there), 0 when there is none."""
    urls = workspace / "packs" / COMBINED / "urls.txt"
    found = re.search(r"127\.0\.0\.1:(\d+)", urls.read_text()) if urls.is_file() else None
    return int(found.group(1)) if found else 0


def build(pack: str, workspace: Path) -> dict[str, Any]:
    print(f"[{pack}] building ...", flush=True)
    done = run_child(
        ["--_child-build", pack, "--workdir", str(workspace)], workspace_env(workspace)
    )
    if not done["success"]:
        raise SystemExit(f"[{pack}] build failed: {done['failed_steps']} {done['failed_checks']}")
    manifest = done["manifest"]
    pages, embedding = manifest["sources"]["pages"], manifest["embedding"]
    print(
        f"[{pack}] {done['process_s']:.0f} s: {pages['kept']} pages, "
        f"{manifest['counts']['Chunk']} chunks, {embedding['texts_per_second']} texts/s "
        f"({embedding['precision']})",
        flush=True,
    )
    return {"process_s": done["process_s"], "manifest": manifest}


# --- Rebuilds of the combined pack: nothing changed, then one page of one library ------------


def served_root(workspace: Path, libraries: list[str]) -> Path:
    """A folder served in place of /usr/share/doc: a link to each library's documentation
    folder, so one page can be edited later (edit_one_page) without touching the system's."""
    root = workspace / "served"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for lib in libraries:
        folder = LIBRARIES[lib][1].split("/")[0]
        if not (root / folder).exists():
            (root / folder).symlink_to(DOC_ROOT / folder)
    return root


def edit_one_page(root: Path, page: str) -> Path:
    """``page`` (a path under ``root``) becomes an edited copy, one sentence added to its
    first paragraph (bench/incremental_bench.py's edit, naming the time); the folders on its
    way become real folders of links, so nothing outside ``root`` changes."""
    parts = Path(page).parts
    here = root
    for part in parts[:-1]:
        target = here / part
        if target.is_symlink():
            real = target.resolve()
            target.unlink()
            target.mkdir()
            for child in real.iterdir():
                (target / child.name).symlink_to(child)
        here = target
    edited = here / parts[-1]
    source = edited.resolve()
    edited.unlink()
    shutil.copy2(source, edited)
    # A sentence of this run: the page a run before edited may be what the pack holds.
    if not change_pages([edited], 1.0, f"Ecosystem benchmark edit {time.time():.0f}"):
        raise SystemExit(f"{page}: no paragraph to edit")
    return edited


def rebuild_facts(workspace: Path, done: dict[str, Any]) -> dict[str, Any]:
    """What one rebuild of the combined pack did: its time, outcome, texts embedded, pages."""
    # A build that changed nothing publishes nothing: the manifest is the version before's,
    # and .versions/last_build.json says what this build found.
    last = json.loads(
        (workspace / "packs" / COMBINED / ".versions" / "last_build.json").read_text()
    )
    published = last["outcome"] == "published"
    manifest = done["manifest"]
    return {
        "process_s": done["process_s"],
        "outcome": last["outcome"],
        "stage_seconds": manifest["stage_seconds"] if published else None,
        "embedded_this_build": manifest["embedding"]["embedded_this_build"] if published else 0,
        "changed_urls": last["changes"]["changed_urls"],
        "new_urls": len(last["changes"]["new_urls"]),
        "removed_urls": len(last["changes"]["removed_urls"]),
    }


def rebuilds(workspace: Path, root: Path, page: str) -> dict[str, Any]:
    """The combined pack rebuilt with nothing changed, then with ``page`` edited: time, texts
    embedded, pages changed; and how many passages the edited page has."""
    import pyarrow.parquet as pq

    unchanged = rebuild_facts(workspace, build(COMBINED, workspace))
    edit_one_page(root, page)
    one_page = rebuild_facts(workspace, build(COMBINED, workspace))
    chunks = pq.read_table(
        workspace / "storage" / "chunks" / f"{COMBINED}.parquet",
        columns=["article_url", "content_hash"],
    ).to_pylist()
    passages = {row["content_hash"] for row in chunks if row["article_url"].endswith(page)}

    return {
        "edited_page": page,
        "edited_page_chunks": len(passages),
        "no_change": unchanged,
        "one_page": one_page,
    }


# --- Embedding: int8 against fp32 ------------------------------------------------------------


def child_embed(workspace: Path, pack: str, sample: int) -> dict[str, Any]:
    """The pack's chunk texts (evenly sampled), embedded by fp32 and int8 in turns."""
    from kpack.contracts import passage_text, section_of_chunk
    from kpack.embedders import embedder_for
    from retrieval.registry import open_pack

    reader = open_pack(workspace / "packs" / pack)
    texts = [
        passage_text(reader.sections[section_of_chunk(chunk)].heading, reader.chunk_text[chunk])
        for chunk in list(reader.chunk_ids)[:: max(1, len(reader.chunk_ids) // sample)][:sample]
    ]
    embedders = {precision: embedder_for("default", precision) for precision in ("fp32", "int8")}
    for embedder in embedders.values():
        embedder.encode(texts[:4])  # loaded and warm before any timing
    seconds = dict.fromkeys(embedders, 0.0)
    for index in range(EMBED_SLICES):
        order = list(embedders) if index % 2 == 0 else list(reversed(embedders))
        part = texts[index::EMBED_SLICES]
        for precision in order:
            started = time.perf_counter()
            embedders[precision].encode(part)
            seconds[precision] += time.perf_counter() - started
    rates = {precision: round(len(texts) / s, 1) for precision, s in seconds.items()}
    return {
        "texts": len(texts),
        "texts_per_second": rates,
        "int8_over_fp32": round(rates["int8"] / rates["fp32"], 2),
        "cores": len(os.sched_getaffinity(0)),
    }


# --- A reader's figures ----------------------------------------------------------------------


def smaps() -> dict[str, Any]:
    """This process's memory: smaps_rollup's fields in MiB, and the resident MiB of each
    mapped file (the working set of the pack's indexes and the model), largest first."""
    rollup: dict[str, float] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        rollup[key] = int(value.split()[0]) / 1024
    by_file: dict[str, float] = {}
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's first line
            name = head[5] if len(head) > 5 else ""
        elif line.startswith("Rss:") and name.startswith("/"):
            by_file[name] = by_file.get(name, 0.0) + int(head[1]) / 1024
    largest = sorted(by_file.items(), key=lambda item: -item[1])[:12]
    return {
        "anonymous_mib": round(rollup.get("Anonymous", 0.0), 1),
        "private_mib": round(
            rollup.get("Private_Clean", 0.0) + rollup.get("Private_Dirty", 0.0), 1
        ),
        "rss_mib": round(rollup.get("Rss", 0.0), 1),
        "mapped_files_mib": round(sum(by_file.values()), 1),
        "mapped_by_file": {path: round(mib, 1) for path, mib in largest},
    }


def pack_questions(
    folder: Path, questions_file: Path | None, heading_questions: int = HEADING_QUESTIONS
) -> list[dict[str, Any]]:
    """The questions asked of a pack, each with the page paths that answer it."""
    if questions_file is not None:
        rows = [
            json.loads(line) for line in questions_file.read_text().splitlines() if line.strip()
        ]
        return [
            {"question": row["question"], "gold_pages": row.get("gold_pages") or []} for row in rows
        ]
    from retrieval.registry import open_pack

    reader = open_pack(folder)
    sections = {
        s.title: s.article_url for s in reader.sections.values() if len(s.title.split()) >= 2
    }
    titles = sorted(sections)[:: max(1, len(sections) // heading_questions)][:heading_questions]
    return [
        {
            "question": f"What does the documentation say about {title}?",
            "gold_pages": [sections[title]],
        }
        for title in titles
    ]


def hit(urls: list[str], gold: list[str]) -> bool:
    return any(url.split("#")[0].endswith(page) for url in urls for page in gold)


def child_first(folder: Path, question: str, what: str) -> dict[str, Any]:
    """A fresh process's first search or query (import, open, model load included)."""
    started = time.perf_counter()
    import retrieval

    imported = time.perf_counter()
    if what == "search":
        retrieval.search(folder, question, k=K)
    else:
        retrieval.query(folder, question, use_llm=False)
    done = time.perf_counter()
    return {
        "import_s": round(imported - started, 3),
        "first_s": round(done - imported, 3),
        "memory": smaps(),
    }


def child_measure(folder: Path, questions: list[dict[str, Any]]) -> dict[str, Any]:
    """One thread: search and query p50/p95, memory, ANN recall, keyword hit@10 with and
    without the per-term cap, graph stages reached."""
    import kpack.keyword_index as indexes
    import retrieval
    from kpack.contracts import section_of_chunk
    from kpack.vector_index import nearest_rows
    from retrieval.registry import open_pack

    asked = [q["question"] for q in questions]
    retrieval.search(folder, asked[0], k=K)  # opened, warmed, the model loaded
    search_ms, query_ms, second_hop, pagerank, hits = [], [], 0, 0, 0
    for round_number in range(ROUNDS):
        for row in questions:
            started = time.perf_counter()
            found = retrieval.search(folder, row["question"], k=K)
            search_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            answered = retrieval.query(folder, row["question"], use_llm=False)
            query_ms.append((time.perf_counter() - started) * 1000)
            if round_number == 0:
                hits += hit([h["url"] for h in found], row["gold_pages"])
                second_hop += "graph_second_hop" in answered["timings_ms"]
                pagerank += any(
                    c.get("pagerank") is not None for c in answered["trace"]["candidates"]
                )
    reader = open_pack(folder)

    def ann_recall(vectors: np.ndarray, ann: Any, questions: list[str]) -> float | None:
        """The share of the exact top K the ANN index finds for the questions."""
        found_rows = total = 0
        if ann is not None:
            for vector in reader.embed(questions):
                approximate, _ = nearest_rows(vectors, vector, K, ann)
                exact, _ = nearest_rows(vectors, vector, K)
                found_rows += len(set(approximate.tolist()) & set(exact.tolist()))
                total += len(exact)
        return round(found_rows / total, 4) if total else None

    recall = {
        "chunk": ann_recall(reader.chunk_vectors, reader.ann, asked),
        "section": ann_recall(reader.section_vectors, reader.section_ann, asked),
    }
    # Chunk recall by probed lists, on questions made from the pack's headings (where
    # IVF_PROBES was chosen) and on the questions measured here.
    by_probes: dict[str, dict[int, float | None]] = {}
    if reader.ann is not None:
        made = [q["question"] for q in pack_questions(folder, None, HEADING_PROBE_QUESTIONS)]
        chosen = reader.ann.nprobe
        for label, questions_asked in (("headings", made), ("measured", asked)):
            by_probes[label] = {}
            for probes in PROBES_COMPARED:
                reader.ann.nprobe = probes
                by_probes[label][probes] = ann_recall(
                    reader.chunk_vectors, reader.ann, questions_asked
                )
        reader.ann.nprobe = chosen

    def keyword_hits() -> int:
        count = 0
        for row in questions:
            urls = [
                reader.sections[section_of_chunk(reader.chunk_ids[r])].article_url
                for r, _ in reader.keywords.search(row["question"], K)
            ]
            count += hit(urls, row["gold_pages"])
        return count

    capped = keyword_hits()
    cap = indexes.KEYWORD_TERM_CANDIDATES
    indexes.KEYWORD_TERM_CANDIDATES = len(reader.chunk_ids) + 1  # every passage of every term
    uncapped = keyword_hits()
    indexes.KEYWORD_TERM_CANDIDATES = cap
    n = len(questions)
    return {
        "chunks": len(reader.chunk_ids),
        "sections": len(reader.section_ids),
        "questions": n,
        "hit_at_10": round(hits / n, 4),
        "search_ms_p50": round(float(np.percentile(search_ms, 50)), 1),
        "search_ms_p95": round(float(np.percentile(search_ms, 95)), 1),
        "query_ms_p50": round(float(np.percentile(query_ms, 50)), 1),
        "query_ms_p95": round(float(np.percentile(query_ms, 95)), 1),
        "memory": smaps(),
        "ann": reader.ann is not None,
        "ann_recall_at_10": recall,
        "ann_probes": reader.ann.nprobe if reader.ann is not None else None,
        "chunk_recall_by_probes": by_probes,
        "keyword_hit_at_10": {"capped": round(capped / n, 4), "uncapped": round(uncapped / n, 4)},
        "reached_pagerank": pagerank,
        "reached_second_hop": second_hop,
    }


def child_several(
    workspace: Path, libraries: list[str], question_sets: dict[str, list[dict[str, Any]]]
) -> dict:
    """The library packs asked together (retrieval.multipack) against the combined pack, on
    the same questions, set by set: hit@5 of each, which pack the first result names and how
    often that pack holds a gold page (the right pack first); and the pack find_packs
    (serving.resolve) ranks first, among the libraries' packs, for each library's name and
    for each of TOPICS."""
    import retrieval
    from retrieval.registry import open_pack
    from serving.resolve import resolve

    packs = workspace / "packs"
    pages = {
        lib: list({s.article_url for s in open_pack(packs / lib).sections.values()})
        for lib in libraries
    }
    sets = {}
    for name, questions in question_sets.items():
        together = combined = right_first = 0
        first_packs: dict[str, int] = {}
        for row in questions:
            merged = retrieval.search([packs / lib for lib in libraries], row["question"], k=5)
            together += hit([h["url"] for h in merged], row["gold_pages"])
            if merged:
                first = merged[0]["pack"]
                first_packs[first] = first_packs.get(first, 0) + 1
                right_first += hit(pages[first], row["gold_pages"])
            alone = retrieval.search(packs / COMBINED, row["question"], k=5)
            combined += hit([h["url"] for h in alone], row["gold_pages"])
        n = len(questions)
        sets[name] = {
            "questions": n,
            "libraries_together_hit_at_5": round(together / n, 4),
            "combined_hit_at_5": round(combined / n, 4),
            "first_result_pack": first_packs,
            "right_pack_first": round(right_first / n, 4),
        }

    def first_library(request: str) -> str | None:
        ranked = [row["pack"] for row in resolve(request, packs, limit=len(libraries) + 1)]
        return next((pack for pack in ranked if pack in libraries), None)

    return {
        "sets": sets,
        "find_packs_first_for_name": {lib: first_library(lib) for lib in libraries},
        "find_packs_first_for_topic": {
            topic: {"wanted": lib, "first": first_library(topic)}
            for topic, lib in TOPICS.items()
            if lib in libraries
        },
    }


def joined_questions(workspace: Path, question_sets: dict[str, Path]) -> Path:
    """One JSON-lines file of every set's questions."""
    file = workspace / "joined.questions.jsonl"
    file.write_text("".join(path.read_text() for path in question_sets.values()))
    return file


# A cold figure is the page cache emptied on an idle disk: right after a build the disk is
# still busy for a minute or more (here it is mounted with online discard, and a build deletes
# gigabytes), and a first search then took 1.8-3.1 s against 1.1-1.5 s once it was quiet
# (bench/HISTORY.md, stop 51).
DISK_QUIET_S = 3.0  # no block device read, wrote or discarded for this long
DISK_WAIT_MAX_S = 180.0


def disk_activity() -> tuple[int, ...]:
    """Every whole block device's completed reads, writes and discards and its I/Os in flight
    (/proc/diskstats); empty where the file cannot be read."""
    try:
        lines = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return ()
    counts: list[int] = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 12 and not fields[2].startswith(("loop", "ram")):
            counts += [int(fields[3]), int(fields[7]), int(fields[11])]
            counts += [int(fields[14])] if len(fields) >= 15 else []
    return tuple(counts)


def wait_for_quiet_disk() -> float:
    """Wait until no block device has done anything for DISK_QUIET_S (at most
    DISK_WAIT_MAX_S); the seconds waited."""
    started = time.perf_counter()
    last, since = disk_activity(), time.perf_counter()
    while time.perf_counter() - started < DISK_WAIT_MAX_S:
        time.sleep(0.5)
        now = disk_activity()
        if now != last:
            last, since = now, time.perf_counter()
        elif time.perf_counter() - since >= DISK_QUIET_S:
            break
    return round(time.perf_counter() - started, 1)


def drop_caches() -> bool:
    """Empty the page cache (root only) once the disk is quiet; whether it could."""
    os.sync()
    wait_for_quiet_disk()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def reader_figures(workspace: Path, pack: str, questions_file: Path | None) -> dict[str, Any]:
    folder = workspace / "packs" / pack
    questions = pack_questions(folder, questions_file)
    file = workspace / f"{pack}.questions.json"
    file.write_text(json.dumps(questions))
    one_thread = {**workspace_env(workspace), "KPACK_READER_THREADS": "1", "OMP_NUM_THREADS": "1"}
    first: dict[str, Any] = {}
    for what in ("search", "query"):
        for state in ("cold", "warm"):
            emptied = drop_caches() if state == "cold" else None
            done = run_child(
                ["--_child-first", str(folder), questions[0]["question"], what], one_thread
            )
            first[f"{what}_{state}"] = {
                **done,
                **({"caches_dropped": emptied} if state == "cold" else {}),
            }
    measured = run_child(["--_child-measure", str(folder), str(file)], one_thread)
    print(
        f"[{pack}] first search cold {first['search_cold']['first_s']} s, warm "
        f"{first['search_warm']['first_s']} s; search p50 {measured['search_ms_p50']} ms, query "
        f"p50 {measured['query_ms_p50']} ms; anonymous {measured['memory']['anonymous_mib']} MiB",
        flush=True,
    )
    return {"first": first, **measured}


# --- Report ----------------------------------------------------------------------------------


def report(
    builds: dict[str, dict],
    embedding: dict,
    readers: dict[str, dict],
    several: dict,
    rebuilt: dict[str, Any],
) -> str:
    build_rows = []
    for pack, done in builds.items():
        manifest = done["manifest"]
        pages, embedded = manifest["sources"]["pages"], manifest["embedding"]
        skipped = pages["skipped"]
        seconds = manifest["stage_seconds"]
        build_rows.append(
            [
                pack,
                manifest.get("documentation_version"),
                f"{pages['found']} / {pages['kept']} / {done['content_pages']} "
                f"({pages['kept'] / max(done['content_pages'], 1):.0%})",
                f"{skipped['not_found']} / {skipped['excluded']} / {skipped['redirect_stubs']} / "
                f"{skipped['duplicates']}",
                pages["capped"],
                manifest["counts"]["Chunk"],
                *[round(seconds.get(stage) or 0, 1) for stage in STAGES],
                "built before" if done["process_s"] is None else done["process_s"],
                # None: every vector came from the cache (nothing was embedded)
                f"{embedded['texts_per_second'] or 'cached'} ({embedded['precision']})",
            ]
        )
    parts = [
        "### Builds (each from its seed lines, default settings)\n",
        markdown_table(
            [
                "pack",
                "docs",
                "pages found / kept / content (kept share)",
                "skipped 404 / excl. / stub / dup.",
                "capped",
                "chunks",
                *[f"{stage} s" for stage in STAGES],
                "build s",
                "texts/s",
            ],
            build_rows,
        ),
    ]
    if embedding:
        rates = embedding["texts_per_second"]
        parts.append(
            f"\n### Embedding, the same {embedding['texts']} texts in turns, one process "
            f"({embedding['cores']} cores)\n\n"
            f"fp32 {rates['fp32']} texts/s, int8 {rates['int8']} texts/s: "
            f"int8 x{embedding['int8_over_fp32']}"
        )
    reader_rows = []
    for pack, r in readers.items():
        first = r["first"]
        recall = r["ann_recall_at_10"]
        keyword = r["keyword_hit_at_10"]
        reader_rows.append(
            [
                pack,
                r["chunks"],
                f"{first['search_cold']['first_s']} / {first['search_warm']['first_s']}",
                f"{first['query_cold']['first_s']} / {first['query_warm']['first_s']}",
                f"{r['search_ms_p50']} / {r['search_ms_p95']}",
                f"{r['query_ms_p50']} / {r['query_ms_p95']}",
                f"{r['memory']['anonymous_mib']} / {r['memory']['private_mib']} / "
                f"{r['memory']['mapped_files_mib']}",
                f"{recall['chunk']} / {recall['section']}" if r["ann"] else "no ANN index",
                f"{keyword['capped']} / {keyword['uncapped']}",
                r["hit_at_10"],
                f"{r['reached_pagerank']} / {r['reached_second_hop']} of {r['questions']}",
            ]
        )
    cold = all(
        r["first"][f"{what}_cold"].get("caches_dropped")
        for r in readers.values()
        for what in ("search", "query")
    )
    parts += [
        f"\n### Readers (fresh processes, one thread; cold = page cache {'dropped' if cold else 'NOT dropped (no permission): cold equals warm'})\n",
        markdown_table(
            [
                "pack",
                "chunks",
                "first search s cold / warm",
                "first query s cold / warm",
                "search ms p50 / p95",
                "query ms p50 / p95",
                "MiB anonymous / private / mapped files",
                "ANN recall@10 chunk / section",
                "keyword hit@10 capped / uncapped",
                "hit@10",
                "PageRank / second hop",
            ],
            reader_rows,
        ),
    ]
    for pack, r in readers.items():
        for label, recalls in r.get("chunk_recall_by_probes", {}).items():
            parts.append(
                f"\n{pack}: chunk ANN recall@{K} by probed lists ({label} questions, "
                f"{r['ann_probes']} probed by default): "
                + ", ".join(f"{probes}: {value}" for probes, value in recalls.items())
            )
    if several:
        parts += [
            "\n### The libraries' packs asked together against the combined pack\n",
            markdown_table(
                [
                    "questions",
                    "n",
                    "hit@5 together",
                    "hit@5 combined",
                    "right pack first",
                    "first result's pack",
                ],
                [
                    [
                        name,
                        row["questions"],
                        row["libraries_together_hit_at_5"],
                        row["combined_hit_at_5"],
                        row.get("right_pack_first", "-"),
                        ", ".join(f"{p} {c}" for p, c in sorted(row["first_result_pack"].items())),
                    ]
                    for name, row in several["sets"].items()
                ],
            ),
        ]
        named = several["find_packs_first_for_name"]
        topics = several["find_packs_first_for_topic"]
        missed = [f"{t!r} -> {r['first']}" for t, r in topics.items() if r["first"] != r["wanted"]]
        parts.append(
            f"\nfind_packs ranks the library's own pack first (among the libraries' packs) for "
            f"{sum(lib == pack for lib, pack in named.items())} of {len(named)} library names and "
            f"{len(topics) - len(missed)} of {len(topics)} topics"
            + (f" (missed: {'; '.join(missed)})" if missed else "")
        )
    if rebuilt:
        rows = [
            [
                label,
                run["process_s"],
                round(sum(v or 0 for v in (run["stage_seconds"] or {}).values()), 1)
                if run["stage_seconds"]
                else f"- ({run['outcome']})",
                round((run["stage_seconds"] or {}).get("fetched_pages") or 0, 1)
                if run["stage_seconds"]
                else "-",
                run["embedded_this_build"],
                ", ".join(
                    url.rsplit("/", 2)[-2] + "/" + url.rsplit("/", 1)[-1]
                    for url in run["changed_urls"]
                )
                or "none",
                run["new_urls"],
                run["removed_urls"],
            ]
            for label, run in (
                ("no change", rebuilt["no_change"]),
                ("one page edited", rebuilt["one_page"]),
            )
        ]
        parts += [
            f"\n### Rebuilds of the combined pack (edited: {rebuilt['edited_page']}, "
            f"{rebuilt['edited_page_chunks']} chunks after the edit)\n",
            markdown_table(
                [
                    "rebuild",
                    "process s",
                    "stages s",
                    "fetch s",
                    "texts embedded",
                    "pages changed",
                    "new",
                    "removed",
                ],
                rows,
            ),
        ]
    return "\n".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--libraries",
        default=",".join(LIBRARIES),
        help=f"the libraries, joined by commas (default all: {','.join(LIBRARIES)})",
    )
    parser.add_argument("--workdir", type=Path, help="workspace (default: a new temporary one)")
    parser.add_argument("--questions", type=Path, help="JSON lines: question, gold_pages")
    parser.add_argument("--no-combined", action="store_true", help="skip the combined pack")
    parser.add_argument(
        "--several-questions",
        type=Path,
        nargs="*",
        default=[],
        help="JSON-lines sets asked of the libraries' packs together and of the combined pack "
        "(also the combined pack's reader questions); default its headings'",
    )
    parser.add_argument(
        "--rebuilds",
        action="store_true",
        help=f"rebuild the combined pack unchanged, then with one page edited ({EDITED_PAGE})",
    )
    parser.add_argument(
        "--measure", help="the packs whose readers are measured, joined by commas (default all)"
    )
    parser.add_argument(
        "--keep-built",
        action="store_true",
        help="a pack the workspace already publishes from the same seed lines is not built "
        "again: its build figures are its manifest's, its time is not known (a run stopped "
        "part way goes on without re-embedding from the cache and calling that a build)",
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR / "ecosystem_bench.json")
    parser.add_argument("--_child-build", metavar="PACK", help=argparse.SUPPRESS)
    parser.add_argument("--_child-embed", metavar="PACK", help=argparse.SUPPRESS)
    parser.add_argument("--_child-first", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--_child-measure", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_child-several", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._child_build:
        emit(child_build(args._child_build, args.workdir.resolve()))
        return
    if args._child_embed:
        emit(child_embed(args.workdir.resolve(), args._child_embed, EMBED_SAMPLE))
        return
    if args._child_first:
        folder, question, what = args._child_first
        emit(child_first(Path(folder), question, what))
        return
    if args._child_several:
        libraries, question_sets = args._child_several
        emit(
            child_several(
                args.workdir.resolve(),
                libraries.split(","),
                json.loads(Path(question_sets).read_text()),
            )
        )
        return
    if args._child_measure:
        folder, questions = args._child_measure
        emit(child_measure(Path(folder), json.loads(Path(questions).read_text())))
        return

    libraries = [lib.strip() for lib in args.libraries.split(",") if lib.strip()]
    unknown = [lib for lib in libraries if lib not in LIBRARIES]
    if unknown:
        raise SystemExit(f"unknown libraries {unknown}; known: {', '.join(LIBRARIES)}")
    missing = missing_packages(libraries)
    if missing:
        raise SystemExit(f"install the documentation first: apt-get install {' '.join(missing)}")
    workspace = (
        args.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / "kpack-ecosystem"
    ).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    packs = libraries + ([] if args.no_combined else [COMBINED])
    root = served_root(workspace, libraries)
    rebuilt: dict[str, Any] = {}
    # Kept packs are rebuilt from the port their seed lines name: another port is other URLs.
    with serve(root, earlier_port(workspace) if args.keep_built else 0) as base_url:
        host = base_url.removeprefix("http://").rstrip("/")
        print(f"workspace {workspace}; /usr/share/doc served at {base_url}", flush=True)
        builds = {}
        for pack in packs:
            kept = kept_build(pack, libraries, workspace, host) if args.keep_built else None
            if kept is None:
                copy_pack(pack, libraries, workspace, host)
                kept = build(pack, workspace)
            builds[pack] = {**kept, "content_pages": content_pages(pack, libraries)}
        if args.rebuilds and not args.no_combined:
            rebuilt = rebuilds(workspace, root, EDITED_PAGE)
            print(f"rebuilds: {rebuilt}", flush=True)
    embedding = run_child(
        ["--_child-embed", packs[-1], "--workdir", str(workspace)], workspace_env(workspace)
    )
    print(f"embedding: {embedding['texts_per_second']} texts/s", flush=True)
    question_sets = {
        path.stem if path.stem != "questions" else path.parent.name: path
        for path in args.several_questions
    }
    measured = [p for p in packs if args.measure is None or p in args.measure.split(",")]
    readers = {
        pack: reader_figures(
            workspace,
            pack,
            # The combined pack is asked real questions when there are some: the sets asked of
            # the libraries together, one file of them all.
            joined_questions(workspace, question_sets)
            if pack == COMBINED and question_sets
            else args.questions,
        )
        for pack in measured
    }
    several = {}
    if not args.no_combined:
        # The sets given (else the combined pack's headings') to the libraries together.
        sets = {
            # A question no page answers (an out-of-domain one) has no hit to find.
            name: [
                q for q in pack_questions(workspace / "packs" / COMBINED, path) if q["gold_pages"]
            ]
            for name, path in question_sets.items()
        } or {"headings": pack_questions(workspace / "packs" / COMBINED, args.questions)}
        file = workspace / "several.questions.json"
        file.write_text(json.dumps(sets))
        several = run_child(
            ["--_child-several", ",".join(libraries), str(file), "--workdir", str(workspace)],
            workspace_env(workspace),
        )
        print(f"several packs: {several}", flush=True)
    table = report(builds, embedding, readers, several, rebuilt)
    print()
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "ecosystem",
        "started_at": started_at,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "workspace": str(workspace),
        "libraries": libraries,
        "builds": builds,
        "embedding": embedding,
        "readers": readers,
        "several": several,
        "rebuilds": rebuilt,
    }
    args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")
    args.out.with_suffix(".md").write_text(table + "\n")
    print(f"\nresults: {args.out}")


if __name__ == "__main__":
    main()
