"""Content quality scoring (seed 000): drops stubs and off-topic sections from the context.

Its overlap compares a text's search words as written (kpack.text.search_words, not stemmed:
"caching" does not meet "cache" here, where kpack.text.term_set's stems would)."""

from __future__ import annotations

from functools import lru_cache

from kpack.text import search_words
from retrieval.query import Query

QUALITY_THRESHOLD = 0.3
MIN_WORDS = 20


@lru_cache(maxsize=65536)
def text_profile(text: str) -> tuple[int, frozenset[str]]:
    """(word count, distinct search words) of a text. Pack texts repeat across queries, so
    each is scanned once per process."""
    return len(text.split()), frozenset(search_words(text))


def quality_score(content: str, question: str) -> float:
    """min(1, length_score + keyword_score); sections under 20 words score 0.

    length_score  = min(0.8, 0.2 + (words / 200) * 0.6)
    keyword_score = min(0.2, overlap * 0.2), overlap = share of question terms in the section
    """
    words, content_words = text_profile(content)
    if words < MIN_WORDS:
        return 0.0
    length_score = min(0.8, 0.2 + (words / 200) * 0.6)
    wanted = text_profile(question)[1]
    overlap = len(wanted & content_words) / len(wanted) if wanted else 0.0
    keyword_score = min(0.2, overlap * 0.2)
    return min(1.0, length_score + keyword_score)


class QualityFilter:
    """Stage: scores the context and the kept passages, and drops context sections below the
    threshold (0.3), but never the only one: a short section can be exactly what was asked
    ("Releases are cut every Tuesday")."""

    name, phase, toggle = "quality_filter", "context", "enable_quality_filter"

    def __init__(self, threshold: float = QUALITY_THRESHOLD) -> None:
        self.threshold = threshold

    def __call__(self, query: Query) -> None:
        for candidate in query.candidates:
            candidate.quality = quality_score(candidate.text, query.text)
            candidate.reasons.append(f"quality {candidate.quality:.2f}")
        for section in query.context:
            section.quality = quality_score(section.text, query.text)
        kept = [s for s in query.context if (s.quality or 0.0) >= self.threshold]
        if not kept and query.context:
            kept = [max(query.context, key=lambda s: s.similarity)]
        query.notes["quality_filtered"] = [
            f"{s.title} > {s.heading}" for s in query.context if s not in kept
        ]
        query.context = kept
