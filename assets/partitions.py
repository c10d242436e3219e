"""Packs are partitions: one per folder of the packs directory that holds a urls.txt.

The set is dynamic: the pack_sources sensor (and ``kpack build``) add new folders, so a new
pack needs no code change. Also here: what every stage of a pack's build shares (the
automation condition, per-pack checks, the "unchanged" observation).
"""

import logging
from collections.abc import Callable

from dagster import (
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetObservation,
    AutomationCondition,
    DynamicPartitionsDefinition,
    MetadataValue,
)
from dagster import asset_check as dagster_asset_check

MAX_LISTED_FAILURES = 200
# The stages that record "unchanged" instead of their output (see observe_unchanged).
UNCHANGED_STAGES = ("fetched_pages", "pack_graph")

packs_partitions = DynamicPartitionsDefinition(name="packs")

# Downstream stages follow their inputs when the automation daemon runs (dagster dev).
follow_upstream = AutomationCondition.eager()


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
    changes: dict,
    failures: list[dict],
    **details: object,
) -> None:
    """Record that this build changed nothing since ``version`` (pipelines.outcomes reads it):
    the stage emits this observation instead of its output, so the stages after it are skipped.
    ``details``: the fingerprints compared, and what else the stage knows."""
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
        )
    )
    context.log.info(f"{context.partition_key}: nothing changed since version {version}")


class _NothingToGateFilter(logging.Filter):
    """Drops Dagster's warning that a blocking check of an UNCHANGED_STAGES asset "emitted no
    result": when the stage records "unchanged", its checks and every stage after it are
    skipped, so nothing goes ungated; the warning would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "emitted no result" not in message or not any(
            f"'{stage}:" in message for stage in UNCHANGED_STAGES
        )


logging.getLogger("dagster._core.execution.plan.active").addFilter(_NothingToGateFilter())
