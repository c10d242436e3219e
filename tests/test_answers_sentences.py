"""Offline answers over encyclopedia-style pages: the sentence that answers is found, whole.

One pack is built for this module from Markdown pages written as Wikipedia writes an event's
article: sentences that say "the race" instead of the article's name, note marks after full
stops, a long sentence listing many names, and names with accents or written in two words.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kpack.contracts import chunk_id
from kpack.text import split_sentences
from retrieval.agent import KnowledgeGraphAgent
from retrieval.answer_type import answer_kind, holds_answer
from retrieval.answer_units import units_of
from retrieval.extractive import extractive_answer
from retrieval.meaning import word_vectors_of
from retrieval.missing_names import DECLINED
from retrieval.passage_context import passage_in_context
from retrieval.query import ContextSection
from retrieval.unit_scoring import score_sentences
from retrieval.unit_selection import chain
from tests.conftest import build, write_pack

WORD_VECTORS = word_vectors_of("sentence-transformers/all-MiniLM-L6-v2")

REGATTA = """# Harbor Regatta 2031

The Harbor Regatta 2031 was a sailing race to decide the champion of the Northern Sailing
League for its 2031 season. The Harbor Regatta 2031 drew 24 boats from 9 clubs, and its
committee sold 3,000 tickets for the harbor wall. The race was held on May 3, 2031, at Gull
Point in the town of Marrow Bay. The Sea Wolf, skippered by Ada Brightwater, won the Harbor
Regatta 2031 by four minutes. On the morning of the race the committee shortened the course
by two miles. The course was shortened because fog covered the outer buoys.

## Broadcast

Two bakeries gave the prizes for the crews: Crumb and Co gave the bread, Hollow Oak gave
the cider.[citation needed] Marrow Bay Radio covered the race for the whole coast, with Tilda
Okafor as the commentator.

## Clubs

The clubs that sent boats were the Marrow Bay Yacht Club, which sent five boats and hosted
the skippers' dinner, the Gull Point Sailing Society, which sent four boats and lent its
slipway, the Northern Lights Rowing and Sailing Club, which sent three boats, the Cape Fennel
Boat Club, which sent three boats, the Old Harbor Association, which sent two boats, the
Estuary Youth Sailing Trust, which sent two boats, the Lantern Island Club, which sent two
boats, the Saltmarsh Mariners, which sent two boats, and the Quayside Dinghy Club, which sent
the single boat of Orrin Pell.
"""

PRIORY = """# Priory of Saint Brannoc

The priory at Kéravel was founded by Ewen of Morlaix in the year 1120, on the site of an
older chapel. Its library kept more than two hundred charters by the fourteenth century. The
Lindqvist-Hart Gallery of the priory museum stands beside the cloister and shows its silver.
The gallery lends objects to other museums, e.g. `Reliquary 7` and the Brannoc Psalter, for up
to a year at a time.
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> KnowledgeGraphAgent:
    root = tmp_path_factory.mktemp("sentences")
    (root / "docs").mkdir()
    pages = {"regatta.md": REGATTA, "priory.md": PRIORY}
    for name, text in pages.items():
        (root / "docs" / name).write_text(text)
    folder: Path = write_pack(root, "events", [f"file:../../docs/{name}" for name in pages])
    assert build(root, "events").success
    # The gate is tested elsewhere: here every question reaches the answer stage.
    return KnowledgeGraphAgent(folder, use_llm=False, context_confidence_threshold=0.0)


def test_a_when_question_is_answered_first_by_the_sentence_that_dates_the_event(offline):
    # The dating sentence says "the race", not the article's name: the title says what it is
    # about. A sentence with a count ("24 boats") dates nothing.
    answer = offline.query("When was the Harbor Regatta 2031 held?")["answer"]
    assert answer.startswith("The race was held on May 3, 2031, at Gull Point")


def test_a_why_question_is_answered_first_by_the_sentence_that_gives_the_reason(offline):
    answer = offline.query("Why did the committee shorten the course?")["answer"]
    assert answer.startswith("The course was shortened because fog covered the outer buoys.")


def test_a_note_mark_after_a_full_stop_ends_the_sentence(offline):
    answer = offline.query("Who was the commentator on Marrow Bay Radio?")["answer"]
    assert "Marrow Bay Radio covered the race for the whole coast, with Tilda Okafor" in answer
    assert "Hollow Oak" not in answer  # the sentence before the note mark is another one


def test_a_long_sentence_that_holds_the_answer_is_quoted(offline):
    answer = offline.query("Which club sent the single boat of Orrin Pell?")["answer"]
    assert "the Quayside Dinghy Club, which sent the single boat of Orrin Pell" in answer


