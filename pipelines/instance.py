"""The Dagster instance every build, `kpack ui` and the Celery workers share.

Dagster's SQLite event log opens a new connection for every event and closes it after one
commit. A build writes a few hundred events (each log line, input load and output is one), and
on this kind of disk one open-commit-close costs about 7 ms: over half of a no-change rebuild.
:class:`PooledSqliteEventLogStorage` keeps a connection per database open instead and writes in
WAL mode with ``synchronous=NORMAL``, where a commit costs about 0.05 ms and a crashed process
cannot corrupt the file (an OS crash may lose the last events, never the database). It reads
and writes the same files as Dagster's own class, so a DAGSTER_HOME stays readable by any
Dagster tool.

A step's stdout and stderr go to the run's log files the UI shows (:class:`StepOutputLogs`),
not also to the terminal: Dagster's own manager mirrors them there through a ``tail`` and a
Python watcher process per step, whose output would land in the middle of ``kpack build``'s
progress table, and which print a traceback of their own on Ctrl-C. ``kpack build --verbose``
mirrors them as Dagster does (:data:`MIRROR_ENV`).

``ensure_dagster_home`` writes a ``dagster.yaml`` that selects both, and a run queue checked
every second that starts one run of a pack at a time, unless the user wrote their own
(Postgres, say), which is left as it is.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import DagsterInstance
from dagster._core.execution.compute_logs import redirect_to_file
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SqliteEventLogStorage,
    SqliteEventLogStorageWatchdog,
)
from dagster._core.storage.local_compute_log_manager import (
    IO_TYPE_EXTENSION,
    LocalComputeLogManager,
)
from dagster._core.storage.sql import create_engine
from dagster._core.storage.tags import PARTITION_NAME_TAG
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import QueuePool
from watchdog.observers import Observer

from kpack import settings
from kpack.errors import SPACE_MARGIN_BYTES, PackError

# What settings.dagster_home() wrote before this module existed: safe to upgrade.
PLAIN_CONFIG = "telemetry:\n  enabled: false\n"
WRITTEN_BY_KPACK = "# Written by kpack (pipelines/instance.py)."
CONFIG_TEMPLATE = f"""\
{WRITTEN_BY_KPACK} Replace it with your own to use another storage.
telemetry:
  enabled: false
# No "Join the Dagster community" pop-up over the UI of every fresh instance.
nux:
  enabled: false
# Debug lines are not stored: the IO manager alone writes two per asset ("Writing file at
# ...", "Loading file from ..."), and each is a row in the event log, a quarter of a build's.
python_logs:
  python_log_level: INFO
event_log_storage:
  module: pipelines.instance
  class: PooledSqliteEventLogStorage
  config:
    base_dir: {{base_dir}}
compute_logs:
  module: pipelines.instance
  class: StepOutputLogs
  config:
    base_dir: {{logs_dir}}
# Runs launched from the UI, the sensor or the schedule wait in the daemon's queue: looking
# every second instead of every 5 keeps a UI build within seconds of `kpack build`. One run
# per pack at a time ({PARTITION_NAME_TAG}: the pack): a build the sensor requests while a
# Materialize click or `kpack build` builds the same pack waits for it instead of failing on
# the pack's build lock.
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
    tag_concurrency_limits:
      - key: {PARTITION_NAME_TAG}
        value:
          applyLimitPerUniqueValue: true
        limit: 1
