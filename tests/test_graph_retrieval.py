"""The entity-passage graph (kpack.graph) and the graph stages (retrieval.entity_graph) over a pack
built once for this module from Markdown pages written for it: a company page names its
founder, the founder's page says where she was born, and founder pages of other companies
stand between the question's words and the founder's page."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import retrieval
from cli.main import main
from kpack.config import load_config
from kpack.contracts import section_of_chunk
from kpack.graph import linked_entities, personalized_pagerank, second_hop
from retrieval.entity_graph import load_graph_index
from retrieval.registry import reading
from tests.conftest import build, write_pack

QUESTION = "Where was the founder of Zorblax Industries born?"
PAGES = {
    "zorblax.md": """# Zorblax Industries

Zorblax Industries is a maker of brass telescopes and survey instruments. Zorblax Industries
was founded by Mirela Quandt in 1921 in a rented workshop by the harbour. The company sells
its instruments to observatories and schools across the north.
""",
    "quandt.md": """# Mirela Quandt

Mirela Quandt was an engineer who spent her working life grinding lenses. Quandt was born in
Tervola, a village on the Kemi river, and learned glass work from her uncle.
""",
    "brenner.md": """# Osvald Brenner

Osvald Brenner was the founder of Brenner Optics, a telescope company. The founder was born
in Graz and built the first Brenner Optics industries workshop there before moving to Vienna.
""",
    "lind.md": """# Halvard Lind

Halvard Lind was the founder of Lind Instruments. The founder was born in Bergen, and his
industries sold lenses to instrument makers along the coast for a decade.
""",
    "harbour.md": """# Harbour Workshops

The Zorblax Industries' workshop stood by the harbour next to a rope maker and a sail loft;
the three shared one crane.
""",
    "sala.md": """# Teodor Sala

Teodor Sala was the founder of Sala Telescope Industries. The founder was born in Turin and
trained as a clockmaker before he turned to industries of optics.
""",
}
EVAL_QUESTIONS = [
    {"id": "g1", "question": QUESTION, "answers": ["Tervola"]},
    {"id": "g2", "question": "Where was Osvald Brenner born?", "answers": ["Graz"]},
    {"id": "g3", "question": "Where was Teodor Sala born?", "answers": ["Turin"]},
    {"id": "g4", "question": "What stood next to the Zorblax workshop?", "answers": ["sail loft"]},
    {"id": "g5", "question": "What does Zorblax Industries make?", "answers": ["brass telescopes"]},
]


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("graph")
    folder = write_pack(root, "founders", [f"file:pages/{name}" for name in PAGES], {})
    (folder / "pages").mkdir()
    for name, text in PAGES.items():
        (folder / "pages" / name).write_text(text)
    (folder / "eval").mkdir()
    (folder / "eval" / "questions.jsonl").write_text(
        "\n".join(json.dumps(q) for q in EVAL_QUESTIONS) + "\n"
    )
    assert build(root, "founders").success
    return folder


def titles(hits) -> list[str]:
    return list(dict.fromkeys(hit["title"] for hit in hits))


def test_the_pack_records_which_passage_mentions_which_entity(pack):
    with reading(pack) as reader:
        mentions = {
            (reader.articles[reader.sections[sid].article_url].title, entity)
            for sid, entity in reader.query(
                "MATCH (c:Chunk)-[:MENTIONS]->(e:Entity) RETURN c.section_id, e.entity_id"
            )
        }
        index = reader.memo(load_graph_index)
    assert index is not None
    # A name in the text, and the pack's own titles: its own, and another page's it names.
    assert ("Zorblax Industries", "mirela quandt") in mentions
    assert ("Zorblax Industries", "zorblax industries") in mentions
    assert ("Mirela Quandt", "tervola") in mentions
    # "The Zorblax Industries' workshop" is the same entity as "Zorblax Industries".
    assert ("Harbour Workshops", "zorblax industries") in mentions
    graph = index.graph
    node = graph.entity_node("zorblax industries")
    assert node is not None and graph.mentions_of(node) == 2
    assert [graph.name_of(n) for n, _ in linked_entities(graph, QUESTION)] == ["Zorblax Industries"]


def test_personalized_pagerank_reaches_the_founder_through_her_name(pack):
    with reading(pack) as reader:
        graph = reader.memo(load_graph_index).graph
        company = passage_of(reader, graph, "Zorblax Industries")
        scores = personalized_pagerank(graph, {company: 1.0}, damping=0.5)
        founder = passage_of(reader, graph, "Mirela Quandt")
        others = [passage_of(reader, graph, t) for t in ("Osvald Brenner", "Teodor Sala")]
        assert scores[founder] > max(scores[o] for o in others)
        assert np.isclose(scores.sum(), 1.0)
        bridges = second_hop(graph, company)
        assert [graph.passages[p] for p in bridges.passages] == [graph.passages[founder]]
        assert graph.name_of(int(bridges.entities[0])) == "Mirela Quandt"


def passage_of(reader, graph, title: str) -> int:
    return next(
        i
        for i, p in enumerate(graph.passages)
        if reader.articles[reader.sections[section_of_chunk(p)].article_url].title == title
    )


def test_the_second_hop_finds_the_passage_vector_search_alone_misses(pack):
    flat = retrieval.search(pack, QUESTION, k=2, profile="balanced", enable_graph=False)
    assert "Mirela Quandt" not in titles(flat)
    # Five questions are too few for the pack's own evidence to keep the graph on
    # (retrieval.eval.evidence): switched on here.
    hits = retrieval.search(pack, QUESTION, k=2, profile="balanced", enable_graph=True)
    assert titles(hits) == ["Zorblax Industries", "Mirela Quandt"]
    why = hits[1]["why"]
    assert "second hop" in why
    assert "via entity 'Mirela Quandt' from passage 'Zorblax Industries'" in why


def test_the_graph_stages_are_in_balanced_and_not_in_baseline(pack):
    assert {"graph_retrieval", "graph_second_hop"} <= set(
        retrieval.agent(pack, "balanced", use_llm=False, enable_graph=True).stages
    )
    assert not {"graph_retrieval", "graph_second_hop"} & set(
        retrieval.agent(pack, "baseline", use_llm=False).stages
    )
    response = retrieval.query(pack, QUESTION, use_llm=False, enable_graph=True)
    assert response["trace"]["graph"]["question_entities"] == ["Zorblax Industries"]
    graph_found = [c for c in response["trace"]["candidates"] if "graph #" in c["why"]]
    assert graph_found and all(
        "via entity" in c["why"] or "first-hop" in c["why"] for c in graph_found
    )


def test_calibration_writes_the_graph_settings_to_kg_config(pack, capsys):
    assert (
        main(["eval", str(pack), "--no-llm", "--profiles", "baseline,balanced", "--write-config"])
        == 0
    )
    written = json.loads((pack / "kg_config.json").read_text())["query"]
    for key in ("graph_weight", "graph_expand", "graph_bridge_threshold", "reranker_beta"):
        assert key in written
    assert load_config(pack).query.graph_expand == written["graph_expand"]
    out = capsys.readouterr().out
    assert "baseline" in out and "balanced" in out