def test_names_with_accents_in_two_words_or_misspelled_are_found(offline):
    priory = offline.query("Who founded the priory at Kéravel?")["answer"]
    assert "Ewen of Morlaix" in priory and not priory.startswith(DECLINED)
    boat = offline.query("Who skippered the Seawolf in the regatta?")["answer"]
    assert "Ada Brightwater" in boat and not boat.startswith(DECLINED)
    hall = offline.query("What does the Lindqvst-Hart Gallery of the priory museum show?")
    assert "shows its silver" in hall["answer"] and not hall["answer"].startswith(DECLINED)
    # An abbreviation of a few capitals is no name to decline by: pages spell it out.
    radio = offline.query("Who was the commentator on MBR for the regatta?")["answer"]
    assert "Tilda Okafor" in radio and not radio.startswith(DECLINED)
    # A name no passage writes in any of these ways is still declined.
    assert offline.query("Who skippered the Stormbird?")["answer"].startswith(DECLINED)


# (question, the kind of answer it asks for, a sentence that holds one, a sentence that does not)
ANSWER_KINDS = [
    (
        "How much did the new lighthouse cost?",
        "number",
        "The lighthouse cost 40,000 crowns to build.",
        "On June 9, 1874, the council voted for it.",  # a date is no count
    ),
    (
        "What day was the race sailed?",
        "date",
        "It was sailed on April 12, 2031.",
        "It finished with a 30-metre lead.",  # a count is no date
    ),
    (
        "Why does shelf.find return None for a key in the middle?",
        "reason",
        "shelf.find() will only match at the start of the key.",
        "Return None if the key does not match.",
    ),
    ("Since when has shelf.restore existed?", "date", "New in version 3.8.", "It returns a float."),
    (
        # "When" opens the condition of the question, which asks for an exception.
        "When the upload stalls for a minute, what exception does the client raise?",
        "exception",
        "If the transfer stalls, it raises TransferStalledError.",
        "Changed in version 3.7: it waits longer.",
    ),
    (
        "shelf.close refuses to run twice. What error is that?",
        "exception",
        "A ShelfClosedError is raised.",
        "The shelf must be open.",
    ),
]


@pytest.mark.parametrize(("question", "kind", "holding", "lacking"), ANSWER_KINDS)
def test_the_kind_of_answer_a_question_asks_for(question, kind, holding, lacking):
    assert answer_kind(question) == kind
    assert holds_answer(kind, holding, question)
    assert not holds_answer(kind, lacking, question)


def test_an_answer_holds_what_the_question_does_not_and_datetime_is_no_date():
    assert not holds_answer("exception", "shelf.close raises a ShelfError.", "Why a ShelfError?")
    assert answer_kind("Which datetime method gives a text form?") != "date"


def test_a_term_the_sentence_lacks_counts_by_the_meaning_of_the_word_the_question_writes():
    # "separate" stems to "separ", whose word pieces mean nothing; the word's vector is close
    # enough to "different" to count for part of its weight.
    passage = ContextSection(
        "s1",
        "https://example.org/pools",
        "Pools",
        "Pools",
        "A process pool runs code in a different process.",
        0.5,
        0.0,
        "passage",
    )
    (unit,) = score_sentences(
        "How do I run code in a separate process?", [passage], meaning=WORD_VECTORS
    )
    assert dict(unit.credit).get("separ", 0.0) > 0


def test_a_sentence_ends_at_a_note_mark_or_the_bracket_its_full_stop_closes():
    paragraph = (
        "(Default values are computed once; this is usually avoided.) If a slot is unfilled, "
        "a TypeError is raised. Hollow Oak gave the cider.[citation needed] Marrow Bay Radio "
        "covered it, e.g. on the coast."
    )
    assert split_sentences(paragraph) == [
        "(Default values are computed once; this is usually avoided.)",
        "If a slot is unfilled, a TypeError is raised.",
        "Hollow Oak gave the cider.[citation needed]",
        "Marrow Bay Radio covered it, e.g. on the coast.",
    ]


def test_a_sentence_goes_on_after_an_abbreviation_a_dotted_name_and_a_code_span():
    text = (
        "Dates are read in most forms, e.g. `2031-W07` or 12 May, i.e. Any ISO form. "
        "Join parts with os.path.join() first. It needs Python 3.11. Dr. Lee wrote `x = 1. Y` "
        "in the guide.\n```\nrun(). Then\n```\nDone."
    )
    assert split_sentences(text) == [
        "Dates are read in most forms, e.g. `2031-W07` or 12 May, i.e. Any ISO form.",
        "Join parts with os.path.join() first.",
        "It needs Python 3.11.",
        "Dr. Lee wrote `x = 1. Y` in the guide.",
        "```\nrun(). Then\n```",
        "Done.",
    ]


