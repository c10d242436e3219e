"""The offline extractor: deterministic entities, relations and facts without any network."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kpack.ingest.extraction import (
    MAX_FACTS_PER_SECTION,
    MAX_RELATIONS_PER_SECTION,
    TitleMatcher,
    extract_offline,
    merge_extractions,
)
from kpack.ingest.html import html_blocks, main_content, markdown_blocks
from kpack.ingest.sections import split_sections
from kpack.text import normalize_entity

SITE = Path(__file__).parent / "site" / "docs"


def site_sections():
    for name in ("index.html", "guide.html", "malformed.html"):
        title, body = main_content((SITE / name).read_text())
        yield from split_sections(html_blocks(body), title, name)[1]
    yield from split_sections(markdown_blocks((SITE / "readme.md").read_text()), None, "readme")[1]


def entities(result) -> dict[str, dict]:
    return {normalize_entity(e["name"]): e for e in result["entities"]}


def test_same_input_gives_the_same_output():
    sections = list(site_sections())
    assert len(sections) >= 8
    first = [extract_offline(s.title, s.content) for s in sections]
    second = [extract_offline(s.title, s.content) for s in copy.deepcopy(sections)]
    assert first == second
    assert any(r["entities"] for r in first) and any(r["facts"] for r in first)


def test_code_identifiers_are_api_and_type_entities():
    text = (
        "Call widget.configure() once, then load_config() reads the retry_count setting. "
        "Sprockets are checked by the SprocketValidator class and `frob --fast` runs it."
    )
    found = entities(extract_offline("", text))
    assert found["widget.configure"]["type"] == "api"
    assert found["widget.configure"]["name"] == "widget.configure()"
    assert found["load_config"]["type"] == "api"
    assert found["retry_count"]["type"] == "api"
    assert found["sprocketvalidator"]["type"] == "type"
    assert found["frob --fast"]["type"] == "api"


def test_abbreviations_are_not_dotted_names():
    found = entities(
        extract_offline("", "Use a short name, e.g. sprocket or i.e. gizmo, in tests.")
    )
    assert "e.g" not in found and "i.e" not in found


def test_capitalised_multi_word_names_without_leading_function_words():
    text = (
        "However Sprocket Registry keeps every sprocket of the Bank of England, unlike Acme Corp."
    )
    found = entities(extract_offline("", text))
    assert found["sprocket registry"]["type"] == "name"
    assert found["sprocket registry"]["name"] == "Sprocket Registry"
    assert "bank of england" in found
    assert "acme corp" in found
    assert not any(key.startswith("however") for key in found)


def test_a_single_capitalised_word_is_a_name_inside_a_sentence_not_at_its_start():
    found = entities(extract_offline("", "Sprockets turn when Gizmos spin. Oahu waits."))
    assert set(found) == {"gizmos"}
    assert found["gizmos"]["name"] == "Gizmos"


def test_a_name_may_run_across_a_line_break_of_a_wrapped_paragraph():
    text = "Quandt was born in\nTervola, a village on the\nKemi river, and built\nBrass Telescopes."
    found = entities(extract_offline("", text))
    assert {"tervola", "kemi", "brass telescopes"} <= set(found)


def test_the_before_one_lower_case_word_is_an_anaphor_not_a_term():
    result = extract_offline("", "The film was shot in a warehouse over three long winter months.")
    assert result["facts"] and "film" not in entities(result)
    result = extract_offline("", "Neither version of the game was a great commercial success.")
    assert not any(key.startswith("neither") for key in entities(result))


def test_bold_text_is_a_term():
    found = entities(extract_offline("", "A **frobnication cycle** takes one second."))
    assert found["frobnication cycle"]["type"] == "term"


def test_heading_is_a_topic_entity():
    result = extract_offline("Environment variables", "Nothing to see.")
    assert result["entities"][0] == {
        "name": "Environment variables",
        "type": "topic",
        "description": "Section heading: Environment variables",
    }


def test_definitional_sentences_become_facts_about_their_subject():
    text = (
        "A frobnicator is a device that converts sprockets into gizmos. "
        "Frobnicators hum quietly. "
        "The Sprocket Registry keeps every sprocket that the toolkit knows."
    )
    result = extract_offline("Concepts", text)
    facts = {f["content"]: f["entity"] for f in result["facts"]}
    assert facts == {
        "A frobnicator is a device that converts sprockets into gizmos.": "frobnicator",
    }
    found = entities(result)
    assert found["frobnicator"]["type"] == "term"
    assert found["frobnicator"]["description"].startswith("A frobnicator is a device")


def test_definition_of_an_entity_already_named_describes_it():
    text = "The SprocketValidator returns a list of every broken sprocket it found."
    result = extract_offline("", text)
    assert result["facts"] == [{"content": text, "entity": "SprocketValidator"}]
    assert entities(result)["sprocketvalidator"]["description"] == text


def test_definition_subject_with_a_code_span_has_no_stray_backtick():
    result = extract_offline("", "The `level` argument defaults to 3 for production systems.")
    assert result["facts"], result
    names = [e["name"] for e in result["entities"]] + [f["entity"] for f in result["facts"]]
    assert all(name.count("`") % 2 == 0 for name in names), names


def test_short_definitions_are_not_facts():
    assert extract_offline("", "X is a thing.")["facts"] == []


@pytest.mark.parametrize(
    ("kind", "sentence", "cap"),
    [
        (
            "facts",
            "Gadget number{i} is a component that does task number {i}.",
            MAX_FACTS_PER_SECTION,
        ),
        ("relations", "Use alpha_{i} with beta_{i} and gamma_{i} here.", MAX_RELATIONS_PER_SECTION),
    ],
)
def test_facts_and_relations_are_capped_per_section(kind, sentence, cap):
    text = " ".join(sentence.format(i=i) for i in range(2 * cap))
    assert len(extract_offline("", text)[kind]) == cap


def test_relations_link_entities_named_in_one_sentence():
    text = (
        "The Sprocket Registry feeds the SprocketValidator class through load_config(). "
        "Acme Corp ships gizmos."
    )
    result = extract_offline("", text)
    assert len(result["relations"]) == 2
    linked = {name for r in result["relations"] for name in (r["source"], r["target"])}
    assert linked == {"Sprocket Registry", "SprocketValidator", "load_config()"}
    for relation in result["relations"]:
        assert relation["relation"] == "MENTIONED_WITH"
        assert relation["context"].startswith("The Sprocket Registry feeds")
    names = {normalize_entity(e["name"]) for e in result["entities"]}
    for relation in result["relations"]:
        assert normalize_entity(relation["source"]) in names
        assert normalize_entity(relation["target"]) in names


def test_no_relation_across_sentences():
    result = extract_offline("", "Acme Corp builds gizmos. The Sprocket Registry stores them.")
    assert result["relations"] == []


def test_code_blocks_are_not_read_as_prose():
    text = (
        "Install it first.\n\n"
        "```\n# the cache_dir value is None unless HOME is set\nrun_frobnicator --level 3\n```\n\n"
        "Then run it."
    )
    result = extract_offline("", text)
    assert result["facts"] == []
    names = {normalize_entity(e["name"]) for e in result["entities"]}
    assert "cache_dir" not in names and "run_frobnicator" not in names


def test_entities_are_deduplicated_by_normalized_name():
    text = "Call `widget.frob()` first. Then widget.frob() again, and Widget.Frob() once more."
    result = extract_offline("", text)
    keys = [normalize_entity(e["name"]) for e in result["entities"]]
    assert keys.count("widget.frob") == 1
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("Sprocket Registry", "sprocket registry"),
        ("  The   Sprocket  Registry ", "sprocket registry"),
        ("the registry", "registry"),
        ("`widget.frob()`", "widget.frob"),
        ("load_config()", "load_config"),
        ('"Quoted Name"', "quoted name"),
        ("'single'", "single"),
        ("Theano", "theano"),
        ("SprocketValidator", "sprocketvalidator"),
        ("The Oberoi Group's", "oberoi group"),
        ("Leland, North Carolina", "leland north carolina"),
        ("Lilu (mythology)", "lilu"),
        ("Pokémon", "pokemon"),
        ("sprockets", "sprocket"),
        ("Williams", "williams"),
        ("frob --fast", "frob --fast"),
    ],
)
def test_normalize_entity(raw, key):
    assert normalize_entity(raw) == key


def test_the_packs_own_titles_are_entities_of_their_sections_and_of_those_naming_them():
    def section(n: int, title: str, content: str) -> dict:
        return {
            "article_url": f"http://x/{n}",
            "section_id": f"s{n}",
            "article_title": title,
            "title": title,
            "content": content,
        }

    sections = [
        section(1, "Maximum Overdrive", "A 1986 film written and directed by Stephen King."),
        section(2, "Leland, North Carolina", "Maximum Overdrive was shot in Leland, in 1985."),
        section(3, "Lilu (mythology)", "In Akkadian texts a Lilu is a spirit."),
        section(4, "Demon", "The Lilu are demons; maximum overdrive is not a title here."),
    ]
    tables = merge_extractions((s, {"entities": []}) for s in sections)
    mentions = {(m["section_id"], m["entity_id"]) for m in tables["entity_mentions"]}
    assert ("s1", "maximum overdrive") in mentions  # its own title
    assert ("s2", "maximum overdrive") in mentions  # named, as written
    assert ("s4", "lilu") in mentions  # "Lilu (mythology)" is named "Lilu"
    assert ("s4", "maximum overdrive") not in mentions  # not written as the title is
    assert ("s2", "leland north carolina") in mentions


def test_a_title_named_by_too_many_sections_is_a_common_word_not_a_link():
    texts = [f"Section {i} mentions Python and nothing else." for i in range(10)]
    matcher = TitleMatcher(["Python", "Sprocket Registry"])
    assert matcher.mentions([*texts, "The Sprocket Registry and Python."])[-1] == [
        "Sprocket Registry"
    ]
