"""Pack folders: names, urls.txt, kg_config.json and the published files.

A pack is a folder ``packs/<name>/`` with a ``urls.txt``. The build publishes versions under
``.versions/`` and points ``pack.db``, ``manifest.json`` and ``skill.md`` at the current one
through symlinks, so a reader that resolves a path once sees one consistent version.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from kpack import settings

PACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SUPPORTED_SCHEMES = ("http", "https", "file")
DEFAULT_SCHEDULE = "0 3 * * 1"
PUBLISHED_FILES = ("pack.db", "manifest.json", "skill.md")


class PackError(ValueError):
    """A problem the user can fix (bad name, unknown pack, malformed config): shown without traceback."""


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


@dataclass(frozen=True)
class FetchConfig:
    timeout_s: float = 20.0
    max_bytes: int = 5_000_000
    retries: int = 3
    max_redirects: int = 10
    max_workers: int = 8
    # Private and loopback hosts are refused unless allowed: a pack must not be able to
    # read the build machine's network. Local docs and tests turn this on.
    allow_private_hosts: bool = False
    # file: URLs may only read under these folders (relative to the pack folder). The
    # default is the folder that holds the packs folder, i.e. the project.
    file_roots: tuple[str, ...] = ("../..",)
    # Seconds between two requests to the same host (across all workers): a polite crawler
    # never hammers one server. Tests and benchmarks on loopback set 0.
    per_host_delay_s: float = 0.2


@dataclass(frozen=True)
class PackConfig:
    """kg_config.json: per-pack overrides of the build and query defaults."""

    embedding_model: str = "default"
    extraction: str = "auto"  # auto: Claude when ANTHROPIC_API_KEY is set, else offline
    extraction_model: str = "claude-haiku-4-5"
    chunk_tokens: int = 256
    chunk_overlap_tokens: int = 48
    max_failed_fraction: float = 0.2
    # When the Dagster schedule pack_refresh_schedule (off until turned on in the UI) rebuilds
    # this pack: a cron string in UTC, weekly (Monday 03:00) by default; "" never.
    schedule: str = DEFAULT_SCHEDULE
    fetch: FetchConfig = field(default_factory=FetchConfig)

    def to_json(self) -> dict:
        return asdict(self)


def load_config(folder: Path) -> PackConfig:
    path = folder / "kg_config.json"
    if not path.is_file():
        return PackConfig()
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PackError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(raw, dict):
        raise PackError(f"{path}: expected a JSON object")
    fetch = _build(FetchConfig, raw.pop("fetch", {}), f"{path} fetch")
    # Keys the query side (retrieval) reads live in the same file; the build ignores them.
    build_keys = {f.name for f in fields(PackConfig)}
    config = _build(PackConfig, {k: v for k, v in raw.items() if k in build_keys}, str(path))
    if config.extraction not in ("auto", "claude", "offline"):
        raise PackError(f"{path}: extraction must be 'auto', 'claude' or 'offline'")
    if not 0 < config.chunk_overlap_tokens < config.chunk_tokens:
        raise PackError(f"{path}: need 0 < chunk_overlap_tokens < chunk_tokens")
    if not 0.0 <= config.max_failed_fraction <= 1.0:
        raise PackError(f"{path}: max_failed_fraction must be between 0 and 1")
    if config.schedule not in ("", DEFAULT_SCHEDULE) and not valid_cron(config.schedule):
        raise PackError(
            f"{path}: schedule must be a cron string such as {DEFAULT_SCHEDULE!r} "
            f'(minute hour day month weekday), or "" for never; got {config.schedule!r}'
        )
    for key, least in (
        ("timeout_s", 0.001),
        ("max_bytes", 1),
        ("retries", 0),
        ("max_redirects", 0),
        ("max_workers", 1),
        ("per_host_delay_s", 0.0),
    ):
        if getattr(fetch, key) < least:
            raise PackError(f"{path}: fetch.{key} must be at least {least}")
    return PackConfig(**{**asdict(config), "fetch": fetch})


def valid_cron(cron: str) -> bool:
    """A cron string Dagster's scheduler accepts (five fields, or @daily/@weekly/...)."""
    from dagster._utils.schedules import is_valid_cron_string  # dagster's own cron parser

    return is_valid_cron_string(cron)


def _build(cls, raw: dict, where: str):
    if not isinstance(raw, dict):
        raise PackError(f"{where}: expected a JSON object")
    defaults = cls()
    unknown = sorted(set(raw) - {f.name for f in fields(cls)})
    if unknown:
        raise PackError(f"{where}: unknown keys {unknown}")
    values = {}
    for key, value in raw.items():
        default = getattr(defaults, key)
        if not _same_kind(default, value):
            raise PackError(f"{where}: {key} must be like {default!r}, got {value!r}")
        values[key] = tuple(value) if isinstance(default, tuple) else value
    return cls(**values)


def _same_kind(default: object, value: object) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, tuple):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, type(default))


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
