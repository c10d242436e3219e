"""kpack: create, build, list, query and evaluate knowledge packs, and open the Dagster UI."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kpack import settings
from kpack.packs import PackError, list_packs, parse_urls, read_manifest, validate_pack_name

console = Console()
err = Console(stderr=True)


def cmd_new(args: argparse.Namespace) -> int:
    name = validate_pack_name(args.name)
    folder = settings.packs_dir() / name
    if (folder / "urls.txt").exists():
        raise PackError(f"pack {name!r} already exists at {folder}")
    lines = list(args.url or [])
    if args.urls_file:
        try:
            lines += Path(args.urls_file).read_text().splitlines()
        except OSError as exc:
            raise PackError(f"cannot read --urls-file: {exc}") from exc
    if not lines:
        raise PackError("give at least one --url or a --urls-file")
    sources, problems = parse_urls("\n".join(lines), folder)
    for problem in problems:
        err.print(f"[yellow]skipped[/] {escape(str(problem))}")
    if not sources:
        raise PackError("none of the URLs is valid; nothing was created")
    folder.mkdir(parents=True, exist_ok=True)
    # The lines as given: a relative file: URL stays relative to the pack folder.
    (folder / "urls.txt").write_text("".join(f"{lines[s.line_no - 1].strip()}\n" for s in sources))
    console.print(
        f"created {folder / 'urls.txt'} with {len(sources)} URLs; build it with "
        f"[bold]kpack build {name}[/]"
    )
    return 0


def _watch_progress(build_id: str, done: threading.Event) -> None:
    """Render step states of the run tagged with build_id until done is set."""
    waiting = Text("loading the asset graph and starting the run ...", style="dim")
    with Live(waiting, console=console, refresh_per_second=4, transient=True) as live:
        from dagster import DagsterEventType, DagsterInstance, RunsFilter

        from pipelines.build import BUILD_TAG

        instance = DagsterInstance.get()
        wanted = {
            DagsterEventType.STEP_START,
            DagsterEventType.STEP_SUCCESS,
            DagsterEventType.STEP_FAILURE,
            DagsterEventType.STEP_SKIPPED,
        }
        states: dict[str, str] = {}
        while not done.wait(0.3):
            runs = instance.get_runs(RunsFilter(tags={BUILD_TAG: build_id}), limit=1)
            if not runs:
                continue
            for record in instance.all_logs(runs[0].run_id, of_type=wanted):
                event = record.dagster_event
                if event and event.step_key:
                    states[event.step_key] = event.event_type_value
            table = Table(title=f"building ({runs[0].run_id[:8]})", show_edge=False)
            table.add_column("step")
            table.add_column("state")
            for step, state in states.items():
                table.add_row(step, state.removeprefix("STEP_").lower())
            live.update(table)


def cmd_build(args: argparse.Namespace) -> int:
    from pipelines.build import build_pack

    settings.dagster_home()
    build_id = uuid.uuid4().hex
    done = threading.Event()
    watcher = None
    if console.is_terminal and not args.no_progress:
        watcher = threading.Thread(target=_watch_progress, args=(build_id, done), daemon=True)
        watcher.start()
    started = time.perf_counter()
    try:
        result = build_pack(
            args.name, build_id=build_id, log_level=args.log_level, force=args.force
        )
    finally:
        done.set()
        if watcher:
            watcher.join()
    elapsed = time.perf_counter() - started
    manifest = result.manifest
    if not result.success:
        err.print(
            f"[red]build of {args.name} did not publish[/]: failed steps "
            f"{result.failed_steps or '-'}, failed checks {result.failed_checks or '-'} "
            f"(run {result.run_id}; see `kpack ui`). The previous version, if any, is "
            "unchanged."
        )
        return 1
    if result.outcome == "unchanged":
        console.print(
            f"{args.name}: nothing changed since version {manifest['version']}, so nothing was "
            f"published ({elapsed:.1f}s; `kpack build {args.name} --force` publishes anyway)"
        )
        return 0
    _print_summary(manifest, elapsed)
    return 0


def _print_summary(manifest: dict, elapsed: float) -> None:
    counts, sources = manifest["counts"], manifest["sources"]
    table = Table(title=f"{manifest['name']} v{manifest['version']} published", show_edge=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("pages ok / failed", f"{sources['ok']} / {sources['failed']}")
    if "changes" in manifest:
        table.add_row("pages new / changed / unchanged / removed", _changes_text(manifest))
    for key in ("Article", "Section", "Chunk", "Entity", "Fact", "LINKS_TO", "ENTITY_RELATION"):
        table.add_row(key, str(counts[key]))
    table.add_row(
        "embedding", f"{manifest['embedding']['model']} ({manifest['embedding']['dimension']}d)"
    )
    table.add_row("extraction", manifest["extraction"]["method"])
    for stage, seconds in manifest["stage_seconds"].items():
        table.add_row(f"  {stage} s", f"{seconds}")
    table.add_row("total s", f"{elapsed:.1f}")
    console.print(table)
    for failure in sources["failures"]:
        err.print(
            f"[yellow]failed[/] line {failure['line']}: "
            + escape(f"{failure['url']}: {failure['error']}")
        )
    for problem in sources["invalid_lines"]:
        err.print(f"[yellow]skipped[/] {escape(problem)}")


def cmd_list(args: argparse.Namespace) -> int:
    root = settings.packs_dir()
    table = Table(show_edge=False)
    for column in ("pack", "version", "built", "articles", "sections", "chunks", "failed URLs"):
        table.add_column(column)
    for name in list_packs(root):
        manifest = read_manifest(root / name)
        if manifest is None:
            table.add_row(name, "-", "never built", "", "", "", "")
            continue
        counts = manifest["counts"]
        table.add_row(
            name,
            str(manifest["version"]),
            manifest["built_at"],
            str(counts["Article"]),
            str(counts["Section"]),
            str(counts["Chunk"]),
            str(manifest["sources"]["failed"]),
        )
    console.print(table)
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    import json

    import retrieval

    hits = retrieval.search(args.name, args.question, k=args.k, profile=args.profile)
    if args.json:
        print(json.dumps(hits, indent=2))
        return 0
    if not hits:
        console.print("no passages found")
    for rank, hit in enumerate(hits, start=1):
        console.print(
            f"[bold]{rank}. {hit['heading']}[/]  (score {hit['score'] or 0:.4f}, "
            f"similarity {hit['similarity'] or 0:.3f})\n   {hit['url']}"
        )
        text = " ".join(hit["text"].split())
        console.print(f"   {text[:400]}{'...' if len(text) > 400 else ''}\n", highlight=False)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    import json

    import retrieval

    result = retrieval.query(
        args.name, args.question, profile=args.profile, use_llm=not args.no_llm, max_results=args.k
    )
    related = retrieval.context_pack(args.name, args.question) if args.explain else None
    if args.json:
        print(
            json.dumps(
                {**result, **({"context_pack": related} if args.explain else {})},
                indent=2,
                default=str,
            )
        )
        return 0
    console.print(result["answer"], highlight=False)
    console.print(
        f"\n[dim]{result['query_type']}, {result['timings_ms']['total']:.0f} ms, "
        f"{result['token_usage']['api_calls']} LLM calls[/]"
    )
    if result["citations"]:
        console.print("[bold]Sources[/]")
        for citation in result["citations"]:
            console.print(f"  - {citation['section']}  {citation['url']}", highlight=False)
    if args.explain:
        _explain(result, related or [])
    return 0


def _explain(result: dict, related: list[dict]) -> None:
    trace = result["trace"]
    console.print(
        f"\n[bold]Retrieval trace[/] (profile {trace['profile']}, gate threshold "
        f"{trace['threshold']}, best similarity {trace.get('max_similarity') or 0:.3f})"
    )
    table = Table(show_edge=False)
    table.add_column("passage", max_width=48, no_wrap=True, overflow="ellipsis")
    for column in ("sim", "bm25", "pr", "xenc", "qual", "comb"):
        table.add_column(column, justify="right")
    table.add_column("dropped", max_width=20, no_wrap=True, overflow="ellipsis")
    fmt = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
    for c in trace.get("candidates", []):
        table.add_row(
            c["heading"][:60],
            fmt(c["similarity"]),
            fmt(c["bm25"]),
            fmt(c["pagerank"]),
            fmt(c["cross_encoder"]),
            fmt(c["quality"]),
            fmt(c["combined"]),
            c["dropped"] or "",
        )
    console.print(table)
    timings = ", ".join(f"{k} {v:.1f}" for k, v in result["timings_ms"].items())
    console.print(f"[dim]timings ms: {timings}[/]")
    console.print("\n[bold]Context pack[/]")
    pack_table = Table(show_edge=False)
    for column in ("article", "score", "why"):
        pack_table.add_column(column)
    for row in related:
        pack_table.add_row(row["title"], str(row["score"]), row["why"])
    console.print(pack_table)


def cmd_eval(args: argparse.Namespace) -> int:
    """kpack eval PACK [...]; kpack eval generate PACK --n N."""
    import json

    from retrieval.evaluation import (
        evaluate,
        load_questions,
        markdown_summary,
        write_results,
        write_threshold,
    )
    from retrieval.pack import resolve_folder

    if args.target == "generate":
        return _eval_generate(args)
    folder = resolve_folder(args.target)
    questions, problems = load_questions(
        Path(args.questions) if args.questions else folder / "eval" / "questions.jsonl", folder
    )
    for problem in problems:
        err.print(f"[yellow]skipped[/] {escape(problem)}")
    if not questions:
        raise PackError("no valid question to evaluate")
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    with console.status("evaluating") as status:
        results = evaluate(
            folder,
            questions,
            profiles,
            use_llm=not args.no_llm,
            judge_model=args.judge_model,
            progress=lambda condition, i, n: status.update(f"{condition}: question {i + 1}/{n}"),
        )
    paths = write_results(results, folder / "eval" / "results")
    if args.write_config:
        best = results["calibration"]["best_threshold"]
        console.print(
            f"context_confidence_threshold = {best} written to {write_threshold(folder, best)}"
        )
    if args.json:
        print(json.dumps(results, indent=2, default=str))
        return 0
    print(markdown_summary(results))
    console.print(f"results: {paths['json']}\nchart:   {paths['png']}")
    return 0


def _eval_generate(args: argparse.Namespace) -> int:
    from kpack.llm import ClaudeClient
    from retrieval.evaluation import generate_questions
    from retrieval.pack import open_pack

    if not args.pack:
        raise PackError("usage: kpack eval generate PACK --n N")
    pack = open_pack(args.pack)
    sections = [
        (s.article_url, s.heading, s.content) for s in pack.sections.values() if s.word_count >= 40
    ]
    written = generate_questions(pack.folder, sections, args.n, ClaudeClient())
    console.print(
        f"wrote {len(written)} candidate questions to {pack.folder / 'eval' / 'candidates.jsonl'}; "
        "review them, then add the good ones to eval/questions.jsonl"
    )
    return 0


def _changes_text(manifest: dict) -> str:
    c = manifest.get("changes")
    if not c:
        return "-"
    return (
        f"{c['new']} / {c['changed']} / {c['unchanged']} ({c['not_modified']} not modified) "
        f"/ {c['removed']}"
    )


def _age(timestamp: str | None) -> str:
    """'3h 12m ago' for an ISO 8601 time."""
    from datetime import UTC, datetime

    if not timestamp:
        return "-"
    seconds = int((datetime.now(UTC) - datetime.fromisoformat(timestamp)).total_seconds())
    if seconds < 60:
        return f"{max(seconds, 0)}s ago"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if days:
        return f"{days}d {hours % 24}h ago"
    return f"{hours}h {minutes % 60}m ago" if hours else f"{minutes}m ago"


def pack_status(name: str) -> dict:
    """Everything `kpack status` shows, as one dict (also its --json output)."""
    from datetime import UTC, datetime

    from kpack.config import load_config
    from kpack.packs import pack_dir
    from kpack.store import PackStore, version_number
    from pipelines.build import build_running
    from pipelines.schedules import next_tick

    folder = pack_dir(validate_pack_name(name))
    store = PackStore(packs_dir=str(folder.parent))
    manifest = read_manifest(folder)
    current, previous = store.current(name), store.previous_version(name)
    try:
        cron, schedule_error = load_config(folder).schedule, None
    except PackError as exc:
        cron, schedule_error = None, str(exc)
    upcoming = next_tick(cron, datetime.now(UTC)) if cron else None
    newer = [
        v.name
        for v in store.published_versions(name)
        if current and version_number(v) > version_number(current)
    ]
    return {
        "pack": name,
        "published": manifest is not None,
        "version": version_number(current) if current else None,
        "previous_version": version_number(previous) if previous else None,
        "rolled_back_from": newer[-1] if newer else None,
        "built_at": manifest["built_at"] if manifest else None,
        "age": _age(manifest["built_at"]) if manifest else None,
        "changes": manifest.get("changes") if manifest else None,
        "failures": manifest["sources"]["failures"] if manifest else [],
        "extraction": manifest["extraction"] if manifest else None,
        "last_build": store.last_build(name),
        "build_running": build_running(folder),
        "schedule": {
            "cron": cron,
            "timezone": "UTC",
            "next": upcoming.isoformat() if upcoming else None,
            "error": schedule_error,
            "note": "runs only while pack_refresh_schedule is on in the Dagster UI",
        },
    }


def cmd_status(args: argparse.Namespace) -> int:
    import json

    status = pack_status(args.name)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    lines: list[tuple[str, str]] = []
    if not status["published"]:
        lines.append(("published", f"never (build it with kpack build {status['pack']})"))
    else:
        lines.append(("version", f"v{status['version']:04d}"))
        previous = status["previous_version"]
        lines.append(("previous kept version", f"v{previous:04d}" if previous else "none"))
        if status["rolled_back_from"]:
            lines.append(("rolled back from", status["rolled_back_from"]))
        lines.append(("built", f"{status['built_at']} ({status['age']})"))
        changes = _changes_text({"changes": status["changes"]})
        lines.append(("pages new / changed / unchanged / removed", changes))
        lines.append(("failed URLs", str(len(status["failures"]))))
        extraction = status["extraction"]
        cost = extraction.get("estimated_cost_usd")
        lines.append(
            (
                "LLM calls / tokens in+out / est. cost",
                f"{extraction['llm_calls']} / {extraction['llm_input_tokens']}+"
                f"{extraction['llm_output_tokens']} / "
                + (f"${cost:.4f}" if cost is not None else "unknown model price"),
            )
        )
    last = status["last_build"]
    if last:
        detail = {
            "published": f"published v{last['version']:04d}",
            "unchanged": f"nothing changed since v{last['version']:04d}, nothing published",
            "failed": "failed, the published version is unchanged: steps "
            f"{last.get('failed_steps') or '-'}, checks {last.get('failed_checks') or '-'}",
        }.get(last["outcome"], last["outcome"])
        lines.append(("last build", f"{_age(last['checked_at'])}: {detail} (run {last['run_id']})"))
    lines.append(("build running", "yes" if status["build_running"] else "no"))
    schedule = status["schedule"]
    if schedule["error"]:
        lines.append(("schedule", f"invalid: {schedule['error']}"))
    elif schedule["cron"]:
        lines.append(
            (
                "schedule",
                f"{schedule['cron']} UTC, next {schedule['next']} ({schedule['note']})",
            )
        )
    else:
        lines.append(("schedule", 'never (schedule is "" in kg_config.json)'))
    console.print(f"[bold]{escape(status['pack'])}[/]")
    width = max(len(what) for what, _ in lines)
    for what, value in lines:  # soft_wrap: a long value is not cut into the next line
        console.print(f"  {what.ljust(width)}  {escape(value)}", soft_wrap=True, highlight=False)
    for failure in status["failures"]:
        err.print(
            f"[yellow]failed[/] line {failure['line']}: "
            + escape(f"{failure['url']}: {failure['error']}")
        )
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from kpack.packs import pack_dir
    from kpack.store import PackStore, version_number
    from pipelines.build import build_lock

    name = validate_pack_name(args.name)
    folder = pack_dir(name)
    with build_lock(folder):  # no build publishes while current is flipped
        old, new = PackStore(packs_dir=str(folder.parent)).rollback(name)
    console.print(
        f"{name}: rolled back from {old.name} to {new.name}; version {version_number(new)} "
        f"is now current ({old.name} stays on disk until the next build publishes; that "
        "build starts from the current sources again)"
    )
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    settings.dagster_home()
    command = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(settings.PROJECT_ROOT / "workspace.yaml"),
        "-p",
        str(args.port),
    ]
    return subprocess.call(command, cwd=settings.PROJECT_ROOT, env=os.environ.copy())


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="kpack", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="create packs/NAME/urls.txt")
    new.add_argument("name")
    new.add_argument("--url", action="append", help="a URL (repeatable)")
    new.add_argument("--urls-file", help="a file with one URL a line")
    new.set_defaults(run=cmd_new)
    build = sub.add_parser("build", help="build (or rebuild) a pack in-process")
    build.add_argument("name")
    build.add_argument("--no-progress", action="store_true")
    build.add_argument("--log-level", default="WARNING", help="Dagster log level on the console")
    build.add_argument(
        "--force", action="store_true", help="publish a new version even if nothing changed"
    )
    build.set_defaults(run=cmd_build)
    sub.add_parser("list", help="packs and their manifest figures").set_defaults(run=cmd_list)
    search = sub.add_parser("search", help="ranked passages for a question")
    search.add_argument("name")
    search.add_argument("question")
    search.add_argument("--k", type=int, default=5)
    search.add_argument("--json", action="store_true")
    search.add_argument("--profile", choices=["baseline", "balanced", "max"])
    search.set_defaults(run=cmd_search)
    ask = sub.add_parser("query", help="answer a question from a pack, with citations")
    ask.add_argument("name")
    ask.add_argument("question")
    ask.add_argument("--profile", choices=["baseline", "balanced", "max"])
    ask.add_argument("--no-llm", action="store_true", help="extractive answer, no API call")
    ask.add_argument(
        "--explain", action="store_true", help="show the retrieval trace and context pack"
    )
    ask.add_argument("--json", action="store_true", help="the full response dict")
    ask.add_argument("--k", type=int, default=5, help="passages to retrieve (max_results)")
    ask.set_defaults(run=cmd_query)
    ev = sub.add_parser("eval", help="evaluate a pack (or: kpack eval generate PACK --n N)")
    ev.add_argument("target", help="the pack, or 'generate'")
    ev.add_argument("pack", nargs="?", help="with 'generate': the pack")
    ev.add_argument(
        "--questions", help="a questions.jsonl (default: the pack's eval/questions.jsonl)"
    )
    ev.add_argument("--profiles", default="baseline,balanced,max")
    ev.add_argument("--no-llm", action="store_true", help="score answers without an API key")
    ev.add_argument("--judge-model", default="claude-haiku-4-5")
    ev.add_argument("--write-config", action="store_true", help="store the best gate threshold")
    ev.add_argument("--json", action="store_true")
    ev.add_argument("--n", type=int, default=20, help="with 'generate': how many questions")
    ev.set_defaults(run=cmd_eval)
    status = sub.add_parser(
        "status", help="freshness, last build, what changed, failures, schedule of a pack"
    )
    status.add_argument("name")
    status.add_argument("--json", action="store_true")
    status.set_defaults(run=cmd_status)
    rollback = sub.add_parser("rollback", help="make the previous kept version current again")
    rollback.add_argument("name")
    rollback.set_defaults(run=cmd_rollback)
    ui = sub.add_parser("ui", help="start the Dagster UI (dagster dev)")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(run=cmd_ui)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except PackError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    except KeyboardInterrupt:
        err.print("interrupted; the published pack is unchanged")
        return 130


if __name__ == "__main__":
    sys.exit(main())
