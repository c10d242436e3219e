"""The BM25 keyword index of a version's passages: written by the build, searched by a query.

``keyword_*.npy`` (kpack.index_files): the vocabulary is one UTF-8 byte string
(``keyword_vocabulary.npy``) with term offsets, sorted, searched by bisection: no Python dict
is built at open (bm25s loads its vocabulary from JSON into a dict, O(vocabulary) at every
open, a second or more at a million passages). Postings are CSC-like: per term an offset into
``keyword_rows.npy`` (chunk rows, ascending) and ``keyword_weights.npy`` (the BM25 weight of
the term in that passage). A search costs what the question's terms' postings hold, and
opening a version builds nothing.

Scoring is Okapi BM25 as Lucene and Kuzu compute it (k1 = 1.2, b = 0.75, idf = ln(1 + (N - n +
0.5) / (n + 0.5))) over the passage text, the weights computed at build time. Terms are
kpack.text.search_terms. Each distinct term of the question counts once.
"""

from __future__ import annotations

from array import array as flat_array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np

from kpack.index_files import (
    KEYWORD_FILES,
    KEYWORD_LENGTHS,
    KEYWORD_OFFSETS,
    KEYWORD_ROWS,
    KEYWORD_TERM_OFFSETS,
    KEYWORD_VOCABULARY,
    KEYWORD_WEIGHTS,
)
from kpack.mapped_tables import Lookup, load_array
from kpack.text import search_terms, words

# Keyword search takes at most this many passages per question term, the term's heaviest
# (KeywordIndex.search): every passage of every term of a pack of up to this size.
KEYWORD_TERM_CANDIDATES = 20_000
TERMS_REMEMBERED = 1 << 16  # terms whose vocabulary position a reader keeps (number_of)
K1 = 1.2  # BM25 as Lucene and Kuzu compute it
B = 0.75


def keyword_postings(texts: Iterable[str]) -> dict[str, np.ndarray]:
    """BM25 postings of ``texts`` (kpack.text.search_terms), in the module docstring's format:
    file name -> array.

    Each text's words are counted in C (Counter) and each distinct word is stemmed once per
    pack; the postings are gathered in flat integer arrays and grouped by one sort, so a
    million passages' tens of millions of postings take a few hundred MB, not a Python
    object each."""
    term_of_word: dict[str, int] = {}  # word -> its term's number (-1 for a stop word)
    numbers: dict[str, int] = {}  # term -> its number, in order of first use
    rows, terms, frequencies = flat_array("i"), flat_array("i"), flat_array("i")
    lengths = flat_array("d")
    for row, text in enumerate(texts):
        counts: dict[int, int] = {}
        for word, n in Counter(words(text)).items():
            number = term_of_word.get(word)
            if number is None:
                term = next(iter(search_terms(word)), "")
                number = term_of_word[word] = numbers.setdefault(term, len(numbers)) if term else -1
            if number >= 0:
                counts[number] = counts.get(number, 0) + n
        lengths.append(sum(counts.values()))
        rows.extend([row] * len(counts))
        terms.extend(counts)
        frequencies.extend(counts.values())
    return _postings_arrays(list(numbers), rows, terms, frequencies, np.asarray(lengths))


def _postings_arrays(
    vocabulary: list[str],
    rows: flat_array,
    terms: flat_array,
    frequencies: flat_array,
    lengths: np.ndarray,
) -> dict[str, np.ndarray]:
    """The keyword index files from flat (row, term number, frequency) postings."""
    encoded = [term.encode() for term in vocabulary]
    order = sorted(range(len(encoded)), key=encoded.__getitem__)  # by UTF-8 bytes
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    term = position[np.frombuffer(terms, dtype=np.int32)]
    grouped = np.argsort(term, kind="stable")  # by term, rows ascending within each
    at = np.frombuffer(rows, dtype=np.int32)[grouped]
    tf = np.frombuffer(frequencies, dtype=np.int32)[grouped].astype(np.float64)
    held = np.bincount(term, minlength=len(order))
    offsets = np.concatenate([[0], np.cumsum(held)]).astype(np.int64)
    average = float(lengths.mean()) if len(lengths) and lengths.mean() > 0 else 1.0
    norm = K1 * (1.0 - B + B * lengths / average)
    idf = np.log(1.0 + (len(lengths) - held + 0.5) / (held + 0.5))
    weights = np.repeat(idf, held) * tf * (K1 + 1.0) / (tf + norm[at])
    ordered = [encoded[i] for i in order]
    return {
        KEYWORD_VOCABULARY: np.frombuffer(b"".join(ordered), dtype=np.uint8),
        KEYWORD_TERM_OFFSETS: np.concatenate([[0], np.cumsum([len(e) for e in ordered])]).astype(
            np.int64
        ),
        KEYWORD_OFFSETS: offsets,
        KEYWORD_ROWS: at.astype(np.int32),
        KEYWORD_WEIGHTS: weights.astype(np.float32),
        KEYWORD_LENGTHS: lengths.astype(np.float32),
    }


