"""Retrieval by the APIs a question names: the passages that define them.

A developer's question reaches its answer through the API it names or describes. The names
come from :func:`retrieval.coding_questions.read_question`: the calls in a problem's code
(``df.pivot_table(...)`` names ``pivot_table``), names written as calls in prose
(``value_counts()``), a backticked or quoted span that the pack defines (```sorted```), and
a word of the question that is the last part of an identifier the pack defines ("the max of
a list" names ``max``). Each name is looked up in the version's documentation graph
(kpack.docgraph, its definitions by last part), and the defining passages form one ranking,
ordered by their cosine similarity to the question: of the many ``sum`` definitions of a data
library, the one whose passage reads closest to the question goes first.

A name the pack defines in more than :data:`MAX_DEFINITIONS` places says little on its own
(a word such as "get" or "index"); its definitions still rank, but only the closest
:data:`PER_NAME` of them. The ranking is fused with the others (retrieval.candidates.fuse)
at the weight the profile sets (``api_weight``).
"""

from __future__ import annotations

import numpy as np

from kpack.contracts import section_of_chunk
from kpack.docgraph import Definition
from kpack.text import STOPWORDS, WORD, stem
from retrieval.candidates import passage
from retrieval.coding_questions import read_question
from retrieval.query import Candidate, Query

# The definitions of one name that enter the ranking: the closest to the question.
PER_NAME = 3
# Nearest definitions read per passage wanted: several definitions share a passage.
PER_PASSAGE = 4
# More definitions than this under one last part, and a bare word of the question naming it
# is no evidence that the question is about that API (it is a common word of the pack).
MAX_DEFINITIONS = 12


def named_apis(query: Query) -> list[tuple[str, bool]]:
    """The names a question gives, each with whether it was written as code (a call, a code
    span) rather than as a plain word of its prose."""
    reading = query.reading or read_question(query.text)
    named: dict[str, bool] = {}
    for name in reading.api_names:
        named[name.lower()] = True
    for span in reading.asker_names:
        if span.replace("_", "").replace(".", "").isalnum():  # a bare name, not a value
            named.setdefault(span.rsplit(".", 1)[-1].lower(), True)
    for word in WORD.findall(reading.prose.lower()):
        if len(word) > 2 and word not in STOPWORDS:
            named.setdefault(word, False)
    return list(named.items())


def defined_names(query: Query) -> list[tuple[str, bool, list[Definition]]]:
    """The names of :func:`named_apis` that the version defines, with their definitions; a
    bare word only where it is specific (defined in at most MAX_DEFINITIONS places)."""
    graph = query.reader.doc_graph
    if graph is None:
        return []
    found = []
    for name, as_code in named_apis(query):
        definitions = graph.definitions_named(name)
        if not definitions and not as_code:
            # A word names an API by its stem only when it names none as written: "summing"
            # names sum, while "loads" names loads and not load.
            definitions = graph.definitions_named(stem(name))
        if definitions and (as_code or len(definitions) <= MAX_DEFINITIONS):
            found.append((name, as_code, definitions))
    return found


class ApiSearch:
    """The passages defining the APIs the question names, closest to the question first."""

    name, phase, toggle = "api_search", "retrieve", "enable_api_search"

    def __call__(self, query: Query) -> None:
        found: dict[int, tuple[str, bool]] = {}
        # Per name given as a word, how closely its best entry reads like the question: the
        # gate's keyword evidence (retrieval.gate).
        word_evidence: dict[str, float] = {}
        graph = query.reader.doc_graph
        for word, as_code, definitions in defined_names(query):
            if not as_code and query.vectors is not None:
                entries = graph.entry_similarity(definitions, query.vector)
                word_evidence[word] = max(word_evidence.get(word, 0.0), float(entries.max()))
            rows = np.array(sorted({d.chunk for d in definitions}), dtype=np.int64)
            closest = rows[np.argsort(-query.passage_similarity(rows), kind="stable")]
            by_row = {d.chunk: d.name for d in definitions}
            for row in closest[:PER_NAME]:
                found.setdefault(int(row), (by_row[int(row)], as_code))
        if not found:
            return
        query.notes["api_words"] = {w: round(v, 4) for w, v in word_evidence.items()}
        rows = np.array(list(found), dtype=np.int64)
        similarity = query.passage_similarity(rows)
        hits: list[Candidate] = []
        for rank, at in enumerate(np.argsort(-similarity, kind="stable"), start=1):
            row = int(rows[at])
            passage_id = query.reader.chunk_ids[row]
            candidate = passage(query.reader, passage_id, section_of_chunk(passage_id), "api")
            if candidate is None:
                continue
            name, as_code = found[row]
            candidate.similarity = float(similarity[at])
            how = "written as code" if as_code else "a word of the question"
            candidate.reasons.append(f"api #{rank}: defines {name} ({how})")
            hits.append(candidate)
        query.notes["apis"] = {name: as_code for name, as_code in found.values()}
        query.rankings.append(("api", hits))


class DefinitionSearch:
    """The passages whose definitions read closest to the question: the question's vector
    against each definition's entry text (kpack.ingest.definitions), the defining passage
    standing for its definition. An intent ("list the files of a directory") reads like an
    entry's first line of description, and the passage that holds it averages several."""

    name, phase, toggle = "definition_search", "retrieve", "enable_api_search"

    def __call__(self, query: Query) -> None:
        graph = query.reader.doc_graph
        if graph is None or query.vectors is None:
            return
        hits: list[Candidate] = []
        seen: set[int] = set()
        for definition, similarity in graph.nearest(query.vector, query.depth * PER_PASSAGE):
            if definition.chunk in seen:
                continue
            seen.add(definition.chunk)
            passage_id = query.reader.chunk_ids[definition.chunk]
            candidate = passage(
                query.reader, passage_id, section_of_chunk(passage_id), "definition"
            )
            if candidate is None:
                continue
            candidate.reasons.append(
                f"definition #{len(hits) + 1}: {definition.name} (entry similarity "
                f"{similarity:.3f})"
            )
            hits.append(candidate)
            if len(hits) == query.depth:
                break
        query.rankings.append(("definition", hits))