"""
# Open databases kept per process: the index and the few runs in flight; older runs' are closed.
MAX_OPEN_SHARDS = 8
BUSY_TIMEOUT_S = 15


def ensure_dagster_home(home: Path | None = None) -> Path:
    """Create ``home`` with kpack's dagster.yaml unless the user wrote their own (one that an
    older kpack wrote is brought up to date). By default
    ``home`` is settings.dagster_home(), which then becomes DAGSTER_HOME for
    ``DagsterInstance.get()``."""
    if home is None:
        home = settings.dagster_home()
        os.environ["DAGSTER_HOME"] = str(home)
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    wanted = kpack_config(home)
    written = config.read_text() if config.exists() else None
    if (
        written is None
        or written == PLAIN_CONFIG
        or (written.startswith(WRITTEN_BY_KPACK) and written != wanted)
    ):
        config.write_text(wanted)
    return home


def open_instance() -> DagsterInstance:
    """The instance of settings.dagster_home() (see ensure_dagster_home), opened under
    :func:`storage_errors`."""
    ensure_dagster_home()
    with storage_errors():
        return DagsterInstance.get()


@contextmanager
def storage_errors() -> Iterator[None]:
    """A failure of the instance's SQLite storage in the block as one PackError line. On a
    full disk SQLite cannot even open its files ("disk I/O error"), so where the packs, the
    storage and DAGSTER_HOME share a full disk, this is what a command meets first."""
    try:
        yield
    except DBAPIError as exc:
        home = Path(os.environ.get("DAGSTER_HOME") or settings.dagster_home())
        free = shutil.disk_usage(home).free
        problem = f"Dagster's storage in {home} failed: {exc.orig}"
        if free < SPACE_MARGIN_BYTES:
            problem += f"; its disk is full ({free:,} bytes free): free some space and try again"
        raise PackError(problem) from None


# Set (to "1") by `kpack build --verbose`: steps' output is mirrored to the terminal too.
MIRROR_ENV = "KPACK_MIRROR_STEP_OUTPUT"


class StepOutputLogs(LocalComputeLogManager):
    """Dagster's local compute-log manager, writing a step's output to its log files only
    (see the module doc); the files and the UI's view of them are Dagster's own."""

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> StepOutputLogs:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator[CapturedLogContext]:
        if os.environ.get(MIRROR_ENV) == "1":
            with super().capture_logs(log_key) as context:
                yield context
            return
        out = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        err = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        for path in (out, err):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        with redirect_to_file(sys.stdout, out), redirect_to_file(sys.stderr, err):
            yield CapturedLogContext(log_key)
        Path(self.complete_artifact_path(log_key)).touch()  # the UI: capture is complete


def kpack_config(home: Path) -> str:
    """The dagster.yaml kpack writes in ``home``."""
    return CONFIG_TEMPLATE.format(base_dir=home / "history" / "runs", logs_dir=home / "storage")


def _wal(dbapi_connection: object, _record: object) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()


class _WalWatchdog(SqliteEventLogStorageWatchdog):
    """Dagster's run-log watcher, also woken by the WAL file, where new events now land first
    (the UI's live run view would otherwise wait for a checkpoint)."""

    def __init__(self, storage: SqliteEventLogStorage, run_id: str, *args: Any, **kw: Any):
        super().__init__(storage, run_id, *args, **kw)
        self._patterns = [self._log_path, self._log_path + "-wal"]

    def on_modified(self, event: Any) -> None:
        self._process_log()


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """SqliteEventLogStorage with one open connection per database (see the module doc)."""

    def __init__(self, base_dir: str, inst_data: Any = None) -> None:
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        super().__init__(base_dir, inst_data)

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> PooledSqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    def _engine(self, shard: str) -> Engine:
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        engine = create_engine(
            self.conn_string_for_shard(shard),
            poolclass=QueuePool,
            pool_size=1,
            max_overflow=4,
            # Connections move between threads (the UI's watcher), one at a time under _db_lock.
            connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        )
        event.listen(engine, "connect", _wal)
        if shard not in self._initialized_dbs:
            self._initdb(engine)
            self._initialized_dbs.add(shard)
        self._engines[shard] = engine
        while len(self._engines) > MAX_OPEN_SHARDS:
            self._engines.popitem(last=False)[1].dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock, self._engine(shard).connect() as conn, conn.begin():
            yield conn

    def _dispose_engines(self) -> None:
        while self._engines:
            self._engines.popitem()[1].dispose()

    def wipe(self) -> None:
        with self._db_lock:
            self._dispose_engines()  # their files are about to be deleted
        super().wipe()

    def watch(self, run_id: str, cursor: str | None, callback: Any) -> None:
        if not self._obs:
            self._obs = Observer()
            self._obs.start()
        watchdog = _WalWatchdog(self, run_id, callback, cursor)
        self._watchers[run_id][callback] = (
            watchdog,
            self._obs.schedule(watchdog, self._base_dir, recursive=True),
        )

    def dispose(self) -> None:
        with self._db_lock:
            self._dispose_engines()
        super().dispose()
