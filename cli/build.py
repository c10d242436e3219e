"""new, build, list, status, rollback, ui: a pack's life on this machine.

Dagster and the pipelines load inside the commands that run them, so ``kpack --help`` and
``kpack list`` start without them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from functools import partial
from pathlib import Path

from rich import box
from rich.markup import escape
from rich.table import Table

from cli.output import console, err, print_skipped, report
from kpack import settings
from kpack.config import pack_description, setting_json
from kpack.errors import PackError
from kpack.packs import (
    WEB,
    folders_outside,
    list_packs,
    new_pack_folder,
    pack_dir,
    private_hosts,
    read_manifest,
    read_urls_text,
    sources_location,
    time_ago,
    write_urls,
)


def cmd_new(args: argparse.Namespace) -> int:
    folder = new_pack_folder(args.name)
    lines = list(args.url or [])
    if args.urls_file:
        lines += read_urls_text(Path(args.urls_file)).splitlines()
    if not lines:
        raise PackError("give at least one --url or a --urls-file")
    sources, problems = write_urls(folder, lines)
    given = len(args.url or [])
    # A problem's line number counts the --url values first: name what the user typed.
    print_skipped(
        f"--url {p.line!r}: {p.reason}"
        if p.line_no <= given
        else f"{args.urls_file} line {p.line_no - given}: {p.reason}: {p.line!r}"
        for p in problems
    )
    if not sources:
        raise PackError("none of the URLs is valid; nothing was created")
    private = private_hosts(sources)
    if private:
        err.print(
            f"[yellow]warning:[/] {escape(', '.join(private))}: not a public host, so a build "
            "refuses its pages unless the pack's kg_config.json allows private hosts: "
            f"{escape(setting_json('fetch.allow_private_hosts', True))}",
            soft_wrap=True,
        )
    from kpack.store import PackStore

    store = PackStore(packs_dir=str(folder.parent))
    outside = folders_outside(sources, store.file_roots(folder.name))
    if outside:
        # The folders as the setting writes them: the default roots, then the user's folders.
        roots = [*store.config(folder.name).fetch.file_roots, *outside]
        err.print(
            f"[yellow]warning:[/] {escape(', '.join(outside))}: outside the folders a build "
            "reads files from, so a build refuses those files unless the pack's "
            f"kg_config.json lists them: {escape(setting_json('fetch.file_roots', roots))}",
            soft_wrap=True,
        )
    console.print(
        f"created {folder / 'urls.txt'} with {len(sources)} URLs; build it with "
        f"[bold]kpack build {folder.name}[/]"
    )
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    if args.dry_run:  # pipelines.dry_run: fetches and estimates, sends and publishes nothing
        from pipelines.dry_run import dry_run

        return report(escape(dry_run(args.name).report()))
    from pipelines.build import BUILD_TAG, build_pack
    from pipelines.instance import MIRROR_ENV, open_instance, storage_errors
    from pipelines.progress import BuildProgress

    if args.verbose:  # the steps' own output on the terminal too, as Dagster prints it
        os.environ[MIRROR_ENV] = "1"
    build_id = uuid.uuid4().hex
    started = time.perf_counter()
    # Dagster's own console log only with --verbose: by default the progress rows and one
    # line of cause say what happened, with no stack traces.
    log_level = args.log_level or ("INFO" if args.verbose else "CRITICAL")
    instance = open_instance()
    build = partial(
        build_pack,
        args.name,
        instance=instance,
        build_id=build_id,
        log_level=log_level,
        force=args.force,
    )
    with storage_errors():
        if args.no_progress:
            result = build()
        else:
            with BuildProgress(instance, (BUILD_TAG, build_id), console, live=console.is_terminal):
                result = build()
    elapsed = time.perf_counter() - started
    manifest = result.manifest
    if result.not_recorded:
        err.print(f"[yellow]warning:[/] {escape(result.not_recorded)}", soft_wrap=True)
    if result.outcome == "interrupted":  # recorded for `kpack status`; main() says the rest
        raise KeyboardInterrupt
    if not result.success:
        kept = f"v{manifest['version']:04d} stays current" if manifest else "nothing is published"
        err.print(
            f"[red]build of {escape(args.name)} failed:[/] {escape(result.cause or 'unknown cause')}"
            f"\n{kept}; details: `kpack build {escape(args.name)} --verbose` or run "
            f"{result.run_id} in `kpack ui`",
            highlight=False,
        )
        failed = result.stage_metadata.get("fetched_pages", {}).get("failed", 0)
        _print_failures(result.failures(), failed, said=result.cause or "")
        return 1
    if result.outcome == "unchanged":
        evidence = result.stage_metadata.get("graph_evidence")
        chosen_again = (
            f"; the graph stages it runs were chosen again by this version of kpack: "
            f"{evidence['chosen']}"
            if evidence
            else ""
        )
        return report(
            f"{args.name}: nothing changed since v{manifest['version']:04d}, so nothing was "
            f"published{chosen_again} ({elapsed:.1f}s; `kpack build {args.name} --force` "
            "publishes anyway)"
        )
    _print_summary(manifest, result.stage_seconds, elapsed)
    capped = result.stage_metadata.get("fetched_pages", {}).get("crawl_capped") or 0
    if capped:
        limit = manifest["config"]["crawl"]["max_pages"]
        console.print(
            f"[yellow]the crawl stopped at crawl.max_pages ({limit:,} pages)[/]: {capped:,} "
            "more pages in scope were left out; to take them, raise it in kg_config.json: "
            f"{escape(setting_json('crawl.max_pages', limit * 2))}",
            highlight=False,
        )
    return 0


def _print_summary(manifest: dict, stage_seconds: dict[str, float], elapsed: float) -> None:
    counts, sources = manifest["counts"], manifest["sources"]
    table = Table(title=f"{manifest['name']} v{manifest['version']} published", show_edge=False)
    # At 80 columns: a label never wraps, a long value folds inside its own column.
    table.add_column("what", no_wrap=True)
    table.add_column("value", justify="right", overflow="fold")
    table.add_row("pages ok / failed", f"{sources['ok']} / {sources['failed']}")
    pages = sources.get("pages")
    if pages:  # what the crawl found, and why pages were left out
        table.add_row("pages found / kept", f"{pages['found']} / {pages['kept']}")
        skipped = pages["skipped"]
        table.add_row(
            "skipped 404 / excluded / stub / duplicate",
            f"{skipped['not_found']} / {skipped['excluded']} / {skipped['redirect_stubs']}"
            f" / {skipped['duplicates']}",
        )
        table.add_row("capped by crawl.max_pages", str(pages["capped"]))
    if "changes" in manifest:
        table.add_row(CHANGES_LABEL, _changes_text(manifest))
        table.add_row(NOT_MODIFIED_LABEL, str(manifest["changes"]["not_modified"]))
    for key in ("Article", "Section", "Chunk", "Entity", "Fact", "LINKS_TO", "ENTITY_RELATION"):
        table.add_row(key, str(counts[key]))
    model = manifest["embedding"]["model"].rsplit("/", 1)[-1]  # the hub's owner is in status
    table.add_row("embedding", f"{model} ({manifest['embedding']['dimension']}d)")
    table.add_row("extraction", manifest["extraction"]["method"])
    # Every step's time in its stage group (the embedding shards in "embed"); "other" is the
    # rest of the wall time (start-up, Dagster between steps), so the rows add up to the total.
    for stage, seconds in stage_seconds.items():
        table.add_row(f"  {stage} s", f"{seconds:.1f}")
    table.add_row(
        "  other (start-up, Dagster) s", f"{max(elapsed - sum(stage_seconds.values()), 0):.1f}"
    )
    table.add_row("total s", f"{elapsed:.1f}")
    console.print(table)
    _print_changed_pages(manifest.get("changes") or {})
    _print_failures(sources["failures"], sources["failed"])
    print_skipped(sources["invalid_lines"])


LISTED_CHANGES = 10  # pages named per kind of change; manifest.json's "changes" has them all


def _print_changed_pages(changes: dict) -> None:
    """The pages a build found new, changed or removed, by URL, one a line (a URL is never
    broken: a terminal makes a link of it only in one piece); a first build's pages are all
    new and are not listed."""
    first_build = not changes.get("changed") and not changes.get("unchanged")
    for kind in ("new", "changed", "removed"):
        urls = changes.get(f"{kind}_urls") or []
        if not urls or (kind == "new" and first_build):
            continue
        console.print(f"{kind} pages ({len(urls)}):", highlight=False)
        for url in urls[:LISTED_CHANGES]:
            console.print(f"  {url}", markup=False, highlight=False, soft_wrap=True)
        if len(urls) > LISTED_CHANGES:
            console.print(f"  ... and {len(urls) - LISTED_CHANGES} more (manifest.json: changes)")


LISTED_FAILURES = 20
CHANGES_LABEL = "pages new / changed / unchanged / removed"
# A separate count, not a fourth kind of page: a page that is new to the published version can
# still have answered 304 to the conditional request its last (unpublished) fetch allowed.
NOT_MODIFIED_LABEL = "pages answered 304 Not Modified"


def _print_failures(failures: list[dict], failed: int, said: str = "") -> None:
    """The URLs a build could not fetch on stderr, the first LISTED_FAILURES of them, then how
    many more (``failed`` in all). URLs that failed alike (their error with its address and
    host left out) are one line of error, then the lines and URLs it names; an error the
    message above already ``said`` is not repeated."""
    shown = failures[:LISTED_FAILURES]
    groups: dict[str, list[dict]] = {}
    for failure in shown:
        groups.setdefault(_error_kind(failure["error"]), []).append(failure)
    for alike in groups.values():
        if len(alike) == 1:
            [failure] = alike
            if failure["error"] in said:
                err.print(f"[yellow]failed[/] line {failure['line']}: {escape(failure['url'])}")
                continue
            err.print(
                f"[yellow]failed[/] line {failure['line']}: "
                + escape(f"{failure['url']}: {failure['error']}"),
                soft_wrap=True,
            )
            continue
        error = alike[0]["error"]
        why = "the error above" if error in said else escape(error)
        err.print(f"[yellow]failed[/] {len(alike)} URLs: {why}", soft_wrap=True)
        for failure in alike:
            err.print(f"  line {failure['line']}: {escape(failure['url'])}", soft_wrap=True)
    more = max(failed, len(failures)) - min(len(failures), LISTED_FAILURES)
    if more > 0:
        err.print(f"[yellow]failed[/] ... and {more} more (`kpack ui`: fetched_pages' metadata)")


# What differs between the same error of two URLs: a quoted host or path, an address, a number.
ERROR_DETAILS = re.compile(r"'[^']*'|\b\d[\w.:]*|\[[0-9a-f:]+\]", re.IGNORECASE)


def _error_kind(error: str) -> str:
    return ERROR_DETAILS.sub("_", error)


def _graph_text(graph: dict) -> str:
    """Which graph stages run and why: the evidence's line, and the settings that override it."""
    overridden = ", ".join(
        f"{t}={v} set in kg_config.json" for t, v in graph["set_in_config"].items()
    )
    return graph["why"] + (f"; {overridden} wins" if overridden else "")


