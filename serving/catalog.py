"""What the HTTP API and the MCP server both say about packs, and how they check a question.

Everything here reads the published version through its ``current`` link, resolved once per
call, so the manifest and skill.md of one answer always belong to one version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kpack import settings
from kpack.packs import PackError, current_version, list_packs, pack_dir

# The CLI's limit (retrieval rejects longer questions with the same words).
MAX_QUESTION_CHARS = 8000
MAX_K = 50


class QuestionError(PackError):
    """The question itself is unusable (empty, too long): the caller's mistake, not the pack's."""


def packs_root(root: Path | None = None) -> Path:
    return Path(root).resolve() if root else settings.packs_dir()


def pack_folder(name: str, root: Path) -> Path:
    """The folder of a known pack; PackError (with the known names) otherwise."""
    return pack_dir(name, root)


def clean_question(question: object, limit: int = MAX_QUESTION_CHARS) -> str:
    """The question as the CLI accepts it, with the CLI's messages."""
    if not isinstance(question, str) or not question.strip():
        raise QuestionError("the question is empty")
    if len(question) > limit:
        raise QuestionError(
            f"the question is {len(question):,} characters long; the limit is {limit:,}"
        )
    return question


def version_of(folder: Path) -> int | None:
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
    row: dict[str, Any] = {"name": name, "published": manifest is not None}
    if error:
        row["error"] = error
    if manifest is None:
        row["version"] = int(version.name[1:]) if version else None
        if version is None:
            row["error"] = f"never built: run `kpack build {name}`"
        return row
    counts = manifest.get("counts", {})
    row |= {
        "version": manifest.get("version"),
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
