"""kpack: create, build, list, query and evaluate knowledge packs, and open the Dagster UI."""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
import uuid
from dataclasses import asdict
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kpack import settings
from kpack.config import PROFILE_NAMES
from kpack.packs import (
    PackError,
    list_packs,
    parse_urls,
    read_manifest,
    read_urls_text,
    validate_pack_name,
)

console = Console()
err = Console(stderr=True)


def _report(message: str) -> int:
    """A command's closing line, and its exit status 0. ``message`` is Rich markup (paths in
    it escaped); numbers and paths are not colour-highlighted."""
    console.print(message, highlight=False)
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    name = validate_pack_name(args.name)
    folder = settings.packs_dir() / name
    if (folder / "urls.txt").exists():
        raise PackError(f"pack {name!r} already exists at {folder}")
    lines = list(args.url or [])
    if args.urls_file:
        lines += read_urls_text(Path(args.urls_file)).splitlines()
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


def cmd_build(args: argparse.Namespace) -> int:
    if args.dry_run:  # pipelines.dry_run: fetches and estimates, sends and publishes nothing
        from pipelines.dry_run import dry_run

        return _report(escape(dry_run(args.name).report()))
    from dagster import DagsterInstance

    from pipelines.build import BUILD_TAG, build_pack
    from pipelines.instance import ensure_dagster_home
    from pipelines.progress import BuildProgress

    ensure_dagster_home()
    build_id = uuid.uuid4().hex
    started = time.perf_counter()
    show_progress = not args.no_progress
    # Dagster's own console log only with --verbose: by default the progress rows and one
    # line of cause say what happened, with no stack traces.
    log_level = args.log_level or ("INFO" if args.verbose else "CRITICAL")
    instance = DagsterInstance.get()
    build = partial(
        build_pack,
        args.name,
        instance=instance,
        build_id=build_id,
        log_level=log_level,
        force=args.force,
    )
    if show_progress:
        with BuildProgress(instance, (BUILD_TAG, build_id), console, live=console.is_terminal):
            result = build()
    else:
        result = build()
    elapsed = time.perf_counter() - started
    manifest = result.manifest
    if not result.success:
        kept = f"v{manifest['version']:04d} stays current" if manifest else "nothing is published"
        err.print(
            f"[red]build of {escape(args.name)} failed:[/] {escape(result.cause or 'unknown cause')}"
            f"\n{kept}; details: `kpack build {escape(args.name)} --verbose` or run "
            f"{result.run_id} in `kpack ui`",
            highlight=False,
        )
        return 1
    if result.outcome == "unchanged":
        return _report(
            f"{args.name}: nothing changed since v{manifest['version']:04d}, so nothing was "
            f"published ({elapsed:.1f}s; `kpack build {args.name} --force` publishes anyway)"
        )
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
        # no_wrap: a build time cut to "2026-11-22T07..." tells nothing
        table.add_column(column, no_wrap=column in ("pack", "version", "built"))
    for name in list_packs(root):
        manifest = read_manifest(root / name)
        if manifest is None:
            table.add_row(name, "-", "never built", "", "", "", "")
            continue
        counts = manifest["counts"]
        table.add_row(
            name,
            f"v{manifest['version']:04d}",
            f"{manifest['built_at'].replace('T', ' ')} ({_age(manifest['built_at'])})",
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
            f"[bold]{rank}. {escape(hit['heading'])}[/]  (score {hit['score'] or 0:.4f}, "
            f"similarity {hit['similarity'] or 0:.3f})\n   {escape(hit['url'])}"
        )
        text = " ".join(hit["text"].split())
        # Page text is data, never markup: "[/]" in a passage must print as it is.
        console.print(
            f"   {text[:400]}{'...' if len(text) > 400 else ''}\n", markup=False, highlight=False
        )
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
    console.print(result["answer"], markup=False, highlight=False)
    console.print(
        f"\n[dim]{result['query_type']}, {result['timings_ms']['total']:.0f} ms, "
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
    table = Table(show_edge=False)
    table.add_column("passage", max_width=48, no_wrap=True, overflow="ellipsis")
    for column in ("sim", "bm25", "pr", "xenc", "qual", "comb"):
        table.add_column(column, justify="right")
    table.add_column("dropped", max_width=20, no_wrap=True, overflow="ellipsis")
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
    for column in ("article", "score", "why"):
        pack_table.add_column(column)
    for row in related:
        pack_table.add_row(Text(row["title"]), str(row["score"]), Text(row["why"]))
    console.print(pack_table)


def cmd_eval(args: argparse.Namespace) -> int:
    """kpack eval PACK [...]; kpack eval generate PACK --n N."""
    import json

    from retrieval.eval import (
        check_profiles,
        evaluate,
        load_questions,
        markdown_summary,
        write_query_settings,
        write_results,
        write_threshold,
    )
    from retrieval.reader import resolve_folder

    if args.target == "generate":
        return _eval_generate(args)
    profiles = check_profiles([p.strip() for p in args.profiles.split(",") if p.strip()])
    folder = resolve_folder(args.target)
    questions, problems = load_questions(
        Path(args.questions) if args.questions else folder / "eval" / "questions.jsonl", folder
    )
    for problem in problems:
        err.print(f"[yellow]skipped[/] {escape(problem)}")
    if not questions:
        raise PackError("no valid question to evaluate")
    results = evaluate(
        folder,
        questions,
        profiles,
        use_llm=not args.no_llm,
        judge_model=args.judge_model,
        progress=_eval_progress,
        calibrate_graph_weights=args.write_config,
    )
    paths = write_results(results, folder / "eval" / "results")
    if args.write_config:
        best = results["calibration"]["best_threshold"]
        graph = results["calibration"]["graph"]
        write_query_settings(folder, graph["chosen"])
        console.print(
            f"context_confidence_threshold = {best} written to {write_threshold(folder, best)}; "
            f"graph settings {graph['chosen']} ({graph['why']}) too; "
            f"queries use them once `kpack build {folder.name}` has published them",
            markup=False,
        )
    if args.json:
        print(json.dumps(results, indent=2, default=str))
        return 0
    print(markdown_summary(results))
    console.print(f"results: {paths['json']}\nchart:   {paths['png']}")
    return 0


def _eval_progress(condition: str, number: int, total: int, record: dict) -> None:
    """One line per question on stderr (plain when piped): how it went and how long it took."""
    if record["gated"]:
        outcome = "gated"
    elif record["unanswerable"]:
        outcome = "refused (unanswerable)" if record["refused"] else "answered (unanswerable)"
    elif record["out_of_domain"]:
        outcome = "answered (out of domain)"
    elif record["hit_rank"]:
        outcome = f"hit at {record['hit_rank']}"
    else:
        outcome = "no hit" if record["retrieved"] else "answered"
    total_ms = record["timings_ms"].get("total", 0.0)
    err.print(
        f"{condition} {number}/{total}: {outcome}, {total_ms:.0f} ms - {record['question'][:60]}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _eval_generate(args: argparse.Namespace) -> int:
    from kpack.llm import ClaudeClient
    from retrieval.eval import candidate_sections, generate_questions
    from retrieval.reader import reading

    if not args.pack:
        raise PackError("usage: kpack eval generate PACK --n N")
    with reading(args.pack) as reader:
        generated = generate_questions(
            reader.folder, candidate_sections(reader), args.n, ClaudeClient()
        )
    if not generated.written:
        raise PackError(f"no candidate question was written: {generated.why_none()}")
    console.print(
        f"wrote {len(generated.written)} candidate questions to {generated.path}; "
        "review them, then add the good ones to eval/questions.jsonl",
        highlight=False,
    )
    if generated.failures:
        err.print(f"skipped sections: {generated.why_none()}", markup=False, highlight=False)
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
    from kpack.errors import PackNotReady
    from kpack.gate import configured_threshold
    from kpack.packs import pack_dir
    from kpack.store import PackStore, build_running, verify_version, version_number
    from pipelines.schedules import next_tick, schedule_running

    folder = pack_dir(validate_pack_name(name))
    store = PackStore(packs_dir=str(folder.parent))
    manifest = read_manifest(folder)
    current, previous = store.current(name), store.previous_version(name)
    try:
        cron, schedule_error = load_config(folder).schedule, None
    except PackError as exc:
        cron, schedule_error = None, str(exc)
    from dagster import DagsterInstance

    from pipelines.instance import ensure_dagster_home

    ensure_dagster_home()
    running = schedule_running(DagsterInstance.get())
    upcoming = next_tick(cron, datetime.now(UTC)) if cron and running else None
    rolled_back_from = store.rolled_back_from(name)
    try:
        damage = verify_version(current) if current else None
    except PackNotReady as exc:
        damage = str(exc)
    return {
        "pack": name,
        "published": manifest is not None,
        "version": version_number(current) if current else None,
        "previous_version": version_number(previous) if previous else None,
        "rolled_back_from": rolled_back_from.name if rolled_back_from else None,
        # newer versions no rollback left: a publish killed before flipping `current`
        "unpublished_versions": [v.name for v in store.unpublished_versions(name)],
        "damaged": damage,
        "built_at": manifest["built_at"] if manifest else None,
        "age": _age(manifest["built_at"]) if manifest else None,
        "changes": manifest.get("changes") if manifest else None,
        "failures": manifest["sources"]["failures"] if manifest else [],
        "extraction": manifest["extraction"] if manifest else None,
        "gate": asdict(configured_threshold(manifest)) if manifest else None,
        "last_build": store.last_build(name),
        "build_running": build_running(folder),
        "schedule": {
            "cron": cron,
            "timezone": "UTC",
            "next": upcoming.isoformat() if upcoming else None,
            "running": running,
            "error": schedule_error,
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
        if status["damaged"]:
            lines.append(("damaged", status["damaged"]))
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
        gate = status["gate"]
        lines.append(("gate threshold", f"{gate['threshold']} ({gate['source']}: {gate['why']})"))
    if status["unpublished_versions"]:
        unpublished = ", ".join(status["unpublished_versions"])
        lines.append(
            (
                "unpublished versions",
                f"{unpublished} (a build was stopped while publishing; "
                "the next publish removes it)",
            )
        )
    last = status["last_build"]
    if last:
        lines.append(("last build", f"{_age(last['checked_at'])}: {_last_build_text(last)}"))
    lines.append(("build running", "yes" if status["build_running"] else "no"))
    schedule = status["schedule"]
    if schedule["error"]:
        lines.append(("schedule", f"invalid: {schedule['error']}"))
    elif schedule["cron"] and schedule["running"]:
        lines.append(("schedule", f"{schedule['cron']} UTC, next run {schedule['next']}"))
    elif schedule["cron"]:
        lines.append(
            (
                "schedule",
                f"{schedule['cron']} UTC, but pack_refresh_schedule is off: no scheduled "
                "builds until it is turned on in the Dagster UI (Automation)",
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


def _last_build_text(last: dict) -> str:
    """One line for last_build.json; a failed first build has no version to name."""
    version = last.get("version")
    label = f"v{version:04d}" if isinstance(version, int) else None
    if last["outcome"] == "published":
        detail = f"published {label}"
    elif last["outcome"] == "unchanged":
        detail = f"nothing changed since {label}, nothing published"
    elif last["outcome"] == "failed":
        kept = f"{label} is still published" if label else "nothing is published yet"
        cause = last.get("cause") or (
            f"steps {last.get('failed_steps') or '-'}, checks {last.get('failed_checks') or '-'}"
        )
        detail = f"failed ({kept}): {cause}"
    else:
        detail = last["outcome"]
    return f"{detail} (run {last.get('run_id')})"


def cmd_rollback(args: argparse.Namespace) -> int:
    from kpack.packs import pack_dir
    from kpack.store import PackStore, build_lock, version_number

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
    from pipelines.instance import ensure_dagster_home

    ensure_dagster_home()
    command = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(settings.PROJECT_ROOT / "workspace.yaml"),
        "-h",
        args.host,
        "-p",
        str(args.port),
    ]
    return subprocess.call(command, cwd=settings.PROJECT_ROOT, env=os.environ.copy())


def cmd_serve(args: argparse.Namespace) -> int:
    from serving.http import is_loopback, serve

    token = args.token or os.environ.get("KPACK_API_TOKEN") or None
    if not 0 < args.port < 65536:
        raise PackError(f"--port must be between 1 and 65535, got {args.port}")
    if token is None and not is_loopback(args.host):
        err.print(
            f"[yellow]warning:[/] serving on {escape(args.host)} without a token: anyone who "
            "can reach this port can query every pack (set KPACK_API_TOKEN or --token)"
        )
    err.print(
        f"serving the packs in {escape(str(settings.packs_dir()))} on "
        f"http://{escape(args.host)}:{args.port} (API docs at /docs"
        f"{', bearer token required' if token else ''}); Ctrl-C stops"
    )
    serve(
        args.host,
        args.port,
        token=token,
        warmup=not args.no_warmup,
        access_log=args.access_log,
    )
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    # stdout is the protocol stream: nothing may be printed here.
    from serving.mcp import run_stdio

    run_stdio()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from kpack.archive import ARCHIVE_MANIFEST, export_pack

    result = export_pack(args.name, Path(args.output) if args.output else None)
    return _report(
        f"exported {result.pack} version {result.version} to {escape(str(result.path))} "
        f"({result.bytes / 2**20:.1f} MiB, {len(result.files)} files with their SHA-256 in "
        f"{ARCHIVE_MANIFEST}); install it elsewhere with [bold]kpack install "
        f"{escape(result.path.name)}[/]"
    )


def cmd_install(args: argparse.Namespace) -> int:
    from kpack.archive import install

    with console.status("verifying checksums, the database and the embedding model"):
        result = install(args.source, name=args.as_name, replace=args.replace)
    return _report(
        f"installed {result.source_pack} v{result.source_version} as {result.pack} version "
        f"{result.version} in {escape(str(result.folder))} ({len(result.files)} files verified, "
        f'{result.seconds:.1f}s); ask it with [bold]kpack query {result.pack} "question"[/]'
    )


def cmd_validate(args: argparse.Namespace) -> int:
    import json

    from kpack.archive import validate

    with console.status("checking"):
        report = validate(args.target)
    if args.json:
        print(
            json.dumps(
                {
                    "subject": report.subject,
                    "ok": report.ok,
                    "pack": report.pack,
                    "version": report.version,
                    "checks": [vars(c) for c in report.checks],
                },
                indent=2,
            )
        )
        return 0 if report.ok else 1
    table = Table(title=escape(report.subject), show_edge=False)
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for check in report.checks:
        table.add_row(
            check.name, "[green]ok[/]" if check.ok else "[red]FAILED[/]", escape(check.detail)
        )
    console.print(table)
    console.print("[green]valid[/]" if report.ok else "[red]not valid[/]")
    return 0 if report.ok else 1


def _add_serving_commands(sub: argparse._SubParsersAction) -> None:
    """serve, mcp, export, install, validate: packs where people work, and packs that travel."""
    serve = sub.add_parser("serve", help="the HTTP API over published packs (FastAPI)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (loopback default)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--token", help="require this bearer token (default: the KPACK_API_TOKEN variable)"
    )
    serve.add_argument(
        "--no-warmup", action="store_true", help="start without loading packs and models first"
    )
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(run=cmd_serve)
    sub.add_parser("mcp", help="the MCP server for Claude Code (stdio)").set_defaults(run=cmd_mcp)
    export = sub.add_parser("export", help="write the published version to one .kpack archive")
    export.add_argument("name")
    export.add_argument("-o", "--output", help="the archive to write (default: NAME-vN.kpack)")
    export.set_defaults(run=cmd_export)
    inst = sub.add_parser("install", help="verify and install a .kpack archive (file or URL)")
    inst.add_argument("source", help="a .kpack file or an http(s) URL of one")
    inst.add_argument("--as", dest="as_name", metavar="NAME", help="install under this name")
    inst.add_argument(
        "--replace",
        action="store_true",
        help="publish it as the next version of an existing pack of that name",
    )
    inst.set_defaults(run=cmd_install)
    check = sub.add_parser("validate", help="check a pack or a .kpack archive without installing")
    check.add_argument("target", help="a pack name, a .kpack file or an http(s) URL")
    check.add_argument("--json", action="store_true")
    check.set_defaults(run=cmd_validate)


def cmd_push(args: argparse.Namespace) -> int:
    from kpack.remote import push, storage_path

    with console.status(f"uploading {args.name} to {storage_path()}"):
        pointer = push(args.name)
    return _report(
        f"pushed {pointer['pack']} version {pointer['version']} to "
        f"{escape(str(storage_path()))} ({pointer['bytes'] / 2**20:.1f} MiB); "
        f"other machines get it with [bold]kpack pull {pointer['pack']}[/]"
    )


def cmd_pull(args: argparse.Namespace) -> int:
    from kpack.remote import pull, storage_path

    with console.status(f"downloading {args.name} from {storage_path()}"):
        result = pull(args.name)
    if not result.downloaded:
        return _report(
            f"{result.pack} is already at the shared store's version "
            f"(v{result.source_version}, local version {result.version})"
        )
    return _report(
        f"pulled {result.pack} v{result.source_version} ({result.bytes / 2**20:.1f} MiB, "
        f"verified) as local version {result.version}"
    )


def _add_store_commands(sub: argparse._SubParsersAction) -> None:
    """push, pull: published packs in the shared store (KPACK_STORAGE, see kpack.remote)."""
    push = sub.add_parser("push", help="upload the published version to the shared store")
    push.add_argument("name")
    push.set_defaults(run=cmd_push)
    pull = sub.add_parser("pull", help="install the shared store's version of a pack here")
    pull.add_argument("name")
    pull.set_defaults(run=cmd_pull)


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
    build.add_argument("--verbose", action="store_true", help="show Dagster's log and stack traces")
    build.add_argument(
        "--log-level", help="Dagster log level on the console (with --verbose: INFO)"
    )
    build.add_argument(
        "--force", action="store_true", help="publish a new version even if nothing changed"
    )
    build.add_argument(
        "--dry-run",
        action="store_true",
        help="print the sections Claude would extract and the estimated tokens and dollars",
    )
    build.set_defaults(run=cmd_build)
    sub.add_parser("list", help="packs and their manifest figures").set_defaults(run=cmd_list)
    search = sub.add_parser("search", help="ranked passages for a question")
    search.add_argument("name")
    search.add_argument("question")
    search.add_argument("--k", type=int, default=5)
    search.add_argument("--json", action="store_true")
    search.add_argument("--profile", choices=PROFILE_NAMES)
    search.set_defaults(run=cmd_search)
    ask = sub.add_parser("query", help="answer a question from a pack, with citations")
    ask.add_argument("name")
    ask.add_argument("question")
    ask.add_argument("--profile", choices=PROFILE_NAMES)
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
    ev.add_argument(
        "--write-config",
        action="store_true",
        help="store the best gate threshold and graph settings in kg_config.json",
    )
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
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0: all)")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(run=cmd_ui)
    _add_serving_commands(sub)
    _add_store_commands(sub)
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


def run() -> None:
    """The ``kpack`` console script: :func:`main` in a process of its own."""
    code = main()
    # Python's last garbage collections at exit walk every object of the ~3,000 modules that
    # Dagster loads: 0.5 s, an eighth of a no-change rebuild. Frozen objects are skipped;
    # atexit handlers, flushing and module clean-up still run. Not in main(): a process that
    # calls it (the tests) lives on, and frozen objects are never collected.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
