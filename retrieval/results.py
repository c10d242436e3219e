"""What queries and searches return: the seed's dict and list, which also render in Jupyter.

``QueryResult`` is a dict with exactly the seed's keys (answer, sources, entities, facts,
cypher_query, query_type, token_usage) plus citations, version (the pack version that
answered), timings_ms and trace, so it indexes,
compares and ``json.dumps`` like the plain dict (``sources`` and ``citations`` name only the
passages the answer cites, at most k; the trace keeps the whole context); in a notebook it
shows the answer with clickable citations, a sources table, the stage timings and the
retrieval trace (``_repr_html_``, ``_repr_markdown_``), and ``to_frame()`` turns it into a
pandas DataFrame.
``SearchResults`` is the list of passage dicts of a search, likewise, with the version that
answered as its ``version`` attribute. Both render from their
own contents only, so a result loaded back from JSON renders the same.
"""

from __future__ import annotations

import time
from html import escape
from typing import TYPE_CHECKING, Literal

from kpack.ingest.word_pieces import estimate_tokens
from retrieval.citations import CITATION
from retrieval.confidence import gate_verdict, rate_passages
from retrieval.query import Query

if TYPE_CHECKING:
    import pandas as pd

    from retrieval.reader import PackReader

SCORE_COLUMNS = ("similarity", "bm25", "pagerank", "cross_encoder", "quality", "combined")
SEARCH_FIELDS = (
    "similarity",
    "sentence_similarity",
    "bm25",
    "rrf",
    "pagerank",
    "cross_encoder",
    "passage_id",
)


