"""kpack: create, build, list, query and evaluate knowledge packs, and open the Dagster UI."""

from __future__ import annotations

import argparse
import gc
import os
import sys

from rich.markup import escape

import cli.build
import cli.eval
import cli.query
import cli.serve
import cli.store
from cli.output import err
from kpack.errors import PackError

INTERRUPTED = 130  # the shell's status for a command stopped by SIGINT

# Each group adds its commands to the parser; `kpack --help` lists them in this order.
COMMAND_GROUPS = (cli.build, cli.query, cli.eval, cli.serve, cli.store)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="kpack", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_commands(sub)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except PackError as exc:
        # soft_wrap: the terminal wraps a long message; Rich would break a path inside it
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted; the published pack is unchanged")
        return INTERRUPTED


def run() -> None:
    """The ``kpack`` console script: :func:`main` in a process of its own."""
    code = main()
    if code == INTERRUPTED:
        # Exit now: a fetch or an LLM call in flight on a worker thread would otherwise hold
        # the exit until its own timeout. Nothing of the build is left to write.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    # Python's last garbage collections at exit walk every object of the ~3,000 modules that
    # Dagster loads: 0.5 s, an eighth of a no-change rebuild. Frozen objects are skipped;
    # atexit handlers, flushing and module clean-up still run. Not in main(): a process that
    # calls it (the tests) lives on, and frozen objects are never collected.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
