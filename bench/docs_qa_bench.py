"""Documentation questions with answer keys: page hits, two-page questions, answers, refusals.

The set is ``shared/benchmarks/python_docs_qa/questions.jsonl`` (35 answerable questions and 5
out-of-domain ones over Debian's python3.11-doc, see its README): every question names its
gold pages (paths under the HTML root, ``library/json.html``) and the answer-term groups a
correct answer contains. The pack is the project's Python docs pack (the library, tutorial,
reference, howto and faq pages, as bench/build_bench.py builds it), served on 127.0.0.1.

Per profile (offline: no key, ``use_llm=False``):

- retrieval (``retrieval.search``, k=10): page hit@1, hit@5 and MRR@10 over the answerable
  questions (a gold page among the pages of the top k passages); for two-page questions
  (``"hops": 2``) how many have every gold page in the top 5 and in the top 10;
- answers (``retrieval.query``, its default k): how many answerable answers contain every
  answer-term group (case-insensitive), sources per answer, and how many out-of-domain
  questions are refused: the gate fired, or the answer cites nothing (a plain "the pack does
  not cover this");
- p50 of the query latency;
- the citation check of the answers: statements supported of those checked, and how many were
  kept with a support below the threshold (bench.harness.CitationTally).

A question file in the pack eval format (``gold_urls`` and ``answers``, such as
bench/python_docs_questions.jsonl, the development questions) is read too: its gold URLs are
the gold pages and each of its answers is a term group of its own.

The JSON keeps a row per question (gold rank, term groups matched, refused) so failures can be
read. This script measures; nothing in the project is tuned to these questions.

    .venv/bin/python bench/docs_qa_bench.py --workdir /work/bench-ws
    .venv/bin/python bench/docs_qa_bench.py --workdir /work/bench-ws --questions held_out.jsonl
    .venv/bin/python bench/docs_qa_bench.py --workdir /work/bench-ws \
        --questions bench/python_docs_questions.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.corpora import (  # noqa: E402
    BENCHMARKS,
    ensure_python_docs,
    make_pack,
    page_urls,
    python_doc_pages,
    serve,
)
from bench.harness import OUT_DIR, CitationTally, build_here  # noqa: E402

DEFAULT_QUESTIONS = BENCHMARKS / "python_docs_qa/questions.jsonl"
PACK = "python_docs"
GATED = "confidence_gated_fallback"
SEARCH_K = 10


def load_questions(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def ensure_pack(workdir: Path, rebuild: bool) -> Path:
    """The Python docs pack of ``workdir``, built from the served corpus unless it exists."""
    folder = workdir / "packs" / PACK
    if (folder / "pack.db").exists() and not rebuild:
        return folder
    root = ensure_python_docs()
    pages = python_doc_pages(root)
    with serve(root) as base_url:
        make_pack(workdir, PACK, page_urls(base_url, root, pages), {"extraction": "offline"})
        print(f"building {PACK} from {len(pages)} pages at {base_url} ...", flush=True)
        build = build_here(PACK, workdir)
    if not build.result.success:
        raise SystemExit(f"the {PACK} build failed: {build.result.cause}")
    print(f"built in {build.total_s:.0f} s", flush=True)
    return folder


def page_of(url: str) -> str:
    """A passage's article URL as a path under the HTML root (``library/json.html``)."""
    path = unquote(urlsplit(url).path).lstrip("/")
    return path


def first_gold_rank(pages: list[str], gold: set[str]) -> int | None:
    return next((rank for rank, page in enumerate(pages, start=1) if page in gold), None)


def terms_matched(answer: str, groups: list[list[str]]) -> list[bool]:
    text = answer.lower()
    return [any(term.lower() in text for term in group) for group in groups]


def answer_groups(item: dict[str, Any]) -> list[list[str]]:
    """The term groups a correct answer contains: the set's ``answer_terms``, or for a question
    in the pack eval format every one of its ``answers``, each a group of its own."""
    return item.get("answer_terms") or [[answer] for answer in item.get("answers") or []]


def refused(result: dict[str, Any]) -> bool:
    return result.get("query_type") == GATED or not result.get("citations")


