"""search, query (with --explain): questions to a published pack, through retrieval.

retrieval loads inside the commands: ``kpack --help`` never pays for it.
"""

from __future__ import annotations

import argparse
import json
import textwrap

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cli.output import console
from kpack.config import PROFILE_NAMES

# The profiles in a line each (retrieval.profiles has them whole; importing it here would
# make `kpack --help` pay for retrieval).
PROFILE_HELP = (
    "which stages answer (default: the pack's kg_config.json, else balanced): baseline, "
    "hybrid search only; balanced, plus graph retrieval and a multi-document context; max, "
    "plus query expansion and the cross-encoder; latency_optimized, a smaller context; "
    "coverage_optimized, query expansion and a wider context (docs/querying.md)"
)


# A passage shows at most this many lines: a long section is read through its link.
SHOWN_LINES = 12
INDENT = "   "


def cmd_search(args: argparse.Namespace) -> int:
    import retrieval

    hits = retrieval.search(
        args.name, args.question, k=args.k, profile=args.profile, tokens=args.tokens
    )
    if args.json:
        print(json.dumps(hits, indent=2))
        return 0
    if not hits:
        console.print("no passages found")
    gate = hits.gate or {}
    # One pack's verdict, or each pack's by name (several packs): refused when every one is.
    verdicts = [gate] if "refused" in gate else list(gate.values())
    if verdicts and all(verdict.get("refused") for verdict in verdicts):
        why = "; ".join(dict.fromkeys(verdict["why"] for verdict in verdicts if verdict["why"]))
        console.print(f"[yellow]the confidence gate would refuse this question[/]: {escape(why)}\n")
    for rank, hit in enumerate(hits, start=1):
        pack = f"{escape(hit['pack'])}: " if "pack" in hit else ""  # one of several packs
        console.print(
            f"[bold]{rank}. {pack}{escape(hit['heading'])}[/]\n   score {hit['score']:.3f}, "
            f"confidence {hit['confidence']:.3f}, similarity {hit['similarity'] or 0:.3f}",
            highlight=False,
        )
        # A URL is never broken: a terminal makes a link of it only in one piece.
        console.print(f"   {hit['url']}", markup=False, highlight=False, soft_wrap=True)
        # Page text is data, never markup ("[/]" prints as it is); code keeps its lines.
        console.print(
            _shown(hit["text"], console.width) + "\n", markup=False, highlight=False, soft_wrap=True
        )
    return 0


def _shown(text: str, width: int) -> str:
    """A passage indented under its heading: prose wrapped to the terminal, code lines as
    written (in a fence, or indented), at most SHOWN_LINES lines."""
    lines: list[str] = []
    in_code = False
    for line in text.strip("\n").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or line.startswith("```") or line[:1].isspace() or not line:
            lines.append(INDENT + line.rstrip())
        else:
            lines += textwrap.wrap(
                line, max(width - len(INDENT), 20), initial_indent=INDENT, subsequent_indent=INDENT
            )
    if len(lines) > SHOWN_LINES:
        lines = [*lines[:SHOWN_LINES], f"{INDENT}... ({len(lines) - SHOWN_LINES} more lines)"]
    return "\n".join(lines)


def cmd_query(args: argparse.Namespace) -> int:
    import retrieval

    result = retrieval.query(
        args.name, args.question, profile=args.profile, use_llm=not args.no_llm, max_results=args.k
    )
    # Of several packs ("pandas,python"), the one that answered.
    answering = result.get("pack", args.name)
    related = retrieval.context_pack(answering, args.question) if args.explain else None
    if args.json:
        print(
            json.dumps(
                {**result, **({"context_pack": related} if args.explain else {})},
                indent=2,
                default=str,
            )
        )
        return 0
    console.print(result["answer"], markup=False, highlight=False)
    console.print(
        f"\n[dim]{'from ' + answering + ', ' if 'pack' in result else ''}"
        f"{result['query_type']}, {result['timings_ms']['total']:.0f} ms, "
        f"{result['token_usage']['api_calls']} LLM calls[/]"
    )
    if result["citations"]:
        console.print("[bold]Sources[/]")
        for citation in result["citations"]:
            _print_source(citation["section"], citation["url"])
    if args.explain:
        _explain(result, related or [])
    return 0


