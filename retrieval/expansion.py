"""Multi-query retrieval (seed 002): Claude Haiku writes two more phrasings of the question,
and the retrieval stages search all three, so a passage worded differently is still found."""

from __future__ import annotations

import re

from kpack.llm import ClaudeClient, LLMError
from retrieval.query import Query

EXPANSION_PROMPT = (
    "Write {n} alternative phrasings of the search question below that use different "
    "vocabulary but ask for the same information. Reply with one phrasing per line and nothing "
    "else.\n\nQuestion: {question}"
)
LIST_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*])\s*")


def alternative_phrasings(llm: ClaudeClient, model: str, question: str, n: int = 2) -> list[str]:
    """Up to n rewordings of the question; none when the call fails (retrieval goes on)."""
    try:
        text = llm.complete(
            model,
            "You rewrite search queries.",
            EXPANSION_PROMPT.format(n=n, question=question),
            256,
        )
    except LLMError:
        return []
    lines = [LIST_MARKER.sub("", line).strip() for line in text.splitlines()]
    return [line for line in lines if line and line.lower() != question.lower()][:n]


class MultiQueryExpander:
    """Stage: adds Claude's phrasings to ``query.phrasings`` (nothing without an LLM)."""

    name, phase, toggle = "multi_query", "retrieve", "enable_multi_query"

    def __call__(self, query: Query) -> None:
        if query.llm.available:
            query.phrasings += alternative_phrasings(
                query.llm, query.settings.expansion_model, query.text
            )
        query.notes["queries"] = list(query.phrasings)
