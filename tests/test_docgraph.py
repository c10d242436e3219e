"""The documentation graph (issue 23): section links through anchors, API identifiers defined
by signatures, mention counts that count naming passages, the documentation graph stage
(retrieval.docgraph) and the per-pack evidence that decides which graph stages run
(retrieval.eval.evidence, kpack.graph_evidence).

The pack is built once for the module from three Sphinx-like HTML pages: a tutorial whose
"Keeping settings between runs" section links to the reference entry ``prefs.store`` (a
``<dt>`` signature of the reference page), a reference page, and a garden page that shares a
few words with the question and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import retrieval
from cli.main import main
from kpack.graph import build_entity_graph
from kpack.graph_evidence import EVIDENCE_FILE, read_choice
from kpack.ingest.mentions import chunk_mentions
from kpack.ingest.sections import parse_pages
from retrieval.agent import KnowledgeGraphAgent
from retrieval.candidates import embed_question
from retrieval.docgraph import reached_passages
from retrieval.eval import OFFLINE_MARK, evaluate, load_questions
from retrieval.eval.evidence import BASELINE, FOUND, choose, choose_crowding, sign_test
from retrieval.eval.questions import Question
from retrieval.query import Query
from retrieval.registry import close_all, reading
from tests.conftest import build, write_pack

QUESTION = "How can my program keep its settings between runs?"
TUTORIAL = """<html><head><title>Widget tutorial</title></head><body><div role="main">
<section id="the-widget-tutorial"><h1>The Widget Tutorial</h1>
<p>This tutorial walks through the widget toolkit one step at a time, from the first window to a
finished program that remembers what its user chose.</p>
<section id="keeping-settings"><h2>Keeping settings between runs</h2>
<p>While your program runs, its settings live in a dictionary. To keep them between runs, hand
the dictionary and an open file to <a class="reference internal"
href="reference.html#prefs.store"><code>prefs.store()</code></a> when the program closes, and the
next run has the settings the user chose last time.</p>
</section>
<section id="loading-settings"><h2>Loading settings when the program starts</h2>
<p>When the program starts, open the file the settings were kept in and read the dictionary back
before the first window opens, so the program starts with the settings of its last run.</p>
</section>
<section id="windows"><h2>Opening windows</h2>
<p>A window is opened with a title and a size; widgets are placed in it row by row, and the
window is shown once every widget is in place (see <a href="#missing-anchor">later</a> and
<a href="reference.html">the reference</a>).</p>
</section>
</section></div></body></html>
"""
REFERENCE = """<html><head><title>prefs reference</title></head><body><div role="main">
<section id="module-prefs"><h1>prefs — storing program preferences</h1>
<p>The prefs module stores the preferences of a program in a file and reads them back.</p>
<section id="functions"><h2>Functions</h2>
<dl class="py function"><dt class="sig sig-object py" id="prefs.store"><span
class="sig-prename">prefs.</span><span class="sig-name">store</span>(obj, fp, *, indent=None)</dt>
<dd><p>Save obj, for example the options a user picked in your program, to the open file
fp, so that the program can restore them with prefs.fetch() the next time it runs. With indent,
each nesting level is indented by that many spaces.</p></dd></dl>
<dl class="py function"><dt class="sig sig-object py" id="prefs.fetch"><span
class="sig-prename">prefs.</span><span class="sig-name">fetch</span>(fp)</dt>
<dd><p>Deserialize the prefs stream read from fp into a Python object; raises PrefsError when
the stream is truncated.</p></dd></dl>
</section></section></div></body></html>
"""
GARDEN = """<html><head><title>Garden</title></head><body><div role="main">
<h1>Garden notes</h1><p>Tomatoes need sun and steady watering; basil keeps aphids away from
them, and a mulch of straw keeps the soil moist between runs of dry weather.</p></div></body></html>
"""
PAGES = {"tutorial.html": TUTORIAL, "reference.html": REFERENCE, "garden.html": GARDEN}
LINK_PATH = "via link from 'Keeping settings between runs' to 'prefs.store'"


def page_rows() -> list[dict]:
    base = "https://docs.example.org/"
    return [
        {
            "url": base + name,
            "final_url": base + name,
            "format": "html",
            "body": body,
            "title_hint": None,
            "content_hash": name,
        }
        for name, body in PAGES.items()
    ]


def built_widgets(root: Path) -> Path:
    """The pack of PAGES, built in the workspace ``root``."""
    folder = write_pack(root, "widgets", [f"file:pages/{name}" for name in PAGES], {})
    (folder / "pages").mkdir()
    for name, text in PAGES.items():
        (folder / "pages" / name).write_text(text)
    assert build(root, "widgets").success
    return folder


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    return built_widgets(tmp_path_factory.mktemp("docgraph"))


def headings(hits) -> list[str]:
    return [hit["heading"].split(" > ")[-1] for hit in hits]


# Parsing: anchors, links, definitions


def test_section_links_resolve_through_anchors_to_the_defining_section():
    parsed = parse_pages(page_rows())
    title = {s["section_id"]: s["heading_path"].split(" > ")[-1] for s in parsed.sections}
    links = {
        (title[link["source_section_id"]], title[link["target_section_id"]], link["anchor"])
        for link in parsed.section_links
    }
    # The tutorial's link reaches the reference section that holds the <dt id="prefs.store">;
    # a link without an anchor reaches the page's first section; an anchor the page does not
    # hold reaches nothing.
    assert ("Keeping settings between runs", "Functions", "prefs.store") in links
    assert ("Opening windows", "prefs — storing program preferences", "") in links
    assert not any(anchor == "missing-anchor" for _, _, anchor in links)
    defines = {title[s["section_id"]]: s["defines"] for s in parsed.sections if s["defines"]}
    assert defines == {"Functions": ["prefs.store", "prefs.fetch"]}


def test_markdown_links_reach_the_section_of_a_headings_slug():
    base = "https://docs.example.org/"
    pages = [
        {
            "url": base + "guide.md",
            "final_url": base + "guide.md",
            "format": "markdown",
            "body": "# Guide\n\nIntro.\n\n## Stage 5: embeddings\n\nVectors.\n\n"
            "## `prefs.store(obj, fp)`\n\nStores it.\n",
            "title_hint": None,
            "content_hash": "g",
        },
        {
            "url": base + "index.md",
            "final_url": base + "index.md",
            "format": "markdown",
            "body": "# Index\n\nSee [the stage](guide.md#stage-5-embeddings) for details.\n",
            "title_hint": None,
            "content_hash": "i",
        },
    ]
    parsed = parse_pages(pages)
    title = {s["section_id"]: s["title"] for s in parsed.sections}
    assert [
        (title[x["source_section_id"]], title[x["target_section_id"]]) for x in parsed.section_links
    ] == [("Index", "Stage 5: embeddings")]
    assert [s["defines"] for s in parsed.sections if s["defines"]] == [["prefs.store"]]


# Mention counts


def test_an_entitys_mention_count_is_the_passages_that_name_it():
    """A page title has structural edges to every passage of its page and of every page
    linking to it; only the passages that spell it count as mentions."""
    passages = [("a1", "A"), ("a2", "A"), ("b1", "B"), ("c1", "C")]
    entities = [("alpha", "Alpha"), ("beta", "Beta")]
    mentions = [("a1", "alpha", False), ("a2", "alpha", False), ("b1", "alpha", True)]
    graph = build_entity_graph(
        passages,
        entities,
        mentions,
        titles={"A": "alpha", "B": "beta"},
        links=[("B", "A"), ("C", "A")],
    )
    alpha = graph.entity_node("alpha")
    assert alpha is not None
    assert len(graph.neighbours(alpha)) == 4  # every passage is joined to it ...
    assert graph.mentions_of(alpha) == 1  # ... one names it


def test_a_chunk_names_an_entity_when_it_spells_it():
    chunks = pa.table(
        {
            "chunk_id": ["s-000", "s-001"],
            "section_id": ["s", "s"],
            "content": ["Call json.dump with ensure_ascii=False.", "Then close the file."],
        }
    )
    mentions = pa.table(
        {
            "article_url": ["u"] * 3,
            "section_id": ["s"] * 3,
            "entity_id": ["json.dump", "ensure_ascii", "a paraphrased name"],
        }
    )
    rows = chunk_mentions(chunks, mentions).to_pylist()
    named = {(r["chunk_id"], r["entity_id"]) for r in rows if r["named"]}
    assert named == {("s-000", "json.dump"), ("s-000", "ensure_ascii")}
    # Named by no chunk: every chunk of its section mentions it, none names it.
    assert {r["chunk_id"] for r in rows if r["entity_id"] == "a paraphrased name"} == {
        "s-000",
        "s-001",
    }


# The documentation graph stage


def test_the_reference_passage_comes_in_through_the_tutorials_link(pack):
    # API search off: its definition search finds the entry by meaning on its own.
    flat = retrieval.search(
        pack, QUESTION, k=2, profile="balanced", enable_doc_graph=False, enable_api_search=False
    )
    assert headings(flat) == [
        "Keeping settings between runs",
        "Loading settings when the program starts",
    ]
    hits = retrieval.search(
        pack, QUESTION, k=2, profile="balanced", enable_doc_graph=True, enable_api_search=False
    )
    # The tutorial's second passage gives its place to the page its link leads to, and the
    # trace names the path.
    assert headings(hits) == ["Keeping settings between runs", "Functions"]
    assert LINK_PATH in hits[1]["why"]
    assert "in place of a second passage of 'The Widget Tutorial'" in hits[1]["why"]


def test_definitions_above_the_ann_crossover_are_found_through_their_index_as_exactly(
    tmp_path, monkeypatch
):
    """A pack with more entries than the ANN crossover searches their vectors through an IVF
    index (as its chunks' and sections'), and finds what the exact scan finds."""
    monkeypatch.setenv("KPACK_ANN_MIN_VECTORS", "2")
    folder = built_widgets(tmp_path)
    close_all()
    with reading(folder) as reader:
        graph = reader.doc_graph
        assert graph is not None and graph.ann is not None
        vector = reader.embed([QUESTION])[0]
        through_index = graph.nearest(vector, 2)
        assert sorted(d.name for d, _ in through_index) == ["prefs.fetch", "prefs.store"]
        graph.ann = None
        assert graph.nearest(vector, 2) == through_index


def test_a_question_writing_an_identifier_reaches_its_definition(pack):
    with reading(pack) as reader:
        agent = KnowledgeGraphAgent(reader, profile="balanced", use_llm=False)
        query = Query(
            text="When does prefs.fetch raise an error?",
            k=2,
            reader=reader,
            settings=agent._plan(reader).settings,
            llm=agent.llm,
        )
        embed_question(query)
        reached = reached_passages(query, reader.doc_graph, seeds=[])
        [(row, route)] = reached.items()
        assert reader.sections[reader.chunk_ids[row].rsplit("-", 1)[0]].title == "Functions"
    assert route.words(str) == "defines 'prefs.fetch', which the question writes"


# Evidence: which graph stages a pack runs


def test_the_build_records_its_graph_evidence_and_status_says_why(
    pack, capsys, monkeypatch, tmp_path
):
    version = (pack / ".versions" / "current").resolve()
    record = json.loads((version / EVIDENCE_FILE).read_text())
    assert record["enable_graph"] is False and record["enable_doc_graph"] is False
    assert "too few" in record["why"] and "self-check" in record["source"]
    # Off by the evidence: balanced runs neither graph; a caller's option still switches one on.
    assert not {"doc_graph", "graph_retrieval", "graph_second_hop"} & set(
        retrieval.agent(pack, "balanced", use_llm=False).stages
    )
    assert (
        "doc_graph"
        in retrieval.agent(pack, "balanced", use_llm=False, enable_doc_graph=True).stages
    )
    monkeypatch.setenv("KPACK_PACKS_DIR", str(pack.parent))
    monkeypatch.setenv("KPACK_STORAGE", str(pack.parent.parent / "storage"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert main(["status", pack.name]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "entity graph off, documentation graph off, page crowding off (measured on a self-check"
        in out
    )
    assert "too few to show that a graph stage or page crowding does not lose to baseline" in out
    # Evidence that keeps the documentation graph turns it on in balanced, never in baseline.
    (version / EVIDENCE_FILE).write_text(json.dumps(record | {"enable_doc_graph": True}))
    close_all()
    try:
        assert read_choice(version).enable_doc_graph
        assert "doc_graph" in KnowledgeGraphAgent(pack, profile="balanced").stages
        assert "doc_graph" not in KnowledgeGraphAgent(pack, profile="baseline").stages
    finally:
        (version / EVIDENCE_FILE).write_text(json.dumps(record))
        close_all()


def test_evidence_that_keeps_page_crowding_crowds_the_ranking_and_an_option_still_wins(pack):
    """A version whose evidence kept page crowding ranks one passage of a page before every
    other page's best; a record from before crowding was measured, and a caller's option of
    0, leave the ranking uncrowded."""
    version = (pack / ".versions" / "current").resolve()
    record = json.loads((version / EVIDENCE_FILE).read_text())
    question = "How does the widget tutorial open windows and keep settings?"

    def pages_ranked(**options) -> list[str]:
        close_all()  # a reader keeps the evidence it read
        hits = retrieval.search(pack, question, k=4, profile="baseline", **options)
        return [hit["url"].rsplit("/", 1)[-1].split("#")[0] for hit in hits]

    assert "passages_per_page" not in {k for k in record if record[k]}
    uncrowded = pages_ranked()
    assert uncrowded[:2] == ["tutorial.html", "tutorial.html"], uncrowded
    try:
        (version / EVIDENCE_FILE).write_text(json.dumps(record | {"passages_per_page": 1}))
        crowded = pages_ranked()
        assert crowded[0] == "tutorial.html" and crowded[1] != "tutorial.html", crowded
        assert len(set(crowded)) > len(set(uncrowded)), (crowded, uncrowded)
        assert KnowledgeGraphAgent(pack, profile="balanced").settings["passages_per_page"] == 1
        assert "page crowding on (1 per page)" in read_choice(version).summary()
        assert pages_ranked(passages_per_page=0) == uncrowded
    finally:
        (version / EVIDENCE_FILE).write_text(json.dumps(record))
        close_all()


def test_page_crowding_is_kept_only_when_it_loses_nothing_and_finds_more():
    uncrowded = row(0.7, 0.8, 0.70, 0.5)
    assert choose_crowding(row(0.7, 0.9, 0.72, 0.5), uncrowded) == (
        1,
        "page crowding on: hit@5 0.800 -> 0.900, mrr 0.700 -> 0.720",
    )
    assert choose_crowding(row(0.6, 0.9, 0.72, 0.6), uncrowded) == (
        0,
        "page crowding off: it loses on hit@1",
    )
    no_more_found = (0, "page crowding off: it finds no more of the questions")
    assert choose_crowding(uncrowded, uncrowded) == no_more_found
    # A better MRR alone (a rank swapped) does not turn it on.
    assert choose_crowding(row(0.7, 0.8, 0.71, 0.5), uncrowded) == no_more_found


def row(
    hit1: float, hit5: float, mrr: float, all5: float | None, *, asked: int = 10, several: int = 10
) -> dict:
    several = several if all5 is not None else 0
    return {
        "hit@1": hit1,
        "hit@5": hit5,
        "mrr": mrr,
        "all_gold@5": all5,
        "questions": asked,
        "several_gold": several,
    }


def outcomes(found: set[int], asked: int = 20) -> dict:
    """A configuration's score with the questions it found (FOUND)."""
    return row(0.5, len(found) / asked, 0.6, None, asked=asked) | {
        FOUND: [number in found for number in range(asked)]
    }


