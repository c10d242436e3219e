"""Scale benchmark (issue 20): what a reader costs on packs of 10k, 100k and 1M passages.

How the large packs are made: the build intermediates of a real pack (by default the Python
docs pack of a bench workspace: 374 pages, 7,361 chunks, 26,572 entities, their mentions,
links, section links, relations, facts and real MiniLM vectors) are replicated until the wanted
number of chunks: copy k of a page gets the URL ``<url>#copy-k`` (so its section and chunk ids
are new, and its section links join its own sections), its title and its entities' keys get the
word `` copyK`` (a large site names more things, not the same things more often; a name word,
so a copy's title is its own title entity), and so do the API names its sections define and its
section links' anchors (normalised, kpack.text.normalize_entity), so a copy's documentation
graph defines its own entities and its links point at its own definitions; its MENTIONS edges
are the source pack's (the build's chunk_mentions, run once on the source, naming flags
included) with those ids, and every vector is the real one plus Gaussian noise (sigma 0.02 per
dimension), renormalised, so no two passages share a vector. The copies' texts are the real
texts, so keyword postings grow with the pack as a real site's common words do (and a copy's
defining passage is its section's first unless the suffixed name is written in it). The pack is
then written by the build's own code: assets.graph.write_staged (the Kuzu database, the
retrieval indexes and the documentation graph) and PackStore.publish (seal), exactly as
pack_graph and pack_manifest write a version; the seconds and the peak resident memory of each
step are reported.

Measured per size, each in a fresh child process (one thread, ``KPACK_READER_THREADS=1``):
open time of the reader, its resident memory after the queries (from /proc/self/smaps_rollup:
anonymous memory, the reader's own, against file-backed pages of the mapped indexes, which
processes reading the same version share; Private_*/Shared_* are recorded too), balanced-profile
search p50/p95 over three rounds of the questions (graph stage included; the first, which
loads the model, is not counted) with each stage's p50, and ANN recall@10 against the exact
scan of the same mapped matrix (tables above the ANN crossover only). Writing the 1M pack
takes about 20 minutes and 10 GB on two cores; its files take about 14 GB (the faiss index
files hold a copy of the vectors, 2 GB of it).

    .venv/bin/python bench/scale_bench.py --source WS/storage --workdir WS2 \
        --sizes 10000,100000,1000000

``--fresh PACK PACK ...`` measures instead what a user of each pack pays in fresh processes
(issue 20, item 2): the first search through the public API (the version opened and warmed,
the model loaded), the resident memory after it, and balanced p50/p95 on one thread,
--processes times per pack, side by side:

    .venv/bin/python bench/scale_bench.py --fresh SQUAD_WS/packs/squad_wiki6 \
        WS/packs/python_docs --questions ../shared/benchmarks/python_docs_qa/questions.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

if TYPE_CHECKING:
    import pyarrow as pa

SOURCE_PACK = "python_docs"
TABLES = (
    "articles",
    "sections",
    "chunks",
    "entities",
    "entity_mentions",
    "links",
    "section_links",
    "relations",
    "facts",
    "embeddings",
    "pagerank",
)
NOISE = 0.02
QUESTIONS = [
    "How do I read a file line by line?",
    "What does json.dumps do with non-ASCII characters?",
    "How do I create a virtual environment?",
    "What is the difference between a list and a tuple?",
    "How do I sort a dictionary by value?",
    "How do I start a thread?",
    "What does the with statement do?",
    "How can I parse command line arguments?",
    "How do I format a date as a string?",
    "What is a generator expression?",
    "How do I compare two floating point numbers?",
    "How do I run a subprocess and capture its output?",
    "What does functools.lru_cache do?",
    "How do I write a unit test?",
    "How are exceptions chained?",
    "How do I open a socket connection?",
    "What is the global interpreter lock?",
    "How do I copy a directory tree?",
    "What does asyncio.gather return?",
    "How do I read environment variables?",
]


def replicate(source: Path, chunks_wanted: int, seed: int = 0) -> dict:
    """The source pack's intermediates, replicated to ``chunks_wanted`` chunks (see the module
    docstring); ``mentions`` are the MENTIONS edges (the build's chunk_mentions on the source
    pack, replicated as the rest)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from kpack.ingest.mentions import chunk_mentions
    from kpack.text import normalize_entity

    base = {name: pq.read_table(source / name / f"{SOURCE_PACK}.parquet") for name in TABLES}
    base["mentions"] = chunk_mentions(base["chunks"], base["entity_mentions"])
    copies = -(-chunks_wanted // base["chunks"].num_rows)
    rng = np.random.default_rng(seed)
    vectors = np.asarray(
        base["embeddings"]["embedding"].to_pylist(), dtype=np.float32
    )  # the real vectors
    out: dict[str, list[pa.Table]] = {name: [] for name in base}
    # A copy's anchors are the source's as keys (normalised), suffixed: the copy's keys.
    anchors = pa.array(
        [normalize_entity(a or "") for a in base["section_links"]["anchor"].to_pylist()],
        pa.string(),
    )
    for k in range(copies):
        tag = f"#copy-{k}" if k else ""  # on URLs and ids
        named = f" copy{k}" if k else ""  # on entity keys and titles (a name word: it survives
        # kpack.text.normalize_entity, so a copy's titles are its own title entities)

        def suffixed(table: pa.Table, columns: dict[str, str]) -> pa.Table:
            for column, suffix in columns.items():
                if suffix:
                    at = table.schema.get_field_index(column)
                    table = table.set_column(
                        at, column, pc.binary_join_element_wise(table[column], suffix, "")
                    )
            return table

        out["articles"].append(
            suffixed(base["articles"], {"url": tag, "content_hash": tag, "title": named})
        )
        out["pagerank"].append(suffixed(base["pagerank"], {"url": tag}))
        sections = suffixed(
            base["sections"],
            {"section_id": tag, "article_url": tag, "content_hash": tag, "article_title": named},
        )
        out["sections"].append(
            sections.set_column(
                sections.schema.get_field_index("defines"),
                "defines",
                suffixed_names(sections["defines"], named),
            )
        )
        out["chunks"].append(
            suffixed(
                base["chunks"],
                {
                    "chunk_id": tag,
                    "section_id": tag,
                    "article_url": tag,
                    "content_hash": tag,
                    "article_title": named,
                },
            )
        )
        out["entities"].append(suffixed(base["entities"], {"entity_id": named}))
        out["entity_mentions"].append(
            suffixed(
                base["entity_mentions"],
                {"article_url": tag, "section_id": tag, "entity_id": named},
            )
        )
        mentions = suffixed(base["mentions"], {"entity_id": named})
        out["mentions"].append(
            mentions.set_column(
                0,
                "chunk_id",
                pc.replace_substring_regex(mentions["chunk_id"], r"-(\d+)$", f"{tag}-\\1"),
            )
        )
        out["links"].append(suffixed(base["links"], {"source_url": tag, "target_url": tag}))
        section_links = suffixed(
            base["section_links"], {"source_section_id": tag, "target_section_id": tag}
        )
        if named:
            section_links = section_links.set_column(
                section_links.schema.get_field_index("anchor"),
                "anchor",
                pc.if_else(
                    pc.equal(anchors, ""), anchors, pc.binary_join_element_wise(anchors, named, "")
                ),
            )
        out["section_links"].append(section_links)
        out["relations"].append(
            suffixed(
                base["relations"],
                {
                    "source_id": named,
                    "target_id": named,
                    "article_url": tag,
                    "section_id": tag,
                },
            )
        )
        out["facts"].append(
            suffixed(base["facts"], {"fact_id": tag, "article_url": tag, "section_id": tag})
        )
        noisy = vectors + rng.normal(0.0, NOISE, vectors.shape).astype(np.float32)
        noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
        dim = noisy.shape[1]
        out["embeddings"].append(
            pa.table(
                {
                    "content_hash": pc.binary_join_element_wise(
                        base["embeddings"]["content_hash"], tag, ""
                    ),
                    "embedding": pa.FixedSizeListArray.from_arrays(pa.array(noisy.ravel()), dim),
                }
            )
        )
    tables = {name: pa.concat_tables(parts) for name, parts in out.items()}
    # Section and chunk ids embed the copy tag after the id, so keep chunk_id -> section_id
    # as contracts.section_of_chunk reads it: the tag goes on the section id, and the chunk id
    # is rebuilt from it.
    chunks = tables["chunks"]
    index = pc.cast(chunks["chunk_index"], pa.string())
    chunk_ids = pc.binary_join_element_wise(chunks["section_id"], pc.utf8_lpad(index, 3, "0"), "-")
    tables["chunks"] = chunks.set_column(
        chunks.schema.get_field_index("chunk_id"), "chunk_id", chunk_ids
    ).slice(0, chunks_wanted)
    # The last copy may be cut short: its mentions of chunks that were cut go too.
    last = out["mentions"][-1]
    out["mentions"][-1] = last.filter(
        pc.is_in(last["chunk_id"], value_set=tables["chunks"]["chunk_id"].combine_chunks())
    )
    tables["mentions"] = pa.concat_tables(out["mentions"])
    return tables


def suffixed_names(names: pa.ChunkedArray, suffix: str) -> pa.ChunkedArray:
    """A list-of-names column with ``suffix`` on every name (none when ``suffix`` is empty)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not suffix:
        return names
    lists = names.combine_chunks()
    flat = pc.binary_join_element_wise(lists.values, suffix, "")
    return pa.chunked_array([pa.ListArray.from_arrays(lists.offsets, flat, mask=lists.is_null())])


class Steps:
    """Seconds and peak resident memory per step of writing a pack (this process, and the
    Kuzu writer child), for the report."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.started = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.rows.append(
            {
                "step": name,
                "s": round(now - self.started, 1),
                "peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                "child_peak_gib": round(
                    resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2
                ),
            }
        )
        print(f"    {self.rows[-1]}", flush=True)
        self.started = now


