"""Text utilities shared by ingest and retrieval: one sentence splitter, one code-fence
scanner, one stopword list, so a passage is cut and scored the same way everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Literal

# A sentence ends at . ! or ? followed by space and something that starts a sentence
# (a capital, a digit, a code span, a quote or a bracket): "e.g. foo" stays one sentence.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\"'(\[])")

# A Markdown code fence: three or more backticks or tildes, possibly indented.
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")

LineRole = Literal["text", "open", "code", "close"]

# Function words: never a search term, never the start of a name.
STOPWORDS = frozenset(
    [
        "a",
        "after",
        "all",
        "also",
        "although",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "before",
        "but",
        "by",
        "can",
        "do",
        "does",
        "each",
        "every",
        "for",
        "from",
        "has",
        "have",
        "here",
        "how",
        "however",
        "i",
        "if",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "note",
        "of",
        "on",
        "or",
        "see",
        "since",
        "so",
        "some",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)


def split_sentences(text: str) -> list[str]:
    """The sentences of one paragraph (no newlines are needed or removed)."""
    return SENTENCE_END.split(text)


def fence_roles(lines: Iterable[str]) -> Iterator[tuple[str, LineRole]]:
    """Each line with its role: prose ``text``, or the ``open`` fence, ``code`` inside it and
    the ``close`` fence of a fenced code block. A fence closes with the same character, at
    least as long; an unclosed fence runs to the end."""
    fence: str | None = None
    for line in lines:
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                yield line, "open"
            else:
                yield line, "text"
        elif match and match.group(1).startswith(fence):
            fence = None
            yield line, "close"
        else:
            yield line, "code"


def prose_lines(content: str) -> list[str]:
    """The lines of a passage outside its fenced code blocks."""
    return [line for line, role in fence_roles(content.split("\n")) if role == "text"]
