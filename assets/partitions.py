"""Packs are partitions: one per folder of the packs directory that holds a urls.txt.

The set is dynamic: the pack_sources sensor (and ``kpack build``) add new folders, so a new
pack needs no code change.
"""

from collections.abc import Callable

from dagster import AssetChecksDefinition, AutomationCondition, DynamicPartitionsDefinition
from dagster import asset_check as dagster_asset_check

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
