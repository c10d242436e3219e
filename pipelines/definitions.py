"""The code location `dagster dev` (workspace.yaml) and `kpack build` load."""

from pathlib import Path

from dagster import (
    AssetSelection,
    Definitions,
    define_asset_job,
    load_asset_checks_from_modules,
    load_assets_from_modules,
)

from assets import chunk, embed, evaluate, extract, fetch, graph, manifest, pagerank, parse
from assets.partitions import packs_partitions
from kpack import settings
from pipelines.schedules import pack_refresh_schedule
from pipelines.sensors import pack_sources_sensor
from resources.embedder import EmbedderResource
from resources.fetcher import FetcherResource
from resources.llm import ClaudeResource
from resources.pack_store import PackStore
from resources.storage import (
    ContentCacheResource,
    IntermediatesResource,
    PartitionedParquetIOManager,
)

STAGE_MODULES = (fetch, parse, chunk, extract, embed, pagerank, graph, manifest)
EVALUATION_MODULES = (evaluate,)

build_pack_job = define_asset_job(
    "build_pack",
    selection=AssetSelection.groups("ingest", "parse", "extract", "embed", "graph", "publish"),
    partitions_def=packs_partitions,
    description="Fetch, parse, extract, embed, load and publish one pack.",
)


def make_resources(packs_dir: Path, storage: str) -> dict:
    """The resources of one deployment; tests pass their own folders."""
    return {
        "io_manager": PartitionedParquetIOManager(base_path=storage),
        "content_cache": ContentCacheResource(base_path=storage),
        "intermediates": IntermediatesResource(base_path=storage),
        "pack_store": PackStore(packs_dir=str(packs_dir)),
        "fetcher": FetcherResource(),
        "embedder": EmbedderResource(),
        "claude": ClaudeResource(),
    }


# kpack build materializes exactly these; evaluation runs on its own (it may call the LLM).
build_assets = load_assets_from_modules(STAGE_MODULES)
build_checks = load_asset_checks_from_modules(STAGE_MODULES)

defs = Definitions(
    assets=[*build_assets, *load_assets_from_modules(EVALUATION_MODULES)],
    asset_checks=[*build_checks, *load_asset_checks_from_modules(EVALUATION_MODULES)],
    jobs=[build_pack_job],
    sensors=[pack_sources_sensor],
    schedules=[pack_refresh_schedule],
    resources=make_resources(settings.packs_dir(), settings.storage_base()),
)
