"""Shareable storage for intermediates: a partitioned Parquet IO manager and a content cache.

Both take a base location that is a local folder or any URI pyarrow's filesystems accept
(``s3://bucket/prefix``, ``gs://...``), so moving the intermediates off one machine is a
configuration change. Writes go to a temporary name first and are moved into place, so a killed
step never leaves a truncated Parquet file behind.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from dagster import ConfigurableIOManager, ConfigurableResource, InputContext, OutputContext

from kpack import contracts


class ParquetStore:
    """Reads and writes Parquet files under one base location, local or remote."""

    def __init__(self, base: str):
        if "://" not in base:
            base = str(Path(base).resolve())
        self.fs, self.root = pafs.FileSystem.from_uri(base)

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type == pafs.FileType.File

    def read(self, *parts: str) -> pa.Table | None:
        if not self.exists(*parts):
            return None
        return pq.read_table(self.path(*parts), filesystem=self.fs)

    def write(self, table: pa.Table, *parts: str) -> str:
        final = self.path(*parts)
        self.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        temp = f"{final}.tmp-{uuid.uuid4().hex}"
        pq.write_table(table, temp, filesystem=self.fs, compression="zstd")
        self.fs.move(temp, final)
        return final


def partition_parts(asset: str, partition: str | None) -> tuple[str, str]:
    """Where an asset partition lives under the base: ``<asset>/<partition>.parquet``."""
    return asset, f"{partition or 'all'}.parquet"


class PartitionedParquetIOManager(ConfigurableIOManager):
    """Stores each asset partition at ``<base_path>/<asset>/<partition>.parquet``.

    Outputs are conformed to the asset's declared schema (kpack.contracts) on the way in, so a
    contract violation fails the step that produced it, not the one that reads it.
    """

    base_path: str

    def _store(self) -> ParquetStore:
        return ParquetStore(self.base_path)

    @staticmethod
    def _parts(context: OutputContext | InputContext) -> tuple[str, ...]:
        name = context.asset_key.path[-1]
        partition = context.asset_partition_key if context.has_asset_partitions else None
        return partition_parts(name, partition)

    def handle_output(self, context: OutputContext, obj: pa.Table | list[dict]) -> None:
        name, file = self._parts(context)
        table = contracts.conform(name, obj)
        path = self._store().write(table, name, file)
        context.add_output_metadata({"rows": table.num_rows, "path": path})

    def load_input(self, context: InputContext) -> pa.Table:
        parts = self._parts(context)
        table = self._store().read(*parts)
        if table is None:
            raise FileNotFoundError(
                f"{'/'.join(parts)} is not in {self.base_path}: materialize "
                f"{parts[0]} for this pack first"
            )
        return table


class IntermediatesResource(ConfigurableResource):
    """Read access to the last materialized Parquet of an asset partition, from any step.

    The IO manager only hands a step its declared inputs; a stage that compares with its own
    previous output (fetched_pages, for conditional requests) reads it here. ``base_path`` is
    the IO manager's base path, so the file is the one the IO manager wrote.
    """

    base_path: str

    def previous(self, asset: str, partition: str) -> pa.Table | None:
        """The table as last materialized, or None if this partition never was."""
        return ParquetStore(self.base_path).read(*partition_parts(asset, partition))


class ContentCacheResource(ConfigurableResource):
    """Results keyed by content hash that survive across builds (embeddings, LLM extractions).

    A namespace names what produced the values (model, prompt version), so a change of model
    never serves stale results. One file per (namespace, pack) keeps writes single-writer.
    """

    base_path: str

    def _store(self) -> ParquetStore:
        return ParquetStore(self.base_path)

    @staticmethod
    def _parts(namespace: str, pack: str) -> tuple[str, ...]:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in namespace)
        return "_cache", safe, f"{pack}.parquet"

    def load(self, namespace: str, pack: str) -> pa.Table | None:
        return self._store().read(*self._parts(namespace, pack))

    def save(self, namespace: str, pack: str, table: pa.Table) -> None:
        self._store().write(table, *self._parts(namespace, pack))
