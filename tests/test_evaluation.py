"""The evaluation harness: metrics by hand, the leak-free few-shot guarantee, the asset, the
judge, the CLI's progress and its clear errors."""

from __future__ import annotations

import json
import re

import pytest
from dagster import DagsterInstance, materialize

from assets.evaluate import accuracy_not_dropped, eval_results, gate_rarely_refuses_in_domain
from cli.main import main
from kpack.errors import PackError
from kpack.llm import ClaudeClient
from resources.pack_store import PackStore
from retrieval.eval import (
    Question,
    best_threshold,
    calibrate,
    candidate_sections,
    chart_png,
    evaluate,
    generate_questions,
    leak_filter,
    load_questions,
    load_results,
    questions_frame,
    summary_frame,
    write_threshold,
)
from retrieval.eval.metrics import (
    contains_answer,
    first_hit_rank,
    hit_at,
    mean_reciprocal_rank,
    percentile,
    token_f1,
)
from retrieval.registry import close_all, reading
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
    long_line = json.dumps({"question": "why " * 2500})
    path.write_text(
        '{"question": "ok?", "gold_urls": ["file:docs/a.md"]}\nnot json\n{"question": ""}\n'
        '{"question": "x", "answers": "not a list"}\n{"question": "y", "colour": "red"}\n'
        f"{long_line}\n" + '{"question": "also ok?"}\n'
    )
    questions, problems = load_questions(path, tmp_path)
    assert [q.question for q in questions] == ["ok?", "also ok?"]
    assert questions[0].gold_urls == [(tmp_path / "docs" / "a.md").as_uri()]
    assert [p.split(":")[0] for p in problems] == [
        f"questions.jsonl line {n}" for n in (2, 3, 4, 5, 6)
    ]
    assert "10,000 characters long; the limit is 8,000" in problems[-1]

    path.write_bytes(b'{"question": "ok?"}\n{"question": "caf\xe9?"}\n')
    with pytest.raises(PackError, match=r"not UTF-8 text \(line 2, byte 37\); save it as UTF-8"):
        load_questions(path, tmp_path)


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


