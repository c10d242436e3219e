"""The reader's in-memory keyword search (kpack.keyword_index), ranked as BM25 ranks."""

from __future__ import annotations

import math

from kpack.keyword_index import K1, B, KeywordIndex

PASSAGES = [
    "Set allow_private_hosts to fetch pages from a private network.",
    "A build publishes a new version of the pack when a page changed.",
    "The pack was published yesterday. The pack is small. The pack is fast.",
    "Kuzu stores the graph of the pack on disk.",
]


def test_rare_words_and_identifiers_rank_their_passage_first():
    index = KeywordIndex.of(PASSAGES)
    assert index.search("How do I use allow_private_hosts?", 3)[0][0] == 0
    assert [row for row, _ in index.search("Where is the graph stored?", 3)] == [3]


def test_word_forms_meet_and_stop_words_alone_find_nothing():
    index = KeywordIndex.of(PASSAGES)
    assert {row for row, _ in index.search("publishing", 4)} == {1, 2}
    assert index.search("what is the", 4) == []
    assert index.search("", 4) == []


def test_scores_are_okapi_bm25_with_lucene_idf():
    index = KeywordIndex.of(PASSAGES)
    (row, score), *_ = index.search("disk", 1)
    lengths = [6, 7, 7, 5]  # content words per passage, stop words dropped
    idf = math.log(1 + (4 - 1 + 0.5) / (1 + 0.5))
    expected = idf * (K1 + 1) / (1 + K1 * (1 - B + B * lengths[3] / (sum(lengths) / 4)))
    assert row == 3 and math.isclose(score, expected, rel_tol=1e-6)
    ranked = index.search("pack", 4)
    assert ranked[0][0] == 2  # three mentions beat one, despite the longer passage
    assert [row for row, _ in ranked[1:]] == [3, 1]  # one mention: the shorter passage first


def test_a_common_word_brings_only_its_heaviest_passages(monkeypatch):
    """In a large pack a question's common word sums only the passages it weighs most (the
    query's work stays bounded); a passage that also holds the rare word still ranks first."""
    import kpack.keyword_index

    filler = "The cache keeps entries. " * 3
    passages = [f"{filler} Note {i}." for i in range(40)]
    passages += ["cache " * 6, "The cache and the sprocket setting.", "cache cache"]
    index = KeywordIndex.of(passages)
    exact = index.search("sprocket cache", 3)
    monkeypatch.setattr(kpack.keyword_index, "KEYWORD_TERM_CANDIDATES", 3)
    bounded = index.search("sprocket cache", 3)
    assert bounded[0][0] == exact[0][0] == 41  # both words
    # The passages the bounded search sums for "cache" are its heaviest three.
    rows, weights = index.postings("cach")
    heaviest = {int(r) for r in rows[weights.argsort()[::-1][:3]]}
    assert {row for row, _ in bounded[1:]} <= heaviest
