"""Packs are partitions: one per folder of the packs directory that holds a urls.txt.

The set is dynamic: the pack_sources sensor (and ``kpack build``) add new folders, so a new
pack needs no code change.
"""

from dagster import AutomationCondition, DynamicPartitionsDefinition

packs_partitions = DynamicPartitionsDefinition(name="packs")

# Downstream stages follow their inputs when the automation daemon runs (dagster dev).
follow_upstream = AutomationCondition.eager()
