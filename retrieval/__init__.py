"""Answering questions from a built pack.

    import retrieval
    retrieval.query("demo", "How is a pack published?")          # answer, sources, citations...
    retrieval.search("demo", "How is a pack published?", k=5)     # ranked passages only
    retrieval.context_pack("demo", "How is a pack published?")    # related articles, with why
    retrieval.search(["pandas", "python"], "How do I read a CSV file?")  # several packs at once

Results are the seed's dict (and list of dicts) that also render in Jupyter and turn into
DataFrames (``result.to_frame()``). Importing this package is cheap: the database, the
embedding model and pandas are loaded when first needed.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from kpack.errors import PackNotReady
from retrieval.agent import KnowledgeGraphAgent
from retrieval.multipack import (
    answered_by,
    is_several,
    merge_searches,
    packs_by_relevance,
    readers_of,
    search_depth,
)
from retrieval.profiles import PROFILES
from retrieval.reader import PackReader
from retrieval.registry import WARMERS, close_all, open_pack, reading, resolve_folder
from retrieval.related_articles import context_pack as related_articles
from retrieval.results import QueryResult, SearchResults

MAX_CACHED_AGENTS = 32
_agents: OrderedDict[tuple, KnowledgeGraphAgent] = OrderedDict()
_agents_lock = threading.Lock()


def agent(
    pack: str | Path | PackReader,
    profile: str | None = None,
    use_llm: bool = True,
    **options: object,
) -> KnowledgeGraphAgent:
    """A cached agent per pack and settings (it follows the pack's current version), so the
    second query pays no start-up. The API key is part of the key: a new key, a new client."""
    folder = pack.folder if isinstance(pack, PackReader) else resolve_folder(pack)
    key = (
        folder,
        profile,
        use_llm,
        os.environ.get("ANTHROPIC_API_KEY") if use_llm else None,
        os.environ.get("ANTHROPIC_BASE_URL"),
        tuple(sorted(options.items())),
    )
    with _agents_lock:
        cached = _agents.get(key)
        if cached is not None:
            _agents.move_to_end(key)
            return cached
    made = KnowledgeGraphAgent(folder, profile=profile, use_llm=use_llm, **options)
    with _agents_lock:
        _agents[key] = made
        while len(_agents) > MAX_CACHED_AGENTS:
            _agents.popitem(last=False)
    return made


Packs = str | Path | PackReader | list[str | Path] | tuple[str | Path, ...]


def query(
    pack: Packs,
    question: str,
    profile: str | None = None,
    use_llm: bool = True,
    max_results: int = 5,
    on_text: Callable[[str], object] | None = None,
    **options: object,
) -> QueryResult:
    """The answer with its sources; ``on_text(piece)`` streams the answer as it is written
    (see KnowledgeGraphAgent.query). A PackReader as ``pack`` answers from that version; its
    ``version`` key says which version answered. Several packs (a list, or names joined by
    commas) answer from the one most relevant to the question (retrieval.multipack): the
    result names its ``pack`` and lists every pack asked."""
    if is_several(pack):
        with readers_of(pack) as readers:  # type: ignore[arg-type]
            found = _each(readers, question, search_depth(max_results), profile, options)
            ranked = packs_by_relevance(found)
            best = ranked[0]["pack"]
            result = query(
                readers[best], question, profile, use_llm, max_results, on_text, **options
            )
            return answered_by(result, best, ranked)
    pinned = pack if isinstance(pack, PackReader) else None
    return agent(pack, profile, use_llm, **options).query(  # type: ignore[arg-type]
        question, max_results=max_results, on_text=on_text, reader=pinned
    )


def search(
    pack: Packs,
    question: str,
    k: int = 5,
    profile: str | None = None,
    tokens: int | None = None,
    **options: object,
) -> SearchResults:
    """The k best passages, each with its deep link (``url``), ``confidence`` and ``score``;
    their ``version`` attribute is the version that answered, ``gate`` whether the gate would
    refuse the question. With ``tokens``, the passages of those k that fit in that many tokens,
    each its whole section when that fits (context for an agent). Several packs (a list, or
    names joined by commas) give the k best passages over all of them, merged on their pack's
    relevance and their place in its ranking, each naming its ``pack`` (retrieval.multipack);
    ``version`` and ``gate`` are then each pack's, by name."""
    if is_several(pack):
        with readers_of(pack) as readers:  # type: ignore[arg-type]
            found = _each(readers, question, search_depth(k), profile, options, tokens)
            return merge_searches(found, k, tokens)
    pinned = pack if isinstance(pack, PackReader) else None
    return agent(pack, profile, use_llm=False, **options).search(  # type: ignore[arg-type]
        question, k=k, reader=pinned, tokens=tokens
    )


def _each(
    readers: dict[str, PackReader],
    question: str,
    k: int,
    profile: str | None,
    options: dict,
    tokens: int | None = None,
) -> dict[str, SearchResults]:
    """Each pack's own search, by pack name (what retrieval.multipack merges)."""
    return {
        name: search(reader, question, k, profile, tokens=tokens, **options)
        for name, reader in readers.items()
    }


def _warm_search(reader: PackReader) -> None:
    """A new version's first query's lazy work (the model, the keyword index, the entity
    graph), done by a one-passage search in its default profile before it serves."""
    KnowledgeGraphAgent(reader, use_llm=False).search("warm up", k=1)


WARMERS.append(_warm_search)


def context_pack(pack: str | Path, seed: str, limit: int = 5) -> list[dict]:
    """Related articles for a question, a URL of the pack or an article title, with why."""
    with reading(pack) as reader:
        return related_articles(reader, seed, limit)


__all__ = [
    "PROFILES",
    "KnowledgeGraphAgent",
    "PackNotReady",
    "PackReader",
    "QueryResult",
    "SearchResults",
    "agent",
    "close_all",
    "context_pack",
    "open_pack",
    "query",
    "reading",
    "search",
]
