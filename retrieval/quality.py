"""Content quality scoring (seed 000): drops stubs and off-topic sections from the context."""

from __future__ import annotations

import re
from functools import lru_cache

from kpack.text import STOPWORDS

QUALITY_THRESHOLD = 0.3
MIN_WORDS = 20
WORD = re.compile(r"[a-z0-9_]+")


def terms(text: str) -> frozenset[str]:
    return text_profile(text)[1]


@lru_cache(maxsize=65536)
def text_profile(text: str) -> tuple[int, frozenset[str]]:
    """(word count, content terms) of a text. Pack texts repeat across queries, so each is
    scanned once per process."""
    return len(text.split()), frozenset(w for w in WORD.findall(text.lower()) if w not in STOPWORDS)


def quality_score(content: str, question: str) -> float:
    """min(1, length_score + keyword_score); sections under 20 words score 0.

    length_score  = min(0.8, 0.2 + (words / 200) * 0.6)
    keyword_score = min(0.2, overlap * 0.2), overlap = share of question terms in the section
    """
    words, content_terms = text_profile(content)
    if words < MIN_WORDS:
        return 0.0
    length_score = min(0.8, 0.2 + (words / 200) * 0.6)
    wanted = terms(question)
    overlap = len(wanted & content_terms) / len(wanted) if wanted else 0.0
    keyword_score = min(0.2, overlap * 0.2)
    return min(1.0, length_score + keyword_score)
