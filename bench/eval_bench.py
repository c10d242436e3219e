"""The public benchmark: SQuAD retrieval hit@k against peers, unanswerable questions, pack evals.

1. squad_wiki6 (built by ``bench/build_bench.py --keep``): every answerable question, hit@1/5/10
   and MRR for vector-only (the reader's exact scan), BM25-only (the reader's in-memory
   index), hybrid (RRF) and the balanced profile, and in the same run two peers over the very
   same passages (the pack's chunks, <= 200 words): BM25 with the ``bm25s`` package and
   brute-force dense search with the same embedding model (the pack's Kuzu HNSW and FTS
   indexes, the reference here before, are no longer built). A
   hit is a retrieved passage that contains a gold answer (case and whitespace ignored).
2. Offline answers (balanced profile, no key): of the answerable questions whose gold passage
   is among the 5 passages kept, the share whose answer contains a gold answer span (issue 10
   item 5), how often the answer says the passages do not answer, how many sources the
   response lists, and what the citation check made of the answers' statements (supported,
   and kept with a support below the threshold).
3. The 702 unanswerable questions: how often the gate refuses them (and, for contrast, the
   answerable ones), and whether the offline answer ever states a sentence that is not in the
   retrieved passages.
4. The pack's own eval (retrieval.eval) on the demo pack and the Python docs pack, with
   the question files packs/demo/eval/questions.jsonl and bench/python_docs_questions.jsonl.

    .venv/bin/python bench/eval_bench.py --workdir /work/bench-workspace
    .venv/bin/python bench/eval_bench.py --workdir WS --skip squad,unanswerable,demo,python  # answers
    .venv/bin/python bench/eval_bench.py --workdir WS/int8 --skip answers,unanswerable,demo,python \
        --conditions 'vector (exact scan),balanced profile'
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from bench.corpora import DEFAULT_SQUAD, load_squad  # noqa: E402
from bench.harness import OUT_DIR, CitationTally  # noqa: E402
from kpack.contracts import passage_text  # noqa: E402
from retrieval.agent import KnowledgeGraphAgent  # noqa: E402
from retrieval.candidates import keyword_passages  # noqa: E402
from retrieval.eval import (  # noqa: E402
    Question,
    evaluate,
    load_questions,
    markdown_summary,
    write_results,
)
from retrieval.eval.metrics import (  # noqa: E402
    contains_answer,
    first_hit_rank,
    hit_at,
    mean_reciprocal_rank,
    normalize_text,
)
from retrieval.missing_names import DECLINED  # noqa: E402
from retrieval.registry import open_pack  # noqa: E402
from retrieval.synthesis import NO_CONTEXT_ANSWER  # noqa: E402

DEPTH = 10
CITATION = re.compile(r"\s*\[Source: [^\]]*\]")


def squad_questions(squad_file: Path = DEFAULT_SQUAD) -> tuple[list[Question], list[Question]]:
    answerable, impossible = [], []
    for article in load_squad(squad_file):
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                question = Question(
                    0, qa["question"], qa["id"], answers=[a["text"] for a in qa["answers"]]
                )
                (impossible if qa.get("is_impossible") else answerable).append(question)
    return answerable, impossible


def passages_of(pack) -> tuple[list[str], list[dict]]:
    """Every chunk of the pack as (id, passage dict), the peers' corpus."""
    rows = pack.query(
        "MATCH (a:Article)-[:HAS_CHUNK]->(c:Chunk) RETURN c.chunk_id, c.section_id, a.url, c.content ORDER BY c.chunk_id"
    )
    ids = [r[0] for r in rows]
    return ids, [{"url": r[2], "text": r[3], "heading": pack.sections[r[1]].heading} for r in rows]


def ranks_for(search, questions: list[Question]) -> tuple[list[int | None], float]:
    started = time.perf_counter()
    ranks = [first_hit_rank(search(q.question), q) for q in questions]
    return ranks, (time.perf_counter() - started) / max(len(questions), 1) * 1000


