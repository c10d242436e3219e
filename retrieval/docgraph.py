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
3. lets the best of them, in order, take the place of the highest passage of the top k that
   is not the first of its page there (a page's second or later passage), when its own page
   is not above that place already: the pages of the top k stay, so no page the search found
   leaves the top k or moves down, and a page the search missed comes in. The displaced
   passage goes just below the top k (or, when the reached passage was lower in the top k,
   takes its place), and the offline answer still quotes it (retrieval.synthesis): for an
   answer the graph adds a page, it takes no passage of the best page away. A reached passage
   must be at least as similar to the question as the gate's threshold asks of any passage.

Every passage it places says how it was reached ("via link from 'Saving structured data
with json' to 'json.dump'"). There are no weights to fit: the floor is the pack's own gate
threshold, and whether the stage runs on a pack at all is decided by the pack's own evidence
(retrieval.eval.evidence).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kpack.contracts import section_of_chunk
from kpack.docgraph import DocGraph
from kpack.text import code_names, normalize_entity
from retrieval.candidates import passage
from retrieval.query import Candidate, Query

# The reason a passage the stage moved out of the top k carries; the offline answer still
# quotes it (retrieval.synthesis.answer_passages).
MOVED_DOWN = "moved down by the documentation graph"
NO_DOC_GRAPH = (
    "this pack version has no documentation graph (built before section links): rebuild it "
    "to use it"
)


@dataclass(frozen=True)
class Route:
    """How a passage was reached; put in words only for the passages the stage places."""

    kind: Literal["question", "link", "written"]
    name: str = ""  # the identifier defined ("" for a link whose anchor defines nothing)
    here: int = -1  # the section row of the best passage it was reached from
    there: int = -1  # the linked section's row
    incoming: bool = False  # the linked section links to ``here``

    def words(self, title: Callable[[int], str]) -> str:
        """The route in words; ``title(section row)`` names a section."""
        if self.kind == "question":
            return f"defines {self.name!r}, which the question writes"
        if self.kind == "written":
            return f"defines {self.name!r}, which {title(self.here)!r} writes"
        there = self.name or title(self.there)
        source, target = (there, title(self.here)) if self.incoming else (title(self.here), there)
        return f"via link from {source!r} to {target!r}"


@dataclass(frozen=True)
class Reached:
    row: int  # chunk row
    merit: float  # cosine similarity to the question
    route: Route


def question_identifiers(text: str) -> list[str]:
    """The keys (normalize_entity) of the identifiers a question writes: dotted or underscored
    names, code spans and calls ("json.dumps", "exist_ok", "`sorted`", "sorted()")."""
    names = code_names(text)
    names += [span.strip("`") for span in text.split() if span.startswith("`")]
    names += [word for word in text.split() if word.endswith("()")]
    return list(dict.fromkeys(k for k in map(normalize_entity, names) if k))


def reached_passages(query: Query, graph: DocGraph, seeds: list[Candidate]) -> dict[int, Route]:
    """Chunk row -> how it was reached (see the module docstring, step 1); the first route
    found for a passage is kept."""
    reader = query.reader
    reached: dict[int, Route] = {}
    for key in question_identifiers(query.text):
        for definition in graph.definitions(key):
            reached.setdefault(definition.chunk, Route("question", definition.name))
    # A linked section's first chunk row -> (its number of chunks, the first route to it):
    # many seeds link to the same sections (a module's index page, a class every page names),
    # and each is scored once. A route is made only for a row not reached before (a seed
    # has dozens of links, most of them to rows already reached).
    closest: dict[int, tuple[int, Route]] = {}
    for seed in seeds:
        here = reader.section_row.get(seed.section_id)
        if here is None:
            continue
        links = graph.links(here)
        targets, incoming = links.targets.tolist(), links.incoming.tolist()
        chunks = links.chunks.tolist()
        for i, (defined, first) in enumerate(
            zip(links.defined.tolist(), links.first_chunk.tolist(), strict=True)
        ):
            if defined >= 0:
                if defined not in reached:
                    reached[defined] = Route("link", links.anchor(i), here, targets[i], incoming[i])
            elif chunks[i] > 0 and first not in closest:
                closest[first] = (chunks[i], Route("link", "", here, targets[i], incoming[i]))
        for key in dict.fromkeys(code_names(seed.text)):
            for definition in graph.definitions(key):
                reached.setdefault(definition.chunk, Route("written", definition.name, here))
    for row, route in _closest_chunks(query, closest):
        reached.setdefault(row, route)
    return reached


def _closest_chunks(
    query: Query, sections: dict[int, tuple[int, Route]]
) -> list[tuple[int, Route]]:
    """For each linked section (its first chunk row -> its number of chunks and the route),
    the chunk row of its passage closest to the question: one similarity pass over them all."""
    if not sections:
        return []
    rows = np.concatenate(
        [np.arange(first, first + count) for first, (count, _) in sections.items()]
    )
    similarity = query.passage_similarity(rows)
    found, at = [], 0
    for first, (count, route) in sections.items():
        found.append((first + int(np.argmax(similarity[at : at + count])), route))
        at += count
    return found


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

        def title(section_row: int) -> str:
            return query.reader.sections[query.reader.section_ids[section_row]].title

        # A passage as far from the question as an out-of-domain one is no help, whatever
        # links to it: the gate's threshold (calibrated on the pack, kpack.gate) is the floor.
        floor = query.settings.context_confidence_threshold or 0.0
        waiting = {c.passage_id: c for c in query.candidates}
        displaced: list[Candidate] = []
        placed = 0
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
                f"documentation graph: {found.route.words(title)} (similarity {found.merit:.3f}), "
                f"in place of a second passage of {out.title!r}"
            )
            out.reasons.append(MOVED_DOWN)
            lower = next((i for i, c in enumerate(top) if c is candidate), None)
            if lower is None:
                displaced.append(out)
            else:  # it was lower in the top k: the two change places
                top[lower] = out
            top[slot] = candidate
            placed += 1
        if placed:
            kept = {id(c) for c in top} | {id(c) for c in displaced}
            query.candidates = top + displaced + [c for c in query.candidates if id(c) not in kept]
        query.notes["doc_graph"] = {"reached": len(reached), "placed": placed}


def _second_passage(top: list[Candidate]) -> int | None:
    """The highest position of ``top`` holding a page's second (or later) passage; None when
    every passage there is the first of its page."""
    seen: set[str] = set()
    for position, candidate in enumerate(top):
        if candidate.article_url in seen:
            return position
        seen.add(candidate.article_url)
    return None
