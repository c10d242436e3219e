"""One question to several packs: each pack is searched on its own, and the passages are merged
on how relevant their pack is to the question and where the pack ranks them.

A pack's own ranking (its fused, graph-reranked ``score``) is relative to that pack: a rank
fusion score or a BM25 weight from the pandas pack says nothing about one from the Python pack.
What every pack built with the same embedding model shares is the cosine similarity of the
question and a passage, so it measures how relevant a pack is (:func:`pack_relevance`: the mean
similarity of its best ``PACK_EVIDENCE_PASSAGES`` passages, plus ``PACK_COVERAGE_WEIGHT``
times the share of the question's specific words its best passage holds, which its own gate
measured against its own vocabulary), and within a pack its own ranking holds: a passage's
merge score is its pack's relevance less ``PACK_RANK_STEP`` for each place below the pack's
first (:func:`merge_score`). Merging on each passage's own similarity instead
threw the packs' rankings away: a short intent ("get max key in dictionary") is as close to a
Rust or pandas passage as to the Python one that answers it. Packs embedded by different
models have no common scale and are refused together. Each passage names its ``pack`` and its
trace says how its merge score was made.

An answer comes from one pack: the most relevant (so Claude is asked once, not once per pack);
the result names that ``pack`` in itself and in each citation, and lists every pack asked with
its relevance (``packs``).
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
# The merge (module docstring), chosen on the development half (even lines) of conala_dev and
# python_docs_qa asked of the ten library packs of bench/ecosystem_bench.py
# (bench/multipack_merge_sweep.py --k 10); hit@5 there 0.493 and 0.889 against 0.384 and
# 0.889 for merging on each passage's similarity (the other half and DS-1000 are reported in
# bench/RESULTS.md). The best passage alone (0.438 with the same step) or all ten (0.479)
# judged a pack worse than its best three; steps of 0.01 and 0.04 gave 0.479 and 0.452.
PACK_EVIDENCE_PASSAGES = 3
PACK_RANK_STEP = 0.02
# The words as evidence of a pack (retrieval.confidence.gate_verdict's coverage), added to
# its passages' similarity. Swept over each library pack's top 10 with the rule above
# (bench/HISTORY.md, stop 48), development half (even lines): conala_dev hit@5 0.466 at 0,
# 0.479 at 0.05, 0.493 at 0.1 and 0.15, 0.479 at 0.2 and 0.3; python_docs_qa 0.889 throughout
# up to 0.2; 0.1 kept. The other half: 0.513 -> 0.526 (conala_dev), 0.941 -> 0.941
# (python_docs_qa).
PACK_COVERAGE_WEIGHT = 0.1
# Each pack is searched for at least this many passages, whatever k the merge keeps: a
# pack's own ranking of ten is better evidence than of five (bench/multipack_merge_sweep.py
# --k 5 against --k 10, development halves: 0.425 against 0.493 on conala_dev, 0.833 against
# 0.889 on python_docs_qa with the rule above).
PACK_SEARCH_DEPTH = 10


def search_depth(k: int) -> int:
    """How many passages each pack is asked for when the merge keeps ``k``."""
    return max(k, PACK_SEARCH_DEPTH)


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


def pack_relevance(results: SearchResults) -> float:
    """How relevant a pack is to the question: the mean cosine similarity of its best
    ``PACK_EVIDENCE_PASSAGES`` passages, plus PACK_COVERAGE_WEIGHT times the share of the
    question's specific words that its gate found in its best passage (0.0 for a pack that
    found none)."""
    best = sorted((hit.get("similarity") or 0.0 for hit in results), reverse=True)
    best = best[:PACK_EVIDENCE_PASSAGES]
    if not best:
        return 0.0
    words = (results.gate or {}).get("coverage") or 0.0
    return sum(best) / len(best) + PACK_COVERAGE_WEIGHT * words


def merge_score(relevance: float, place: int) -> float:
    """A passage's place in the merged ranking: its pack's relevance, less PACK_RANK_STEP for
    each place below the pack's first (``place`` 0)."""
    return relevance - PACK_RANK_STEP * place


def merge_searches(
    found: dict[str, SearchResults], k: int, tokens: int | None = None
) -> SearchResults:
    """The k passages of every pack's with the best merge scores (module docstring), each
    naming its pack; with ``tokens``, those of them, best first, that fit in the budget
    together (each pack's search gave its passages with their tokens). A passage's ``score``
    is its confidence capped by the score above it in the merged ranking, as in one pack's
    (retrieval.confidence). ``version`` and ``gate`` are each pack's, by pack name."""
    hits = []
    for name, results in found.items():
        relevance = pack_relevance(results)
        for place, hit in enumerate(results):
            merged = merge_score(relevance, place)
            why = f"{name} #{place + 1}, pack relevance {relevance:.3f}: merged {merged:.3f}"
            hits.append(
                (
                    merged,
                    hit.get("similarity") or 0.0,
                    {
                        "pack": name,
                        **hit,
                        "merge_score": merged,
                        "why": f"{hit['why']}; {why}" if hit.get("why") else why,
                    },
                )
            )
    ranked = [hit for *_, hit in sorted(hits, key=lambda t: (-t[0], -t[1]))]
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


def packs_by_relevance(found: dict[str, SearchResults]) -> list[dict]:
    """Every pack asked, with its version and its relevance to the question, best first."""
    rows = [
        {"pack": name, "version": results.version, "relevance": pack_relevance(results)}
        for name, results in found.items()
    ]
    return sorted(rows, key=lambda row: row["relevance"], reverse=True)


def answered_by(result: QueryResult, pack: str, packs: list[dict]) -> QueryResult:
    """``result`` (the chosen pack's answer) naming its pack in itself and in each citation,
    with every pack asked (``packs``)."""
    result["citations"] = [{"pack": pack, **citation} for citation in result["citations"]]
    result["pack"] = pack
    result["packs"] = packs
    return result
