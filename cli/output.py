"""The consoles every command group prints to, and a command's closing line."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console()
err = Console(stderr=True)


def report(message: str) -> int:
    """A command's closing line, and its exit status 0. ``message`` is Rich markup (paths in
    it escaped); numbers and paths are not colour-highlighted."""
    console.print(message, highlight=False)
    return 0


def print_skipped(problems: list) -> None:
    """The input lines a command skipped (LineProblems or strings), one warning each."""
    for problem in problems:
        err.print(f"[yellow]skipped[/] {escape(str(problem))}")
