"""Keeps the pack partitions in step with the packs folder.

A new folder with a urls.txt becomes a partition (one whose pages are on the web once it has
been built: :func:`builds_here`), and the partition of a deleted folder is removed. Once known, a change of the URLs in its urls.txt (an edited comment is none) or of a
build setting in kg_config.json starts a build of that pack; a change of ``schedule`` or of the
``query`` settings does not (they change when a pack is rebuilt or how it is queried, not what
it holds). The first tick only records
what is there, so turning the sensor on never rebuilds every pack at once.
"""

import hashlib
import json
from pathlib import Path

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, sensor

from assets.partitions import packs_partitions
from kpack import settings
from kpack.config import CONFIG_FILE, load_config
from kpack.errors import PackError
from kpack.packs import WEB, current_version, list_packs, read_urls, sources_location
from pipelines.jobs import build_pack_job


def source_fingerprints() -> dict[str, str]:
    """Per pack, a hash of what a build reads: the URLs of urls.txt (not its comments, blank
    lines or line numbers) and the build settings."""
    root = settings.packs_dir()
    fingerprints = {}
    for pack in list_packs(root):
        folder = root / pack
        try:
            sources = [(source.url, source.depth) for source in read_urls(folder)[0]]
            digest = hashlib.sha256(json.dumps(sources).encode())
        except PackError:  # not UTF-8: fixing it starts a build, which reads it again
            digest = hashlib.sha256((folder / "urls.txt").read_bytes())
        try:
            build_settings = load_config(folder).build_settings()
            digest.update(json.dumps(build_settings, sort_keys=True).encode())
        except PackError:
            # An invalid kg_config.json: hash its bytes, so fixing it starts a build (which
            # then reports the problem, or succeeds).
            digest.update((folder / CONFIG_FILE).read_bytes())
        fingerprints[pack] = digest.hexdigest()
    return fingerprints


def builds_here(folder: Path) -> bool:
    """Whether the pack becomes a partition now: one whose pages are on the web only once it
    has been built (`kpack build` adds its partition). "Materialize all" in the UI builds
    every partition, and on a machine without internet the web-only example packs of a fresh
    clone would only fail."""
    return sources_location(folder) != WEB or current_version(folder) is not None


@sensor(
    job=build_pack_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Adds a partition per pack folder, removes deleted ones, and builds a pack "
    "when its urls.txt or build settings change.",
)
def pack_sources_sensor(context: SensorEvaluationContext) -> SensorResult:
    current = source_fingerprints()
    first_tick = context.cursor is None
    previous = json.loads(context.cursor) if context.cursor else {}
    known = set(context.instance.get_dynamic_partitions(packs_partitions.name))
    root = settings.packs_dir()
    new = sorted(p for p in set(current) - known if builds_here(root / p))
    deleted = sorted(known - set(current))
    changed = (
        []
        if first_tick
        else sorted(p for p in current if p in previous and previous[p] != current[p])
    )
    requests = []
    if new:
        requests.append(packs_partitions.build_add_request(new))
    if deleted:
        requests.append(packs_partitions.build_delete_request(deleted))
    return SensorResult(
        run_requests=[RunRequest(partition_key=p, run_key=f"{p}:{current[p]}") for p in changed],
        dynamic_partitions_requests=requests,
        cursor=json.dumps(current),
    )