def write_pack(workdir: Path, name: str, tables: dict, steps: Steps) -> float:
    """Write and publish the pack with the build's own functions; returns the seconds taken."""
    from assets.graph import write_staged
    from kpack.store import PackStore

    started = time.perf_counter()
    packs = workdir / "packs"
    folder = packs / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "urls.txt").write_text("https://docs.python.org/3/\n")
    store = PackStore(packs)
    staging = store.new_staging(name, "scale")
    dim = len(tables["embeddings"]["embedding"][0])
    write_staged(staging, tables, dim, steps.done)
    manifest = {
        "name": name,
        "version": store.next_version(name),
        "embedding": {"model": "sentence-transformers/all-MiniLM-L6-v2", "dimension": dim},
        "config": {},
    }
    (staging / "manifest.json").write_text(json.dumps(manifest))
    store.publish(name, manifest["version"], staging)
    steps.done("seal and publish")
    return time.perf_counter() - started


def memory() -> dict[str, float]:
    """Resident MiB of this process (smaps_rollup): ``anonymous`` is memory only this process
    can use (the reader's own); ``file_backed`` is mapped file pages (the page cache), which
    every process mapping the same index files shares, though smaps counts them as
    Private_Clean while only one process maps them."""
    fields: dict[str, int] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    private = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    shared = fields.get("Shared_Clean", 0) + fields.get("Shared_Dirty", 0)
    return {
        "rss_mib": fields.get("Rss", 0) / 1024,
        "private_mib": private / 1024,
        "shared_mib": shared / 1024,
        "file_backed_mib": (fields.get("Rss", 0) - fields.get("Anonymous", 0)) / 1024,
    }


