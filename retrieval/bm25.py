"""BM25 over the passages a reader holds in memory: keyword search without a database call.

Kuzu's full-text index answered each question in 6 to 9 ms on the Python docs pack (7,361
passages), a fifth of a whole query; the same ranking from postings held in memory takes well
under a millisecond, and threads serving several questions no longer wait on the reader's one
Kuzu connection for it. The index is built once per pack version, on the first keyword search
(about half a second for 7,000 passages), and kept in the reader's cache.

Scoring is Okapi BM25 as Lucene and Kuzu compute it (k1 = 1.2, b = 0.75, idf = ln(1 + (N - n +
0.5) / (n + 0.5))) over the passage text. Terms are kpack.text.search_terms: words of letters,
digits and underscores (``allow_private_hosts`` stays one term), lower-cased, stop words
dropped, and lightly stemmed so "publishes", "published" and "publish" meet. Each distinct
term of the question counts once.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass

import numpy as np

from kpack.text import search_terms, words
from retrieval.reader import PackReader, best_rows

K1 = 1.2
B = 0.75
CACHE_KEY = "bm25"

_build_lock = threading.Lock()


@dataclass(frozen=True)
class KeywordIndex:
    """Per term, the passages (rows of the reader's chunk table) that hold it and the BM25
    weight each gets for it."""

    rows: dict[str, np.ndarray]
    weights: dict[str, np.ndarray]
    passages: int
    frequency: dict[str, int]  # term -> how many passages hold it (the gate's idf)

    @classmethod
    def of(cls, texts: list[str]) -> KeywordIndex:
        seen: dict[str, str] = {}  # word -> its term ("" for a stop word)
        counts = [_term_counts(text, seen) for text in texts]
        lengths = np.array([sum(c.values()) for c in counts], dtype=np.float64)
        average = float(lengths.mean()) if len(lengths) and lengths.mean() > 0 else 1.0
        norm = K1 * (1.0 - B + B * lengths / average)
        holders: dict[str, list[tuple[int, int]]] = {}
        for row, count in enumerate(counts):
            for term, tf in count.items():
                holders.setdefault(term, []).append((row, tf))
        rows, weights, frequency = {}, {}, {}
        for term, held in holders.items():
            at = np.array([row for row, _ in held], dtype=np.int64)
            tf = np.array([tf for _, tf in held], dtype=np.float64)
            idf = math.log(1.0 + (len(texts) - len(held) + 0.5) / (len(held) + 0.5))
            rows[term] = at
            frequency[term] = len(held)
            weights[term] = (idf * tf * (K1 + 1.0) / (tf + norm[at])).astype(np.float32)
        return cls(rows, weights, len(texts), frequency)

    def search(self, text: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` best rows for the terms of ``text``: (row, BM25 score), best first, ties
        by row; rows without any of the terms are not returned."""
        known = [t for t in dict.fromkeys(search_terms(text)) if t in self.rows]
        if not known or k <= 0:
            return []
        scores = np.bincount(
            np.concatenate([self.rows[t] for t in known]),
            weights=np.concatenate([self.weights[t] for t in known]),
            minlength=self.passages,
        )
        best = best_rows(scores, k, np.flatnonzero(scores > 0))
        return [(int(row), float(scores[row])) for row in best]


def _term_counts(text: str, seen: dict[str, str]) -> dict[str, int]:
    """search_terms(text), counted. Words are counted before they become terms (``seen``
    remembers each word's term): stemming every occurrence was most of building the index."""
    counts: dict[str, int] = {}
    for word, n in Counter(words(text)).items():
        term = seen.get(word)
        if term is None:
            term = seen[word] = next(iter(search_terms(word)), "")
        if term:
            counts[term] = counts.get(term, 0) + n
    return counts


def keyword_index(reader: PackReader) -> KeywordIndex:
    """The reader's KeywordIndex over its chunk texts, built on first use."""
    if CACHE_KEY not in reader.cache:
        with _build_lock:
            if CACHE_KEY not in reader.cache:
                reader.cache[CACHE_KEY] = KeywordIndex.of(
                    [reader.chunk_text[chunk] for chunk in reader.chunk_ids]
                )
    return reader.cache[CACHE_KEY]
