"""Sections cut into overlapping chunks that fit the token budget."""

from __future__ import annotations

from itertools import pairwise

import pytest

from kpack.ingest.chunking import WORDS_PER_TOKEN, estimate_tokens, split_into_chunks


def prose(sentences: int, words_per_sentence: int, prefix: str = "s") -> str:
    """Numbered sentences whose words are all distinct, so positions can be traced."""
    return " ".join(
        " ".join(["Sentence"] + [f"{prefix}{j}w{i}" for i in range(words_per_sentence - 1)]) + "."
        for j in range(sentences)
    )


def overlap_lines(before: str, after: str) -> list[str]:
    """The lines that start `after` and also end `before`."""
    a, b = before.split("\n"), after.split("\n")
    for k in range(min(len(a), len(b)), 0, -1):
        if a[-k:] == b[:k]:
            return b[:k]
    return []


def test_estimate_tokens():
    assert estimate_tokens("") == 0
    assert estimate_tokens("one two three") == 4
    assert estimate_tokens(" ".join(["w"] * 192)) == 256


def test_short_section_is_one_chunk_identical_to_the_text():
    text = "A short section.\n\nWith two paragraphs and `code`."
    assert split_into_chunks(text, 256, 48) == [text]


def test_section_exactly_at_the_budget_is_one_chunk():
    text = " ".join(f"w{i}" for i in range(int(64 * WORDS_PER_TOKEN)))
    assert split_into_chunks(text, 64, 16) == [text]


@pytest.mark.parametrize(("tokens", "overlap"), [(64, 16), (256, 48), (40, 8)])
def test_long_section_is_split_within_budget_with_overlap_and_full_coverage(tokens, overlap):
    text = prose(sentences=80, words_per_sentence=6)
    chunks = split_into_chunks(text, tokens, overlap)
    assert len(chunks) > 2
    for chunk in chunks:
        assert estimate_tokens(chunk) <= tokens, chunk
    for before, after in pairwise(chunks):
        shared = overlap_lines(before, after)
        assert shared, (before, after)
        assert sum(len(line.split()) for line in shared) <= overlap * WORDS_PER_TOKEN
    # Every word is in some chunk, and the chunks read in the section's order.
    words = text.split()
    seen = [w for chunk in chunks for w in chunk.split()]
    assert set(seen) == set(words)
    firsts = [words.index(chunk.split()[1]) for chunk in chunks]
    assert firsts == sorted(firsts)


def test_neighbouring_chunks_share_about_the_overlap():
    chunks = split_into_chunks(prose(sentences=60, words_per_sentence=10), 64, 16)
    for before, after in pairwise(chunks):
        shared = set(before.split()) & set(after.split()) - {"Sentence"}
        assert shared, (before, after)


def test_code_lines_are_never_cut():
    code = "\n".join(f"call_{i}(alpha, beta, gamma, delta)" for i in range(40))
    text = f"Intro sentence here.\n```\n{code}\n```\nOutro sentence here."
    chunks = split_into_chunks(text, 64, 16)
    assert len(chunks) > 1
    lines = {line for chunk in chunks for line in chunk.split("\n")}
    for i in range(40):
        assert f"call_{i}(alpha, beta, gamma, delta)" in lines
    for chunk in chunks:
        assert estimate_tokens(chunk) <= 64


def test_a_sentence_longer_than_the_budget_is_cut_into_pieces():
    text = " ".join(f"w{i}" for i in range(100))  # one sentence, no punctuation
    chunks = split_into_chunks(text, 40, 8)
    assert all(estimate_tokens(c) <= 40 for c in chunks)
    assert {w for c in chunks for w in c.split()} == set(text.split())


def test_carried_overlap_plus_next_sentence_stays_within_budget():
    text = "Alpha beta gamma delta epsilon. " + prose(1, 26, prefix="b")
    chunks = split_into_chunks(text, 40, 8)
    assert all(estimate_tokens(c) <= 40 for c in chunks), [estimate_tokens(c) for c in chunks]


def test_overlap_survives_sentences_longer_than_the_overlap():
    chunks = split_into_chunks(prose(sentences=20, words_per_sentence=40), 256, 48)
    assert len(chunks) > 1
    for before, after in pairwise(chunks):
        assert set(before.split()) & set(after.split()) - {"Sentence"}
