"""search, query (with --explain): questions to a published pack, through retrieval.

retrieval loads inside the commands: ``kpack --help`` never pays for it.
"""

from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cli.output import console
from kpack.config import PROFILE_NAMES


def cmd_search(args: argparse.Namespace) -> int:
    import retrieval

    hits = retrieval.search(args.name, args.question, k=args.k, profile=args.profile)
    if args.json:
        print(json.dumps(hits, indent=2))
        return 0
    if not hits:
        console.print("no passages found")
    for rank, hit in enumerate(hits, start=1):
        pack = f"{escape(hit['pack'])}: " if "pack" in hit else ""  # one of several packs
        console.print(
            f"[bold]{rank}. {pack}{escape(hit['heading'])}[/]  (score {hit['score'] or 0:.4f}, "
            f"similarity {hit['similarity'] or 0:.3f})\n   {escape(hit['url'])}"
        )
        text = " ".join(hit["text"].split())
        # Page text is data, never markup: "[/]" in a passage must print as it is.
        console.print(
            f"   {text[:400]}{'...' if len(text) > 400 else ''}\n", markup=False, highlight=False
        )
    return 0


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
            console.print(
                f"  - {citation['section']}  {citation['url']}", markup=False, highlight=False
            )
    if args.explain:
        _explain(result, related or [])
    return 0


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
    # Readable at 80 columns: the scores never wrap; the passage and the reason it was dropped
    # wrap between words when the terminal is narrow.
    table = Table(show_edge=False)
    table.add_column("passage", max_width=48)
    for column in ("sim", "bm25", "pr", "xenc", "qual", "comb"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("dropped", max_width=20)
    fmt = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
    for c in trace.get("candidates", []):
        table.add_row(
            Text(c["heading"][:60]),
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
    search.add_argument("--k", type=int, default=5)
    search.add_argument("--json", action="store_true")
    search.add_argument("--profile", choices=PROFILE_NAMES)
    search.set_defaults(run=cmd_search)
    ask = sub.add_parser("query", help="answer a question from a pack, with citations")
    ask.add_argument("name", help="a pack, or several joined by commas: pandas,python")
    ask.add_argument("question")
    ask.add_argument("--profile", choices=PROFILE_NAMES)
    ask.add_argument("--no-llm", action="store_true", help="extractive answer, no API call")
    ask.add_argument(
        "--explain", action="store_true", help="show the retrieval trace and context pack"
    )
    ask.add_argument("--json", action="store_true", help="the full response dict")
    ask.add_argument("--k", type=int, default=5, help="passages to retrieve (max_results)")
    ask.set_defaults(run=cmd_query)
