"""Whether a pack version's graph stages and page crowding run by default, as its own evidence
decided (issue 23; page crowding: issue 32).

After a version is published the build measures the graph stages on the pack's questions, or
on a self-check made from its headings (retrieval.eval.evidence), and writes the record into
the version's folder as ``graph_evidence.json``: the questions' source, each configuration's
scores, the two toggles chosen (``enable_graph``: entity PageRank and the second hop,
retrieval.entity_graph; ``enable_doc_graph``: the documentation graph, retrieval.docgraph), the
page crowding chosen with them (``passages_per_page``: retrieval.crowding) and why.

Queries take those as the pack's defaults (kg_config.json's ``enable_graph`` /
``enable_doc_graph`` / ``passages_per_page`` and a caller's options still win); ``kpack status``
shows them. A version without a record (built before the measurement existed, or while it has
not run yet) runs no graph stage and no page crowding by default: each runs only where the pack
showed that it does not lose. A record written before page crowding was measured keeps it off.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

EVIDENCE_FILE = "graph_evidence.json"
GRAPH_TOGGLES = ("enable_graph", "enable_doc_graph")
GRAPH_NAMES = {"enable_graph": "entity graph", "enable_doc_graph": "documentation graph"}
CROWDING = "passages_per_page"  # the query setting the evidence chooses besides the toggles
NO_EVIDENCE = (
    "no graph evidence was recorded for this version: the graph stages are off until a build "
    "measures them (or kg_config.json's query.enable_graph / enable_doc_graph sets them)"
)


@dataclass(frozen=True)
class GraphChoice:
    """The graph toggles a version runs by default, where they came from and why."""

    enable_graph: bool
    enable_doc_graph: bool
    source: str | None  # the questions measured, in words; None: no evidence recorded
    why: str
    passages_per_page: int = 0  # page crowding (retrieval.crowding); 0: off

    @property
    def toggles(self) -> dict[str, bool]:
        return {"enable_graph": self.enable_graph, "enable_doc_graph": self.enable_doc_graph}

    @property
    def settings(self) -> dict[str, int]:
        """The query settings the evidence chose (the pack's defaults under kg_config.json)."""
        return {CROWDING: self.passages_per_page}

    def summary(self) -> str:
        """One line: which graph is on, whether pages are crowded, and why ("documentation
        graph on, entity graph off, page crowding on: ...")."""
        on = [GRAPH_NAMES[t] for t, value in self.toggles.items() if value]
        off = [GRAPH_NAMES[t] for t, value in self.toggles.items() if not value]
        states = [f"{name} on" for name in on] + [f"{name} off" for name in off]
        states.append(
            f"page crowding on ({self.passages_per_page} per page)"
            if self.passages_per_page
            else "page crowding off"
        )
        where = f" (measured on {self.source})" if self.source else ""
        return f"{', '.join(states)}{where}: {self.why}"


def read_choice(version_dir: Path) -> GraphChoice:
    """The version's recorded choice; every graph stage off when it has none (or an
    unreadable one, which says so)."""
    path = version_dir / EVIDENCE_FILE
    if not path.is_file():
        return GraphChoice(False, False, None, NO_EVIDENCE)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return GraphChoice(
            bool(record["enable_graph"]),
            bool(record["enable_doc_graph"]),
            str(record["source"]),
            str(record["why"]),
            int(record.get(CROWDING) or 0),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return GraphChoice(False, False, None, f"{EVIDENCE_FILE} is unreadable ({exc})")


def read_record(version_dir: Path) -> dict | None:
    """The whole record (each configuration's scores too), or None."""
    try:
        return json.loads((version_dir / EVIDENCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_evidence(version_dir: Path, record: dict) -> Path:
    """Write the record into the version's folder, atomically (a reader never sees half)."""
    path = version_dir / EVIDENCE_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path