def measure(folder: Path) -> dict:
    """In a fresh process: open, search (three rounds of the questions, with each stage's
    p50), memory and ANN recall of one pack."""
    import retrieval
    from kpack.vector_index import nearest_rows
    from retrieval.reader import PackReader

    stages: dict[str, list[float]] = {}
    agent_module = sys.modules["retrieval.agent"]
    run_stages = agent_module.run

    def timed_run(query, steps):  # type: ignore[no-untyped-def]
        done = run_stages(query, steps)
        for name, ms in done.timings.items():
            stages.setdefault(name, []).append(ms)
        return done

    agent_module.run = timed_run
    before = memory()
    started = time.perf_counter()
    version = (folder / ".versions" / "current").resolve()
    reader = PackReader(folder, version)
    open_s = time.perf_counter() - started
    opened = memory()
    # The graph stages on, whatever the pack's own evidence says: a replicated pack has no
    # graph_evidence.json (the build's graph_evidence step runs after publishing), and the
    # figure the issue asks for includes them.
    agent = retrieval.KnowledgeGraphAgent(
        reader, profile="balanced", use_llm=False, enable_graph=True, enable_doc_graph=True
    )
    agent.search(QUESTIONS[0], k=5)  # the model loads
    stages.clear()
    rounds: list[list[float]] = []
    for _ in range(3):
        rounds.append([])
        for question in QUESTIONS[1:]:
            started = time.perf_counter()
            agent.search(question, k=5)
            rounds[-1].append((time.perf_counter() - started) * 1000)
    timings = [ms for done in rounds for ms in done]
    searched = memory()
    recall = {}
    for label, vectors, ann in (
        ("Chunk", reader.chunk_vectors, reader.ann),
        ("Section", reader.section_vectors, reader.section_ann),
    ):
        if ann is None:
            continue
        found = total = 0
        for question in QUESTIONS:
            vector = reader.embed([question])[0]
            approximate, _ = nearest_rows(vectors, vector, 10, ann)
            exact, _ = nearest_rows(vectors, vector, 10)
            found += len(set(approximate.tolist()) & set(exact.tolist()))
            total += len(exact)
        recall[label] = found / total
    return {
        "chunks": len(reader.chunk_ids),
        "sections": len(reader.section_ids),
        "open_s": round(open_s, 3),
        "memory_before_open": before,
        "memory_after_open": opened,
        "memory_after_queries": searched,
        "search_ms_p50": round(float(np.percentile(timings, 50)), 1),
        "search_ms_p95": round(float(np.percentile(timings, 95)), 1),
        # The first round reads the pages its questions need from disk where the page cache
        # has not kept them (a pack that is served keeps them warm): p95 per round shows it.
        "search_ms_p95_by_round": [round(float(np.percentile(r, 95)), 1) for r in rounds],
        "stage_ms_p50": {k: round(float(np.percentile(v, 50)), 2) for k, v in stages.items()},
        "ann": reader.ann is not None,
        "ann_recall_at_10": recall.get("Chunk"),
        "section_ann_recall_at_10": recall.get("Section"),
    }


