"""The build_pack job: every build of a pack, whoever starts it, is a run of this job."""

from dagster import AssetSelection, ExecutorDefinition, define_asset_job, in_process_executor
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from assets.partitions import packs_partitions

JOB_NAME = "build_pack"
BUILD_GROUPS = ("ingest", "parse", "extract", "embed", "graph", "publish")


def build_job(
    name: str, executor: ExecutorDefinition, description: str, tags: dict[str, str] | None = None
) -> UnresolvedAssetJobDefinition:
    """Every stage of one pack's build, run by ``executor``; ``tags`` go on every run."""
    return define_asset_job(
        name,
        selection=AssetSelection.groups(*BUILD_GROUPS),
        partitions_def=packs_partitions,
        executor_def=executor,
        description=description,
        tags=tags,
    )


# In one process by default: each stage is seconds of work, and a process per step (Dagster's
# multiprocess default) made a no-change rebuild from the UI 5x slower than `kpack build`.
# A distributed executor is opt-in configuration (pipelines.executors, docs/deployment.md).
build_pack_job = build_job(
    JOB_NAME, in_process_executor, "Fetch, parse, extract, embed, load and publish one pack."
)
