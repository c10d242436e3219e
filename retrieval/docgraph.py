"""The documentation graph in ranking (issue 23): section links and API definitions bring in
the page the question's search missed.

A documentation question often needs two pages: the tutorial that shows how, and the reference
entry of the function it uses. Search finds one and ranks several passages of it first; the
documentation graph (kpack.docgraph: which section links to which, through which anchor, and
which passage defines each API identifier) knows where the other is.

``DocGraphExpansion`` (rank phase, after the rerankers, before top_k):

1. reaches passages from the question and from the ``graph_expand`` best passages: the
   definition of every API identifier the question writes ("json.dumps", "ensure_ascii");
   along every link of a best passage's section, out and in, the passage the link's anchor
   defines (else the linked section's passage closest to the question); and the definition of
   every identifier a best passage writes;
2. scores each reached passage on its own merit, its cosine similarity to the question, as
   every candidate already has one, never by the rank of the passage it was reached from
   (bridges inserted after their source pushed gold passages down);
3. lets it take the place of the highest passage of the top k that it beats and that is not
   the first of its page there (a page's second passage): the pages of the top k stay, so no
   page the search found leaves the top k or moves down, and a page the search missed comes
   in. The displaced passage goes just below the top k. A reached passage whose page is in
   the top k already adds no page and is left where it is.

Every passage it places says how it was reached ("via link from 'Saving structured data
with json' to 'json.dump'"). The constants are structural (which passages may be replaced),
not weights fitted to a benchmark; whether the stage runs on a pack is decided by the pack's
own evidence (retrieval.eval.evidence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kpack.contracts import chunk_id, section_of_chunk
from kpack.docgraph import DocGraph
from kpack.text import code_names, normalize_entity
from retrieval.candidates import passage
from retrieval.query import Candidate, Query

NO_DOC_GRAPH = (
    "this pack version has no documentation graph (built before section links): rebuild it "
    "to use it"
)


@dataclass(frozen=True)
class Reached:
    row: int  # chunk row
    merit: float  # cosine similarity to the question
    path: str  # how it was reached, in words


def question_identifiers(text: str) -> list[str]:
    """The keys (normalize_entity) of the identifiers a question writes: dotted or underscored
    names, code spans and calls ("json.dumps", "exist_ok", "`sorted`", "sorted()")."""
    names = code_names(text)
    names += [span.strip("`") for span in text.split() if span.startswith("`")]
    names += [word for word in text.split() if word.endswith("()")]
    return list(dict.fromkeys(k for k in map(normalize_entity, names) if k))


def _section_title(query: Query, section_row: int) -> str:
    return query.reader.sections[query.reader.section_ids[section_row]].title


def _closest_chunk(query: Query, section_id: str) -> int | None:
    """The chunk row of a section's passage closest to the question."""
    reader = query.reader
    first = reader.chunk_row.get(chunk_id(section_id, 0))
    if first is None:
        return None
    end = first
    while end < len(reader.chunk_ids) and section_of_chunk(reader.chunk_ids[end]) == section_id:
        end += 1
    rows = np.arange(first, end)
    return int(rows[int(np.argmax(query.passage_similarity(rows)))])


def reached_passages(query: Query, graph: DocGraph, seeds: list[Candidate]) -> dict[int, str]:
    """Chunk row -> how it was reached (see the module docstring, step 1); the first path
    found for a passage is kept."""
    reader = query.reader
    reached: dict[int, str] = {}
    for key in question_identifiers(query.text):
        for definition in graph.definitions(key):
            reached.setdefault(
                definition.chunk, f"defines {definition.name!r}, which the question writes"
            )
    for seed in seeds:
        row = reader.section_row.get(seed.section_id)
        if row is None:
            continue
        here = _section_title(query, row)
        for link in graph.links(row):
            target_id = reader.section_ids[link.target]
            defined = [
                d
                for d in graph.definitions(normalize_entity(link.anchor))
                if d.section == link.target
            ]
            chunk = defined[0].chunk if defined else _closest_chunk(query, target_id)
            if chunk is None:
                continue
            there = defined[0].name if defined else _section_title(query, link.target)
            source, target = (there, here) if link.incoming else (here, there)
            reached.setdefault(chunk, f"via link from {source!r} to {target!r}")
        for key in dict.fromkeys(code_names(seed.text)):
            for definition in graph.definitions(key):
                reached.setdefault(
                    definition.chunk,
                    f"defines {definition.name!r}, which {here!r} writes",
                )
    return reached


class DocGraphExpansion:
    """See the module docstring. Settings: ``graph_expand`` (how many best passages are
    expanded)."""

    name, phase, toggle = "doc_graph", "rank", "enable_doc_graph"

    def __call__(self, query: Query) -> None:
        graph = query.reader.doc_graph
        if graph is None:
            query.notes["doc_graph"] = NO_DOC_GRAPH
            return
        top = query.candidates[: query.k]
        reached = reached_passages(query, graph, top[: query.settings.graph_expand])
        rows = np.array(sorted(reached), dtype=np.int64)
        merits = query.passage_similarity(rows) if len(rows) else np.zeros(0)
        ordered = sorted(
            (Reached(int(r), float(m), reached[int(r)]) for r, m in zip(rows, merits, strict=True)),
            key=lambda r: (-r.merit, r.row),
        )
        # A passage as far from the question as an out-of-domain one is no help, whatever
        # links to it: the gate's threshold (calibrated on the pack, kpack.gate) is the floor.
        floor = query.settings.context_confidence_threshold or 0.0
        waiting = {c.passage_id: c for c in query.candidates}
        displaced: list[Candidate] = []
        for found in ordered:
            slot = _second_passage(top)
            if found.merit < floor or slot is None:
                break
            passage_id = query.reader.chunk_ids[found.row]
            candidate = waiting.get(passage_id) or passage(
                query.reader, passage_id, section_of_chunk(passage_id), query.text
            )
            if candidate is None or any(c.article_url == candidate.article_url for c in top[:slot]):
                continue  # its page is above the slot already: nothing to gain
            if candidate.similarity is None:
                candidate.similarity = found.merit
                query.considered.append(candidate)
            out = top[slot]
            candidate.reasons.append(
                f"documentation graph: {found.path} (similarity {found.merit:.3f}), in place of "
                f"a second passage of {out.title!r}"
            )
            out.reasons.append("moved down by the documentation graph")
            if candidate in top:  # it was lower in the top k: the two change places
                top[top.index(candidate)] = out
            else:
                displaced.append(out)
            top[slot] = candidate
        if displaced or any(c is not o for c, o in zip(top, query.candidates, strict=False)):
            kept = {id(c) for c in top} | {id(c) for c in displaced}
            rest = [c for c in query.candidates if id(c) not in kept]
            query.candidates = top + displaced + rest
        query.notes["doc_graph"] = {
            "reached": len(reached),
            "placed": sum(1 for c in top if c.reasons and "documentation graph:" in c.reasons[-1]),
        }


def _second_passage(top: list[Candidate]) -> int | None:
    """The highest position of ``top`` holding a page's second (or later) passage; None when
    every passage there is the first of its page."""
    seen: set[str] = set()
    for position, candidate in enumerate(top):
        if candidate.article_url in seen:
            return position
        seen.add(candidate.article_url)
    return None
