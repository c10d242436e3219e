"""Keeps the pack partitions in step with the packs folder.

A new folder with a urls.txt becomes a partition; once known, a change of its urls.txt or
kg_config.json starts a build of that pack. The first tick only records what is there, so
turning the sensor on never rebuilds every pack at once.
"""

import hashlib
import json

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, sensor

from assets.partitions import packs_partitions
from kpack import settings
from kpack.packs import list_packs

WATCHED_FILES = ("urls.txt", "kg_config.json")


def source_fingerprints() -> dict[str, str]:
    root = settings.packs_dir()
    fingerprints = {}
    for pack in list_packs(root):
        digest = hashlib.sha256()
        for name in WATCHED_FILES:
            path = root / pack / name
            digest.update(path.read_bytes() if path.is_file() else b"")
        fingerprints[pack] = digest.hexdigest()
    return fingerprints


@sensor(
    job_name="build_pack",
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Adds a partition per pack folder and builds a pack when its sources change.",
)
def pack_sources_sensor(context: SensorEvaluationContext) -> SensorResult:
    current = source_fingerprints()
    first_tick = context.cursor is None
    previous = json.loads(context.cursor) if context.cursor else {}
    known = set(context.instance.get_dynamic_partitions(packs_partitions.name))
    new = sorted(set(current) - known)
    changed = (
        []
        if first_tick
        else sorted(p for p in current if p in previous and previous[p] != current[p])
    )
    return SensorResult(
        run_requests=[RunRequest(partition_key=p, run_key=f"{p}:{current[p]}") for p in changed],
        dynamic_partitions_requests=[packs_partitions.build_add_request(new)] if new else [],
        cursor=json.dumps(current),
    )
