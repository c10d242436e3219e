"""The evaluation harness: metrics by hand, the leak-free few-shot guarantee, the asset, the judge."""

from __future__ import annotations

import json

import pytest
from dagster import DagsterInstance, materialize

from assets.evaluate import accuracy_not_dropped, eval_results, gate_rarely_refuses_in_domain
from resources.pack_store import PackStore
from retrieval.evaluation import (
    Question,
    best_threshold,
    calibrate,
    contains_answer,
    evaluate,
    first_hit_rank,
    hit_at,
    leak_filter,
    load_questions,
    mean_reciprocal_rank,
    percentile,
    token_f1,
    write_threshold,
)
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import fake_anthropic_server

QUESTIONS = [
    {
        "id": "env",
        "question": "Which environment variable sets where the sprocket cache lives?",
        "ground_truth": "WIDGET_HOME",
        "answers": ["WIDGET_HOME"],
        "gold_urls": ["/docs/guide.html"],
    },
    {
        "id": "install",
        "question": "What is the pip package name of the toolkit?",
        "ground_truth": "widget-toolkit",
        "answers": ["widget-toolkit"],
        "gold_urls": ["/docs/index.html"],
    },
    {
        "id": "release",
        "question": "How often are releases cut?",
        "ground_truth": "Every second Tuesday",
        "answers": ["second Tuesday"],
        "gold_urls": ["/docs/readme.md"],
    },
    {"id": "ood", "question": "Who won the football world cup in 1998?", "out_of_domain": True},
]


def test_retrieval_metrics_match_hand_computed_values():
    q = Question(1, "q", "q", answers=["Paris"], gold_urls=["https://x.org/b"])
    passages = [
        {"url": "https://x.org/a", "text": "nothing here"},
        {"url": "https://x.org/c", "text": "The capital is  PARIS."},  # case and spaces ignored
        {"url": "https://x.org/b#part", "text": "gold url, fragment dropped"},
    ]
    assert first_hit_rank(passages, q) == 2
    ranks = [1, 3, None, 10]
    assert hit_at(ranks, 1) == 0.25 and hit_at(ranks, 5) == 0.5 and hit_at(ranks, 10) == 0.75
    assert mean_reciprocal_rank(ranks) == pytest.approx((1 + 1 / 3 + 0 + 0.1) / 4)
    assert contains_answer("It is   in paris, France", ["Paris"]) and not contains_answer(
        "Lyon", ["Paris"]
    )


def test_answer_metrics_and_percentiles_match_hand_computed_values():
    assert token_f1("the cat sat", "a cat sat down") == pytest.approx(
        2 * (2 / 2) * (2 / 3) / (1 + 2 / 3)
    )
    assert token_f1("", "x") == 0.0
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([5], 0.95) == 5
    rows = calibrate(
        [(0.9, False), (0.45, False), (0.3, True), (None, True)], thresholds=(0.25, 0.4, 0.5)
    )
    assert [(r["in_domain_answered"], r["out_of_domain_refused"]) for r in rows] == [
        (1.0, 0.5),
        (1.0, 1.0),
        (0.5, 1.0),
    ]
    assert best_threshold(rows, default=0.5) == 0.4