def _print_source(section: str, url: str) -> None:
    """``  - section  url`` on one line when it fits the terminal, else the URL on the next
    line: a URL is never broken (a terminal makes a link of it only in one piece)."""
    line = f"  - {section}  {url}"
    if len(line) > console.width:
        line = f"  - {section}\n    {url}"
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _explain(result: dict, related: list[dict]) -> None:
    trace = result["trace"]
    console.print(
        f"\n[bold]Retrieval trace[/] (profile {trace['profile']}, gate threshold "
        f"{trace['threshold']}, best similarity {trace.get('max_similarity') or 0:.3f})"
    )
    if trace.get("threshold_source"):
        console.print(
            f"[dim]gate threshold from {trace['threshold_source']}: "
            f"{escape(trace['threshold_why'])}[/]"
        )
    # Readable at 80 columns: a passage is one row. The scores never wrap; the passage's
    # heading and the reason it was dropped are cut short when the terminal is narrow (the
    # reasons below give every passage's whole story).
    table = Table(show_edge=False, collapse_padding=True)
    # The section's own heading on one line: its page's title is in the sources and the
    # reasons below, and a heading path wrapped over four lines hid the scores.
    table.add_column("passage", max_width=32, no_wrap=True, overflow="ellipsis")
    for column in ("sim", "bm25", "pr", "xenc", "qual", "comb"):
        table.add_column(column, justify="right", no_wrap=True, min_width=5)
    table.add_column("dropped", min_width=11, max_width=20, no_wrap=True, overflow="ellipsis")
    fmt = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
    for c in trace.get("candidates", []):
        table.add_row(
            Text(c["heading"].split(" > ")[-1]),
            fmt(c["similarity"]),
            fmt(c["bm25"]),
            fmt(c["pagerank"]),
            fmt(c["cross_encoder"]),
            fmt(c["quality"]),
            fmt(c["combined"]),
            Text(c["dropped"] or ""),
        )
    console.print(table)
    kept = sorted(
        (c for c in trace.get("candidates", []) if c.get("rank")), key=lambda c: c["rank"]
    )
    if kept:
        console.print("[bold]Why the kept passages rank where they do[/]")
    for c in kept:
        console.print(f"  {c['rank']}. {c['heading']}: {c['why']}", markup=False, highlight=False)
    timings = ", ".join(f"{k} {v:.1f}" for k, v in result["timings_ms"].items())
    console.print(f"[dim]timings ms: {timings}[/]")
    console.print("\n[bold]Context pack[/]")
    pack_table = Table(show_edge=False)
    pack_table.add_column("article")
    pack_table.add_column("score", justify="right", no_wrap=True)
    pack_table.add_column("why")
    for row in related:
        pack_table.add_row(Text(row["title"]), str(row["score"]), Text(row["why"]))
    console.print(pack_table)


def add_commands(sub: argparse._SubParsersAction) -> None:
    search = sub.add_parser("search", help="ranked passages for a question")
    search.add_argument("name", help="a pack, or several joined by commas: pandas,python")
    search.add_argument("question")
    search.add_argument("--k", type=int, default=5, help="how many passages (default 5)")
    search.add_argument(
        "--tokens",
        type=int,
        help="whole passages, best first, up to this many tokens (context for an agent)",
    )
    search.add_argument("--json", action="store_true", help="the passages as JSON")
    search.add_argument("--profile", choices=PROFILE_NAMES, help=PROFILE_HELP)
    search.set_defaults(run=cmd_search)
    ask = sub.add_parser("query", help="answer a question from a pack, with citations")
    ask.add_argument("name", help="a pack, or several joined by commas: pandas,python")
    ask.add_argument("question")
    ask.add_argument("--profile", choices=PROFILE_NAMES, help=PROFILE_HELP)
    ask.add_argument("--no-llm", action="store_true", help="extractive answer, no API call")
    ask.add_argument(
        "--explain", action="store_true", help="show the retrieval trace and context pack"
    )
    ask.add_argument("--json", action="store_true", help="the full response dict")
    ask.add_argument("--k", type=int, default=5, help="passages to retrieve (max_results)")
    ask.set_defaults(run=cmd_query)
