"""push, pull: published packs in the shared store (KPACK_STORAGE, see kpack.remote)."""

from __future__ import annotations

import argparse

from rich.markup import escape

from cli.output import console, report


def cmd_push(args: argparse.Namespace) -> int:
    from kpack.remote import push, storage_path

    with console.status(f"uploading {args.name} to {storage_path()}"):
        pointer = push(args.name)
    return report(
        f"pushed {pointer['pack']} version {pointer['version']} to "
        f"{escape(str(storage_path()))} ({pointer['bytes'] / 2**20:.1f} MiB); "
        f"other machines get it with [bold]kpack pull {pointer['pack']}[/]"
    )


def cmd_pull(args: argparse.Namespace) -> int:
    from kpack.remote import pull, storage_path

    with console.status(f"downloading {args.name} from {storage_path()}"):
        result = pull(args.name)
    if not result.downloaded:
        return report(
            f"{result.pack} is already at the shared store's version "
            f"(v{result.source_version}, local version {result.version})"
        )
    return report(
        f"pulled {result.pack} v{result.source_version} ({result.bytes / 2**20:.1f} MiB, "
        f"verified) as local version {result.version}"
    )


def add_commands(sub: argparse._SubParsersAction) -> None:
    push = sub.add_parser("push", help="upload the published version to the shared store")
    push.add_argument("name")
    push.set_defaults(run=cmd_push)
    pull = sub.add_parser("pull", help="install the shared store's version of a pack here")
    pull.add_argument("name")
    pull.set_defaults(run=cmd_pull)