def test_question_file_reports_bad_lines_with_their_numbers(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text(
        '{"question": "ok?", "gold_urls": ["file:docs/a.md"]}\nnot json\n{"question": ""}\n'
        '{"question": "x", "answers": "not a list"}\n{"question": "y", "colour": "red"}\n'
    )
    questions, problems = load_questions(path, tmp_path)
    assert [q.question for q in questions] == ["ok?"]
    assert questions[0].gold_urls == [(tmp_path / "docs" / "a.md").as_uri()]
    assert [p.split(":")[0] for p in problems] == [
        f"questions.jsonl line {n}" for n in (2, 3, 4, 5)
    ]


@pytest.fixture(scope="module")
def eval_pack(site, tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluation")
    pages = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
    config = {"fetch": TEST_FETCH, "query": {"context_confidence_threshold": 0.25}}
    folder = write_pack(root, "evalpack", [site.url(p) for p in pages], config)
    (folder / "eval").mkdir()
    lines = [{**q, "gold_urls": [site.url(u) for u in q.get("gold_urls", [])]} for q in QUESTIONS]
    (folder / "eval" / "questions.jsonl").write_text("\n".join(json.dumps(q) for q in lines) + "\n")
    assert build(root, "evalpack").success
    return folder


def test_few_shot_pool_never_holds_the_graded_question_or_its_answer(eval_pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    questions, _ = load_questions(eval_pack / "eval" / "questions.jsonl", eval_pack)
    with fake_anthropic_server() as fake:
        results = evaluate(eval_pack, questions, ["balanced"], anthropic_base_url=fake.base)
    synthesis = [
        r["body"] for r in fake.requests if "passages" in r["body"]["messages"][0]["content"]
    ]
    assert len(synthesis) >= 3
    for question in questions[:3]:
        prompt = next(
            b["messages"][0]["content"]
            for b in synthesis
            if b["messages"][0]["content"].endswith(f"Question: {question.question}\nAnswer:")
        )
        examples = prompt.split("<passages>")[0]
        assert "=== Example 1 ===" in examples  # the other questions are offered...
        assert question.question not in examples  # ...never the graded one
        assert question.ground_truth not in examples
    for record in results["questions"]["balanced"]:
        assert record["question"] not in record["few_shot"]
    # The filter also catches a differently worded example that carries the same answer.
    leaks = leak_filter(questions[0])
    assert leaks({"id": "other", "question": "Name the cache variable", "answer": "widget_home"})
    assert not leaks({"id": "other", "question": "Name the package", "answer": "widget-toolkit"})


def test_judge_scores_with_another_model_and_a_failure_is_not_a_zero(eval_pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    questions, _ = load_questions(eval_pack / "eval" / "questions.jsonl", eval_pack)
    with fake_anthropic_server() as fake:
        results = evaluate(eval_pack, questions, ["balanced"], anthropic_base_url=fake.base)
    judged = [r["body"] for r in fake.requests if "grade answers" in r["body"]["system"]]
    assert judged and {b["model"] for b in judged} == {"claude-haiku-4-5"}
    balanced = results["summary"]["balanced"]
    assert results["conditions"] == ["balanced", "no_pack"]
    assert balanced["accuracy"] == 1.0 and balanced["judge_failures"] == 0
    assert results["answer_scoring"] == "judge:claude-haiku-4-5"

    with fake_anthropic_server(fail_with=500) as broken:
        failed = evaluate(eval_pack, questions, ["balanced"], anthropic_base_url=broken.base)
    row = failed["summary"]["balanced"]
    assert row["judge_failures"] == 3 and row["accuracy"] is None  # failures, not zeros
    with pytest.raises(ValueError, match="also answers"):
        evaluate(
            eval_pack,
            questions,
            ["balanced"],
            judge_model="claude-opus-4-6",
            anthropic_base_url="http://127.0.0.1:9",
        )


def test_eval_results_asset_materializes_with_summary_chart_and_checks(eval_pack, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("packs", ["evalpack"])
    result = materialize(
        [eval_results, gate_rarely_refuses_in_domain, accuracy_not_dropped],
        partition_key="evalpack",
        instance=instance,
        resources={"pack_store": PackStore(packs_dir=str(eval_pack.parent))},
        selection=["eval_results"],
    )
    assert result.success
    metadata = result.asset_materializations_for_node("eval_results")[0].metadata
    assert metadata["questions"].value == 4
    assert "| balanced |" in metadata["summary"].value
    assert metadata["chart"].value.startswith("![evaluation chart](data:image/png;base64,")
    runs = list((eval_pack / "eval" / "results").glob("*"))
    assert {p.suffix for p in runs} == {".json", ".md", ".png"}
    saved = json.loads(next(p for p in runs if p.suffix == ".json").read_text())
    assert saved["conditions"] == ["baseline", "balanced", "max"]
    assert saved["summary"]["balanced"]["hit@5"] == 1.0
    assert saved["summary"]["balanced"]["gate_rate_out_of_domain"] == 1.0
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert set(checks) == {"gate_rarely_refuses_in_domain", "accuracy_not_dropped"}

    path = write_threshold(eval_pack, saved["calibration"]["best_threshold"])
    assert (
        json.loads(path.read_text())["query"]["context_confidence_threshold"]
        == saved["calibration"]["best_threshold"]
    )


def test_generate_writes_candidate_questions_through_claude_and_needs_a_key(eval_pack, monkeypatch):
    from kpack.llm import ClaudeClient
    from retrieval.evaluation import generate_questions
    from retrieval.pack import open_pack

    pack = open_pack(eval_pack)
    sections = [(s.article_url, s.heading, s.content) for s in pack.sections.values()]
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ValueError, match="needs ANTHROPIC_API_KEY"):
        generate_questions(eval_pack, sections, 2, ClaudeClient())
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server() as fake:
        written = generate_questions(eval_pack, sections, 2, ClaudeClient(base_url=fake.base))
    assert len(written) == 2 and written[0]["ground_truth"] == "WIDGET_HOME"
    candidates, problems = load_questions(eval_pack / "eval" / "candidates.jsonl", eval_pack)
    assert not problems and len(candidates) == 2 and candidates[0].gold_urls
