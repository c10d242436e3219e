"""Building a pack in-process: the same asset graph the Dagster UI runs, no daemon needed.

A build ends in one of three outcomes: ``published`` (a new version), ``unchanged`` (nothing
changed since the published version, so nothing was published; see assets.graph) or
``failed`` (the published version, if any, is untouched). The outcome of the latest build is
kept in ``.versions/last_build.json`` for ``kpack status``.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from dagster import DagsterInstance, materialize

from assets.partitions import packs_partitions
from kpack import settings
from kpack.config import load_config
from kpack.packs import PackError, pack_dir, parse_urls, read_manifest
from kpack.store import PackStore
from pipelines.definitions import build_assets, build_checks, make_resources

BUILD_TAG = "kpack/build_id"


@dataclass
class BuildResult:
    pack: str
    run_id: str
    success: bool
    manifest: dict | None
    failed_steps: list[str] = field(default_factory=list)
    failed_checks: list[str] = field(default_factory=list)
    outcome: str = "failed"  # published | unchanged | failed
    # This run's materialization metadata by asset (e.g. stage_metadata["embeddings"]["embedded"])
    stage_metadata: dict[str, dict] = field(default_factory=dict)

    @property
    def published(self) -> bool:
        return self.outcome == "published"


@contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """One build of a pack at a time: a second one fails fast instead of racing the first."""
    with open(folder / ".build.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise PackError(f"pack {folder.name!r} is already being built") from exc
        yield


def build_running(folder: Path) -> bool:
    """Whether a build of the pack holds its lock right now (probed without waiting)."""
    lock = folder / ".build.lock"
    if not lock.exists():
        return False
    with open(lock) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def build_pack(
    pack: str,
    packs_dir: Path | None = None,
    storage: str | None = None,
    instance: DagsterInstance | None = None,
    build_id: str | None = None,
    log_level: str = "INFO",
    resource_overrides: dict | None = None,
    force: bool = False,
) -> BuildResult:
    """Materialize every stage for one pack. Raises PackError only when nothing can be built.

    ``force`` publishes a new version even when nothing changed since the current one.
    """
    quiet_env()
    packs_dir = packs_dir or settings.packs_dir()
    folder = pack_dir(pack, packs_dir)
    sources, problems = parse_urls((folder / "urls.txt").read_text(), folder)
    if not sources:
        detail = "; ".join(str(p) for p in problems) or "the file is empty"
        raise PackError(f"pack {pack!r} has no valid URL in urls.txt ({detail})")
    load_config(folder)  # a malformed kg_config.json stops here, before anything runs
    if instance is None:
        settings.dagster_home()
        instance = DagsterInstance.get()
    if not instance.has_dynamic_partition(packs_partitions.name, pack):
        instance.add_dynamic_partitions(packs_partitions.name, [pack])
    build_id = build_id or uuid.uuid4().hex
    with build_lock(folder):
        result = materialize(
            [*build_assets, *build_checks],
            partition_key=pack,
            instance=instance,
            resources={
                **make_resources(packs_dir, storage or settings.storage_base()),
                **(resource_overrides or {}),
            },
            tags={BUILD_TAG: build_id},
            run_config={
                "loggers": {"console": {"config": {"log_level": log_level}}},
                "ops": {"pack_graph": {"config": {"force_publish": force}}},
            },
            raise_on_error=False,
        )
        failed_steps = [e.step_key for e in result.all_events if e.is_step_failure and e.step_key]
        failed_checks = [c.check_name for c in result.get_asset_check_evaluations() if not c.passed]
        stage_metadata = {
            event.asset_key.path[-1]: {
                k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()
            }
            for event in result.get_asset_materialization_events()
        }
        success = result.success and not failed_checks
        outcome = (
            "failed"
            if not success
            else "published"
            if "pack_manifest" in stage_metadata
            else "unchanged"
        )
        if outcome == "failed":
            _record_failure(folder, pack, result.run_id, failed_steps, failed_checks)
    return BuildResult(
        pack=pack,
        run_id=result.run_id,
        success=success,
        manifest=read_manifest(folder),
        failed_steps=failed_steps,
        failed_checks=failed_checks,
        outcome=outcome,
        stage_metadata=stage_metadata,
    )


def _record_failure(
    folder: Path, pack: str, run_id: str, failed_steps: list[str], failed_checks: list[str]
) -> None:
    """Record a failed build for ``kpack status`` (the published version is untouched)."""

    current = read_manifest(folder)
    PackStore(packs_dir=str(folder.parent)).record_build(
        pack,
        {
            "outcome": "failed",
            "version": current["version"] if current else None,
            "checked_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "run_id": run_id,
            "failed_steps": failed_steps,
            "failed_checks": failed_checks,
        },
    )


def quiet_env() -> None:
    """Tokenizers warn about forked worker threads once Dagster has started; they are unused.

    HF_HUB_OFFLINE is left alone: the packaged default model loads from a local path anyway,
    and a pack that names another model (BAAI/bge-base-en-v1.5) must be able to download it.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