def retrieval_table(
    pack_folder: Path, questions: list[Question], only: set[str] | None = None
) -> dict:
    """hit@k and MRR per condition (``only``: the conditions named, all when None)."""
    import bm25s

    pack = open_pack(pack_folder)
    _, passages = passages_of(pack)
    vector_agent = KnowledgeGraphAgent(
        pack_folder, profile="baseline", use_llm=False, enable_hybrid=False
    )
    hybrid_agent = KnowledgeGraphAgent(pack_folder, profile="baseline", use_llm=False)
    balanced_agent = KnowledgeGraphAgent(pack_folder, profile="balanced", use_llm=False)
    # The balanced profile with both graph stages on, whatever the pack's graph evidence
    # chose: how it ranked before that evidence existed (issue 23), for comparisons with then.
    graph_agent = KnowledgeGraphAgent(
        pack_folder, profile="balanced", use_llm=False, enable_graph=True, enable_doc_graph=True
    )

    def as_dicts(candidates) -> list[dict]:
        return [{"url": c.article_url, "text": c.text} for c in candidates]

    corpus_tokens = bm25s.tokenize(
        [p["text"] for p in passages], stopwords="en", show_progress=False
    )
    peer_bm25 = bm25s.BM25()
    peer_bm25.index(corpus_tokens, show_progress=False)
    vectors = pack.embed([passage_text(p["heading"], p["text"]) for p in passages])

    def bm25s_search(question: str) -> list[dict]:
        hits, _ = peer_bm25.retrieve(
            bm25s.tokenize([question], stopwords="en", show_progress=False),
            k=min(DEPTH, len(passages)),
            show_progress=False,
        )
        return [passages[i] for i in hits[0]]

    def dense_search(question: str) -> list[dict]:
        scores = vectors @ pack.embed([question])[0]
        return [passages[i] for i in np.argsort(-scores)[:DEPTH]]

    conditions = {
        "vector (exact scan)": lambda q: vector_agent.search(q, k=DEPTH),
        "bm25 (in-memory)": lambda q: as_dicts(keyword_passages(pack, q, DEPTH)),
        "hybrid (RRF)": lambda q: hybrid_agent.search(q, k=DEPTH),
        "balanced profile": lambda q: balanced_agent.search(q, k=DEPTH),
        "balanced with graph stages on": lambda q: graph_agent.search(q, k=DEPTH),
        "peer: bm25s": bm25s_search,
        "peer: dense brute force": dense_search,
    }
    table = {}
    for name, search in conditions.items():
        if only is not None and name not in only:
            continue
        print(f"  {name} ...", flush=True)
        ranks, ms = ranks_for(search, questions)
        table[name] = {
            "hit@1": hit_at(ranks, 1),
            "hit@5": hit_at(ranks, 5),
            "hit@10": hit_at(ranks, 10),
            "mrr": mean_reciprocal_rank(ranks),
            "ms_per_question": round(ms, 2),
        }
    return {
        "passages": len(passages),
        "max_passage_words": max(len(p["text"].split()) for p in passages),
        "questions": len(questions),
        "conditions": table,
    }


def answer_table(pack_folder: Path, answerable: list[Question]) -> dict:
    """Offline answers of the balanced profile to the answerable questions whose gold passage
    is among the passages kept (k=5): how often the answer quotes a gold answer span."""
    agent = KnowledgeGraphAgent(pack_folder, profile="balanced", use_llm=False)
    chunk_text = open_pack(pack_folder).chunk_text
    eligible = contained = declined = 0
    sources = []
    missed = []  # the eligible questions whose answer quotes no gold span: to compare two runs
    tally = CitationTally()
    for question in answerable:
        result = agent.query(question.question, max_results=5)
        tally.add(result)
        sources.append(len(result["sources"]))
        kept = [c["passage_id"] for c in result["trace"]["candidates"] if c.get("rank")]
        if not any(contains_answer(chunk_text.get(p, ""), question.answers) for p in kept):
            continue
        eligible += 1
        answer = CITATION.sub("", result["answer"])
        if contains_answer(answer, question.answers):
            contained += 1
        else:
            missed.append(question.question)
        declined += not says_something(result["answer"])
    return {
        "questions": len(answerable),
        "gold_passage_in_top5": eligible,
        "answer_contains_gold_span": contained,
        "share": round(contained / eligible, 4) if eligible else 0.0,
        "answer_says_passages_do_not_answer": declined,
        "mean_sources": round(sum(sources) / len(sources), 2) if sources else 0.0,
        "max_sources": max(sources, default=0),
        **tally.as_row(),
        "missed": missed,
    }