def first_query(folder: Path, questions: list[str]) -> dict:
    """In a fresh process, what a user of a pack pays through the public API: importing
    retrieval, the first search (the version opened, warmed and the model loaded, one thread),
    the memory after it, and balanced search p50/p95 over ``questions`` (three rounds)."""
    started = time.perf_counter()
    import retrieval

    imported = time.perf_counter()
    retrieval.search(folder, questions[0], k=5, profile="balanced")
    first = time.perf_counter()
    after_first = memory()
    timings = []
    for _ in range(3):
        for question in questions[1:]:
            began = time.perf_counter()
            retrieval.search(folder, question, k=5, profile="balanced")
            timings.append((time.perf_counter() - began) * 1000)
    return {
        "pack": folder.name,
        "import_s": round(imported - started, 3),
        "first_search_s": round(first - imported, 3),
        "memory_after_first_search": after_first,
        "memory_after_searches": memory(),
        "search_ms_p50": round(float(np.percentile(timings, 50)), 1),
        "search_ms_p95": round(float(np.percentile(timings, 95)), 1),
    }


def run_child(*args: str) -> dict:
    """One measurement in a fresh process on one thread; its JSON line."""
    env = {**os.environ, "KPACK_READER_THREADS": "1", "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env
    )
    if child.returncode != 0:
        raise SystemExit(child.stderr[-3000:])
    return json.loads(child.stdout.strip().splitlines()[-1])


