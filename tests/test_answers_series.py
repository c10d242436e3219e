"""Offline answers to a question that names one of a series ("Clifftop Relay 12").

The passages are written for this module, as an encyclopedia writes an event's article: the
page names earlier races of the series too ("Clifftop Relay IX"), and the sentence that says
who won leans on the sentence before it for the race's name.
"""

from __future__ import annotations

from retrieval.extractive import extractive_answer
from retrieval.meaning import word_vectors_of
from retrieval.query import ContextSection
from retrieval.series import series_named, speaks_of, value
from retrieval.unit_scoring import names_written, opens_with_a_name, score_sentences

WORD_VECTORS = word_vectors_of("sentence-transformers/all-MiniLM-L6-v2")
TITLE = "Clifftop Relay 12"
QUESTION = "Which crew won Clifftop Relay 12?"
# In ranking order: the page's passage on the bids ranks first, though it says who won an
# earlier race; the outcome is in the article's opening and in its passage on records.
PASSAGES = [
    (
        "bids",
        0.62,
        "The Clifftop Relay 12 opened with a parade of the runners through Gull Harbour. The "
        "committee chose the coast path for the Clifftop Relay 12 in 2031. The town last "
        "hosted the race in 2019 (Clifftop Relay IX), won by the home crew Gannets. The bid "
        "depended on a new footbridge.",
    ),
    (
        "opening",
        0.70,
        "Clifftop Relay 12 was a running race to decide the champion of the Coastal Running "
        "League for the 2034 season. The Harbour League champion Marsh Harriers beat the Fen "
        "League champion Dune Runners by nine seconds to earn their second relay title.",
    ),
    (
        "records",
        0.50,
        "Clifftop Relay 12 set several course records. Harriers won despite dropping the baton "
        "twice on the cliff stairs. Their time was the slowest ever for a winning crew.",
    ),
]


def passages() -> list[ContextSection]:
    return [
        ContextSection(
            name,
            "https://events.example/clifftop-relay-12.html",
            TITLE,
            name,
            text,
            similarity,
            0.0,
            "retrieved",
        )
        for name, similarity, text in PASSAGES
    ]


def test_the_one_of_a_series_a_question_names_is_read_with_its_number_by_value():
    (relay,) = series_named(QUESTION)
    assert relay.words == ("Clifftop", "Relay") and relay.numbers == {12}
    assert speaks_of("The Clifftop Relay XII ended at dusk.", (relay,)) == (True, False)
    assert speaks_of("It was the first since Clifftop Relay IX.", (relay,)) == (False, True)
    assert speaks_of("Every clifftop relay is run in May.", (relay,)) == (False, False)
    assert value("XLVIII") == 48 and value("MCMXC") == 1990
    # A question's first word and a version are no series ("Python 3.11" is a release).
    assert series_named("In 1985 who won the relay?") == ()
    assert series_named("What is new in Python 3.11?") == ()


def test_a_sentence_about_another_one_of_the_series_earns_nothing_for_its_name():
    # The earlier race's sentence holds "won" and "crew" and the series' words, but it says who
    # won Clifftop Relay IX: the race's words and number count nothing for it, though the
    # title and the sentence before it write them.
    scored = score_sentences(QUESTION, passages(), meaning=WORD_VECTORS)
    earlier = next(s for s in scored if "Gannets" in s.unit.sentence)
    assert {t: c for t, c in earlier.credit if c}.keys() == {"won", "crew"}
    assert scored[0].unit.sentence.startswith("Harriers won")
    # Nor does the sentence after it lean on it for the question's words.
    footbridge = next(s for s in scored if "footbridge" in s.unit.sentence)
    assert not {"won", "crew"} & {term for term, _ in footbridge.credit}


def test_the_sentence_after_the_one_naming_the_race_answers_for_that_race():
    # "Harriers won despite ..." says neither the race's name nor its number; the sentence
    # before it names the race whole, so the number counts for it in full, not at the title's
    # half share, and a question asking a fact starts from the unit that states it, not from
    # the best-ranked passage.
    answer, _ = extractive_answer(QUESTION, passages(), meaning=WORD_VECTORS)
    assert answer.startswith("Harriers won despite dropping the baton twice")


def test_a_name_opening_a_sentence_is_a_name_where_the_passages_write_it_as_one():
    texts = tuple(text for _, _, text in PASSAGES)
    names = names_written(texts)
    assert "harriers" in names and "the" not in names and "clifftop" in names
    assert opens_with_a_name("Harriers won despite dropping the baton.", names, QUESTION)
    assert not opens_with_a_name("Their time was the slowest ever.", names, QUESTION)
    # A name the question holds is no answer to it.
    assert not opens_with_a_name("Clifftop Relay 12 set records.", names, QUESTION)
