"""The build_pack job: every build of a pack, whoever starts it, is a run of this job."""

from dagster import AssetSelection, define_asset_job, in_process_executor

from assets.partitions import packs_partitions

JOB_NAME = "build_pack"
BUILD_GROUPS = ("ingest", "parse", "extract", "embed", "graph", "publish")

# In one process by default: each stage is seconds of work, and a process per step (Dagster's
# multiprocess default) made a no-change rebuild from the UI 5x slower than `kpack build`.
# A distributed executor is opt-in configuration (docs/deployment.md).
build_pack_job = define_asset_job(
    JOB_NAME,
    selection=AssetSelection.groups(*BUILD_GROUPS),
    partitions_def=packs_partitions,
    executor_def=in_process_executor,
    description="Fetch, parse, extract, embed, load and publish one pack.",
)
