"""Developers' questions (issue 32): the asker's own names and a problem's code and data are
no search terms; the APIs a question names reach the passages that define them; the gate
refuses when the pack lacks the answer, not when the question is terse or names variables.

The pack is built once for the module from three invented Sphinx-like pages: the reference of
a ``tally`` library (``tally.Ledger.rollup``, ``tally.Ledger.spread``, ``tally.read_ledger``),
a tutorial page, and a page about a bakery whose words are the words of a problem's data rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import retrieval
from retrieval.coding_questions import is_code_line, read_question
from retrieval.query import clean_question
from retrieval.registry import close_all
from tests.conftest import build, write_pack

REFERENCE = """<html><head><title>tally reference</title></head><body><div role="main">
<section id="module-tally"><h1>tally — ledgers of counted things</h1>
<p>The tally module keeps ledgers: tables of counted things with a row per entry.</p>
<section id="ledger"><h2>The Ledger class</h2>
<dl class="py method"><dt class="sig sig-object py" id="tally.Ledger.rollup"><span
class="sig-prename">Ledger.</span><span class="sig-name">rollup</span>(by, how='add')</dt>
<dd><p>Combine the entries that share a key into one entry per key, adding up their counts
(or keeping the largest, with how='max'). Returns a new Ledger.</p></dd></dl>
<dl class="py method"><dt class="sig sig-object py" id="tally.Ledger.spread"><span
class="sig-prename">Ledger.</span><span class="sig-name">spread</span>(column)</dt>
<dd><p>Turn the distinct values of one column into columns of their own, one row per
remaining key, so a long ledger becomes a wide one.</p></dd></dl>
</section>
<section id="reading"><h2>Reading ledgers</h2>
<dl class="py function"><dt class="sig sig-object py" id="tally.read_ledger"><span
class="sig-prename">tally.</span><span class="sig-name">read_ledger</span>(path)</dt>
<dd><p>Open a ledger file written by Ledger.save and return the Ledger it holds.</p></dd></dl>
</section></section></div></body></html>
"""
TUTORIAL = """<html><head><title>tally tutorial</title></head><body><div role="main">
<section id="first-steps"><h1>First steps with tally</h1>
<p>A ledger starts empty; every call to add puts one entry in it, with a key and a count.
Printing a ledger shows its entries as a table, one row per entry.</p>
</section></div></body></html>
"""
BAKERY = """<html><head><title>Bakery notes</title></head><body><div role="main">
<h1>Morning bakery notes</h1><p>Rye loaves, spelt rolls and oat buns come out of the oven in
that order; the rye loaves need the longest, the oat buns the shortest. Count the rye, spelt
and oat trays before the shop opens.</p></div></body></html>
"""
PAGES = {"reference.html": REFERENCE, "tutorial.html": TUTORIAL, "bakery.html": BAKERY}

# A problem statement as agents send them: prose around a table of data and code.
PROBLEM = """Problem:
I have a ledger like this:

   shop    item   count
0  north   rye    3
1  north   spelt  5
2  south   rye    2
3  south   oat    7

led = tally.read_ledger("trays.tly")
print(led)

