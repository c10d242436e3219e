"""The packs folder as a Dagster resource: a thin shell over kpack.store."""

from __future__ import annotations

from dagster import ConfigurableResource

from kpack.store import PackStoreOps


class PackStore(ConfigurableResource, PackStoreOps):
    """Reads pack definitions and stages/publishes pack databases under ``packs_dir``."""

    packs_dir: str
