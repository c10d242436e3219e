"""One question to several packs (retrieval.multipack) and finding the pack for a library or
a topic (serving.resolve), over two packs built from invented Sphinx-style pages: the
retrieval API, the CLI, the HTTP API and the MCP server over stdio."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

import retrieval
from cli.main import main
from kpack.errors import PackError
from kpack.ingest.doc_version import documentation_title, documentation_version
from retrieval.multipack import merge_searches, pack_relevance
from retrieval.results import SearchResults
from serving.http import create_app
from serving.resolve import resolve
from tests.conftest import build, write_pack
from tests.test_serving_http import running


def page(title: str, site: str, sections: dict[str, str]) -> str:
    body = "".join(f"<h2>{heading}</h2><p>{text}</p>" for heading, text in sections.items())
    return (
        f"<html><head><title>{title} &#8212; {site}</title></head>"
        f"<body><div class='body' role='main'><h1>{title}</h1>{body}</div></body></html>"
    )


BREW_SITE = "Brewlib 4.2.1 documentation"
BOIL_SITE = "Boillib Documentation (0.9.x)"
SITES = {
    "brewlib": {
        "steeping.html": page(
            "Steeping",
            BREW_SITE,
            {
                "Steeping times": "Oolong leaves steep for three minutes at 90 degrees; green "
                "leaves steep for two minutes, and a longer steep turns the cup bitter.",
                "The steep() call": "brewlib.steep(leaves, minutes) starts the infuser timer "
                "and lifts the basket out of the pot when the minutes are over.",
            },
        ),
        "blends.html": page(
            "Blends",
            BREW_SITE,
            {
                "Mixing leaves": "A blend mixes several leaf grades by weight; brewlib.Blend "
                "records each grade's share and its origin estate.",
                "Storing a blend": "Keep a blend in an airtight tin away from light, so the "
                "aroma lasts for months.",
            },
        ),
        "version.html": page(
            "Version 4.2.0",
            BREW_SITE,
            {"Changes": "The infuser timer counts in seconds as well as minutes."},
        ),
    },
    "boillib": {
        "heating.html": page(
            "Heating elements",
            BOIL_SITE,
            {
                "Boiling target": "The kettle heats until the water reaches its boiling "
                "target; above 1,500 metres of altitude boillib lowers the target by one "
                "degree for every 300 metres, since water boils cooler in thin air.",
                "Element wattage": "boillib.Element(watts) drives the heating coil; a "
                "3,000 watt coil brings a litre to the boil in about two minutes.",
            },
        ),
        "safety.html": page(
            "Safety",
            BOIL_SITE,
            {
                "Dry boil guard": "When the kettle holds no water the dry boil guard cuts the "
                "current within four seconds and raises boillib.DryBoilError.",
                "Scale": "Limescale on the coil slows heating; descale the kettle monthly "
                "with citric acid.",
            },
        ),
    },
}
TEA_QUESTION = "How long should oolong leaves steep?"
KETTLE_QUESTION = "At what altitude does the kettle lower its boiling target?"


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("several")
    (root / "docs").mkdir()
    for pack, pages in SITES.items():
        for name, html in pages.items():
            (root / "docs" / f"{pack}-{name}").write_text(html)
        write_pack(root, pack, [f"file:../../docs/{pack}-{name}" for name in pages])
        with pytest.MonkeyPatch.context() as env:  # the fixture outlives one test's monkeypatch
            env.setenv("KPACK_STORAGE", str(root / "storage"))
            env.setenv("DAGSTER_HOME", str(root / "dagster_home"))
            assert build(root, pack).published
    return root / "packs"


@pytest.fixture
def in_packs(packs, monkeypatch) -> Path:
    monkeypatch.setenv("KPACK_PACKS_DIR", str(packs))
    return packs


def test_search_merges_packs_by_relevance_keeping_each_packs_order(packs):
    folders = [packs / "brewlib", packs / "boillib"]
    merged = retrieval.search(folders, TEA_QUESTION, k=6)
    assert merged[0]["pack"] == "brewlib" and "Oolong" in merged[0]["text"]
    assert {hit["pack"] for hit in merged} == {"brewlib", "boillib"}
    scores = [hit["merge_score"] for hit in merged]
    assert scores == sorted(scores, reverse=True)
    assert merged.version == {"brewlib": 1, "boillib": 1}
    for name in ("brewlib", "boillib"):
        # Each pack's passages come in the pack's own order, with the cosine it gave them.
        alone = [
            (h["passage_id"], h["similarity"])
            for h in retrieval.search(packs / name, TEA_QUESTION, k=6)
        ]
        kept = [(h["passage_id"], h["similarity"]) for h in merged if h["pack"] == name]
        assert kept == alone[: len(kept)]
    assert "brewlib #1, pack relevance" in merged[0]["why"]
    # Each pack's gate measured how much of the question its best passage holds.
    assert all(0.0 <= merged.gate[name]["coverage"] <= 1.0 for name in ("brewlib", "boillib"))
    kettle = retrieval.search(folders, KETTLE_QUESTION, k=3)
    assert kettle[0]["pack"] == "boillib" and "altitude" in kettle[0]["text"]


def test_a_pack_is_as_relevant_as_its_best_passages_not_its_single_closest():
    def found(*similarities: float) -> SearchResults:
        return SearchResults({"passage_id": str(s), "similarity": s} for s in similarities)

    # One passage that happens to be close against three that answer: the three win, the
    # lone passage comes after the answering pack's.
    lone, answering = found(0.60, 0.20, 0.18), found(0.55, 0.52, 0.50, 0.49)
    assert pack_relevance(answering) > pack_relevance(lone)
    merged = merge_searches({"lone": lone, "answering": answering}, k=5)
    assert [hit["pack"] for hit in merged] == ["answering"] * 4 + ["lone"]
    assert [hit["similarity"] for hit in merged] == [0.55, 0.52, 0.50, 0.49, 0.60]
    # A pack nearly as relevant as the first has its best passages among the first's.
    first, second = found(0.50, 0.49, 0.48, 0.47), found(0.49, 0.48, 0.47)
    merged = merge_searches({"first": first, "second": second}, k=5)
    assert [hit["pack"] for hit in merged] == ["first", "second", "first", "second", "first"]
    assert pack_relevance(found()) == 0.0


def test_a_pack_whose_best_passage_holds_the_questions_words_is_the_more_relevant():
    def found(coverage: float, *similarities: float) -> SearchResults:
        results = SearchResults({"passage_id": str(s), "similarity": s} for s in similarities)
        results.gate = {"refused": False, "coverage": coverage}
        return results

    # A little closer by meaning, but its best passage lacks most of the question's words.
    near, worded = found(0.3, 0.50, 0.49, 0.48), found(1.0, 0.48, 0.47, 0.46)
    assert pack_relevance(worded) > pack_relevance(near)
    merged = merge_searches({"near": near, "worded": worded}, k=3)
    assert [hit["pack"] for hit in merged][:2] == ["worded", "worded"]
    # With the same words, meaning decides.
    assert pack_relevance(found(1.0, 0.50, 0.49, 0.48)) > pack_relevance(worded)


def test_query_answers_from_the_pack_that_holds_the_answer(packs):
    result = retrieval.query([packs / "brewlib", packs / "boillib"], KETTLE_QUESTION, use_llm=False)
    assert result["pack"] == "boillib" and "300 metres" in result["answer"]
    assert result["citations"] and {c["pack"] for c in result["citations"]} == {"boillib"}
    assert [row["pack"] for row in result["packs"]] == ["boillib", "brewlib"]
    assert result["packs"][0]["relevance"] > result["packs"][1]["relevance"]


def test_the_cli_takes_packs_joined_by_commas(in_packs, capsys):
    assert main(["query", "brewlib,boillib", TEA_QUESTION, "--no-llm"]) == 0
    out = capsys.readouterr().out
    assert "three minutes" in out and "from brewlib" in out
    assert main(["search", "boillib,brewlib", KETTLE_QUESTION, "--json", "--k", "2"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert hits[0]["pack"] == "boillib"
    assert main(["search", "brewlib,nosuchpack", TEA_QUESTION]) == 2
    assert "nosuchpack" in capsys.readouterr().err


def test_an_empty_pack_name_in_a_list_is_a_clear_error(packs):
    with pytest.raises(PackError, match="name the packs to ask"):
        retrieval.search("brewlib,", TEA_QUESTION)


def test_http_search_and_query_of_several_packs(packs):
    with running(create_app(packs)) as base:
        found = httpx.post(
            f"{base}/packs/brewlib,boillib/search", json={"question": KETTLE_QUESTION, "k": 3}
        )
        assert found.status_code == 200, found.text
        body = found.json()
        assert body["version"] == {"brewlib": 1, "boillib": 1}
        assert body["results"][0]["pack"] == "boillib"
        asked = httpx.post(
            f"{base}/packs/brewlib,boillib/query",
            json={"question": TEA_QUESTION, "use_llm": False},
            timeout=60,
        )
        assert asked.status_code == 200, asked.text
        assert asked.json()["pack"] == "brewlib"
        unknown = httpx.post(f"{base}/packs/brewlib,nope/search", json={"question": "x"})
        assert unknown.status_code == 404 and "nope" in unknown.json()["detail"]


def test_several_packs_keep_a_token_budget_each_gate_and_falling_scores(packs):
    folders = [packs / "brewlib", packs / "boillib"]
    merged = retrieval.search(folders, TEA_QUESTION, k=10, tokens=60)
    assert merged and sum(hit["tokens"] for hit in merged) <= 60
    assert set(merged.gate) == {"brewlib", "boillib"}
    assert all("refused" in verdict for verdict in merged.gate.values())
    scores = [hit["score"] for hit in merged]
    assert scores == sorted(scores, reverse=True)  # capped down the merged ranking
    with running(create_app(packs)) as base:
        linked = httpx.get(
            f"{base}/packs/brewlib,boillib/search", params={"q": TEA_QUESTION, "tokens": 60}
        )
        assert linked.status_code == 200, linked.text
        body = linked.json()
        assert set(body["gate"]) == {"brewlib", "boillib"}
        assert body["results"][0]["pack"] == "brewlib"
        assert sum(hit["tokens"] for hit in body["results"]) <= 60


def test_the_documentation_version_is_read_from_the_pages(packs, in_packs, capsys):
    manifest = json.loads((packs / "brewlib" / "manifest.json").read_text())
    assert manifest["documentation_version"] == "4.2.1"  # not the page titled "Version 4.2.0"
    assert manifest["documentation_title"] == BREW_SITE
    boil = json.loads((packs / "boillib" / "manifest.json").read_text())
    assert boil["documentation_version"] == "0.9.x"
    assert main(["list"]) == 0
    assert "4.2.1" in capsys.readouterr().out


def test_a_pack_of_several_sites_names_no_one_release():
    """Most pages of one site name its release; a pack where no site holds most pages has none
    (a Python and pandas pack is neither release)."""
    python = [f"Page {n} — Python 3.11.2 documentation" for n in range(3)]
    pandas = [f"Page {n} — pandas 1.5.3 documentation" for n in range(2)]
    scipy = [f"Page {n} — SciPy v1.10.1 Manual" for n in range(2)]
    assert documentation_version([*python, "What's New In Python 3.12", None]) == "3.11.2"
    assert documentation_version([*python, *pandas, *scipy]) is None
    assert documentation_title([*python, *pandas]) == "Python 3.11.2 documentation"


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        ("brewlib", "brewlib"),
        ("Boillib", "boillib"),
        ("infuser timer", "brewlib"),
        ("limescale and descaling", "boillib"),
        ("water boiling at high altitude", "boillib"),
        ("mixing tea leaf grades", "brewlib"),
    ],
)
def test_find_packs_ranks_the_pack_of_a_library_or_topic_first(packs, request_text, expected):
    assert resolve(request_text, packs)[0]["pack"] == expected


def test_mcp_find_packs_and_several_packs_over_stdio(packs):
    env = {key: value for key, value in os.environ.items() if key != "ANTHROPIC_API_KEY"}
    env |= {"KPACK_PACKS_DIR": str(packs), "HF_HUB_OFFLINE": "1"}
    params = StdioServerParameters(
        command=str(Path(sys.executable).with_name("kpack")), args=["mcp"], env=env
    )

    def payload(result) -> dict:
        assert not result.is_error, result.content
        return json.loads(result.content[0].text)

    async def session() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            found = payload(await client.call_tool("find_packs", {"library_or_topic": "Brewlib"}))
            first = found["packs"][0]
            assert (first["pack"], first["documentation_version"], first["name_match"]) == (
                "brewlib",
                "4.2.1",
                2,
            )
            listed = payload(await client.call_tool("list_packs", {}))
            versions = {row["name"]: row["documentation_version"] for row in listed["packs"]}
            assert versions == {"brewlib": "4.2.1", "boillib": "0.9.x"}
            hits = payload(
                await client.call_tool(
                    "search_pack", {"pack": "brewlib,boillib", "question": KETTLE_QUESTION}
                )
            )
            assert hits["results"][0]["pack"] == "boillib"
            answer = payload(
                await client.call_tool(
                    "query_pack",
                    {"pack": "brewlib,boillib", "question": TEA_QUESTION, "use_llm": False},
                )
            )
            assert answer["pack"] == "brewlib"

    anyio.run(session)
