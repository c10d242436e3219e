"""Packs are partitions: one per folder of the packs directory that holds a urls.txt.

The set is dynamic: the pack_sources sensor (and ``kpack build``) add new folders, so a new
pack needs no code change. Also here: what every stage of a pack's build shares (the code
version, the automation condition, per-pack checks, the "unchanged" observation).
"""

import logging
from collections.abc import Callable

from dagster import (
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetObservation,
    AssetOut,
    AutomationCondition,
    DataVersion,
    DynamicPartitionsDefinition,
    MetadataValue,
    asset,
)
from dagster import asset_check as dagster_asset_check

# Dagster reads an event's data version from these tags (it sets them on materializations; an
# observation of a materializable asset has no public parameter for them).
from dagster._core.definitions.data_version import (
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
)

import assets
import kpack
import resources
from kpack.changes import code_digest

MAX_LISTED_FAILURES = 200
# The stage that records "unchanged" instead of its output (see observe_unchanged).
UNCHANGED_STAGE = "fetched_pages"
# The code version of every build stage: the digest of the code a build runs. A new one makes
# the Dagster UI mark the stages stale ("has a new code version"), and it is part of the sources
# fingerprint (kpack.changes), so the next build runs every stage and publishes.
BUILD_CODE_VERSION = code_digest(kpack, assets, resources)

packs_partitions = DynamicPartitionsDefinition(name="packs")

# Downstream stages follow their inputs when the automation daemon runs (dagster dev).
follow_upstream = AutomationCondition.eager()


def build_stage(**spec: object) -> Callable:
    """``@asset`` for a stage of a pack's build: one partition per pack, versioned with the
    build code and following its inputs; ``spec`` adds the stage's own arguments (group,
    description, ...). The first stage passes ``automation_condition=None``: nothing is
    upstream of it; a stage that runs more code than the build's passes its own
    ``code_version``."""
    defaults = {"automation_condition": follow_upstream, "code_version": BUILD_CODE_VERSION}
    return asset(partitions_def=packs_partitions, **{**defaults, **spec})


def stage_outputs(descriptions: dict[str, str]) -> dict[str, AssetOut]:
    """The ``outs`` of a multi-asset build stage: one per name, described, versioned and
    following upstream like every :func:`build_stage`."""
    return {
        name: AssetOut(
            description=description,
            code_version=BUILD_CODE_VERSION,
            automation_condition=follow_upstream,
        )
        for name, description in descriptions.items()
    }


def pack_check(
    asset: object, description: str, blocking: bool = False
) -> Callable[[Callable], AssetChecksDefinition]:
    """An asset check of one pack's partition of ``asset`` (every check here is per pack);
    ``blocking``: a failure stops the assets downstream, so nothing broken is published."""
    return dagster_asset_check(
        asset=asset, partitions_def=packs_partitions, blocking=blocking, description=description
    )


def observe_unchanged(
    context: AssetExecutionContext,
    version: int,
    data_version: DataVersion,
    changes: dict,
    failures: list[dict],
    **details: object,
) -> None:
    """Record that this build changed nothing since ``version`` (pipelines.outcomes reads it):
    the stage emits this observation, with the ``data_version`` of its last materialization,
    instead of its output, so the stages after it are skipped and stay fresh in the UI.
    ``details``: what else the stage knows."""
    context.log_event(
        AssetObservation(
            asset_key=context.asset_key,
            partition=context.partition_key,
            metadata={
                "unchanged": True,
                "current_version": version,
                "changes": MetadataValue.json(changes),
                "failures": MetadataValue.json(failures[:MAX_LISTED_FAILURES]),
                "outcome": f"unchanged since v{version:04d}",
                **details,
            },
            tags={DATA_VERSION_TAG: data_version.value, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"},
        )
    )
    context.log.info(f"{context.partition_key}: nothing changed since version {version}")


class _NothingToGateFilter(logging.Filter):
    """Drops Dagster's warning that a blocking check of the UNCHANGED_STAGE "emitted no
    result": when the stage records "unchanged", its checks and every stage after it are
    skipped, so nothing goes ungated; the warning would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "emitted no result" not in message or f"'{UNCHANGED_STAGE}:" not in message


logging.getLogger("dagster._core.execution.plan.active").addFilter(_NothingToGateFilter())