def measure(folder: Path, profile: str, questions: list[dict[str, Any]]) -> dict[str, Any]:
    import retrieval

    retrieval.search(folder, "warm up the reader", k=SEARCH_K, profile=profile)
    rows, latencies = [], []
    tally = CitationTally()
    for item in questions:
        hits = retrieval.search(folder, item["question"], k=SEARCH_K, profile=profile)
        pages = [page_of(hit["url"]) for hit in hits]
        started = time.perf_counter()
        result = retrieval.query(folder, item["question"], profile=profile, use_llm=False)
        latencies.append((time.perf_counter() - started) * 1000)
        tally.add(result)
        gold = set(item.get("gold_pages") or item.get("gold_urls") or [])
        matched = terms_matched(result["answer"], answer_groups(item))
        rows.append(
            {
                "id": item["id"],
                "kind": item.get("kind"),
                "hops": item.get("hops", 1),
                "out_of_domain": bool(item.get("out_of_domain")),
                "gold_rank": first_gold_rank(pages, gold) if gold else None,
                "all_gold_in_top5": bool(gold) and gold <= set(pages[:5]),
                "all_gold_in_top10": bool(gold) and gold <= set(pages[:10]),
                "terms_matched": matched,
                "all_terms": bool(matched) and all(matched),
                "refused": refused(result),
                "sources": len(result.get("sources") or []),
                "answer": result["answer"],
            }
        )
    summary = summarize(rows, latencies) | tally.as_row()
    return {"profile": profile, "summary": summary, "rows": rows}


def summarize(rows: list[dict[str, Any]], latencies: list[float]) -> dict[str, Any]:
    answerable = [r for r in rows if not r["out_of_domain"]]
    outside = [r for r in rows if r["out_of_domain"]]
    twopage = [r for r in answerable if r["hops"] >= 2]
    ranks = [r["gold_rank"] for r in answerable]
    n = len(answerable) or 1
    return {
        "answerable": len(answerable),
        "hit@1": round(sum(1 for k in ranks if k is not None and k <= 1) / n, 3),
        "hit@5": round(sum(1 for k in ranks if k is not None and k <= 5) / n, 3),
        "mrr@10": round(sum(1 / k for k in ranks if k is not None) / n, 3),
        "twopage": len(twopage),
        "twopage_all_in_top5": sum(r["all_gold_in_top5"] for r in twopage),
        "twopage_all_in_top10": sum(r["all_gold_in_top10"] for r in twopage),
        "answers_with_all_terms": sum(r["all_terms"] for r in answerable),
        "answerable_refused": sum(r["refused"] for r in answerable),
        "mean_sources": round(statistics.mean(r["sources"] for r in answerable), 2)
        if answerable
        else 0.0,
        "out_of_domain": len(outside),
        "out_of_domain_refused": sum(r["refused"] for r in outside),
        "query_p50_ms": round(statistics.median(latencies), 1) if latencies else None,
    }


def render(results: list[dict[str, Any]], questions_file: Path) -> str:
    lines = [
        f"## {questions_file.name}: {results[0]['summary']['answerable']} answerable, "
        f"{results[0]['summary']['out_of_domain']} out-of-domain questions\n",
        "| profile | hit@1 | hit@5 | MRR@10 | two-page, all gold in top 5 / 10 | answers with "
        "every term group | answerable refused | out-of-domain refused | sources per answer | "
        "query p50 ms | statements supported / checked | kept below the support threshold |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        s = result["summary"]
        lines.append(
            f"| {result['profile']} | {s['hit@1']:.3f} | {s['hit@5']:.3f} | {s['mrr@10']:.3f} "
            f"| {s['twopage_all_in_top5']} / {s['twopage_all_in_top10']} of {s['twopage']} "
            f"| {s['answers_with_all_terms']} of {s['answerable']} | {s['answerable_refused']} "
            f"| {s['out_of_domain_refused']} of {s['out_of_domain']} | {s['mean_sources']} "
            f"| {s['query_p50_ms']} | {s['statements_supported']} / {s['statements_checked']} "
            f"| {s['kept_below_threshold']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="packs/ and storage/ here")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    parser.add_argument("--profiles", default="baseline,balanced,max")
    parser.add_argument("--rebuild", action="store_true", help="build the pack even if it exists")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    workdir = args.workdir.resolve()
    folder = ensure_pack(workdir, args.rebuild)
    questions = load_questions(args.questions)
    results = [measure(folder, profile, questions) for profile in args.profiles.split(",")]
    report = render(results, args.questions)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"docs_qa_bench_{args.questions.stem}"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (args.out / f"{stem}.md").write_text(report + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
