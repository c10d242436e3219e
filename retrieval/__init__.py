"""Answering questions from a built pack.

import retrieval
retrieval.query("demo", "How is a pack published?")          # answer, sources, citations...
retrieval.search("demo", "How is a pack published?", k=5)     # ranked passages only
retrieval.context_pack("demo", "How is a pack published?")    # related articles, with why
"""

from __future__ import annotations

from pathlib import Path

from retrieval.agent import PROFILES, KnowledgeGraphAgent
from retrieval.pack import PackNotReady, open_pack
from retrieval.related_articles import context_pack as related_articles

_agents: dict[tuple, KnowledgeGraphAgent] = {}


def agent(
    pack: str | Path, profile: str | None = None, use_llm: bool = True, **options
) -> KnowledgeGraphAgent:
    """A cached agent per pack version and settings: the second query pays no start-up."""
    opened = open_pack(pack)
    key = (str(opened.version_dir), profile, use_llm, tuple(sorted(options.items())))
    if key not in _agents:
        _agents[key] = KnowledgeGraphAgent(
            opened.folder, profile=profile, use_llm=use_llm, **options
        )
    return _agents[key]


def query(
    pack: str | Path,
    question: str,
    profile: str | None = None,
    use_llm: bool = True,
    max_results: int = 5,
    **options,
) -> dict:
    return agent(pack, profile, use_llm, **options).query(question, max_results=max_results)


def search(
    pack: str | Path, question: str, k: int = 5, profile: str | None = None, **options
) -> list[dict]:
    return agent(pack, profile, use_llm=False, **options).search(question, k=k)


def context_pack(pack: str | Path, seed: str, limit: int = 5) -> list[dict]:
    """Related articles for a question, a URL of the pack or an article title, with why."""
    return related_articles(open_pack(pack), seed, limit)


__all__ = [
    "PROFILES",
    "KnowledgeGraphAgent",
    "PackNotReady",
    "agent",
    "context_pack",
    "open_pack",
    "query",
    "search",
]