def test_no_answer_breaks_a_sentence_at_an_abbreviation(offline):
    answer = offline.query("Which objects does the gallery lend to other museums?")["answer"]
    assert (
        "The gallery lends objects to other museums, e.g. `Reliquary 7` and the Brannoc Psalter"
        in answer
    )
    assert "e.g. [Source" not in answer


def test_a_list_item_is_a_unit_of_its_own_without_its_marker():
    passage = (
        "Sorting orders can vary across cultures even for one alphabet.\n"
        "- The reverse parameter still keeps records with equal keys in their order.\n"
        "- monotonic: a clock that never goes back,\n  even when the system clock is set.\n"
    )
    assert [unit.sentence for unit in units_of(passage)] == [
        "Sorting orders can vary across cultures even for one alphabet.",
        "The reverse parameter still keeps records with equal keys in their order.",
        "monotonic: a clock that never goes back, even when the system clock is set.",
    ]


def test_a_line_after_a_list_item_that_is_not_indented_starts_a_paragraph():
    passage = (
        "This function can be called in several ways:\n"
        "- giving only the mandatory argument: ask_ok('Quit?')\n"
        "This example also introduces the in keyword of the language.\n"
    )
    assert [unit.sentence for unit in units_of(passage)][-2:] == [
        "giving only the mandatory argument: ask_ok('Quit?')",
        "This example also introduces the in keyword of the language.",
    ]


def test_a_passage_that_begins_with_the_fence_the_one_before_ends_with_is_read_as_code():
    # The first passage ends with a whole code block and two sentences; the second begins with
    # the same block (passages overlap). Its opening fence is not the closing one before it.
    block = "```\ni = 5\ndef f(arg=i):\n    print(arg)\n```\n"
    first = f"The default values are evaluated where the function is defined, so that\n{block}"
    first += "will print 5.\nImportant warning: The default value is evaluated only once."
    second = f"{block}will print 5.\nImportant warning: The default value is evaluated only once."
    second += "\nThis makes a difference when the default is a mutable object such as a list."
    texts = {chunk_id("s", 0): first, chunk_id("s", 1): second}
    read = passage_in_context(chunk_id("s", 1), second, texts)
    assert [unit.sentence for unit in units_of(read)] == [
        "Important warning: The default value is evaluated only once.",
        "This makes a difference when the default is a mutable object such as a list.",
    ]


def test_a_release_note_answers_a_version_question_not_a_how_to():
    passage = ContextSection(
        "inifiles",
        "https://docs.example/inifiles.html",
        "inifiles — settings files",
        "Module Contents",
        "class inifiles.SectionReader(f, defaults=None)\n"
        "Create an object that yields each section of the file as a mapping of its keys.\n"
        "Changed in version 3.8: Sections read are now of type dict.",
        0.6,
        0.0,
        "retrieved",
    )
    how = score_sentences("How do I read the sections of a settings file as mappings?", [passage])
    assert how[0].unit.sentence.startswith("Create an object that yields")
    since = score_sentences(
        "Since which version are the sections of a SectionReader dicts?", [passage]
    )
    assert since[0].unit.sentence.startswith("Changed in version 3.8")


def passage(
    section: str, heading: str, text: str, similarity: float, title: str = "tools — small helpers"
) -> ContextSection:
    return ContextSection(
        section,
        f"https://docs.example/tools.html#{section}",
        title,
        heading,
        text,
        similarity,
        0.0,
        "retrieved",
    )


def test_a_sentence_the_index_finds_closer_leads_its_passage_and_none_falls_below_it():
    """Two sentences of one passage hold the question's one term alike: by words alone they tie
    (and the passage's order decides), by the sentence index's similarities the one that means
    what was asked leads. A sentence the index finds far keeps its passage's similarity, as
    does one the index does not hold."""
    stairs = "The lighthouse stairs were rebuilt in granite after a storm."
    lamp = "The lighthouse lamp is lit at dusk by the keeper."
    extra = "The lighthouse museum opens on weekdays."
    question = "When does the lighthouse start shining each evening?"
    tower = passage("tower", "The tower", f"{stairs} {lamp} {extra}", 0.5, "Harbour lighthouse")
    by_words = score_sentences(question, [tower])
    assert [s.unit.sentence for s in by_words][:2] == [stairs, lamp]
    tower.sentences = ((stairs, 0.2), (lamp, 0.8))  # ``extra``: not in the index
    by_meaning = {s.unit.sentence: s for s in score_sentences(question, [tower], None, None, 0.6)}
    assert max(by_meaning.values(), key=lambda s: s.score).unit.sentence == lamp
    assert by_meaning[lamp].similarity == pytest.approx(0.4 * 0.5 + 0.6 * 0.8)
    assert by_meaning[stairs].similarity == by_meaning[extra].similarity == 0.5


