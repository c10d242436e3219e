"""Embedding in shards: which shard embeds a text, and one shard's vectors.

The texts of a pack (kpack.ingest.vectors.distinct_texts) are split by content-hash range into
a fixed number of shards, each embedded by its own build step, so a distributed executor
(Celery, Kubernetes) runs them on as many workers; the in-process executor runs them one after
the other. A text's shard depends on its hash alone, so an unchanged text stays in its shard
and keeps its cached vector from build to build.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kpack.contracts import PARQUET_SCHEMAS
from kpack.errors import PackError
from kpack.ingest.vectors import embedding_column

SHARDS_VARIABLE = "KPACK_EMBED_SHARDS"
# One step in one process: shards only pay off on a cluster (docs/deployment.md).
DEFAULT_SHARDS = 1
MAX_SHARDS = 64


def shard_count() -> int:
    """How many embedding steps a build has (KPACK_EMBED_SHARDS, default 1).

    Read once when the asset graph is defined; every process of one deployment (the webserver,
    the daemon, each worker) must see the same value.
    """
    text = os.environ.get(SHARDS_VARIABLE, str(DEFAULT_SHARDS))
    if not text.isdigit() or not 1 <= int(text) <= MAX_SHARDS:
        raise PackError(
            f"{SHARDS_VARIABLE} must be a whole number from 1 to {MAX_SHARDS}: {text!r}"
        )
    return int(text)


def shard_of(content_hash: str, shards: int) -> int:
    """The shard of a text: its SHA-256 hex digest's leading 32 bits, cut into equal ranges."""
    return int(content_hash[:8], 16) * shards >> 32


@dataclass
class ShardResult:
    table: pa.Table  # the embedding_shard rows: content_hash, embedding, fresh
    embedded: int
    cached: int
    seconds: float  # spent in the model


@dataclass(frozen=True)
class EmbedProgress:
    """How far a shard's encoding is: texts encoded of those to encode, and the seconds left
    at the rate so far."""

    done: int
    total: int
    seconds: float

    @property
    def seconds_left(self) -> float:
        return self.seconds / self.done * (self.total - self.done) if self.done else 0.0

    def words(self) -> str:
        left = f", about {self.seconds_left:.0f} s left" if self.done < self.total else ""
        return f"{self.done:,} of {self.total:,} texts embedded{left}"


# The metadata key of a step's observation that says how far it is, in words (assets.embed
# records it, pipelines.progress shows it on the step's row).
PROGRESS_KEY = "kpack/progress"
# Texts encoded per call: a whole number of the model's batches (kpack.embedding sizes them),
# so progress can be told between calls at no cost in throughput.
ENCODE_SLICE = 1024


def embed_shard(
    texts: dict[str, str],
    cached: pa.Table | None,
    encode: Callable[[list[str]], np.ndarray],
    on_progress: Callable[[EmbedProgress], object] | None = None,
) -> ShardResult:
    """Vectors for ``texts`` (content hash -> text): the cached ones reused, the rest encoded,
    ENCODE_SLICE at a time; ``on_progress`` hears after each slice how far it is.

    ``encode`` is called only when a text is missing from the cache, so a shard served from
    the cache never loads the model.
    """
    schema = PARQUET_SCHEMAS["embedding_shard"]
    known: dict[str, int] = {}
    if cached is not None:
        known = {h: i for i, h in enumerate(cached["content_hash"].to_pylist()) if h in texts}
    missing = [h for h in texts if h not in known]
    parts = []
    if known:
        reused = cached.take(pa.array(list(known.values()))).select(["content_hash", "embedding"])
        parts.append(reused.append_column("fresh", pa.repeat(False, reused.num_rows)))
    seconds = 0.0
    if missing:
        started = time.perf_counter()
        pieces = []
        for start in range(0, len(missing), ENCODE_SLICE):
            pieces.append(encode([texts[h] for h in missing[start : start + ENCODE_SLICE]]))
            if on_progress is not None:
                done = min(start + ENCODE_SLICE, len(missing))
                on_progress(EmbedProgress(done, len(missing), time.perf_counter() - started))
        vectors = np.concatenate(pieces)
        seconds = time.perf_counter() - started
        parts.append(
            pa.table(
                {
                    "content_hash": missing,
                    "embedding": embedding_column(vectors),
                    "fresh": pa.repeat(True, len(missing)),
                }
            )
        )
    table = pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()
    return ShardResult(table, len(missing), len(known), seconds)