def test_both_graphs_run_unless_a_cheaper_configuration_finds_significantly_more():
    both = outcomes(set(range(15)))
    # The documentation graph finds two questions both graphs miss and misses one they find:
    # a point of difference a sample of the questions decides, not evidence.
    rows = {
        BASELINE: outcomes(set(range(14))),
        "documentation graph": outcomes(set(range(14)) | {15, 16}),
        "entity graph": outcomes(set(range(15))),
        "both graphs": both,
    }
    chosen, why = choose(rows)
    assert chosen == "both graphs"
    assert why.startswith("no configuration finds significantly more questions than both graphs")
    assert (
        "documentation graph finds 2 that both graphs miss and misses 1 they find (p 0.50)" in why
    )
    # Five found that both graphs miss, none missed: significant (p 1/32); of two such, the
    # one finding more wins, and the cheaper of two that find as many.
    rows[BASELINE] = outcomes(set(range(20)))
    assert choose(rows) == (
        BASELINE,
        "baseline finds significantly more questions than both graphs (baseline finds 5 that "
        "both graphs miss and misses 0 they find (p 0.03); documentation graph finds 2 that "
        "both graphs miss and misses 1 they find (p 0.50); entity graph finds 0 that both "
        "graphs miss and misses 0 they find (p 1.00))",
    )
    rows["documentation graph"] = outcomes(set(range(20)))
    assert choose(rows)[0] == BASELINE
    assert sign_test(5, 0) == pytest.approx(1 / 32) and sign_test(0, 0) == 1.0


