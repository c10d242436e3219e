"""Live progress of a build run for `kpack build`: one row per stage (state, rows, seconds);
a step that says how far it is (the embedding steps: texts embedded of all, seconds left)
shows it on its row.

The build runs in this process; a watcher thread reads the run's events from the Dagster
instance (the same event log the UI shows) and renders them: a live table in a terminal, one
plain line per finished stage when the output is piped. While the run executes, Dagster points
file descriptors 1 and 2 at the run's compute-log files, so the progress writes to a copy of
the console's descriptor taken before the run starts.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dagster import DagsterEventType, DagsterInstance, RunsFilter
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kpack.ingest.shards import PROGRESS_KEY

# Materialization metadata that says how many rows a stage produced, most specific first.
ROW_KEYS = ("dagster/row_count", "rows", "texts", "articles", "urls", "count_Chunk")


@dataclass
class StageProgress:
    name: str
    state: str = "running"
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    rows: int | None = None
    reported: bool = False  # piped output: its line was printed
    progress: str | None = None  # how far a running step is, in words (kpack.ingest.shards)


class BuildProgress:
    """Follows one run (found by its tag) until ``stop`` is called."""

    def __init__(
        self, instance: DagsterInstance, tag: tuple[str, str], console: Console, live: bool
    ) -> None:
        # The build's own instance: a second DagsterInstance.get() racing the build's first
        # one on a new DAGSTER_HOME would run the storage migrations twice.
        self.instance, self.tag, self.live = instance, tag, live
        self.console = _outside_capture(console)
        self.stages: dict[str, StageProgress] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> BuildProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        self.console.file.close()

    def _follow(self) -> None:
        instance = self.instance
        wanted = {
            DagsterEventType.STEP_START,
            DagsterEventType.STEP_SUCCESS,
            DagsterEventType.STEP_FAILURE,
            DagsterEventType.STEP_SKIPPED,
            DagsterEventType.ASSET_MATERIALIZATION,
            DagsterEventType.ASSET_OBSERVATION,
        }
        run_id, cursor = None, None
        render: Callable[[], None] = self._print_finished
        live = None
        if self.live:
            live = Live(self._table(), console=self.console, refresh_per_second=4)
            live.start()
            render = lambda: live.update(self._table())  # noqa: E731
        try:
            while True:
                finished = self._done.wait(0.25)
                if run_id is None:
                    runs = instance.get_runs(RunsFilter(tags={self.tag[0]: self.tag[1]}), limit=1)
                    run_id = runs[0].run_id if runs else None
                if run_id is not None:
                    connection = instance.get_records_for_run(run_id, cursor, of_type=wanted)
                    cursor = connection.cursor
                    for record in connection.records:
                        self._apply(record.event_log_entry.dagster_event)
                    render()
                if finished:
                    break
        finally:
            if live is not None:
                live.stop()

    def _apply(self, event) -> None:
        if event is None or not event.step_key:
            return
        step = event.step_key
        kind = event.event_type
        if kind == DagsterEventType.STEP_START:
            self.stages[step] = StageProgress(step)
            return
        stage = self.stages.setdefault(step, StageProgress(step))
        if kind == DagsterEventType.ASSET_OBSERVATION:
            said = event.asset_observation_data.asset_observation.metadata.get(PROGRESS_KEY)
            if said is not None:
                stage.progress = str(said.value)
                if not self.live:  # a log: each word of progress is a line
                    self.console.print(f"{step}  {stage.progress}", highlight=False)
            return
        if kind == DagsterEventType.ASSET_MATERIALIZATION:
            metadata = event.step_materialization_data.materialization.metadata
            for key in ROW_KEYS:
                if key in metadata and isinstance(getattr(metadata[key], "value", None), int):
                    stage.rows = (stage.rows or 0) + metadata[key].value
                    break
            return
        stage.state = {
            DagsterEventType.STEP_SUCCESS: "done",
            DagsterEventType.STEP_FAILURE: "failed",
            DagsterEventType.STEP_SKIPPED: "skipped",
        }[kind]
        stage.seconds = time.monotonic() - stage.started

    def _table(self) -> Table | Text:
        if not self.stages:
            return Text("starting the build ...", style="dim")
        table = Table(show_edge=False, title="building")
        for column in ("stage", "state", "rows", "seconds"):
            table.add_column(column, justify="left" if column in ("stage", "state") else "right")
        for stage in self.stages.values():
            seconds = (
                stage.seconds if stage.seconds is not None else time.monotonic() - stage.started
            )
            style = {"failed": "red", "running": "yellow"}.get(stage.state, "")
            state = stage.state
            if state == "running" and stage.progress:
                state = f"running: {stage.progress}"
            table.add_row(
                stage.name,
                Text(state, style=style),
                "" if stage.rows is None else f"{stage.rows:,}",
                f"{seconds:.1f}",
            )
        return table

    def _print_finished(self) -> None:
        for stage in self.stages.values():
            if stage.state != "running" and not stage.reported:
                rows = "" if stage.rows is None else f"  {stage.rows:,} rows"
                self.console.print(
                    f"{stage.name}  {stage.state}  {stage.seconds:.1f}s{rows}", highlight=False
                )
                stage.reported = True


def _outside_capture(console: Console) -> Console:
    """``console`` on a copy of its file descriptor, with its size and colours as they are now
    (the terminal cannot be asked while the descriptors point at log files)."""
    stream = os.fdopen(os.dup(console.file.fileno()), "w", encoding="utf-8")
    return Console(
        file=stream,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]
        width=console.width,
        height=console.height,
    )