def says_something(answer: str) -> bool:
    """False for the offline answers that state the pack has no answer."""
    return not (answer.endswith(NO_CONTEXT_ANSWER) or answer.startswith(DECLINED))


def unanswerable_table(
    pack_folder: Path, answerable: list[Question], impossible: list[Question]
) -> dict:
    agent = KnowledgeGraphAgent(pack_folder, profile="balanced", use_llm=False)
    sample = answerable[:: max(1, len(answerable) // 500)]
    rows = {}
    for label, questions in (("unanswerable", impossible), ("answerable (sample)", sample)):
        gated = quoted = outside = 0
        for question in questions:
            result = agent.query(question.question)
            if result["query_type"] != "vector_search":
                gated += 1
            elif says_something(result["answer"]):
                quoted += 1
                context = context_text(agent, result)
                sentences = [
                    normalize_text(s) for s in CITATION.split(result["answer"]) if s.strip()
                ]
                outside += any(sentence not in context for sentence in sentences)
        rows[label] = {
            "questions": len(questions),
            "gate_refused": gated,
            "answered_with_quotes": quoted,
            "answers_with_a_sentence_not_in_the_passages": outside,
        }
    return {"threshold": agent.settings["context_confidence_threshold"], "rows": rows}


def context_text(agent: KnowledgeGraphAgent, result: dict) -> str:
    """The text of the context sections the answer was built from, normalised."""
    used = {(c["title"], c["section"]) for c in result["citations"]}
    pack = open_pack(agent.source)
    texts = [
        pack.section_text[s.section_id]
        for s in pack.sections.values()
        if (pack.articles[s.article_url].title, s.heading) in used
    ]
    return normalize_text(" ".join(" ".join(t.split()) for t in texts))


def pack_eval(pack_folder: Path, questions_file: Path, url_prefix: str | None = None) -> dict:
    """The pack's own evaluation, gold URLs of the Python docs mapped onto the served pages."""
    if url_prefix is not None:
        lines = []
        for line in questions_file.read_text().splitlines():
            item = json.loads(line)
            if "gold_urls" in item:
                item["gold_urls"] = [url_prefix + u for u in item["gold_urls"]]
            lines.append(json.dumps(item))
        questions_file = pack_folder / "eval" / "questions.jsonl"
        questions_file.parent.mkdir(exist_ok=True)
        questions_file.write_text("\n".join(lines) + "\n")
    questions, problems = load_questions(questions_file, pack_folder)
    results = evaluate(pack_folder, questions, ["baseline", "balanced", "max"], use_llm=False)
    write_results(results, pack_folder / "eval" / "results")
    return {
        "problems": problems,
        "summary": markdown_summary(results),
        "calibration": results["calibration"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir", type=Path, required=True, help="workspace of build_bench --keep"
    )
    parser.add_argument(
        "--skip", default="", help="comma list of parts to skip: squad,unanswerable,demo,python"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT_DIR,
        help=f"folder for eval_bench.json/.md (default {OUT_DIR})",
    )
    parser.add_argument("--squad", type=Path, default=DEFAULT_SQUAD, help="squad_wiki6.json")
    parser.add_argument(
        "--conditions",
        help="comma list of the squad retrieval conditions to run (default: all), e.g. "
        "'vector (exact scan),balanced profile'",
    )
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    packs = args.workdir.resolve() / "packs"
    report: dict = {}
    answerable, impossible = squad_questions(args.squad)
    only = set(args.conditions.split(",")) if args.conditions else None
    if "squad" not in skip:
        print(f"squad_wiki6 retrieval: {len(answerable)} answerable questions", flush=True)
        report["squad_retrieval"] = retrieval_table(packs / "squad_wiki6", answerable, only)
    if "answers" not in skip:
        print(f"squad_wiki6 offline answers: {len(answerable)} answerable questions", flush=True)
        report["squad_answers"] = answer_table(packs / "squad_wiki6", answerable)
    if "unanswerable" not in skip:
        print(f"squad_wiki6 unanswerable: {len(impossible)} questions", flush=True)
        report["squad_unanswerable"] = unanswerable_table(
            packs / "squad_wiki6", answerable, impossible
        )
    if "demo" not in skip:
        print("demo pack eval", flush=True)
        report["demo_eval"] = pack_eval(
            REPO / "packs" / "demo", REPO / "packs" / "demo" / "eval" / "questions.jsonl"
        )
    if "python" not in skip and (packs / "python_docs" / "pack.db").exists():
        print("python_docs pack eval", flush=True)
        pack = open_pack(packs / "python_docs")
        any_url = next(iter(pack.articles))
        prefix = any_url[: any_url.index("/", len("http://")) + 1]
        report["python_docs_eval"] = pack_eval(
            packs / "python_docs", REPO / "bench" / "python_docs_questions.jsonl", prefix
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eval_bench.json").write_text(json.dumps(report, indent=2, default=str))
    print(render(report))
    (args.out / "eval_bench.md").write_text(render(report) + "\n")


def render(report: dict) -> str:
    lines = []
    if "squad_retrieval" in report:
        squad = report["squad_retrieval"]
        lines += [
            f"\n## squad_wiki6 retrieval ({squad['questions']} answerable questions, {squad['passages']} passages, "
            f"longest {squad['max_passage_words']} words)\n",
            "| condition | hit@1 | hit@5 | hit@10 | MRR | ms/question |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in squad["conditions"].items():
            lines.append(
                f"| {name} | {row['hit@1']:.3f} | {row['hit@5']:.3f} | {row['hit@10']:.3f} | {row['mrr']:.3f} | {row['ms_per_question']} |"
            )
    if "squad_answers" in report:
        row = report["squad_answers"]
        lines += [
            "\n## Offline answers (balanced, no key, k=5)\n",
            "| answerable questions | gold passage in top 5 | answer contains a gold span | share | "
            "answer says the passages do not answer | sources per answer (mean / max) | "
            "statements supported / checked | kept below the support threshold |",
            "|---|---|---|---|---|---|---|---|",
            f"| {row['questions']} | {row['gold_passage_in_top5']} | {row['answer_contains_gold_span']} "
            f"| {row['share']:.3f} | {row['answer_says_passages_do_not_answer']} "
            f"| {row['mean_sources']} / {row['max_sources']} "
            f"| {row['statements_supported']} / {row['statements_checked']} "
            f"| {row['kept_below_threshold']} |",
        ]
    if "squad_unanswerable" in report:
        block = report["squad_unanswerable"]
        lines += [
            f"\n## Unanswerable questions (balanced, offline answer, gate threshold {block['threshold']})\n",
            "| set | questions | gate refused | answered with quotes | answers with a sentence not in the passages |",
            "|---|---|---|---|---|",
        ]
        for label, row in block["rows"].items():
            lines.append(
                f"| {label} | {row['questions']} | {row['gate_refused']} | {row['answered_with_quotes']} | {row['answers_with_a_sentence_not_in_the_passages']} |"
            )
    for key in ("demo_eval", "python_docs_eval"):
        if key in report:
            lines += [f"\n## {key}\n", report[key]["summary"]]
            if report[key]["problems"]:
                lines.append(f"question file problems: {report[key]['problems']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
