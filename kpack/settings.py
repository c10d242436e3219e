"""Where things live on disk. Every location can be overridden by an environment variable."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def packs_dir() -> Path:
    """The folder holding one sub-folder per pack (KPACK_PACKS_DIR, else ./packs of the project)."""
    return Path(os.environ.get("KPACK_PACKS_DIR", PROJECT_ROOT / "packs")).resolve()


def _beside_packs(name: str) -> Path:
    """``name`` in the folder that holds the packs folder: beside KPACK_PACKS_DIR when it is
    set (a packs folder elsewhere brings its storage and run history along), else in the
    project."""
    if "KPACK_PACKS_DIR" in os.environ:
        return packs_dir().parent / name
    return PROJECT_ROOT / name


def storage_base() -> str:
    """Base location of the Parquet intermediates and caches (KPACK_STORAGE, else
    ``.kpack_storage`` beside the packs folder).

    A local folder by default; any URI pyarrow's filesystems understand (s3://bucket/prefix,
    gs://...) works too, so the intermediates can move to shared storage unchanged.
    """
    return os.environ.get("KPACK_STORAGE", str(_beside_packs(".kpack_storage")))


def dagster_home() -> Path:
    """The Dagster instance the CLI and `dagster dev` share, so CLI builds show up in the UI
    (created with its dagster.yaml by pipelines.instance.ensure_dagster_home)."""
    home = Path(os.environ.get("DAGSTER_HOME", _beside_packs(".dagster_home"))).resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def model_cache_dir() -> Path:
    """Where derived models (the int8 export of an embedding model, kpack.quantized) are kept
    per machine: KPACK_MODEL_CACHE, else kpack/models under the user's cache folder
    ($XDG_CACHE_HOME, else ~/.cache). Local on purpose: a model is exported for the machine
    that runs it, and KPACK_STORAGE may be an object store."""
    configured = os.environ.get("KPACK_MODEL_CACHE")
    if configured:
        return Path(configured).expanduser().resolve()
    user_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(user_cache, "kpack", "models").resolve()
