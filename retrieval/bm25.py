"""BM25 keyword search over a version's persisted keyword index.

The build writes the postings (kpack.indexes.keyword_postings); a reader maps them and
kpack.indexes.KeywordIndex searches them: per question term, a bisection of the sorted
vocabulary and a slice of the postings, so a search costs what the question's terms' postings
hold, and opening a version builds nothing.

Scoring is Okapi BM25 as Lucene and Kuzu compute it (k1 = 1.2, b = 0.75, idf = ln(1 + (N - n +
0.5) / (n + 0.5))) over the passage text, the weights computed at build time. Terms are
kpack.text.search_terms. Each distinct term of the question counts once.
"""

from kpack.indexes import KeywordIndex

__all__ = ["KeywordIndex"]