I want one entry per shop with the counts of its entries added together. How?
A:
<code>
result = ...
</code>
"""


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coding")
    folder = write_pack(root, "tally", [f"file:pages/{name}" for name in PAGES], {})
    (folder / "pages").mkdir()
    for name, text in PAGES.items():
        (folder / "pages" / name).write_text(text)
    assert build(root, "tally").success
    yield folder
    close_all()


# Reading the question


def test_backticked_and_quoted_spans_are_the_askers_not_search_words():
    reading = read_question("add up the counts per key in ledger `trays_2024` from 'north.tly'")
    assert reading.asker_names == ("trays_2024", "north.tly")
    assert reading.prose == "add up the counts per key in ledger from"
    assert not reading.long


def test_a_problems_code_and_data_rows_are_not_its_prose_and_its_calls_are_api_names():
    reading = read_question(PROBLEM)
    assert reading.long
    assert "rye" not in reading.prose and "trays" not in reading.prose
    assert "one entry per shop" in reading.prose
    assert reading.api_names[0] == "read_ledger"
    assert "print" not in reading.api_names
    assert is_code_line("1  north   spelt  5") and is_code_line("led = tally.read_ledger(x)")
    assert not is_code_line("I want one entry per shop with the counts added together.")


def test_a_question_keeps_its_lines_so_a_pasted_problem_is_read_as_one(pack):
    assert (
        clean_question("  sum a ledger  \r\n    led.add(1)\r\n\n")
        == "  sum a ledger\n    led.add(1)"
    )
    read = retrieval.query(pack, PROBLEM, use_llm=False)["trace"]["question"]
    assert read["problem_statement"]
    assert "spelt" not in read["searched_words"] and "one entry per shop" in read["searched_words"]
    assert read["api_names"][0] == "read_ledger" and "trays.tly" in read["askers_names"]


def test_a_problems_api_list_weighs_more_and_its_definitions_less_than_a_terse_questions(pack):
    problem = retrieval.query(pack, PROBLEM, use_llm=False)["trace"]
    terse = retrieval.query(pack, "how do I read_ledger() a file?", use_llm=False)["trace"]
    assert problem["fusion_weights"]["api"] == 3.0 > terse["fusion_weights"]["api"] == 0.5
    assert problem["fusion_weights"]["definition"] == 0.75 < terse["fusion_weights"]["definition"]
    assert problem["fusion_weights"]["bm25"] == terse["fusion_weights"]["bm25"] == 1.0
    # Several lines of prose alone are no problem statement: no code names its APIs.
    prose = (
        "I keep a long ledger of trays.\nI want to spread one of its columns out.\n"
        "Each distinct value should become a column.\nWhich call does that?"
    )
    told = retrieval.query(pack, prose, use_llm=False)["trace"]
    assert told["question"]["problem_statement"] is False and told["apis"]
    assert told["fusion_weights"]["api"] == 0.5
    # A caller's option (or kg_config.json's query section) still sets them.
    chosen = retrieval.query(pack, PROBLEM, use_llm=False, problem_api_weight=1.0)["trace"]
    assert chosen["fusion_weights"]["api"] == 1.0


def test_a_name_written_as_a_call_in_prose_is_an_api_name():
    assert read_question("why does spread() drop my keys?").api_names == ("spread",)


# Retrieval and the gate over a built pack


def pages_of(hits) -> list[str]:
    """The page of each hit, without its section's anchor (a hit's url is a deep link)."""
    return [hit["url"].split("#", 1)[0].rsplit("/", 1)[-1] for hit in hits]


def test_a_problem_with_data_rows_finds_the_api_its_code_calls_not_the_page_sharing_its_data(
    pack,
):
    hits = retrieval.search(pack, PROBLEM, k=3)
    assert hits, "the gate refused a problem whose code calls an API the pack defines"
    assert pages_of(hits)[0] == "reference.html"
    assert "bakery.html" not in pages_of(hits)[:2]
    assert any("api #" in hit["why"] and "read_ledger" in hit["why"] for hit in hits)


def test_a_terse_question_naming_a_defined_api_is_never_refused(pack):
    result = retrieval.query(pack, "what does `spread` return", use_llm=False)
    assert result["query_type"] != "confidence_gated_fallback"
    assert result["sources"][0] == "tally — ledgers of counted things"
    assert "the pack defines tally.Ledger.spread" in result["trace"]["gate"]["why"]


def test_the_askers_variable_names_do_not_raise_the_gates_bar(pack):
    hits = retrieval.search(pack, "combine entries sharing a key in ledger `qq_zz91_book`", k=3)
    assert hits and pages_of(hits)[0] == "reference.html"
    result = retrieval.query(
        pack, "combine entries sharing a key in ledger `qq_zz91_book`", use_llm=False
    )
    assert "qq_zz91_book" not in str(result["trace"]["gate"].get("absent_terms", []))


def test_an_off_topic_question_is_still_refused(pack):
    result = retrieval.query(pack, "How long should I boil an egg for a runny yolk?", use_llm=False)
    assert result["query_type"] == "confidence_gated_fallback"


def test_an_intent_finds_the_definition_whose_entry_reads_like_it(pack):
    hits = retrieval.search(pack, "make a long ledger into a wide one", k=2)
    assert "definition #1: tally.Ledger.spread" in hits[0]["why"]
    with_api_search_off = retrieval.search(
        pack, "make a long ledger into a wide one", k=2, enable_api_search=False
    )
    assert "definition #" not in " ".join(hit["why"] for hit in with_api_search_off)


def test_an_everyday_question_whose_word_names_an_api_is_still_refused(pack):
    # "spread" is an API of this pack, but its entry reads nothing like the question.
    result = retrieval.query(pack, "How do I spread butter evenly on warm toast?", use_llm=False)
    assert result["query_type"] == "confidence_gated_fallback"
    assert "spread" in result["trace"].get("api_words", {})


def test_page_crowding_puts_other_pages_best_before_a_pages_further_passages():
    from kpack.config import QueryConfig
    from retrieval.crowding import page_crowding
    from retrieval.query import Candidate, Query

    def hit(page: str, n: int) -> Candidate:
        return Candidate(f"{page}-{n}", page, f"https://d.example/{page}", page, "h", "t")

    ranked = [hit("long", 0), hit("long", 1), hit("long", 2), hit("other", 0), hit("third", 0)]
    query = Query("q", 3, None, QueryConfig(passages_per_page=1), None)  # type: ignore[arg-type]
    query.candidates = list(ranked)
    page_crowding(query)
    assert [c.passage_id for c in query.candidates] == [
        "long-0",
        "other-0",
        "third-0",
        "long-1",
        "long-2",
    ]
    assert "page crowding" in query.candidates[3].reasons[0]
    query.settings = QueryConfig(passages_per_page=0)
    query.candidates = list(ranked)
    page_crowding(query)
    assert query.candidates == ranked
