"""serve, mcp, export, install, validate: packs where people work (HTTP, MCP), and packs that
travel as one verified .kpack archive."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from cli.output import console, err, report
from kpack import settings
from kpack.errors import PackError
from kpack.packs import is_loopback


def cmd_serve(args: argparse.Namespace) -> int:
    from serving.runner import serve

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
        header_timeout=args.header_timeout,
        max_connections=args.max_connections,
        allowed_hosts=args.allow_host,
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
    return report(
        f"exported {result.pack} version {result.version} to {escape(str(result.path))} "
        f"({result.bytes / 2**20:.1f} MiB, {len(result.files)} files with their SHA-256 in "
        f"{ARCHIVE_MANIFEST}); install it elsewhere with [bold]kpack install "
        f"{escape(result.path.name)}[/]"
    )


def cmd_install(args: argparse.Namespace) -> int:
    from kpack.archive import install

    with console.status("verifying checksums, the database and the embedding model"):
        result = install(
            args.source, name=args.as_name, replace=args.replace, trust_config=args.trust_config
        )
    if result.dropped:
        from kpack.archive.policy import dropped_note

        err.print(f"[yellow]note:[/] {escape(dropped_note(result.dropped))}")
    return report(
        f"installed {result.source_pack} v{result.source_version} as {result.pack} version "
        f"{result.version} in {escape(str(result.folder))} ({len(result.files)} files verified, "
        f'{result.seconds:.1f}s); ask it with [bold]kpack query {result.pack} "question"[/]'
    )


def cmd_validate(args: argparse.Namespace) -> int:
    from kpack.archive import validate

    with console.status("checking"):
        result = validate(args.target)
    if args.json:
        print(
            json.dumps(
                {
                    "subject": result.subject,
                    "ok": result.ok,
                    "pack": result.pack,
                    "version": result.version,
                    "checks": [vars(c) for c in result.checks],
                },
                indent=2,
            )
        )
        return 0 if result.ok else 1
    table = Table(title=escape(result.subject), show_edge=False)
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for check in result.checks:
        table.add_row(
            check.name, "[green]ok[/]" if check.ok else "[red]FAILED[/]", escape(check.detail)
        )
    console.print(table)
    console.print("[green]valid[/]" if result.ok else "[red]not valid[/]")
    return 0 if result.ok else 1


def add_commands(sub: argparse._SubParsersAction) -> None:
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
    serve.add_argument(
        "--header-timeout",
        type=float,
        metavar="SECONDS",
        help="answer 408 and close a connection that sends no complete request headers within "
        "this time (default: serving.connections.HEADER_TIMEOUT_S, 10)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="connections open at once; beyond, the one waiting longest for its headers is "
        "dropped (default: half the open-file limit, at most 1024)",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host is NAME (repeatable; '*.example.com' for a "
        "domain, '*' for any). By default only loopback names and the --host address are "
        "answered: a web page cannot reach the packs through DNS rebinding",
    )
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
    inst.add_argument(
        "--trust-config",
        action="store_true",
        help="keep the archive's fetch.file_roots and fetch.allow_private_hosts (by default a "
        "rebuild of an installed pack reads no file outside it and no private address)",
    )
    inst.set_defaults(run=cmd_install)
    check = sub.add_parser("validate", help="check a pack or a .kpack archive without installing")
    check.add_argument("target", help="a pack name, a .kpack file or an http(s) URL")
    check.add_argument("--json", action="store_true")
    check.set_defaults(run=cmd_validate)
