"""Pack folders: names, urls.txt, kg_config.json and the published files.

A pack is a folder ``packs/<name>/`` with a ``urls.txt``. The build publishes versions under
``.versions/`` and points ``pack.db``, ``manifest.json`` and ``skill.md`` at the current one
through symlinks, so a reader that resolves a path once sees one consistent version.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kpack import settings
from kpack.errors import PackError

PACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SUPPORTED_SCHEMES = ("http", "https", "file")
PUBLISHED_FILES = ("pack.db", "manifest.json", "skill.md")


def validate_pack_name(name: str) -> str:
    if not isinstance(name, str) or not PACK_NAME.fullmatch(name):
        raise PackError(
            f"invalid pack name {name!r}: use letters, digits, '-' and '_' "
            "(at most 64 characters, no path separators or '..')"
        )
    return name


def list_packs(root: Path | None = None) -> list[str]:
    root = root or settings.packs_dir()
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir() if (p / "urls.txt").is_file() and PACK_NAME.fullmatch(p.name)
    )


def pack_dir(name: str, root: Path | None = None) -> Path:
    """The folder of an existing pack; an unknown name is an error that lists the known ones."""
    validate_pack_name(name)
    root = root or settings.packs_dir()
    folder = root / name
    if not (folder / "urls.txt").is_file():
        known = ", ".join(list_packs(root)) or "none"
        raise PackError(f"unknown pack {name!r} in {root} (available: {known})")
    return folder


def normalize_url(url: str) -> str:
    """The form used to match links to articles: fragment dropped, scheme/host lower-cased."""
    parts = urlsplit(url.strip())
    netloc = parts.netloc.lower()
    if (parts.scheme == "http" and netloc.endswith(":80")) or (
        parts.scheme == "https" and netloc.endswith(":443")
    ):
        netloc = netloc.rsplit(":", 1)[0]
    return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", parts.query, ""))


@dataclass(frozen=True)
class Source:
    line_no: int
    url: str


@dataclass(frozen=True)
class LineProblem:
    line_no: int
    line: str
    reason: str

    def __str__(self) -> str:
        return f"urls.txt line {self.line_no}: {self.reason}: {self.line!r}"


def parse_urls(text: str, base_dir: Path) -> tuple[list[Source], list[LineProblem]]:
    """Parse urls.txt: one URL a line, '#' comments. Bad lines are reported, never fatal.

    ``file:relative/path`` is resolved against ``base_dir`` (the pack folder) so a pack that
    ships with a project works wherever the project is checked out.
    """
    sources: list[Source] = []
    problems: list[LineProblem] = []
    seen: dict[str, int] = {}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        url, reason = resolve_url(line, base_dir)
        if reason:
            problems.append(LineProblem(line_no, line, reason))
            continue
        key = normalize_url(url)
        if key in seen:
            problems.append(LineProblem(line_no, line, f"duplicate of line {seen[key]}"))
            continue
        seen[key] = line_no
        sources.append(Source(line_no, url))
    return sources, problems


def resolve_url(line: str, base_dir: Path) -> tuple[str, str | None]:
    """The URL a urls.txt line names (file: paths made absolute), or the reason it is invalid."""
    if any(ch.isspace() for ch in line):
        return line, "a line holds one URL and no spaces"
    try:
        parts = urlsplit(line)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        return line, f"not a valid URL ({exc})"
    scheme = parts.scheme.lower()
    if not scheme:
        return line, "not a URL (expected http://, https:// or file:)"
    if scheme not in SUPPORTED_SCHEMES:
        return line, f"unsupported scheme {scheme!r} (use http, https or file)"
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return line, "file URLs must not name a host"
        path = Path(parts.path)
        if not path.is_absolute():
            path = (base_dir / path).resolve()
        return path.as_uri(), None
    if not parts.hostname:
        return line, "URL has no host"
    return line, None


def versions_dir(folder: Path) -> Path:
    return folder / ".versions"


def current_version(folder: Path) -> Path | None:
    """The folder of the published version, resolved once so db and manifest agree."""
    link = versions_dir(folder) / "current"
    if not link.exists():
        return None
    return link.resolve()


def read_manifest(folder: Path) -> dict | None:
    version = current_version(folder)
    if version is None:
        return None
    return json.loads((version / "manifest.json").read_text())
