"""The confidence gate's threshold: calibrated when a pack is built
(kpack.ingest.gate_calibration), read (kpack.gate) in the order kg_config.json > the build's
calibration > the embedding model's default, named in the trace and in `kpack status`; and the
evaluation's count of near-miss unanswerable questions."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import retrieval
from cli.main import main
from kpack.gate import (
    COVERAGE_RELIEF,
    COVERAGE_TARGET,
    FALLBACK_THRESHOLD,
    FROM_AGENT,
    FROM_CALIBRATION,
    FROM_CONFIG,
    FROM_OPTION,
    MODEL_THRESHOLDS,
    Vocabulary,
    coverage,
    model_threshold,
)
from kpack.ingest.gate_calibration import (
    IN_DOMAIN_REFUSAL_LIMIT,
    OUT_OF_DOMAIN_PROBES,
    SECTION_VECTOR,
    pack_probes,
)
from kpack.keyword_index import KeywordIndex
from retrieval.agent import KnowledgeGraphAgent
from retrieval.eval import evaluate, load_questions, markdown_summary
from retrieval.eval.metrics import summarize
from retrieval.eval.runner import declined
from tests.conftest import build, write_pack

ROOT = Path(__file__).resolve().parents[1]
# Real documentation, enough of it to calibrate on (a few hundred passages would be slower).
DOCS = ("pack-layout.md", "troubleshooting.md")
IN_DOMAIN = "How do I roll a pack back to the version before?"
OUT_OF_DOMAIN = "What is a good recipe for plum dumplings?"
FOREIGN = "How do I configure an ingress controller in Kubernetes?"
NEAR_MISSES = [
    {"id": "n1", "question": "Which Neo4j plugin loads a pack's graph?", "unanswerable": True},
    {"id": "n2", "question": "Is kpack sold with an enterprise licence?", "unanswerable": True},
]
QUESTIONS = [
    {
        "id": "rollback",
        "question": IN_DOMAIN,
        "answers": ["kpack rollback"],
    },
    {"id": "far", "question": OUT_OF_DOMAIN, "out_of_domain": True},
    *NEAR_MISSES,
]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def docs_pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gate")
    folder = write_pack(root, "docs", [f"file:pages/{name}" for name in DOCS])
    (folder / "pages").mkdir()
    for name in DOCS:
        shutil.copy(ROOT / "docs" / name, folder / "pages" / name)
    (folder / "eval").mkdir()
    (folder / "eval" / "questions.jsonl").write_text(
        "".join(json.dumps(q) + "\n" for q in QUESTIONS)
    )
    assert build(root, "docs").success
    return folder


def read_pages(folder: Path) -> str:
    return "\n".join(page.read_text() for page in sorted((folder / "pages").iterdir()))


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_the_build_records_a_threshold_calibrated_without_labelled_questions(docs_pack):
    gate = manifest_of(docs_pack)["gate"]
    assert gate["calibrated"] is True
    assert gate["model"] == MINILM and gate["model_default"] == MODEL_THRESHOLDS[MINILM]
    assert gate["probes"]["in_domain"] >= 20
    assert gate["probes"]["out_of_domain"] == len(OUT_OF_DOMAIN_PROBES)
    assert gate["refused"]["in_domain"] <= IN_DOMAIN_REFUSAL_LIMIT  # of the pack's own questions
    assert gate["refused"]["out_of_domain"] >= 0.9
    assert 0.1 <= gate["threshold"] <= 0.6 and gate["threshold"] == round(gate["threshold"], 2)
    assert "probes" in gate["method"] and gate["why"]


def test_a_probe_is_never_scored_against_the_passage_it_came_from(docs_pack):
    storage = docs_pack.parents[1] / "storage"
    sections = pq.read_table(storage / "sections" / "docs.parquet")
    chunks = pq.read_table(storage / "chunks" / "docs.parquet")
    text_of = {
        (s, i): c
        for s, i, c in zip(
            chunks["section_id"].to_pylist(),
            chunks["chunk_index"].to_pylist(),
            chunks["content"].to_pylist(),
            strict=True,
        )
    }
    probes = pack_probes(sections, chunks)
    assert probes == pack_probes(sections, chunks)  # deterministic
    for probe in probes:
        words = " ".join(probe.text.rstrip("?").split()[:4])
        own = [u for u, text in text_of.items() if words in " ".join(text.split())]
        if own and not probe.text.startswith(("How does", "What is", "Tell me about")):
            # a sentence probe: the passage quoting it is hidden from it (with its section's
            # own vector when it is near the top)
            assert any(unit in probe.hidden for unit in own), probe
            assert all(u[1] == SECTION_VECTOR or u in text_of for u in probe.hidden)


def test_readers_use_the_calibrated_threshold_and_say_so(docs_pack, capsys, monkeypatch):
    monkeypatch.setenv("KPACK_PACKS_DIR", str(docs_pack.parent))
    calibrated = manifest_of(docs_pack)["gate"]["threshold"]
    retrieval.close_all()
    result = retrieval.query(docs_pack, OUT_OF_DOMAIN, use_llm=False)
    trace = result["trace"]
    assert (trace["threshold"], trace["threshold_source"]) == (calibrated, FROM_CALIBRATION)
    assert result["query_type"] == "confidence_gated_fallback"
    assert f"({FROM_CALIBRATION})" in trace["candidates"][0]["why"]
    assert main(["query", "docs", IN_DOMAIN, "--no-llm", "--explain"]) == 0
    assert f"gate threshold from {FROM_CALIBRATION}" in capsys.readouterr().out
    assert main(["status", "docs", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["gate"]["threshold"] == calibrated
    assert status["gate"]["source"] == FROM_CALIBRATION

    # The seed's way of tuning: a subclass constant replaces the calibrated value...
    class Strict(KnowledgeGraphAgent):
        CONTEXT_CONFIDENCE_THRESHOLD = 0.99

    strict = Strict(docs_pack, use_llm=False)
    assert strict.gate.source == FROM_AGENT and strict.gate.threshold == 0.99
    assert strict.query(IN_DOMAIN)["query_type"] == "confidence_gated_fallback"
    # ...and an option passed with the call wins over everything.
    loose = KnowledgeGraphAgent(docs_pack, use_llm=False, context_confidence_threshold=0.0)
    assert (loose.gate.source, loose.gate.threshold) == (FROM_OPTION, 0.0)


def test_a_question_about_a_subject_the_pack_never_mentions_is_refused_with_the_reason(docs_pack):
    # Both questions clear the same similarity margin; only the words tell them apart. The
    # threshold is put just under each question's own best similarity, so the similarity
    # alone would answer both.
    retrieval.close_all()

    def asked(question: str) -> dict:
        open_gate = KnowledgeGraphAgent(docs_pack, use_llm=False, context_confidence_threshold=0)
        best = open_gate.query(question)["trace"]["max_similarity"]
        agent = KnowledgeGraphAgent(
            docs_pack, use_llm=False, context_confidence_threshold=round(best - 0.01, 3)
        )
        return agent.query(question)

    foreign = asked(FOREIGN)
    gate = foreign["trace"]["gate"]
    assert foreign["query_type"] == "confidence_gated_fallback" and foreign["sources"] == []
    assert gate["gated"] is True and gate["absent_terms"]
    # ...and they name words that really are on no page of the pack.
    words = set(re.findall(r"[a-z0-9]+", read_pages(docs_pack).lower()))
    assert not any(term in words for term in gate["absent_terms"])
    assert f"'{gate['absent_terms'][0]}'" in gate["why"]
    assert "in no passage of this pack" in gate["why"]
    assert gate["required_similarity"] > foreign["trace"]["max_similarity"]
    assert "gate: " in foreign["trace"]["candidates"][0]["why"]

    own = asked(IN_DOMAIN)  # its words are the pack's: the calibrated threshold is enough
    assert own["query_type"] == "vector_search" and own["sources"]
    assert own["trace"]["gate"]["gated"] is False
    assert own["trace"]["gate"]["coverage"] >= COVERAGE_TARGET
    assert own["trace"]["gate"]["required_similarity"] <= own["trace"]["threshold"]


def test_a_question_its_best_passage_covers_whole_needs_less_than_the_threshold(docs_pack):
    # The threshold is put just above the question's best similarity: the similarity alone
    # would refuse it, but every specific word of it is in the passage found.
    retrieval.close_all()
    open_gate = KnowledgeGraphAgent(docs_pack, use_llm=False, context_confidence_threshold=0)
    best = open_gate.query(IN_DOMAIN)["trace"]["max_similarity"]
    above = round(best + COVERAGE_RELIEF / 2, 3)
    agent = KnowledgeGraphAgent(docs_pack, use_llm=False, context_confidence_threshold=above)
    answered = agent.query(IN_DOMAIN)
    gate = answered["trace"]["gate"]
    assert answered["query_type"] == "vector_search" and answered["sources"]
    share = gate["coverage"]
    assert share == 1.0
    assert gate["required_similarity"] == pytest.approx(
        above - COVERAGE_RELIEF * (share - COVERAGE_TARGET) / (1 - COVERAGE_TARGET), abs=1e-4
    )
    assert f"so the gate asks for similarity {gate['required_similarity']:.3f}" in gate["why"]
    assert "reaches it" in gate["why"]
    # A question about a subject the pack never mentions gets no such relief at that line.
    foreign = agent.query(FOREIGN)
    assert foreign["query_type"] == "confidence_gated_fallback"
    assert foreign["trace"]["gate"]["required_similarity"] > above


def test_coverage_weighs_a_term_by_how_rare_it_is_in_the_pack():
    index = KeywordIndex.of(
        ["Roll a pack back with kpack rollback.", "A pack has versions.", "Versions of a pack."]
    )
    vocabulary = Vocabulary(index.passages, index.frequency)
    assert vocabulary.passages == 3 and vocabulary.frequency["pack"] == 3
    covered = coverage("How do I roll back a pack?", ["Roll a pack back."], vocabulary, 0.3)
    assert covered.share == 1.0 and not covered.absent
    assert covered.required == pytest.approx(0.3 - COVERAGE_RELIEF)
    # "versions" is in two passages, "Kubernetes" in none: missing it costs far more.
    missing_rare = coverage(
        "Pack versions on Kubernetes?", ["A pack has versions."], vocabulary, 0.3
    )
    missing_common = coverage("Pack versions on Kubernetes?", ["Kubernetes pack."], vocabulary, 0.3)
    assert missing_rare.absent == ("kubernetes",) and missing_rare.share < missing_common.share
    # Lacking the rare term raises the bar; lacking only a common one, it is still covered
    # enough to be asked a little less.
    assert missing_rare.required > 0.3 > missing_common.required


def test_the_model_table_gives_the_default_and_unknown_models_the_fallback():
    assert model_threshold("default") == MODEL_THRESHOLDS[MINILM] < 0.5  # MiniLM runs lower
    assert model_threshold("BAAI/bge-base-en-v1.5") == 0.5  # the seed's value, tuned for BGE
    assert model_threshold("someone/unknown-model") == FALLBACK_THRESHOLD


def test_eval_counts_near_miss_questions_the_pack_refuses(docs_pack):
    retrieval.close_all()
    questions, problems = load_questions(docs_pack / "eval" / "questions.jsonl", docs_pack)
    assert not problems and [q.unanswerable for q in questions] == [False, False, True, True]
    results = evaluate(docs_pack, questions, ["baseline"], use_llm=False)
    records = results["questions"]["baseline"]
    summary = results["summary"]["baseline"]
    near = [r for r in records if r["unanswerable"]]
    for record in near:
        assert record["refused"] == (record["gated"] or declined(record["answer"]))
        assert record["hit_rank"] is None and "contains_answer" not in record
    assert (summary["in_domain"], summary["out_of_domain"], summary["unanswerable"]) == (1, 1, 2)
    assert summary["unanswerable_refused"] == sum(r["refused"] for r in near)
    assert summary["gate_rate_out_of_domain"] == 1.0
    assert "Near-miss unanswerable questions refused" in markdown_summary(results)


def test_near_miss_refusals_by_hand():
    def record(**fields) -> dict:
        base = {"out_of_domain": False, "unanswerable": False, "gated": False, "refused": False}
        base |= {"cited": False}
        return base | {"retrieved": [], "hit_rank": None, "timings_ms": {}, "tokens": {}} | fields

    summary = summarize(
        [
            record(),
            record(out_of_domain=True, gated=True, refused=True),
            record(unanswerable=True, gated=True, refused=True),
            record(unanswerable=True, refused=True),  # "no passage answers"
            record(unanswerable=True),
        ]
    )
    assert summary["unanswerable"] == 3 and summary["unanswerable_refused"] == 2
    assert summary["refusal_rate_unanswerable"] == round(2 / 3, 4)
    assert summary["gate_rate_in_domain"] == 0.0 and summary["in_domain"] == 1


def test_a_question_cannot_be_both_out_of_domain_and_unanswerable(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text(
        json.dumps({"question": "Both?", "out_of_domain": True, "unanswerable": True}) + "\n"
    )
    questions, problems = load_questions(path, tmp_path)
    assert not questions
    assert problems == [
        "questions.jsonl line 1: a question is out_of_domain or unanswerable, not both"
    ]


def test_kg_config_wins_over_the_calibration(docs_pack, monkeypatch, capsys):
    # Last in this module: it publishes a version with kg_config.json's threshold.
    monkeypatch.setenv("KPACK_PACKS_DIR", str(docs_pack.parent))
    config = docs_pack / "kg_config.json"
    config.write_text(json.dumps({"query": {"context_confidence_threshold": 0.05}}))
    try:
        before = manifest_of(docs_pack)["gate"]
        assert build(docs_pack.parents[1], "docs").success  # a query setting: a new version
        after = manifest_of(docs_pack)["gate"]
        assert after["threshold"] == before["threshold"]  # the same pack, the same calibration
        retrieval.close_all()
        trace = retrieval.query(docs_pack, OUT_OF_DOMAIN, use_llm=False)["trace"]
        assert (trace["threshold"], trace["threshold_source"]) == (0.05, FROM_CONFIG)
        assert main(["status", "docs"]) == 0
        assert "0.05 (kg_config.json" in " ".join(capsys.readouterr().out.split())
    finally:
        config.unlink()
