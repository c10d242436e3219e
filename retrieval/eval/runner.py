"""The evaluation run: what a pack adds, measured without letting a question see its answer.

Each question of ``eval/questions.jsonl`` runs under each condition (profiles, and "no_pack":
the LLM alone, when a key is set), against one pack version held open for the whole run.
Retrieval is scored by where the first relevant passage ranks; answers by a judge model with a
key, else by containment and token F1 against the accepted answers. The few-shot pool never
offers the graded question, nor any example with its id or its answer. Everything goes
through the agent's public API (search, query, answer_without_pack).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from kpack.errors import PackError
from kpack.graph_evidence import read_record
from kpack.llm import EXPANSION_MODEL, ClaudeClient, LLMError
from kpack.packs import normalize_url
from retrieval.agent import KnowledgeGraphAgent
from retrieval.eval.calibrate import best_threshold, calibrate
from retrieval.eval.evidence import graph_evidence
from retrieval.eval.graph_calibration import calibrate_graph
from retrieval.eval.metrics import (
    HIT_DEPTHS,
    all_gold_rank,
    contains_answer,
    contains_terms,
    first_hit_rank,
    normalize_text,
    summarize,
    token_f1,
)
from retrieval.eval.questions import Question
from retrieval.fewshot import normalize_question
from retrieval.missing_names import DECLINED
from retrieval.query import GATED, NOTHING_FOUND
from retrieval.registry import reading
from retrieval.synthesis import NO_CONTEXT_ANSWER

NO_PACK = "no_pack"
JUDGE_SYSTEM = (
    "You grade answers to questions about documentation. Compare the candidate answer with "
    "the reference answer and reply with only an integer from 0 (wrong) to 10 (fully correct "
    "and complete)."
)
FEW_SHOT_POLICY = (
    "evaluated-set hold-out: an example with the id, text or answer of any question being "
    "evaluated is never offered (few-shot examples come from a separate file, or from the "
    "other half of a fixed split)"
)
# progress(condition, question number from 1, questions, the question's record)
Progress = Callable[[str, int, int, dict], None]


def leak_filter(*questions: Question) -> Callable[[dict], bool]:
    """True for few-shot examples that are one of the questions (by id, text or answer): the
    evaluation passes every question it evaluates, so no graded question, nor any other of
    the evaluated set, is ever an example."""
    ids = {q.id for q in questions}
    asked = {normalize_question(q.question) for q in questions}
    answers = {normalize_text(a) for q in questions for a in q.references}

    def leaks(example: dict) -> bool:
        return (
            str(example.get("id")) in ids
            or normalize_question(example.get("question", "")) in asked
            or normalize_text(str(example.get("answer", ""))) in answers
        )

    return leaks


def fixed_split(questions: list[Question]) -> tuple[list[Question], list[Question]]:
    """(chosen on, reported on): the questions split in two by a stable hash of their id, so
    the settings ``--write-config`` chooses are measured on questions they were not chosen
    on, and a run next week splits the same way."""
    tune, report = [], []
    for question in questions:
        half = int(hashlib.sha1(question.id.encode()).hexdigest(), 16) % 2
        (tune if half == 0 else report).append(question)
    return tune, report


class Judge:
    """Scores an answer 0-10 against the reference with a model that did not write it."""

    def __init__(self, llm: ClaudeClient, model: str = EXPANSION_MODEL) -> None:
        self.llm, self.model = llm, model

    def score(self, question: str, reference: str, answer: str) -> int | None:
        prompt = f"Question: {question}\nReference answer: {reference}\nCandidate answer: {answer}\nScore:"
        try:
            reply = self.llm.complete(self.model, JUDGE_SYSTEM, prompt, max_tokens=8)
        except LLMError:
            return None
        match = re.search(r"\b(10|[0-9])\b", reply)
        return int(match.group(1)) if match else None


# The profiles an evaluation compares unless told otherwise (`kpack eval --profiles`, the
# eval_results asset): plain retrieval, the default, and every stage.
COMPARED_PROFILES = ("baseline", "balanced", "max")


def check_profiles(profiles: list[str]) -> list[str]:
    if not profiles:
        raise PackError(
            "no profile to evaluate: give --profiles a comma-separated list such as "
            "baseline,balanced"
        )
    return profiles


def evaluate(
    pack: str | Path,
    questions: list[Question],
    profiles: list[str],
    use_llm: bool = True,
    judge_model: str = EXPANSION_MODEL,
    anthropic_base_url: str | None = None,
    progress: Progress | None = None,
    calibrate_graph_weights: bool = False,
) -> dict:
    """Every question under every condition; returns the full results document (with the
    graph settings' calibration, retrieval.eval.graph_calibration, when asked for)."""
    check_profiles(profiles)
    with reading(pack) as reader:
        agents = {
            p: KnowledgeGraphAgent(
                reader, profile=p, use_llm=use_llm, anthropic_base_url=anthropic_base_url
            )
            for p in profiles
        }
        first = agents[profiles[0]]
        conditions = list(profiles) + ([NO_PACK] if first.llm.available else [])
        judge = None
        if first.llm.available:
            if judge_model in {a.settings["synthesis_model"] for a in agents.values()}:
                raise PackError(f"the judge model {judge_model} also answers; choose another judge")
            judge = Judge(ClaudeClient(base_url=anthropic_base_url), judge_model)
        records: dict[str, list[dict]] = {c: [] for c in conditions}
        held_out = leak_filter(*questions)
        for condition in conditions:
            agent = agents.get(condition, first)
            for number, question in enumerate(questions, start=1):
                record = _run_one(agent, condition, question, judge, held_out)
                records[condition].append(record)
                if progress:
                    progress(condition, number, len(questions), record)
        threshold = first.settings["context_confidence_threshold"]
        threshold_source = first.gate.source
        version = reader.version
        # Settings to write are chosen on one half of a fixed split and reported on the other.
        tune, report = fixed_split(questions) if calibrate_graph_weights else ([], questions)
        graph = calibrate_graph(reader, tune) if calibrate_graph_weights else None
        # The graph stages against baseline on these questions, beside what the version's
        # build measured and chose (retrieval.eval.evidence).
        graph_comparison = {
            "these_questions": graph_evidence(reader, questions, "these questions"),
            "version": read_record(reader.version_dir),
            "in_force": reader.graph_choice.summary(),
        }
    chosen_on = {q.id for q in tune} if calibrate_graph_weights else {q.id for q in questions}
    reported = {q.id for q in report}
    # Near-miss unanswerable questions are on topic by design: a similarity threshold that
    # refused them would refuse answerable ones too, so they are reported, not swept.
    sweep = calibrate(
        [
            (r["max_similarity"], r["out_of_domain"])
            for r in records[profiles[0]]
            if not r["unanswerable"] and r["id"] in chosen_on
        ]
    )
    return {
        "pack": reader.name,
        "pack_version": version,
        "evaluated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "answer_scoring": f"judge:{judge_model}" if judge else "containment+token_f1",
        "few_shot_policy": FEW_SHOT_POLICY,
        "conditions": conditions,
        "summary": {
            c: summarize([r for r in records[c] if r["id"] in reported]) for c in conditions
        },
        "split": {"chosen_on": len(chosen_on), "reported_on": len(reported)}
        if calibrate_graph_weights
        else None,
        "calibration": {
            "current_threshold": threshold,
            "current_threshold_source": threshold_source,
            "best_threshold": best_threshold(sweep, threshold),
            "sweep": sweep,
            "graph": graph,
        },
        "graph_evidence": graph_comparison,
        "questions": records,
    }


def declined(answer: str) -> bool:
    """True for an offline answer in which the pack says that its passages do not answer."""
    text = answer.strip()
    return text.startswith(DECLINED) or text == NO_CONTEXT_ANSWER


def refused(response: dict) -> bool:
    """Whether the pack declined to answer: the gate fired, nothing was found, or the answer
    says that no passage answers (an answer written by Claude is taken as an answer)."""
    return response["query_type"] in (GATED, NOTHING_FOUND) or declined(response["answer"] or "")


def _run_one(
    agent: KnowledgeGraphAgent,
    condition: str,
    question: Question,
    judge: Judge | None,
    held_out: Callable[[dict], bool],
) -> dict:
    record = {
        "id": question.id,
        "question": question.question,
        "out_of_domain": question.out_of_domain,
        "unanswerable": question.unanswerable,
    }
    if condition == NO_PACK:
        passages: list[dict] = []
        response = agent.answer_without_pack(question.question)
    else:
        passages = agent.search(question.question, k=max(HIT_DEPTHS))
        response = agent.query(question.question, exclude_examples=held_out)
    record.update(
        answer=response["answer"],
        query_type=response["query_type"],
        gated=response["query_type"] == GATED,
        refused=refused(response),
        max_similarity=response["trace"].get("max_similarity"),
        cited=bool(response["citations"]) and "[Source:" in response["answer"],
        citations=response["citations"],
        retrieved=[
            {"title": p["title"], "url": p["url"], "heading": p["heading"]} for p in passages
        ],
        hit_rank=first_hit_rank(passages, question) if passages and question.answerable else None,
        gold_pages=len({normalize_url(u) for u in question.gold_urls}),
        all_gold_rank=all_gold_rank(passages, question) if question.answerable else None,
        timings_ms=response["timings_ms"],
        tokens=response["token_usage"],
        few_shot=response["trace"].get("few_shot_questions", []),
        citations_checked=response.get("citations_checked"),
    )
    if question.answer_terms and question.answerable:
        record["contains_terms"] = contains_terms(response["answer"] or "", question.answer_terms)
    if question.references and question.answerable:
        record["contains_answer"] = contains_answer(response["answer"], question.references)
        record["token_f1"] = max(token_f1(response["answer"], r) for r in question.references)
        if judge and question.ground_truth:
            record["judge_score"] = judge.score(
                question.question, question.ground_truth, response["answer"]
            )
            record["judge_failed"] = record["judge_score"] is None
    return record
