"""Evaluation metrics: retrieval (hit@k, MRR, and for questions with several gold pages the
share with all of them in the top k), answers (containment, token F1, judge accuracy), gate
rates, near-miss refusals, citation rate, latency percentiles and tokens per condition."""

from __future__ import annotations

import statistics
import string
from collections import Counter

from kpack.packs import normalize_url
from retrieval.eval.questions import Question

HIT_DEPTHS = (1, 5, 10)
ALL_GOLD_DEPTHS = (5, 10)
JUDGE_PASS = 7
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    return " ".join(text.lower().split())


def contains_answer(text: str, answers: list[str]) -> bool:
    haystack = normalize_text(text)
    return any(normalize_text(a) and normalize_text(a) in haystack for a in answers)


def contains_terms(text: str, groups: list[list[str]]) -> bool:
    """True when the text holds one term of every group (case ignored)."""
    haystack = text.lower()
    return all(any(term.lower() in haystack for term in group) for group in groups)


def is_hit(passage: dict, question: Question) -> bool:
    if question.gold_urls and normalize_url(passage["url"]) in {
        normalize_url(u) for u in question.gold_urls
    }:
        return True
    return bool(question.answers) and contains_answer(passage["text"], question.answers)


def first_hit_rank(passages: list[dict], question: Question) -> int | None:
    return next((rank for rank, p in enumerate(passages, start=1) if is_hit(p, question)), None)


def all_gold_rank(passages: list[dict], question: Question) -> int | None:
    """For a question with several gold pages (a two-page question: the answer needs each),
    the rank by which every one of them has a passage; None when one is missing, or when the
    question has fewer than two gold pages."""
    gold = {normalize_url(u) for u in question.gold_urls}
    if len(gold) < 2:
        return None
    first: dict[str, int] = {}
    for rank, passage in enumerate(passages, start=1):
        url = normalize_url(passage["url"])
        if url in gold:
            first.setdefault(url, rank)
    return max(first.values()) if len(first) == len(gold) else None


def hit_at(ranks: list[int | None], k: int) -> float:
    return sum(1 for r in ranks if r is not None and r <= k) / len(ranks) if ranks else 0.0


def mean_reciprocal_rank(ranks: list[int | None]) -> float:
    return sum(1.0 / r for r in ranks if r) / len(ranks) if ranks else 0.0


def _tokens(text: str) -> list[str]:
    return [t for t in text.lower().translate(_PUNCT).split() if t not in {"a", "an", "the"}]


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD's token F1: overlap of bags of words, articles and punctuation ignored."""
    predicted, expected = _tokens(prediction), _tokens(reference)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if not predicted or not expected or common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _share(records: list[dict], key: str) -> float | None:
    scored = [r[key] for r in records if key in r]
    return round(sum(scored) / len(scored), 4) if scored else None


def _rate(records: list[dict], key: str) -> float | None:
    return round(sum(r[key] for r in records) / len(records), 4) if records else None


def _support(records: list[dict]) -> float | None:
    checked = sum(r["citations_checked"]["checked"] for r in records)
    supported = sum(r["citations_checked"]["supported"] for r in records)
    return round(supported / checked, 4) if checked else None


def summarize(records: list[dict]) -> dict:
    """One condition's metrics over its question records (in domain: the answerable ones).

    ``containment`` is the share of answers containing a reference; ``judge_accuracy`` the
    share a judge model graded 7 of 10 or more (None without a judge).
    """
    inside = [r for r in records if not r["out_of_domain"] and not r["unanswerable"]]
    outside = [r for r in records if r["out_of_domain"]]
    near_misses = [r for r in records if r["unanswerable"]]
    ranked = [r["hit_rank"] for r in inside if r["retrieved"]]
    judged = [r["judge_score"] for r in inside if r.get("judge_score") is not None]
    stages: dict[str, list[float]] = {}
    for record in records:
        for stage, ms in record["timings_ms"].items():
            stages.setdefault(stage, []).append(ms)
    f1 = [r["token_f1"] for r in inside if "token_f1" in r]
    several = [r["all_gold_rank"] for r in inside if r["retrieved"] and r.get("gold_pages", 0) > 1]
    return {
        "questions": len(records),
        "in_domain": len(inside),
        "out_of_domain": len(outside),
        "unanswerable": len(near_misses),
        **{f"hit@{k}": round(hit_at(ranked, k), 4) for k in HIT_DEPTHS},
        "mrr": round(mean_reciprocal_rank(ranked), 4),
        # Questions with several gold pages: the share with every one in the top k.
        "several_gold": len(several),
        **{
            f"all_gold@{k}": round(hit_at(several, k), 4) if several else None
            for k in ALL_GOLD_DEPTHS
        },
        "judge_accuracy": round(sum(1 for s in judged if s >= JUDGE_PASS) / len(judged), 4)
        if judged
        else None,
        "judge_failures": sum(1 for r in inside if r.get("judge_failed")),
        "containment": _share(inside, "contains_answer"),
        # Answer-level: every answer-term group (questions with answer_terms), a gold span in
        # answers whose gold passage was in the top 5, and how many cited statements the
        # citation check found supported by their passage.
        "answer_terms": _share(inside, "contains_terms"),
        "gold_span_top5": _share(
            [r for r in inside if r.get("hit_rank") and r["hit_rank"] <= 5], "contains_answer"
        ),
        "citation_support": _support([r for r in records if r.get("citations_checked")]),
        "token_f1": round(statistics.mean(f1), 4) if f1 else None,
        "gate_rate": _rate(records, "gated"),
        "gate_rate_out_of_domain": _rate(outside, "gated"),
        "gate_rate_in_domain": _rate(inside, "gated"),
        # Near misses refused by the gate or by an answer saying no passage answers.
        "unanswerable_refused": sum(1 for r in near_misses if r["refused"]),
        "refusal_rate_unanswerable": _rate(near_misses, "refused"),
        "citation_rate": _rate([r for r in inside if not r["gated"]], "cited"),
        "latency_ms": {
            s: {"p50": round(percentile(v, 0.5), 2), "p95": round(percentile(v, 0.95), 2)}
            for s, v in stages.items()
        },
        "tokens": {
            k: sum(r["tokens"].get(k, 0) for r in records)
            for k in ("input_tokens", "output_tokens", "api_calls")
        },
    }