# Evaluation: two-page questions, the graph comparison, offline questions


def test_eval_reports_two_page_questions_and_the_graph_comparison(pack):
    tutorial, reference = (
        str((pack / "pages" / n).resolve().as_uri()) for n in PAGES if n != "garden.html"
    )
    questions = [
        Question(1, QUESTION, "two", gold_urls=[tutorial, reference]),
        Question(2, "How are windows opened?", "one", gold_urls=[tutorial]),
    ]
    results = evaluate(pack, questions, ["baseline"], use_llm=False)
    summary = results["summary"]["baseline"]
    assert summary["several_gold"] == 1 and summary["all_gold@10"] == 1.0
    [two, one] = results["questions"]["baseline"]
    assert two["all_gold_rank"] is not None and one["all_gold_rank"] is None
    comparison = results["graph_evidence"]
    assert "too few" in comparison["these_questions"]["why"]
    assert comparison["version"]["chosen"] == BASELINE


def test_offline_generate_writes_marked_candidates_and_a_key_is_not_needed(
    pack, monkeypatch, capsys
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert main(["eval", "generate", str(pack), "--n", "3"]) == 2
    assert f"kpack eval generate {pack} --offline" in " ".join(capsys.readouterr().err.split())
    assert main(["eval", "generate", str(pack), "--n", "3", "--offline"]) == 0
    written, problems = load_questions(pack / "eval" / "candidates.jsonl", pack)
    assert not problems and written
    lines = (pack / "eval" / "candidates.jsonl").read_text().splitlines()
    assert all(json.loads(line)["generated"] == OFFLINE_MARK for line in lines)
    (pack / "eval" / "candidates.jsonl").unlink()