def compare_fresh(packs: list[Path], questions_file: Path | None, processes: int) -> list[dict]:
    """Item 2 of issue 20: each pack in ``processes`` fresh processes, in turn (so page cache
    and machine load are alike), median per pack."""
    questions = QUESTIONS
    if questions_file is not None:
        lines = questions_file.read_text().splitlines()
        questions = [json.loads(line)["question"] for line in lines if line.strip()]
    rows: dict[Path, list[dict]] = {pack: [] for pack in packs}
    for _ in range(processes):
        for pack in packs:
            rows[pack].append(run_child("--_first", str(pack), json.dumps(questions)))
    report = []
    for runs in rows.values():
        middle = sorted(runs, key=lambda r: r["first_search_s"])[len(runs) // 2]
        report.append({**middle, "runs": runs})
    print(
        "| pack | import s | first search s | RSS MiB after it (anonymous / file) | p50 ms | p95 ms |"
    )
    print("|---|---|---|---|---|---|")
    for row in report:
        mem = row["memory_after_first_search"]
        anonymous = mem["rss_mib"] - mem["file_backed_mib"]
        print(
            f"| {row['pack']} | {row['import_s']} | {row['first_search_s']} | "
            f"{mem['rss_mib']:.0f} ({anonymous:.0f} / {mem['file_backed_mib']:.0f}) | "
            f"{row['search_ms_p50']} | {row['search_ms_p95']} |"
        )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=Path("/work/bench-ws-main/storage"))
    parser.add_argument("--workdir", type=Path, default=Path("/work/bench-ws-scale"))
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "scale_bench.json")
    parser.add_argument(
        "--fresh",
        type=Path,
        nargs="+",
        help="instead of the sizes: these packs' first search, memory and p50 in fresh "
        "processes, side by side",
    )
    parser.add_argument("--questions", type=Path, help="with --fresh: a questions.jsonl")
    parser.add_argument("--processes", type=int, default=3, help="with --fresh: runs per pack")
    parser.add_argument("--_measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--_first", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        print(json.dumps(measure(args._measure)))
        return
    if args._first:
        print(json.dumps(first_query(Path(args._first[0]), json.loads(args._first[1]))))
        return
    if args.fresh:
        report = compare_fresh(args.fresh, args.questions, args.processes)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        return
    report = []
    written: dict[int, list[dict]] = {}
    for size in [int(s) for s in args.sizes.split(",")]:
        name = f"scale_{size}"
        folder = args.workdir / "packs" / name
        if not (folder / ".versions" / "current").exists():
            print(f"[{name}] writing ...", flush=True)
            steps = Steps()
            tables = replicate(args.source, size)
            steps.done("replicate the source pack")
            write_s = write_pack(args.workdir, name, tables, steps)
            del tables
            print(f"[{name}] written in {write_s:.1f} s", flush=True)
            written[size] = steps.rows
        row = run_child("--_measure", str(folder))
        row["write_steps"] = written.get(size)
        print(json.dumps(row), flush=True)
        report.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(
        "| chunks | open s | anonymous MiB | file-backed MiB | p50 ms | p95 ms "
        "| p95 ms per round | ANN recall@10 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in report:
        mem = row["memory_after_queries"]
        recall = "exact" if row["ann_recall_at_10"] is None else f"{row['ann_recall_at_10']:.3f}"
        print(
            f"| {row['chunks']:,} | {row['open_s']} | {mem['rss_mib'] - mem['file_backed_mib']:.0f} | "
            f"{mem['file_backed_mib']:.0f} | {row['search_ms_p50']} | {row['search_ms_p95']} | "
            f"{' / '.join(map(str, row['search_ms_p95_by_round']))} | {recall} |"
        )


if __name__ == "__main__":
    main()
