"""Building a pack in-process: the same asset graph the Dagster UI runs, no daemon needed.

Every build is a run of the ``build_pack`` job (pipelines.jobs), so CLI builds and UI builds
share one run list. A build ends in one of four outcomes: ``published`` (a new version),
``unchanged`` (nothing changed since the published version, so nothing was published; see
assets.fetch; its graph evidence is measured again when other code measured it, see
assets.evaluate), ``failed`` or ``interrupted`` (Ctrl-C; in both the published version, if any,
is untouched); pipelines.outcomes
tags the run with it and records it for ``kpack status``. The run holds the pack's build lock
itself (resources.pack_store.build_lifecycle), as a run launched from the UI does.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, Definitions
from dagster._core.execution.execution_result import ExecutionResult

from assets.fetch import FORCE_TAG
from assets.partitions import packs_partitions
from kpack import settings
from kpack.config import load_config
from kpack.packs import PackError, pack_dir, read_manifest, read_urls
from kpack.store import PackStore
from pipelines.definitions import make_definitions
from pipelines.instance import open_instance
from pipelines.jobs import JOB_NAME
from pipelines.outcomes import evidence_follows, record_outcome
from resources.pack_store import PARTITION_TAG

BUILD_TAG = "kpack/build_id"


@dataclass
class BuildResult:
    pack: str
    run_id: str
    success: bool
    manifest: dict | None
    failed_steps: list[str] = field(default_factory=list)
    failed_checks: list[str] = field(default_factory=list)
    outcome: str = "failed"  # published | unchanged | failed | interrupted
    cause: str | None = None  # why a failed build failed, in one line
    # This run's metadata by asset: of its materialization (stage_metadata["embeddings"]
    # ["embedded"]), or of its observation when the stage found nothing changed
    # (stage_metadata["fetched_pages"]["unchanged"]; see assets.partitions.observe_unchanged).
    stage_metadata: dict[str, dict] = field(default_factory=dict)
    # Seconds the run's steps took, summed by stage group (ingest, parse, embed, ...), in the
    # order the groups started: see stage_seconds.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # Why last_build.json could not be written (a full disk), if it could not.
    not_recorded: str | None = None

    def failures(self) -> list[dict]:
        """The URLs this build could not fetch (the first 200; fetched_pages' metadata)."""
        return self.stage_metadata.get("fetched_pages", {}).get("failures") or []

    @property
    def published(self) -> bool:
        return self.outcome == "published"


def build_pack(
    pack: str,
    packs_dir: Path | None = None,
    storage: str | None = None,
    instance: DagsterInstance | None = None,
    build_id: str | None = None,
    log_level: str = "INFO",
    resource_overrides: dict | None = None,
    force: bool = False,
    executor: dict | None = None,
) -> BuildResult:
    """Materialize every stage for one pack. Raises PackError only when nothing can be built
    (no valid URL, a malformed kg_config.json, a build of the pack already running).

    ``force`` (the run tag assets.fetch.FORCE_TAG) publishes a new version even when nothing
    changed since the current one.
    ``executor``: None runs every step in this process; dagster-celery's executor config
    (``{"broker": "redis://...", "backend": "redis://..."}``) runs each step on Celery workers,
    which read KPACK_PACKS_DIR and KPACK_STORAGE themselves (``storage`` and
    ``resource_overrides`` apply to in-process builds only; see pipelines.executors).
    """
    quiet_env()
    packs_dir = packs_dir or settings.packs_dir()
    folder = buildable_pack(pack, packs_dir)
    # The run takes the build lock itself (resources.pack_store.build_lifecycle); refusing here
    # gives a second build the error exit before it starts a run that could only fail.
    PackStore(packs_dir).refuse_if_building(pack)
    if instance is None:
        instance = open_instance()
    if not instance.has_dynamic_partition(packs_partitions.name, pack):
        instance.add_dynamic_partitions(packs_partitions.name, [pack])
    build_id = build_id or uuid.uuid4().hex
    definitions = make_definitions(
        packs_dir, storage or settings.storage_base(), resource_overrides
    )
    job = definitions.resolve_job_def(JOB_NAME)
    run_config = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    tags = {BUILD_TAG: build_id, FORCE_TAG: str(force).lower()}
    run_here = partial(
        job.execute_in_process,
        partition_key=pack,
        instance=instance,
        tags=tags,
        run_config=run_config,
        raise_on_error=False,
    )
    if executor is None:
        result = run_here()
    else:
        # Opt-in: every step a Celery task (pipelines.executors, docs/deployment.md).
        from pipelines.executors import execute_distributed

        result = execute_distributed(instance, executor, run_config, {**tags, PARTITION_TAG: pack})
    run = instance.get_run_by_id(result.run_id)
    summary = record_outcome(instance, run, packs_dir)
    stage_metadata = run_metadata(result)
    follows = evidence_follows(summary, folder, run)
    if follows is not None:
        # The sources are unchanged but the code that chose the graph stages is not (assets.
        # evaluate): the current version is measured again, and nothing is published.
        remeasured = run_here(asset_selection=follows.asset_selection, tags=follows.tags)
        stage_metadata.update(run_metadata(remeasured))
    return BuildResult(
        pack=pack,
        run_id=result.run_id,
        success=summary["outcome"] in ("published", "unchanged"),
        manifest=read_manifest(folder),
        failed_steps=summary.get("failed_steps", []),
        failed_checks=summary.get("failed_checks", []),
        outcome=summary["outcome"],
        cause=summary.get("cause"),
        stage_metadata=stage_metadata,
        stage_seconds=stage_seconds(instance, result.run_id, definitions),
        not_recorded=summary.get("not_recorded"),
    )


def run_metadata(result: ExecutionResult) -> dict[str, dict]:
    """The metadata of a run's assets, by asset name: an asset's materialization wins over its
    observations (an embedding shard's progress reports); an asset observed only (an unchanged
    one) keeps its observation."""
    return {
        event.asset_key.path[-1]: {k: getattr(v, "value", v) for k, v in metadata.items()}
        for event, metadata in [
            *(
                (e, e.asset_observation_data.asset_observation.metadata)
                for e in result.get_asset_observation_events()
            ),
            *((e, e.materialization.metadata) for e in result.get_asset_materialization_events()),
        ]
    }


STEP_ENDS = (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE)


def stage_seconds(instance: DagsterInstance, run_id: str, definitions: Definitions) -> dict:
    """Seconds from each step's start to its end (loading inputs and storing outputs
    included), summed by the asset group the step belongs to: the shards of ``embeddings``
    count in "embed", an asset check in its asset's group."""
    graph = definitions.resolve_asset_graph()
    group_of = {
        assets_def.node_def.name: graph.get(next(iter(keys))).group_name
        for assets_def in graph.assets_defs
        if assets_def.is_executable
        and (keys := list(assets_def.keys) or [c.asset_key for c in assets_def.check_keys])
    }
    started: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for entry in instance.all_logs(run_id, of_type={DagsterEventType.STEP_START, *STEP_ENDS}):
        step = entry.step_key
        if entry.dagster_event.event_type == DagsterEventType.STEP_START:
            started[step] = entry.timestamp
            seconds.setdefault(group_of.get(step, step), 0.0)
        elif step in started:
            group = group_of.get(step, step)
            seconds[group] += entry.timestamp - started.pop(step)
    return {group: round(value, 3) for group, value in seconds.items()}


def buildable_pack(pack: str, packs_dir: Path) -> Path:
    """The pack's folder, or PackError when nothing could be built: no valid URL in urls.txt,
    or a malformed kg_config.json (checked before anything runs)."""
    folder = pack_dir(pack, packs_dir)
    sources, problems = read_urls(folder)
    if not sources:
        detail = "; ".join(str(p) for p in problems) or "the file is empty"
        raise PackError(f"pack {pack!r} has no valid URL in urls.txt ({detail})")
    load_config(folder)
    return folder


def quiet_env() -> None:
    """Tokenizers warn about forked worker threads once Dagster has started; they are unused.

    HF_HUB_OFFLINE is left alone: the packaged default model loads from a local path anyway,
    and a pack that names another model (BAAI/bge-base-en-v1.5) must be able to download it.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
