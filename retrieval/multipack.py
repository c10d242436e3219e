"""One question to several packs: each pack is searched on its own, and the passages are merged
on the question's cosine similarity with each one.

A pack's own ranking (its fused, graph-reranked ``score``) is relative to that pack: a rank
fusion score or a BM25 weight from the pandas pack says nothing about one from the Python pack.
The cosine similarity of the question and a passage is the same measure in every pack built
with the same embedding model, so it is what the merge orders by; packs embedded by different
models have no common scale and are refused together. Each passage names its ``pack``.

An answer comes from one pack: the pack whose best passage is the most similar to the question
(so Claude is asked once, not once per pack); the result names that ``pack`` in itself and in
each citation, and lists every pack asked with its best similarity (``packs``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from kpack.errors import PackError
from retrieval.reader import PackReader
from retrieval.registry import reading
from retrieval.results import QueryResult, SearchResults

PACK_SEPARATOR = ","  # "pandas,python" names two packs (the CLI's, HTTP's and MCP's form)


def pack_names(packs: str | Sequence[str | Path]) -> list[str | Path]:
    """The packs a question goes to: a list, or names joined by commas; each once, in order."""
    given = packs.split(PACK_SEPARATOR) if isinstance(packs, str) else list(packs)
    names = list(dict.fromkeys(p.strip() if isinstance(p, str) else p for p in given))
    if not names or any(name == "" for name in names):
        raise PackError(f"name the packs to ask, separated by commas: got {packs!r}")
    return names


def is_several(pack: object) -> bool:
    """Whether ``pack`` names several packs (a list or tuple, or names joined by commas)."""
    return isinstance(pack, list | tuple) or (isinstance(pack, str) and PACK_SEPARATOR in pack)


@contextmanager
def readers_of(packs: str | Sequence[str | Path]) -> Iterator[dict[str, PackReader]]:
    """The current version of each pack, held open together, by pack name; packs embedded by
    different models are refused, since their similarities are not on one scale."""
    with ExitStack() as stack:
        readers: dict[str, PackReader] = {}
        for pack in pack_names(packs):
            reader = stack.enter_context(reading(pack))
            readers[reader.folder.name] = reader
        models = {name: reader.model_name for name, reader in readers.items()}
        if len(set(models.values())) > 1:
            listed = ", ".join(f"{name} ({model})" for name, model in models.items())
            raise PackError(
                f"these packs were embedded by different models, so their passages cannot be "
                f"ranked together: {listed}; ask them one at a time"
            )
        yield readers


def similarity_of(hit: dict) -> float:
    """The score the merge orders by: the question's cosine with the passage."""
    return hit.get("similarity") or 0.0


def merge_searches(
    found: dict[str, SearchResults], k: int, tokens: int | None = None
) -> SearchResults:
    """The k passages most similar to the question over every pack's, each naming its pack;
    with ``tokens``, those of them, best first, that fit in the budget together (each pack's
    search gave its passages with their tokens). A passage's ``score`` is its confidence
    capped by the score above it in the merged ranking, as in one pack's
    (retrieval.confidence). ``version`` and ``gate`` are each pack's, by pack name."""
    hits = [{"pack": name, **hit} for name, results in found.items() for hit in results]
    ranked = sorted(hits, key=similarity_of, reverse=True)
    if tokens is not None:
        ranked = _within_budget(ranked, tokens)
    merged = SearchResults(_capped_scores(ranked[:k]))
    merged.version = {name: results.version for name, results in found.items()}
    merged.gate = {name: results.gate for name, results in found.items()}
    return merged


def _within_budget(hits: list[dict], tokens: int) -> list[dict]:
    """The hits, in order, while their tokens fit in ``tokens``; one that does not fit is left
    out and a smaller one after it may still fit (retrieval.results.within_budget)."""
    kept, left = [], tokens
    for hit in hits:
        size = hit.get("tokens") or 0
        if size <= left:
            kept.append(hit)
            left -= size
    return kept


def _capped_scores(hits: list[dict]) -> list[dict]:
    """The hits with scores that never rise down the merged ranking."""
    above: float | None = None
    for hit in hits:
        confidence = hit.get("confidence")
        if confidence is not None:
            hit["score"] = confidence if above is None else min(confidence, above)
            above = hit["score"]
    return hits


def packs_by_similarity(found: dict[str, SearchResults]) -> list[dict]:
    """Every pack asked, with its version and its best passage's similarity, best first."""
    rows = [
        {
            "pack": name,
            "version": results.version,
            "similarity": max((similarity_of(hit) for hit in results), default=0.0),
        }
        for name, results in found.items()
    ]
    return sorted(rows, key=lambda row: row["similarity"], reverse=True)


def answered_by(result: QueryResult, pack: str, packs: list[dict]) -> QueryResult:
    """``result`` (the chosen pack's answer) naming its pack in itself and in each citation,
    with every pack asked (``packs``)."""
    result["citations"] = [{"pack": pack, **citation} for citation in result["citations"]]
    result["pack"] = pack
    result["packs"] = packs
    return result