def _changes_text(manifest: dict) -> str:
    c = manifest.get("changes")
    if not c:
        return "-"
    return f"{c['new']} / {c['changed']} / {c['unchanged']} / {c['removed']}"


def cmd_list(args: argparse.Namespace) -> int:
    root = settings.packs_dir()
    # Fits 80 columns: no rules between the columns, figures that never wrap, and the age of
    # the build for its time (`kpack status` gives the time).
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("pack", overflow="fold")
    table.add_column("version", no_wrap=True)
    names = list_packs(root)
    manifests = {name: read_manifest(root / name) for name in names}
    # The documentation's own release (kpack.ingest.doc_version), when some pack's names one.
    releases = {name: (m or {}).get("documentation_version") or "" for name, m in manifests.items()}
    if any(releases.values()):
        table.add_column("docs", overflow="fold", max_width=8)
    table.add_column("built")
    for column in ("articles", "sections", "chunks", "failed"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("sources", no_wrap=True)
    fetched_from_the_web = False
    descriptions: list[tuple[str, str]] = []
    for name in names:
        sources = sources_location(root / name) or "?"
        fetched_from_the_web |= sources == WEB
        manifest = manifests[name]
        docs = [releases[name]] if any(releases.values()) else []
        description = pack_description(root / name, manifest)
        if description:
            descriptions.append((name, description))
        if manifest is None:
            table.add_row(name, "-", *docs, "never built", "", "", "", "", sources)
            continue
        counts = manifest["counts"]
        table.add_row(
            name,
            f"v{manifest['version']:04d}",
            *docs,
            time_ago(manifest["built_at"]),
            str(counts["Article"]),
            str(counts["Section"]),
            str(counts["Chunk"]),
            str(manifest["sources"]["failed"]),
            sources,
        )
    console.print(table)
    for name, description in descriptions:  # kg_config.json's description of each pack
        console.print(f"[bold]{escape(name)}[/]: {escape(description)}", highlight=False)
    if fetched_from_the_web:
        console.print(f"[dim]{WEB}: building the pack fetches its pages from the internet[/]")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from pipelines.status import pack_status

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
        lines.append((CHANGES_LABEL, _changes_text({"changes": status["changes"]})))
        if status["changes"]:
            lines.append((NOT_MODIFIED_LABEL, str(status["changes"]["not_modified"])))
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
        lines.append(("graph", _graph_text(status["graph"])))
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
        lines.append(("last build", f"{time_ago(last['checked_at'])}: {_last_build_text(last)}"))
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
    _print_changed_pages(status["changes"] or {})
    _print_failures(status["failures"], len(status["failures"]))
    return 0


def _last_build_text(last: dict) -> str:
    """One line for last_build.json; a failed first build has no version to name."""
    version = last.get("version")
    label = f"v{version:04d}" if isinstance(version, int) else None
    if last["outcome"] == "published":
        detail = f"published {label}"
    elif last["outcome"] == "unchanged":
        detail = f"nothing changed since {label}, nothing published"
    elif last["outcome"] == "killed":
        kept = f"{label} is published" if label else "nothing is published yet"
        detail = f"its process died before it finished ({kept})"
    elif last["outcome"] == "interrupted":
        detail = f"interrupted ({label} is still published)" if label else "interrupted"
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
    from kpack.store import PackStore, version_number

    folder = pack_dir(args.name)
    old, new = PackStore(packs_dir=str(folder.parent)).rollback(folder.name)
    console.print(
        f"{folder.name}: rolled back from {old.name} to {new.name}; version "
        f"{version_number(new)} is now current ({old.name} stays on disk until the next build "
        "publishes; that build starts from the current sources again)"
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
    return run_process_group(command)


# Seconds `dagster dev` has to stop its webserver, daemon and code server after kpack ui is
# told to stop; what of its process group still runs then is killed. Not longer: the
# webserver waits for a browser's open connections (the UI keeps one), so a stop that waited
# for it took 20 s, and a service manager or a user waits on it.
UI_STOP_GRACE_S = 5.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_process_group(command: list[str]) -> int:
    """Run ``command`` (``dagster dev``) as the leader of a process group of its own, and end
    the whole group with this process. Ctrl-C, SIGTERM and SIGHUP (a closed terminal) are
    passed on to the leader (``dagster dev`` stops its webserver and daemon on SIGINT or
    SIGTERM); whatever of the group runs UI_STOP_GRACE_S later, or after the leader exited,
    is killed, so nothing is left holding the port. Its exit status, or 0 when it stopped
    because it was asked to."""
    leader = subprocess.Popen(
        command, cwd=settings.PROJECT_ROOT, env=os.environ.copy(), process_group=0
    )
    stop_requested: list[float] = []

    def pass_on(signum: int, _frame: object) -> None:
        stop_requested.append(time.monotonic())
        with contextlib.suppress(ProcessLookupError):
            leader.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    previous = {signum: signal.signal(signum, pass_on) for signum in STOP_SIGNALS}
    said_stopping = False
    try:
        while True:
            try:
                code = leader.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if stop_requested and not said_stopping:
                    err.print(f"stopping the Dagster UI (at most {UI_STOP_GRACE_S:g} s) ...")
                    said_stopping = True
                if stop_requested and time.monotonic() - stop_requested[0] > UI_STOP_GRACE_S:
                    _kill_group(leader.pid)
    finally:
        _kill_group(leader.pid)  # the leader's children it left behind
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if stop_requested:
        err.print("the Dagster UI has stopped (its webserver and daemon with it)")
    return 0 if stop_requested else code


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def add_commands(sub: argparse._SubParsersAction) -> None:
    new = sub.add_parser(
        "new",
        help="create packs/NAME/urls.txt",
        description="Create packs/NAME/urls.txt from the URLs given; `kpack build NAME` builds "
        "it. A URL line may be a page, a sitemap, a seed to crawl ('URL depth=2') or a local "
        "file ('file:docs/guide.md'); see docs/building-packs.md.",
    )
    new.add_argument(
        "name", help="the pack's name: letters, digits, '-' and '_' (its folder under packs/)"
    )
    new.add_argument(
        "--url",
        action="append",
        help="a page, sitemap or seed URL ('URL depth=N' crawls N links deep); repeat it",
    )
    new.add_argument(
        "--urls-file", help="a text file of URLs, one URL a line ('#' starts a comment)"
    )
    new.set_defaults(run=cmd_new)
    build = sub.add_parser("build", help="build (or rebuild) a pack in-process")
    build.add_argument("name")
    build.add_argument(
        "--no-progress", action="store_true", help="no progress rows (a log, CI): the summary only"
    )
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
    status = sub.add_parser(
        "status", help="freshness, last build, what changed, failures, schedule of a pack"
    )
    status.add_argument("name")
    status.add_argument("--json", action="store_true", help="the status as JSON")
    status.set_defaults(run=cmd_status)
    rollback = sub.add_parser("rollback", help="make the previous kept version current again")
    rollback.add_argument("name")
    rollback.set_defaults(run=cmd_rollback)
    ui = sub.add_parser("ui", help="start the Dagster UI (dagster dev)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0: all)")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(run=cmd_ui)
