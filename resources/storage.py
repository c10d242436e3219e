"""Shareable storage for intermediates: a partitioned Parquet IO manager and a content cache.

Both sit on one base location (KPACK_STORAGE, see kpack.remote): a local folder, or
``s3://bucket/prefix`` (any universal_pathlib URL), so moving the intermediates off one machine
is a configuration change. The IO manager is Dagster's UPathIOManager, so every step of a run,
wherever it executes (another process, a Celery worker, a Kubernetes pod), reads and writes the
same files. A write is whole or absent: locally a temporary name renamed into place, on an
object store one upload (kpack.remote.write_atomically), so a killed step never leaves a
truncated Parquet file behind. A file damaged anyway (a full disk, a copy
cut short, bytes overwritten) is a cache miss where the file is a cache (previous fetch,
embeddings, extractions): it is recomputed, and the build goes on.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster import (
    ConfigurableIOManagerFactory,
    ConfigurableResource,
    InitResourceContext,
    InputContext,
    MarkdownMetadataValue,
    OutputContext,
    PathMetadataValue,
    UPathIOManager,
)
from upath import UPath

from kpack import contracts
from kpack.remote import storage_path, write_atomically

log = logging.getLogger(__name__)


class DamagedFile(Exception):
    """A Parquet file that exists but cannot be read."""


class ParquetStore:
    """Reads and writes Parquet files under one base location, local or remote."""

    def __init__(self, base: str | UPath):
        self.root = base if isinstance(base, UPath) else storage_path(base)

    def path(self, *parts: str) -> UPath:
        return self.root.joinpath(*parts)

    def read(self, *parts: str) -> pa.Table | None:
        """The table, or None when there is no file; DamagedFile when it cannot be read."""
        return read_parquet(self.path(*parts))

    def read_cache(self, *parts: str) -> pa.Table | None:
        """Like read, but a damaged file is a miss (logged): what it held is recomputed and
        written over it."""
        try:
            return self.read(*parts)
        except DamagedFile as exc:
            log.warning("%s; treating it as a cache miss", exc)
            return None

    def write(self, table: pa.Table, *parts: str) -> str:
        path = self.path(*parts)
        write_parquet(table, path)
        return str(path)


def read_parquet(path: UPath, columns: tuple[str, ...] | None = None) -> pa.Table | None:
    """The table at ``path`` (only ``columns``, when given), or None when there is no file;
    DamagedFile when it cannot be read."""
    try:
        with path.open("rb") as handle:
            # ParquetFile, not pq.read_table: that one imports pyarrow.dataset (~0.7 s a
            # process) to read a single file.
            return pq.ParquetFile(handle).read(columns=list(columns) if columns else None)
    except FileNotFoundError:
        return None
    except (pa.ArrowException, OSError) as exc:
        raise DamagedFile(f"{path} is damaged ({str(exc)[:200]})") from None


def write_parquet(table: pa.Table, path: UPath) -> None:
    write_atomically(path, lambda handle: pq.write_table(table, handle, compression="zstd"))


def partition_parts(asset: str, partition: str | None) -> tuple[str, str]:
    """Where an asset partition lives under the base: ``<asset>/<partition>.parquet``."""
    return asset, f"{partition or 'all'}.parquet"


def output_facts(context: OutputContext) -> dict:
    """The output's metadata values that are plain JSON (counts, durations, usage, failures):
    the stage's facts. Markdown previews and paths are for the UI only."""
    facts = {}
    for key, value in context.output_metadata.items():
        if isinstance(value, MarkdownMetadataValue | PathMetadataValue):
            continue
        plain = getattr(value, "value", value)
        try:
            json.dumps(plain)
        except TypeError:
            continue
        facts[key] = plain
    return facts


class ParquetUPathIOManager(UPathIOManager):
    """Each asset partition at ``<base>/<asset>/<partition>.parquet`` (UPathIOManager's layout).

    Outputs are conformed to the asset's declared schema (kpack.contracts) on the way in, so a
    contract violation fails the step that produced it, not the one that reads it. The output's
    metadata travels with the table as its facts (kpack.contracts.with_facts): the stages that
    read it get its counts, durations and usage with it.
    """

    extension = ".parquet"  # partitions are pack names: never a path separator or ".."

    def make_directory(self, path: UPath) -> None:
        # write_atomically makes local folders; an object store has none to make.
        pass

    def dump_to_path(self, context: OutputContext, obj: pa.Table | list[dict], path: UPath):
        # An asset declares its contract by name, or in its metadata when several assets
        # share one (the embedding shards).
        contract = (context.definition_metadata or {}).get("contract", context.asset_key.path[-1])
        table = contracts.with_facts(contracts.conform(contract, obj), output_facts(context))
        write_parquet(table, path)
        context.add_output_metadata({"rows": table.num_rows})

    def load_from_path(self, context: InputContext, path: UPath) -> pa.Table:
        try:
            table = read_parquet(path)
        except DamagedFile as exc:
            raise DamagedFile(f"{exc}: build the pack again to recompute it") from None
        if table is None:
            asset = context.asset_key.path[-1]
            raise FileNotFoundError(
                f"{path} does not exist: materialize {asset} for this pack first"
            )
        return table


