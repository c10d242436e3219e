"""BM25 keyword search over a version's persisted keyword index (kpack.indexes).

The build writes the postings (kpack.indexes._write_keyword_index); a reader maps them and
:class:`KeywordIndex` searches them: per question term, a bisection of the sorted vocabulary
and a slice of the postings, so a search costs what the question's terms' postings hold, and
opening a version builds nothing.

Scoring is Okapi BM25 as Lucene and Kuzu compute it (k1 = 1.2, b = 0.75, idf = ln(1 + (N - n +
0.5) / (n + 0.5))) over the passage text, the weights computed at build time. Terms are
kpack.text.search_terms. Each distinct term of the question counts once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from kpack import indexes as ix
from kpack.text import search_terms


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

    @classmethod
    def load(cls, folder: Path) -> KeywordIndex:
        """The index the build wrote into a version's index folder, memory-mapped."""
        return cls._of({name: ix.load_array(folder, name) for name in ix.KEYWORD_FILES})

    @classmethod
    def of(cls, texts: list[str]) -> KeywordIndex:
        """The index of ``texts`` (passage i is row i), in memory."""
        return cls._of(ix.keyword_postings(texts))

    @classmethod
    def _of(cls, arrays: Mapping[str, np.ndarray]) -> KeywordIndex:
        return cls(
            arrays[ix.KEYWORD_VOCABULARY],
            arrays[ix.KEYWORD_TERM_OFFSETS],
            arrays[ix.KEYWORD_OFFSETS],
            arrays[ix.KEYWORD_ROWS],
            arrays[ix.KEYWORD_WEIGHTS],
            len(arrays[ix.KEYWORD_LENGTHS]),
        )

    @property
    def terms(self) -> int:
        return len(self._term_offsets) - 1

    def term(self, number: int) -> str:
        start, end = self._term_offsets[number], self._term_offsets[number + 1]
        return bytes(self._vocabulary[start:end]).decode()

    def number_of(self, term: str) -> int | None:
        """The term's position in the sorted vocabulary (bisection on its UTF-8 bytes)."""
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
        by row; rows without any of the terms are not returned."""
        if k <= 0:
            return []
        found = [self.postings(t) for t in dict.fromkeys(search_terms(text))]
        found = [(rows, weights) for rows, weights in found if len(rows)]
        if not found:
            return []
        rows = np.concatenate([r for r, _ in found])
        weights = np.concatenate([w for _, w in found]).astype(np.float64)
        held, at = np.unique(rows, return_inverse=True)
        scores = np.bincount(at, weights=weights, minlength=len(held))
        order = np.lexsort((held, -scores))[:k]
        return [(int(held[i]), float(scores[i])) for i in order]


class _Frequency(Mapping[str, int]):
    """term -> how many passages hold it, read from the postings' offsets."""

    def __init__(self, index: KeywordIndex) -> None:
        self._index = index

    def __getitem__(self, term: str) -> int:
        number = self._index.number_of(term)
        if number is None:
            raise KeyError(term)
        return int(self._index._offsets[number + 1] - self._index._offsets[number])

    def __iter__(self) -> Iterator[str]:
        return (self._index.term(n) for n in range(self._index.terms))

    def __len__(self) -> int:
        return self._index.terms