def test_a_bridge_passages_sentence_naming_the_best_page_leads_only_when_strong_enough():
    """A passage the graph reached through a bridge, whose sentence names the best passage's
    page, adds that sentence to the answer; it leads the answer only when it scores as a lead
    must (LEAD_SHARE of the best), else it follows the best."""
    question = "Until which year did the Quarry Railway carry slate to the harbour?"
    railway_text = (
        "The Quarry Railway carried slate from the hill quarries down to the harbour until 1931."
    )
    museum_text = (
        "Visitors to the Harbour Museum can climb into a restored slate wagon that ran on the "
        "Quarry Railway to the harbour."
    )
    order = {}
    for museum_similarity in (0.3, 0.9):
        railway = passage("railway", "Quarry Railway", railway_text, 0.6, "Quarry Railway")
        museum = passage(
            "museum", "Harbour Museum", museum_text, museum_similarity, "Harbour Museum"
        )
        museum.via = "bridge"
        scored = score_sentences(question, [railway, museum])
        assert scored[0].passage is railway
        answer = chain([scored[0]], scored, [railway, museum], question)
        order[museum_similarity] = [s.passage.section_id for s in answer]
    assert order == {0.3: ["railway", "museum"], 0.9: ["museum", "railway"]}


def test_the_answer_starts_from_the_best_ranked_passage_that_answers():
    # Ranking put the section that does it first; the module's introduction names every term
    # of the question and is a little closer, but only says what the module is.
    section = passage(
        "sub",
        "Subcommands",
        "Call add_commands() on a menu to get a group; each command added to the group is a "
        "subcommand with options of its own.",
        0.52,
        "climenu — command menus",
    )
    intro = passage(
        "intro",
        "climenu",
        "The climenu module builds climenu.Menu objects for scripts: options, subcommands, help "
        "pages and a parser for what the user typed.",
        0.60,
        "climenu — command menus",
    )
    answer, _ = extractive_answer("How do I make subcommands with climenu?", [section, intro])
    assert answer.startswith("Call add_commands() on a menu to get a group")


def test_a_how_to_answer_quotes_the_code_of_its_passage_verbatim_with_one_citation():
    code = (
        "```\nwith tarlite.Archive('notes.tar', mode='a') as archive:\n"
        "    archive.extend(sorted(glob.glob('notes/*.txt')))\n```"
    )
    entry = passage(
        "extend",
        "Archive.extend",
        "Archive.extend(names)\n"
        "Add every file named in the list names to the archive in one call, in the order given.\n"
        "The names may be relative to the current folder.\n"
        f"For instance, to take the notes kept in a folder:\n{code}\n"
        "Members already in the archive are replaced.",
        0.55,
    )
    answer, _ = extractive_answer("How do I add many files to an archive at once?", [entry])
    assert answer.startswith("`Archive.extend(names)`: Add every file named in the list")
    assert f"For instance, to take the notes kept in a folder:\n\n{code}\n" in answer
    # One citation for the passage, after all it said, not one per sentence.
    assert answer.count("[Source: tools — small helpers]") == 1
    assert answer.endswith(f"{code}\n[Source: tools — small helpers]")


def test_a_passage_deep_in_a_long_entry_is_read_with_the_entry_opening():
    # The entry runs over four passages: its definition line is three passages before the one
    # that says what the question asks. The second passage begins inside a line of the first
    # (passages overlap by words), the third does not overlap the second: the opening's lines
    # are the page's, not cut or joined there. The last passage begins with the tail of a
    # sentence that the opening stops before: a paragraph apart, it is no sentence to quote.
    texts = {
        chunk_id("s", 0): "kiln.fire(batch, *, hold=False)\nFire a batch of pots in the kiln.\n"
        "The kiln heats at the rate the glaze of the batch needs.",
        chunk_id("s", 1): "the rate the glaze of the batch needs.\n"
        "A batch of more than forty pots is fired in two loads.",
        chunk_id("s", 2): "The door stays locked while the kiln is hot.",
        chunk_id("s", 3): "for an hour after the last cone bends.\n"
        "If hold is true, the kiln keeps the peak heat for an hour.",
    }
    read = passage_in_context(chunk_id("s", 3), texts[chunk_id("s", 3)], texts)
    assert read == (
        "kiln.fire(batch, *, hold=False)\nFire a batch of pots in the kiln.\n"
        "The kiln heats at the rate the glaze of the batch needs.\n"
        "A batch of more than forty pots is fired in two loads.\n"
        "The door stays locked while the kiln is hot.\n\n"
        "for an hour after the last cone bends.\n"
        "If hold is true, the kiln keeps the peak heat for an hour."
    )
    units = units_of(read)
    assert "The door stays locked while the kiln is hot." in [u.sentence for u in units]
    assert not any("cone" in u.sentence for u in units)
    (hold,) = [u for u in units if u.sentence.startswith("If hold is true")]
    assert hold.signature == "kiln.fire(batch, *, hold=False)"