def _number(value: object) -> str:
    return "" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    """A table of cells that are already HTML."""
    head = "".join(f"<th style='text-align:left'>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _md_cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _link(url: str, text: str) -> str:
    return f"<a href='{escape(url, quote=True)}' target='_blank'>{escape(text)}</a>"


class QueryResult(dict):
    """The response of a query: the seed's dict, which also renders in Jupyter."""

    def _urls(self) -> dict[str, str]:
        return {c["title"]: c["url"] for c in reversed(self.get("citations", []))}

    def _headline(self) -> str:
        timings, usage = self.get("timings_ms", {}), self.get("token_usage", {})
        trace = self.get("trace", {})
        return (
            f"{self.get('query_type')}, profile {trace.get('profile')}, "
            f"{timings.get('total', 0):.0f} ms, {usage.get('api_calls', 0)} LLM calls"
        )

    def _answer_html(self) -> str:
        urls = self._urls()
        parts, last = [], 0
        answer = str(self.get("answer", ""))
        for match in CITATION.finditer(answer):
            parts.append(escape(answer[last : match.start()]))
            title = match.group(1)
            label = f"[{title}]"
            parts.append(_link(urls[title], label) if title in urls else escape(match.group(0)))
            last = match.end()
        parts.append(escape(answer[last:]))
        return "".join(parts).replace("\n", "<br>")

    def _trace_rows(self) -> list[dict]:
        """Every candidate: the kept passages in their final order, then the dropped ones."""
        rows = self.get("trace", {}).get("candidates", [])
        return sorted(rows, key=lambda c: (c.get("rank") is None, c.get("rank") or 0))

    def _repr_html_(self) -> str:
        sources = [
            [str(n), escape(c["title"]), escape(c["section"]), _link(c["url"], c["url"])]
            for n, c in enumerate(self.get("citations", []), start=1)
        ]
        timings = [[escape(stage), f"{ms:.1f}"] for stage, ms in self.get("timings_ms", {}).items()]
        trace = self.get("trace", {})
        candidates = [
            [_number(c.get("rank")), escape(c["heading"])]
            + [_number(c.get(col)) for col in SCORE_COLUMNS]
            + [escape(c.get("dropped") or ""), escape(c.get("why", ""))]
            for c in self._trace_rows()
        ]
        threshold = trace.get("threshold")
        best = trace.get("max_similarity")
        return (
            "<div class='kpack-query-result'>"
            f"<p><b>Answer</b> <small>({escape(self._headline())})</small></p>"
            f"<blockquote>{self._answer_html()}</blockquote>"
            f"<details open><summary><b>Sources</b> ({len(sources)})</summary>"
            + (_html_table(["#", "title", "section", "url"], sources) if sources else "<p>none</p>")
            + "</details><details><summary><b>Timings</b> (ms)</summary>"
            + _html_table(["stage", "ms"], timings)
            + f"</details><details><summary><b>Trace</b>: {len(candidates)} candidates, gate "
            f"threshold {escape(str(threshold))}, best similarity {_number(best)}</summary>"
            + _html_table(["#", "passage", *SCORE_COLUMNS, "dropped", "why"], candidates)
            + "</details></div>"
        )

    def _repr_markdown_(self) -> str:
        urls = self._urls()
        answer = CITATION.sub(
            lambda m: f"[[{m.group(1)}]]({urls[m.group(1)]})" if m.group(1) in urls else m.group(0),
            str(self.get("answer", "")),
        )
        sources = [
            [n, c["title"], c["section"], c["url"]]
            for n, c in enumerate(self.get("citations", []), start=1)
        ]
        timings = ", ".join(f"{k} {v:.1f}" for k, v in self.get("timings_ms", {}).items())
        candidates = [
            [c["heading"], *(_number(c.get(col)) for col in SCORE_COLUMNS), c.get("dropped") or ""]
            for c in self._trace_rows()
        ]
        return "\n\n".join(
            [
                f"**Answer** ({self._headline()})",
                answer,
                "**Sources**",
                _md_table(["#", "title", "section", "url"], sources) if sources else "none",
                f"**Timings (ms)**: {timings}",
                "**Trace**",
                _md_table(["passage", *SCORE_COLUMNS, "dropped"], candidates),
            ]
        )

    def to_frame(self, what: Literal["passages", "trace", "timings"] = "passages") -> pd.DataFrame:
        """The ranked passages that were kept (``passages``), every candidate with its scores
        and reasons (``trace``), or the stage timings (``timings``), as a DataFrame."""
        import pandas as pd

        if what == "timings":
            return pd.DataFrame(
                list(self.get("timings_ms", {}).items()), columns=["stage", "ms"]
            ).set_index("stage")
        rows = self._trace_rows()
        if what == "passages":
            rows = [r for r in rows if r.get("rank") is not None]
        elif what != "trace":
            raise ValueError(f"to_frame({what!r}): use 'passages', 'trace' or 'timings'")
        frame = pd.DataFrame(rows)
        frame.index = pd.RangeIndex(1, len(frame) + 1, name="row")
        return frame.set_index("rank") if what == "passages" else frame


class SearchResults(list):
    """The passages of a search, best first: a list of dicts, which also renders in Jupyter."""

    # The pack version whose reader answered; of several packs, each's by name (multipack).
    version: int | dict[str, int | None] | None = None
    # Whether the gate would refuse the question (retrieval.confidence); of several packs,
    # each pack's verdict by name.
    gate: dict | None = None

    def _repr_html_(self) -> str:
        rows = [
            [
                str(rank),
                escape(hit["title"]),
                escape(hit["heading"]),
                _number(hit.get("score")),
                _number(hit.get("confidence")),
                _number(hit.get("similarity")),
                _link(hit["url"], hit["url"]),
                escape(" ".join(hit["text"].split())[:300]),
            ]
            for rank, hit in enumerate(self, start=1)
        ]
        headers = ["#", "title", "section", "score", "confidence", "similarity", "url", "text"]
        return f"<div class='kpack-search-results'>{_html_table(headers, rows)}</div>"

    def _repr_markdown_(self) -> str:
        rows = [
            [rank, hit["title"], hit["heading"], _number(hit.get("score")), hit["url"]]
            for rank, hit in enumerate(self, start=1)
        ]
        return _md_table(["#", "title", "section", "score", "url"], rows)

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        frame = pd.DataFrame(list(self))
        frame.index = pd.RangeIndex(1, len(frame) + 1, name="rank")
        return frame


def first_entities(reader: PackReader, urls: list[str], limit: int) -> list[dict]:
    """The first ``limit`` entities of the articles, by name, in article order (each article's
    most mentioned first); a page of a library's docs has thousands, so it stops at the limit."""
    found: dict[str, dict] = {}
    for url in urls:
        for entity in reader.article_entities.get(url, []):
            found.setdefault(entity["name"], entity)
            if len(found) == limit:
                return list(found.values())
    return list(found.values())


def passages_cypher(query: Query) -> str | None:
    """The response's ``cypher_query``: a Cypher statement that reads, from the version's
    pack.db, the passages this query ranked first (its top k, in rank order) by id, to look at
    them or to start a query of your own from them. It is not a statement that ran: a query
    runs none, the reader searches the vectors and texts it holds in memory
    (retrieval.reader). None when no passage was ranked (the gate refused, nothing found)."""
    ranked = sorted((c for c in query.considered if c.rank is not None), key=lambda c: c.rank)
    if not ranked:
        return None
    ids = ", ".join(_cypher_string(c.passage_id) for c in ranked)
    return (
        f"UNWIND [{ids}] AS id MATCH (c:Chunk {{chunk_id: id}}) "
        "RETURN c.chunk_id, c.section_id, c.content"
    )


def _cypher_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def query_result(query: Query, token_usage: dict[str, int]) -> QueryResult:
    """The response of a finished query (the seed's keys, then citations, timings, trace)."""
    started = time.perf_counter()
    reader, context = query.reader, query.context
    urls = list(dict.fromkeys(s.article_url for s in context))
    entities = first_entities(reader, urls, 10)
    facts = [fact for s in context for fact in reader.section_facts.get(s.section_id, [])][:10]
    result = QueryResult(
        answer=query.answer,
        sources=list(dict.fromkeys(s.title for s in query.cited)),
        entities=entities,
        facts=facts,
        cypher_query=passages_cypher(query),
        query_type=query.query_type,
        token_usage=token_usage,
        # Only what the answer cites; the whole context is in the trace.
        citations=list(
            {
                (s.title, s.url, s.heading): {
                    "title": s.title,
                    "url": s.url,
                    "section": s.heading,
                }
                for s in query.cited
            }.values()
        ),
    )
    query.timings["response"] = round((time.perf_counter() - started) * 1000, 3)
    result["version"] = reader.version  # the version that answered, not the current one now
    # Citation validation's summary (retrieval.citations); each statement's check is in the trace.
    result["citations_checked"] = query.notes.get("citations_checked")
    result["timings_ms"] = {**query.timings, "total": query.elapsed_ms()}
    result["trace"] = query.trace()
    return result


def search_results(query: Query, tokens: int | None = None) -> SearchResults:
    """The ranked passages of a search, each with its deep link, its confidence and a score
    that never rises down the ranking (retrieval.confidence), and the gate's verdict on the
    question. With ``tokens``, whole passages up to that budget (:func:`within_budget`)."""
    scores = rate_passages(query)
    hits = [
        {
            "title": c.title,
            "url": c.url,
            "heading": c.heading,
            "text": c.text,
            "score": score,
            "confidence": c.confidence,
            **{name: getattr(c, name) for name in SEARCH_FIELDS},
            "why": "; ".join(c.reasons),
        }
        for c, score in zip(query.candidates, scores, strict=True)
    ]
    if tokens is not None:
        hits = within_budget(query, hits, tokens)
    found = SearchResults(hits)
    found.version = query.reader.version
    found.gate = gate_verdict(query)
    return found


def within_budget(query: Query, hits: list[dict], tokens: int) -> list[dict]:
    """The hits, best first, as whole passages while they fit in ``tokens`` (estimated from
    their words, kpack.ingest.word_pieces.estimate_tokens): each passage's whole section when
    it fits (its code verbatim, newlines kept), else the passage alone; one that does not fit
    is left out and a smaller one after it may still fit. Each hit says how many tokens it takes."""
    kept: list[dict] = []
    sections: set[str] = set()
    left = tokens
    for hit, candidate in zip(hits, query.candidates, strict=True):
        if candidate.section_id in sections:
            continue  # already given whole
        section = query.reader.section_text.get(candidate.section_id, "")
        for text, whole in ((section, True), (hit["text"], False)):
            size = estimate_tokens(text)
            if text and size <= left:
                kept.append({**hit, "text": text, "tokens": size, "whole_section": whole})
                left -= size
                if whole:
                    sections.add(candidate.section_id)
                break
    return kept