def test_few_shot_examples_never_come_from_the_evaluated_questions(eval_pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    questions, _ = load_questions(eval_pack / "eval" / "questions.jsonl", eval_pack)
    evaluated, spare = questions[:2], questions[2]  # the pool is the pack's question file
    with fake_anthropic_server() as fake:
        results = evaluate(eval_pack, evaluated, ["balanced"], anthropic_base_url=fake.base)
    synthesis = [
        r["body"] for r in fake.requests if "passages" in r["body"]["messages"][0]["content"]
    ]
    assert len(synthesis) >= 2
    for question in evaluated:
        prompt = next(
            b["messages"][0]["content"]
            for b in synthesis
            if b["messages"][0]["content"].endswith(f"Question: {question.question}\nAnswer:")
        )
        examples = prompt.split("<passages>")[0]
        assert f"Question: {spare.question}" in examples  # a question not evaluated is offered
        for other in evaluated:  # ...never one being evaluated, graded or not
            assert other.question not in examples and other.ground_truth not in examples
    for record in results["questions"]["balanced"]:
        assert record["few_shot"] == [spare.question]
    # The filter also catches a differently worded example that carries the same answer.
    leaks = leak_filter(*evaluated)
    assert leaks({"id": "other", "question": "Name the cache variable", "answer": "widget_home"})
    assert leaks({"id": "install", "question": "Anything", "answer": "anything"})
    assert not leaks({"id": "other", "question": "How often?", "answer": "second Tuesday"})


def test_answer_level_metrics_and_a_split_for_chosen_settings(eval_pack, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    questions, _ = load_questions(eval_pack / "eval" / "questions.jsonl", eval_pack)
    questions[0].answer_terms = [["WIDGET_HOME"]]
    questions[1].answer_terms = [["no such term anywhere"]]
    results = evaluate(eval_pack, questions, ["baseline", "balanced"], use_llm=False)
    for profile in ("baseline", "balanced"):
        row = results["summary"][profile]
        records = results["questions"][profile]
        termed = [r["contains_terms"] for r in records if "contains_terms" in r]
        assert len(termed) == 2 and row["answer_terms"] == sum(termed) / 2
        assert termed[1] is False  # a term no answer holds is never found
        checked = [r["citations_checked"] for r in records if r["citations_checked"]]
        assert checked and row["citation_support"] == sum(c["supported"] for c in checked) / sum(
            c["checked"] for c in checked
        )
        assert "gold_span_top5" in row
    assert results["split"] is None
    split = evaluate(
        eval_pack, questions, ["balanced"], use_llm=False, calibrate_graph_weights=True
    )
    assert split["split"]["chosen_on"] + split["split"]["reported_on"] == len(questions)
    assert split["split"]["chosen_on"] and split["split"]["reported_on"]
    assert split["summary"]["balanced"]["questions"] == split["split"]["reported_on"]
    assert split["calibration"]["graph"]["questions"] <= split["split"]["chosen_on"]


def test_the_graph_grid_starts_from_the_graph_as_the_version_runs_it(eval_pack):
    """`kpack eval --write-config` compares the graph settings with what the version runs by
    default: the entity graph off where the version's own evidence turned it off (the grid
    took it as on whatever the evidence said, and measured a default no query ran)."""
    from kpack.graph_evidence import EVIDENCE_FILE, write_evidence
    from retrieval.eval.graph_calibration import calibrate_graph

    questions, _ = load_questions(eval_pack / "eval" / "questions.jsonl", eval_pack)
    version = (eval_pack / "pack.db").resolve().parent
    recorded = (version / EVIDENCE_FILE).read_bytes()  # the build's record, restored below
    try:
        for on in (False, True):
            evidence = {"enable_graph": on, "enable_doc_graph": False}
            write_evidence(version, {**evidence, "source": "an invented check", "why": "test"})
            close_all()  # a reader keeps the evidence it read
            with reading(eval_pack) as reader:
                assert calibrate_graph(reader, questions)["default"]["enable_graph"] is on
    finally:
        (version / EVIDENCE_FILE).write_bytes(recorded)
        close_all()


def test_judge_scores_with_another_model_and_a_failure_is_not_a_zero(eval_pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    questions, _ = load_questions(eval_pack / "eval" / "questions.jsonl", eval_pack)
    with fake_anthropic_server() as fake:
        results = evaluate(eval_pack, questions, ["balanced"], anthropic_base_url=fake.base)
    judged = [r["body"] for r in fake.requests if "grade answers" in r["body"]["system"]]
    assert judged and {b["model"] for b in judged} == {"claude-haiku-4-5"}
    balanced = results["summary"]["balanced"]
    assert results["conditions"] == ["balanced", "no_pack"]
    assert balanced["judge_accuracy"] == 1.0 and balanced["judge_failures"] == 0
    assert "accuracy" not in balanced  # containment and judge accuracy, each by its name
    assert results["answer_scoring"] == "judge:claude-haiku-4-5"

    with fake_anthropic_server(fail_with=500) as broken:
        failed = evaluate(eval_pack, questions, ["balanced"], anthropic_base_url=broken.base)
    row = failed["summary"]["balanced"]
    assert row["judge_failures"] == 3 and row["judge_accuracy"] is None  # failures, not zeros
    # The answers themselves fell back to the offline answer, saying why.
    answers = [r["answer"] for r in failed["questions"]["balanced"]]
    assert all(a.startswith("The Claude API did not answer") for a in answers)
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
    # One row per metric, one column per condition: narrow enough for the asset page.
    table = metadata["summary_table"].value
    assert [c.name for c in table.schema.columns] == ["metric", "baseline", "balanced", "max"]
    rows = {r.data["metric"]: r.data for r in table.records}
    assert rows["hit@5"]["balanced"] == 1.0
    assert "judge_accuracy" not in rows  # no judge ran: no empty row
    assert metadata["answer_scoring"].value == "containment+token_f1"
    # The chart is Markdown the UI shows inline (under 1000 characters), not behind a dialog.
    chart = metadata["chart"].value
    assert len(chart) < 1000
    assert "containment" in chart and "gated out" in chart
    assert [line.split()[0] for line in chart.splitlines()[1:4]] == ["hit@1", "balanced", "max"]
    assert metadata["chart_png"].value.endswith(".png")
    # Per-condition numbers, which the asset page plots inline across evaluations.
    assert metadata["balanced/hit@5"].value == 1.0
    assert {"baseline/mrr", "balanced/mrr", "max/containment"} <= set(metadata)
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
    with reading(eval_pack) as reader:
        sections = candidate_sections(reader, min_words=1)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ValueError, match="needs ANTHROPIC_API_KEY"):
        generate_questions(eval_pack, sections, 2, ClaudeClient())
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server() as fake:
        generated = generate_questions(eval_pack, sections, 2, ClaudeClient(base_url=fake.base))
    written = generated.written
    assert len(written) == 2 and written[0]["ground_truth"] == "WIDGET_HOME"
    candidates, problems = load_questions(eval_pack / "eval" / "candidates.jsonl", eval_pack)
    assert not problems and len(candidates) == 2 and candidates[0].gold_urls


def test_generate_that_writes_nothing_says_why(eval_pack, monkeypatch, capsys):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with reading(eval_pack) as reader:
        sections = candidate_sections(reader, min_words=1)
    with fake_anthropic_server(fail_with=401) as fake:
        refused = generate_questions(eval_pack, sections, 2, ClaudeClient(base_url=fake.base))
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base)
        code = main(["eval", "generate", str(eval_pack), "--n", "2"])
    assert refused.written == [] and refused.path is None
    assert "the Claude API did not answer" in refused.why_none() and "401" in refused.why_none()
    assert "(2x)" in refused.why_none()
    # The test site's sections are short: the command says so instead of writing 0 questions.
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "no candidate question was written: the pack has no section of 40 words" in err


def test_kpack_eval_shows_progress_per_question_and_compares_profiles(
    eval_pack, monkeypatch, capsys
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code = main(["eval", str(eval_pack), "--profiles", "baseline,balanced", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    progress = [line for line in err.splitlines() if line.startswith(("baseline", "balanced"))]
    assert len(progress) == 2 * len(QUESTIONS)
    assert re.match(r"baseline 1/4: hit at \d+, \d+ ms - Which environment variable", progress[0])
    assert progress[-1].startswith("balanced 4/4: gated")
    results = json.loads(out)
    summary = results["summary"]
    assert summary["baseline"]["judge_accuracy"] is None
    assert summary["baseline"]["containment"] is not None
    # The report compares the conditions side by side, as a table and as a chart.
    frame = summary_frame(results)
    assert list(frame.index) == ["baseline", "balanced"]
    assert {"hit@1", "hit@5", "mrr", "containment", "gate_rate_in_domain"} <= set(frame.columns)
    saved = sorted((eval_pack / "eval" / "results").glob("*.json"))[-1]
    assert load_results(saved)["conditions"] == ["baseline", "balanced"]
    # ... and question by question: where each ranked, whether it was gated.
    per_question = questions_frame(load_results(saved))
    assert len(per_question) == 2 * len(QUESTIONS)
    off_topic = per_question[per_question["id"] == "ood"]
    assert list(off_topic["condition"]) == ["baseline", "balanced"]
    assert off_topic["gated"].all() and off_topic["hit_rank"].isna().all()
    assert per_question["hit_rank"].iloc[0] == results["questions"]["baseline"][0]["hit_rank"]
    assert chart_png(results).startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profiles", ""], "no profile to evaluate"),
        (["--profiles", " , "], "no profile to evaluate"),
        (["--profiles", "baseline,turbo"], "unknown profile 'turbo'"),
    ],
)
def test_kpack_eval_rejects_bad_options_clearly(eval_pack, capsys, argv, message):
    code = main(["eval", str(eval_pack), "--no-llm", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and message in " ".join(err.split()) and "Traceback" not in out + err


def test_kpack_eval_of_a_question_file_that_is_not_utf8_is_a_clear_error(
    eval_pack, tmp_path, capsys
):
    questions = tmp_path / "latin1.jsonl"
    questions.write_bytes('{"question": "Où est le cache?"}\n'.encode("latin-1"))
    code = main(["eval", str(eval_pack), "--no-llm", "--questions", str(questions)])
    _, err = capsys.readouterr()
    assert code == 2 and "is not UTF-8 text (line 1" in " ".join(err.split())