class StagedBuildUPathIOManager(UPathIOManager):
    """pack_graph's record (kpack.contracts.StagedBuild) as ``<base>/pack_graph/<pack>.json``."""

    extension = ".json"

    def make_directory(self, path: UPath) -> None:
        pass  # as ParquetUPathIOManager

    def dump_to_path(self, context: OutputContext, obj: contracts.StagedBuild, path: UPath):
        text = json.dumps(asdict(obj), indent=1)
        write_atomically(path, lambda handle: handle.write(text.encode()))

    def load_from_path(self, context: InputContext, path: UPath) -> contracts.StagedBuild:
        try:
            return contracts.StagedBuild(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path} does not exist: materialize pack_graph first"
            ) from None
        except (ValueError, TypeError) as exc:  # damaged, or written by another version
            raise DamagedFile(f"{path} is damaged ({exc}): build the pack again") from None


class PartitionedParquetIOManager(ConfigurableIOManagerFactory):
    """The IO manager of every build stage, on ``base_path`` (a folder or s3://bucket/prefix)."""

    base_path: str

    def create_io_manager(self, context: InitResourceContext) -> ParquetUPathIOManager:
        return ParquetUPathIOManager(storage_path(self.base_path))


class StagedBuildIOManager(ConfigurableIOManagerFactory):
    """The IO manager of pack_graph's record, beside the intermediates on ``base_path``."""

    base_path: str

    def create_io_manager(self, context: InitResourceContext) -> StagedBuildUPathIOManager:
        return StagedBuildUPathIOManager(storage_path(self.base_path))


class IntermediatesResource(ConfigurableResource):
    """Read access to the last materialized Parquet of an asset partition, from any step.

    The IO manager only hands a step its declared inputs; a stage that compares with its own
    previous output (fetched_pages, for conditional requests) reads it here. ``base_path`` is
    the IO manager's base path, so the file is the one the IO manager wrote.
    """

    base_path: str

    def previous(self, asset: str, partition: str) -> pa.Table | None:
        """The table as last materialized, or None if this partition never was (or its file is
        damaged)."""
        return ParquetStore(self.base_path).read_cache(*partition_parts(asset, partition))


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

    def load(self, namespace: str, pack: str, columns: tuple[str, ...]) -> pa.Table | None:
        """The cached table, or None when there is none, its file is damaged or it lacks one
        of ``columns`` (written by an older version)."""
        table = self._store().read_cache(*self._parts(namespace, pack))
        if table is None or not set(columns) <= set(table.column_names):
            return None
        return table

    def save(self, namespace: str, pack: str, table: pa.Table) -> None:
        self._store().write(table, *self._parts(namespace, pack))

    def load_from_other_packs(
        self, namespace: str, pack: str, columns: tuple[str, ...], wanted: set[str]
    ) -> pa.Table | None:
        """The rows of ``wanted`` content hashes that other packs' caches of ``namespace`` hold
        (first one found wins), or None when none does. A value depends on the namespace and
        the content only, so a pack built from pages other packs already read (a combined
        pack of several libraries) reuses their results. A file's hashes are read first, its
        values only when it holds one wanted; a damaged or older file is skipped."""
        *folder, own = self._parts(namespace, pack)
        found: list[pa.Table] = []
        remaining = set(wanted)
        try:
            files = sorted(self._store().path(*folder).glob("*.parquet"))
        except OSError:
            return None
        for path in files:
            if not remaining:
                break
            if path.name == own:
                continue
            try:
                hashes = read_parquet(path, ("content_hash",))
                if hashes is None:
                    continue
                column = hashes["content_hash"]
                asked = pa.array(sorted(remaining), type=column.type)
                if not pc.any(pc.is_in(column, value_set=asked)).as_py():
                    continue
                table = read_parquet(path, columns)
            except DamagedFile as exc:
                log.warning("%s; not reused", exc)
                continue
            if table is None:
                continue
            rows = table.filter(pc.is_in(table["content_hash"], value_set=asked))
            found.append(rows)
            remaining -= set(rows["content_hash"].to_pylist())
        return pa.concat_tables(found) if found else None

    def _record_path(self, namespace: str, pack: str, name: str) -> UPath:
        *folder, file = self._parts(namespace, pack)
        return self._store().path(*folder, f"{file.removesuffix('.parquet')}.{name}.json")

    def load_record(self, namespace: str, pack: str, name: str) -> Any:
        """A small JSON record kept beside the cache (a build's batch ledger), or None when
        there is none or it is damaged (logged: a damaged record is an empty one)."""
        path = self._record_path(namespace, pack, name)
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s is damaged (%s); treating it as empty", path, str(exc)[:200])
            return None

    def save_record(self, namespace: str, pack: str, name: str, value: Any) -> None:
        """Write the record whole or not at all; an empty one is removed."""
        path = self._record_path(namespace, pack, name)
        if not value:
            path.unlink(missing_ok=True)
            return
        text = json.dumps(value, indent=1)
        write_atomically(path, lambda handle: handle.write(text.encode()))