class KeywordIndex:
    """Per term, the passages (rows of the reader's chunk table) that hold it and the BM25
    weight each gets for it; ``frequency`` (term -> how many passages hold it) is the gate's
    idf."""

    def __init__(
        self,
        vocabulary: np.ndarray,
        term_offsets: np.ndarray,
        offsets: np.ndarray,
        rows: np.ndarray,
        weights: np.ndarray,
        passages: int,
    ) -> None:
        self._vocabulary = vocabulary
        self._term_offsets = term_offsets
        self._offsets = offsets
        self._rows = rows
        self._weights = weights
        self.passages = passages
        self.frequency: Mapping[str, int] = _Frequency(self)
        # A query looks its terms up again and again (the search, the gate's coverage of each
        # passage, the answer's sentence scores): about 200 bisections a question, 20 terms.
        self._numbers: dict[str, int | None] = {}

    @classmethod
    def load(cls, folder: Path) -> KeywordIndex:
        """The index the build wrote into a version's index folder, memory-mapped."""
        return cls._of({name: load_array(folder, name) for name in KEYWORD_FILES})

    @classmethod
    def of(cls, texts: list[str]) -> KeywordIndex:
        """The index of ``texts`` (passage i is row i), in memory."""
        return cls._of(keyword_postings(texts))

    @classmethod
    def _of(cls, arrays: Mapping[str, np.ndarray]) -> KeywordIndex:
        return cls(
            arrays[KEYWORD_VOCABULARY],
            arrays[KEYWORD_TERM_OFFSETS],
            arrays[KEYWORD_OFFSETS],
            arrays[KEYWORD_ROWS],
            arrays[KEYWORD_WEIGHTS],
            len(arrays[KEYWORD_LENGTHS]),
        )

    @property
    def terms(self) -> int:
        return len(self._term_offsets) - 1

    def term(self, number: int) -> str:
        start, end = self._term_offsets[number], self._term_offsets[number + 1]
        return bytes(self._vocabulary[start:end]).decode()

    def number_of(self, term: str) -> int | None:
        """The term's position in the sorted vocabulary: a bisection on its UTF-8 bytes, once
        per term (up to TERMS_REMEMBERED terms are remembered, then forgotten at once)."""
        if term in self._numbers:
            return self._numbers[term]
        if len(self._numbers) >= TERMS_REMEMBERED:
            self._numbers.clear()
        number = self._numbers[term] = self._bisect(term)
        return number

    def _bisect(self, term: str) -> int | None:
        wanted = term.encode()
        low, high = 0, self.terms
        while low < high:
            middle = (low + high) // 2
            start, end = self._term_offsets[middle], self._term_offsets[middle + 1]
            if bytes(self._vocabulary[start:end]) < wanted:
                low = middle + 1
            else:
                high = middle
        return low if low < self.terms and self.term(low) == term else None

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(rows, weights) of the passages holding ``term`` (rows ascending); empty if none."""
        number = self.number_of(term)
        if number is None:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        start, end = self._offsets[number], self._offsets[number + 1]
        return self._rows[start:end], self._weights[start:end]

    def search(self, text: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` best rows for the terms of ``text``: (row, BM25 score), best first, ties
        by row; rows without any of the terms are not returned.

        A term held by more than ``KEYWORD_TERM_CANDIDATES`` passages (a common word of a
        large pack) brings only that many of them, those it weighs most: summing every
        passage of every common word is the length-N work a query must not do, and a
        passage below them has a lower weight for that word than each of the ones kept.
        Exact for a pack of fewer passages."""
        if k <= 0:
            return []
        found = [
            _strongest(*self.postings(t), KEYWORD_TERM_CANDIDATES)
            for t in dict.fromkeys(search_terms(text))
        ]
        found = [(rows, weights) for rows, weights in found if len(rows)]
        if not found:
            return []
        # Scores summed into one array over the pack's passages (a term's rows are distinct,
        # so each addition lands): a memset and a scan, where merging the terms' postings
        # sorted up to 200,000 rows a question.
        scores = np.zeros(self.passages, dtype=np.float64)
        holds = np.zeros(self.passages, dtype=bool)
        for rows, weights in found:
            scores[rows] += weights
            holds[rows] = True
        held = np.flatnonzero(holds)
        held_scores = scores[held]
        if len(held) > k:  # the k best, and every row tied with the k-th
            kth = np.partition(-held_scores, k - 1)[k - 1]
            best = -held_scores <= kth
            held, held_scores = held[best], held_scores[best]
        order = np.lexsort((held, -held_scores))[:k]
        return [(int(held[i]), float(held_scores[i])) for i in order]


def _strongest(rows: np.ndarray, weights: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``most`` postings of highest weight (all of them when there are no more)."""
    if len(rows) <= most:
        return rows, weights
    kept = np.sort(np.argpartition(-np.asarray(weights), most - 1)[:most])
    return rows[kept], weights[kept]


class _Frequency(Lookup[int]):
    """term -> how many passages hold it, read from the postings' offsets."""

    def __init__(self, index: KeywordIndex) -> None:
        self._index = index

    def found(self, term: str) -> int | None:
        number = self._index.number_of(term)
        if number is None:
            return None
        return int(self._index._offsets[number + 1] - self._index._offsets[number])

    def __iter__(self) -> Iterator[str]:
        return (self._index.term(n) for n in range(self._index.terms))

    def __len__(self) -> int:
        return self._index.terms
