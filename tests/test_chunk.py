"""Sections cut into overlapping chunks that the embedding model reads whole, sized in its own
word pieces (counted with the packaged model's real tokenizer)."""

from __future__ import annotations

from itertools import pairwise

import pytest

from kpack.contracts import passage_text
from kpack.ingest.chunking import body_budget, chunk_rows, split_into_chunks
from kpack.ingest.word_pieces import PieceCounter, piece_counter


@pytest.fixture(scope="module")
def counter() -> PieceCounter:
    return piece_counter("default")


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


def test_the_packaged_model_reads_254_pieces_of_text_and_counts_code_as_several(counter):
    assert counter.tokenizer is not None and counter.reads == 254
    # An identifier costs several pieces though it is one word: words misjudge code.
    assert counter.count_one("os.path.expanduser") > 3
    assert counter.count(["alpha beta", "gamma"]) == [2, 1]


def test_short_section_is_one_chunk_identical_to_the_text(counter):
    text = "A short section.\n\nWith two paragraphs and `code`."
    assert split_into_chunks(text, 254, 48, counter) == [text]


def test_section_exactly_at_the_budget_is_one_chunk(counter):
    text = " ".join(["word"] * 64)
    assert counter.count_one(text) == 64
    assert split_into_chunks(text, 64, 16, counter) == [text]


@pytest.mark.parametrize(("budget", "overlap"), [(96, 32), (254, 48), (160, 40)])
def test_long_section_is_split_within_budget_with_overlap_and_full_coverage(
    counter, budget, overlap
):
    text = prose(sentences=80, words_per_sentence=6)
    chunks = split_into_chunks(text, budget, overlap, counter)
    assert len(chunks) > 2
    for chunk in chunks:
        assert counter.count_one(chunk) <= budget, chunk
    for before, after in pairwise(chunks):
        shared = overlap_lines(before, after)
        assert shared, (before, after)
        assert counter.count_one(" ".join(shared)) <= overlap
    words = text.split()
    seen = [w for chunk in chunks for w in chunk.split()]
    assert set(seen) == set(words)
    firsts = [words.index(chunk.split()[1]) for chunk in chunks]
    assert firsts == sorted(firsts)


def test_code_lines_are_never_cut_and_code_heavy_chunks_hold_fewer_words(counter):
    code = "\n".join(f"call_{i}(alpha_beta, gamma.delta, **kwargs)" for i in range(60))
    text = f"Intro sentence here.\n```\n{code}\n```\nOutro sentence here."
    chunks = split_into_chunks(text, 64, 16, counter)
    assert len(chunks) > 1
    lines = {line for chunk in chunks for line in chunk.split("\n")}
    for i in range(60):
        assert f"call_{i}(alpha_beta, gamma.delta, **kwargs)" in lines
    for chunk in chunks:
        assert counter.count_one(chunk) <= 64
        assert len(chunk.split()) < 64 * 0.75  # what a count of words would have allowed


def test_a_sentence_longer_than_the_budget_is_cut_at_words(counter):
    text = " ".join(f"w{i}" for i in range(100))  # one sentence, no punctuation
    chunks = split_into_chunks(text, 40, 8, counter)
    assert all(counter.count_one(c) <= 40 for c in chunks)
    assert {w for c in chunks for w in c.split()} == set(text.split())


def test_overlap_survives_sentences_longer_than_the_overlap(counter):
    chunks = split_into_chunks(prose(sentences=20, words_per_sentence=40), 254, 48, counter)
    assert len(chunks) > 1
    for before, after in pairwise(chunks):
        assert set(before.split()) & set(after.split()) - {"Sentence"}


def test_no_embedded_passage_is_longer_than_the_model_reads_heading_path_included(counter):
    heading = "Library reference > concurrent.futures > ThreadPoolExecutor.submit()"
    section = {
        "section_id": "abc-0001",
        "article_url": "https://docs.example.org/lib.html",
        "article_title": "lib",
        "section_index": 1,
        "heading_path": heading,
        "content": "\n".join(
            f"executor.submit(fn_{i}, *args, **kwargs) returns a Future_{i} object."
            for i in range(90)
        ),
    }
    rows = chunk_rows([section], 256, 48, counter)
    assert len(rows) > 3
    for row in rows:
        embedded = counter.count_one(passage_text(heading, row["content"]))
        assert embedded == row["word_pieces"] <= counter.reads
    assert body_budget(heading, 256, counter) == counter.reads - counter.count_one(heading)


def test_a_smaller_chunk_tokens_setting_is_honoured(counter):
    assert body_budget("H", 100, counter) == 100 - counter.count_one("H")


def test_without_a_tokenizer_sizes_are_estimated_from_words():
    words_only = PieceCounter("unknown-model", 254, None)
    assert words_only.count(["one two three"]) == [4]
