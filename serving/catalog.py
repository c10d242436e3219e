"""What the HTTP API and the MCP server both say about packs, and what they accept.

The limits of a question and the profile names are retrieval's and the core's, not copies:
a question is checked by retrieval.query.clean_question (with the CLI's messages), ``k`` is
bounded by retrieval.query.MAX_SERVED_K, and a profile is one of kpack.config.PROFILE_NAMES,
the names kg_config.json and the CLI accept.

Everything here reads the published version through its ``current`` link, resolved once per
call, so the manifest and skill.md of one answer always belong to one version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from kpack import settings
from kpack.config import PROFILE_NAMES, pack_description
from kpack.packs import (
    WEB,
    PackError,
    current_version,
    list_packs,
    sources_location,
    validate_pack_name,
)
from retrieval.multipack import is_several, pack_names

# Every profile, as a type the request models and tool signatures check (and the OpenAPI
# schema lists); Literal takes the tuple's names as its values.
ProfileName = Literal[PROFILE_NAMES]


# Passages a search returns when the client names no k: a few to read, more to fill a budget
# of tokens from (the budget, not k, then decides how many come back).
DEFAULT_K = 5
DEFAULT_BUDGET_K = 20


def served_k(k: int | None, tokens: int | None) -> int:
    """The k of a served search: the client's, else DEFAULT_K, or DEFAULT_BUDGET_K with a
    token budget."""
    if k is not None:
        return k
    return DEFAULT_K if tokens is None else DEFAULT_BUDGET_K


def packs_root(root: Path | None = None) -> Path:
    return Path(root).resolve() if root else settings.packs_dir()


def pack_folder(name: str, root: Path) -> Path:
    """The folder of a known pack; PackError otherwise. Unlike the CLI's message, it names
    neither the server's packs folder nor the other packs: a client that may not list them
    learns nothing from a guess."""
    validate_pack_name(name)
    folder = root / name
    if not (folder / "urls.txt").is_file():
        raise PackError(f"unknown pack {name!r}: the pack list names the packs served here")
    return folder


def pack_folders(name: str, root: Path) -> Path | list[Path]:
    """The folder of a known pack, or of each of several named as "pandas,python"
    (retrieval.multipack); PackError naming an unknown one (as :func:`pack_folder`)."""
    if is_several(name):
        return [pack_folder(str(one), root) for one in pack_names(name)]
    return pack_folder(name, root)


def version_of(folder: Path) -> int | None:
    """The number of the pack's published version; None before its first build."""
    version = current_version(folder)
    return int(version.name[1:]) if version is not None else None


def _published(folder: Path) -> tuple[Path | None, dict | None, str | None]:
    """(version folder, manifest, error): a damaged manifest is reported, not raised."""
    version = current_version(folder)
    if version is None:
        return None, None, None
    try:
        return version, json.loads((version / "manifest.json").read_text()), None
    except (OSError, json.JSONDecodeError) as exc:
        return version, None, f"manifest.json of {version.name} cannot be read: {exc}"


def summary(name: str, root: Path) -> dict[str, Any]:
    """One line of the pack list: whether it is published, and the manifest's main figures."""
    folder = pack_folder(name, root)
    version, manifest, error = _published(folder)
    # "web": building the pack fetches its pages from the internet (kpack.packs.sources_location)
    sources = sources_location(folder)
    row: dict[str, Any] = {"name": name, "published": manifest is not None, "sources": sources}
    description = pack_description(folder, manifest)
    if description:
        row["description"] = description
    if error:
        row["error"] = error
    if manifest is None:
        row["version"] = int(version.name[1:]) if version else None
        if version is None:
            needs = " (its pages are on the web: the build needs internet access)"
            row["error"] = f"never built: run `kpack build {name}`{needs * (sources == WEB)}"
        return row
    counts = manifest.get("counts", {})
    row |= {
        "version": manifest.get("version"),
        "documentation_title": manifest.get("documentation_title"),
        "documentation_version": manifest.get("documentation_version"),
        "built_at": manifest.get("built_at"),
        "articles": counts.get("Article"),
        "sections": counts.get("Section"),
        "chunks": counts.get("Chunk"),
        "embedding_model": manifest.get("embedding", {}).get("model"),
    }
    return row


def all_summaries(root: Path) -> list[dict[str, Any]]:
    rows = []
    for name in list_packs(root):
        try:
            rows.append(summary(name, root))
        except PackError:  # removed between listing and reading: not a pack any more
            continue
    return rows


def info(name: str, root: Path) -> dict[str, Any]:
    """One pack: its summary, the whole manifest and skill.md of the published version."""
    folder = pack_folder(name, root)
    row = summary(name, root)
    version, manifest, _ = _published(folder)
    if manifest is not None and version is not None:
        skill = version / "skill.md"
        row["manifest"] = manifest
        row["skill_md"] = skill.read_text() if skill.is_file() else None
    return row


def skill_md(name: str, root: Path) -> str:
    folder = pack_folder(name, root)
    version = current_version(folder)
    if version is None or not (version / "skill.md").is_file():
        raise PackError(f"pack {name!r} has not been built yet: run `kpack build {name}`")
    return (version / "skill.md").read_text()
