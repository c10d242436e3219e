"""The code location `dagster dev` (workspace.yaml) and `kpack build` load."""

import os
from pathlib import Path

from dagster import Definitions, load_asset_checks_from_modules, load_assets_from_modules

from assets import chunk, embed, evaluate, extract, fetch, graph, manifest, pagerank, parse
from kpack import settings
from pipelines.jobs import build_pack_job
from pipelines.outcomes import build_failure_sensor, build_outcome_sensor
from pipelines.schedules import pack_refresh_schedule
from pipelines.sensors import pack_sources_sensor
from resources.embedder import EmbedderResource
from resources.fetcher import FetcherResource
from resources.llm import claude_resource
from resources.pack_store import PackStore
from resources.storage import (
    ContentCacheResource,
    IntermediatesResource,
    PartitionedParquetIOManager,
    StagedBuildIOManager,
)

STAGE_MODULES = (fetch, parse, chunk, extract, embed, pagerank, graph, manifest)
EVALUATION_MODULES = (evaluate,)


def make_resources(packs_dir: Path, storage: str) -> dict:
    """The resources of one deployment; tests pass their own folders."""
    return {
        "io_manager": PartitionedParquetIOManager(base_path=storage),
        "staged_build_io_manager": StagedBuildIOManager(base_path=storage),
        "content_cache": ContentCacheResource(base_path=storage),
        "intermediates": IntermediatesResource(base_path=storage),
        "pack_store": PackStore(packs_dir=str(packs_dir)),
        "fetcher": FetcherResource(),
        "embedder": EmbedderResource(),
        "claude": claude_resource(dict(os.environ)),
    }


def make_definitions(packs_dir: Path, storage: str, resource_overrides: dict | None = None):
    """Everything Dagster knows of this project, over the given folders."""
    return Definitions(
        assets=[
            *load_assets_from_modules(STAGE_MODULES),
            *load_assets_from_modules(EVALUATION_MODULES),
        ],
        asset_checks=[
            *load_asset_checks_from_modules(STAGE_MODULES),
            *load_asset_checks_from_modules(EVALUATION_MODULES),
        ],
        jobs=[build_pack_job],
        sensors=[pack_sources_sensor, build_outcome_sensor, build_failure_sensor],
        schedules=[pack_refresh_schedule],
        resources={**make_resources(packs_dir, storage), **(resource_overrides or {})},
    )


defs = make_definitions(settings.packs_dir(), settings.storage_base())
