"""Knowledge Packs core: where packs live, what a pack folder holds, and the data contracts."""

from importlib import metadata

DISTRIBUTION = "knowledge-packs"  # pyproject.toml's name


def version() -> str:
    """The installed kpack's version (pyproject.toml's), "unknown" when run from a checkout
    that was never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
