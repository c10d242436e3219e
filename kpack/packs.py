"""Pack folders: names, urls.txt, kg_config.json and the published files.

A pack is a folder ``packs/<name>/`` with a ``urls.txt``. The build publishes versions under
``.versions/`` and points ``pack.db``, ``manifest.json`` and ``skill.md`` at the current one
through symlinks, so a reader that resolves a path once sees one consistent version.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from kpack import settings
from kpack.errors import PackError

PACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SUPPORTED_SCHEMES = ("http", "https", "file")
PUBLISHED_FILES = ("pack.db", "manifest.json", "skill.md")
# The folder of a version that holds its retrieval indexes (kpack.index_files).
INDEX_DIR = "indexes"


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
    if folder.is_dir() and not (folder / "urls.txt").is_file():
        raise PackError(
            f"no urls.txt in {folder}: a pack folder lists its sources there, one URL a line"
        )
    if not (folder / "urls.txt").is_file():
        known = ", ".join(list_packs(root)) or "none"
        raise PackError(f"unknown pack {name!r} in {root} (available: {known})")
    return folder


def new_pack_folder(name: str, root: Path | None = None) -> Path:
    """The folder a new pack NAME gets; an invalid name or an existing pack is an error."""
    folder = (root or settings.packs_dir()) / validate_pack_name(name)
    if (folder / "urls.txt").exists():
        raise PackError(f"pack {name!r} already exists at {folder}")
    return folder


# Query arguments that say where a visitor came from, never what the page holds.
TRACKING_PARAMETER = re.compile(
    r"^(?:utm_[a-z_]+|fbclid|gclid|dclid|msclkid|mc_cid|mc_eid|_hsenc|_hsmi|igshid)(?:=|$)",
    re.IGNORECASE,
)
REPEATED_SLASHES = re.compile(r"/{2,}")


# A crawl resolves every link of every page, and a site's pages share most of theirs (a
# sidebar, a table of contents): Django's 534 pages hold 49,505 links, a few thousand distinct.
@lru_cache(maxsize=1 << 17)
def normalize_url(url: str) -> str:
    """The form used to match URLs, w3lib's canonical one: percent-encoding normalised
    (``%7E`` is ``~``), dot segments resolved, the host IDNA-encoded and lower-cased, query
    arguments sorted, the fragment dropped; and the default port dropped. A web URL also loses
    its tracking arguments (``utm_*``, ``fbclid``, ...) and repeated slashes in its path
    (``/docs//guide`` is ``/docs/guide``): the same page reached through either is one page.
    ValueError for a URL that cannot be parsed."""
    # Imported here: w3lib.url loads urllib.request and http.client (~40 ms), which a query,
    # reading kpack.packs for pack folders only, does not need.
    from w3lib.url import canonicalize_url

    parts = urlsplit(canonicalize_url(url.strip()))
    netloc, path, query = parts.netloc, parts.path, parts.query
    if (parts.scheme == "http" and netloc.endswith(":80")) or (
        parts.scheme == "https" and netloc.endswith(":443")
    ):
        netloc = netloc.rsplit(":", 1)[0]
    if parts.scheme in ("http", "https"):
        path = REPEATED_SLASHES.sub("/", path)
        query = "&".join(
            pair for pair in query.split("&") if pair and not TRACKING_PARAMETER.match(pair)
        )
    return urlunsplit((parts.scheme.lower(), netloc, path or "/", query, ""))


INDEX_PAGES = ("index.html", "index.htm")


@lru_cache(maxsize=1 << 17)
def page_key(url: str) -> str:
    """The identity of a page: URLs with one key are one page. Beyond normalize_url, a web
    page's trailing slash and final index.html are ignored (``guide/``, ``guide`` and
    ``guide/index.html`` are one page)."""
    parts = urlsplit(normalize_url(url))
    path = parts.path
    if parts.scheme in ("http", "https"):
        for index in INDEX_PAGES:
            path = path.removesuffix(index) if path.endswith("/" + index) else path
        path = path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


@dataclass(frozen=True)
class Source:
    """A URL line of urls.txt."""

    line_no: int
    url: str
    # Link hops a crawl follows from this URL (a seed line ``URL depth=N``); None: this page
    # only. A sitemap URL expands to its pages either way (kpack.ingest.crawl).
    depth: int | None = None


@dataclass(frozen=True)
class LineProblem:
    """A line of urls.txt that names no page to fetch, and why."""

    line_no: int
    line: str
    reason: str

    def __str__(self) -> str:
        return f"urls.txt line {self.line_no}: {self.reason}: {self.line!r}"


def read_urls_text(path: Path) -> str:
    """A urls.txt file as text: UTF-8, a leading byte-order mark dropped. Other bytes are a
    PackError naming the line, not a traceback."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PackError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PackError(
            f"{path}: line {line} is not UTF-8 text (byte {data[exc.start]:#04x}); "
            "save the file as UTF-8"
        ) from None


def read_urls(folder: Path) -> tuple[list[Source], list[LineProblem]]:
    """The sources of a pack folder's urls.txt (see parse_urls)."""
    return parse_urls(read_urls_text(folder / "urls.txt"), folder)


def write_urls(folder: Path, lines: list[str]) -> tuple[list[Source], list[LineProblem]]:
    """Write a new pack's urls.txt: the valid ones among ``lines``, each as given (a relative
    file: URL stays relative to the pack folder). Nothing is written when none is valid."""
    sources, problems = parse_urls("\n".join(lines), folder)
    if sources:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "urls.txt").write_text(
            "".join(f"{lines[s.line_no - 1].strip()}\n" for s in sources)
        )
    return sources, problems


def private_hosts(sources: list[Source]) -> list[str]:
    """The hosts of ``sources`` that a build refuses unless ``fetch.allow_private_hosts`` is
    set, as far as their URLs tell: ``localhost`` and addresses that are not global (loopback,
    private, link-local; the fetcher's own check, kpack.ingest.network_guard, also looks
    inside mapped addresses and at what a name resolves to, which a warning at `kpack new`
    does not)."""
    found = []
    for source in sources:
        host = (urlsplit(source.url).hostname or "").rstrip(".")
        if not host or urlsplit(source.url).scheme not in ("http", "https"):
            continue
        try:
            address = ipaddress.ip_address(host)
            private = not address.is_global or address.is_multicast
        except ValueError:  # a name, not an address
            private = is_loopback(host) or host.endswith(".localhost")
        if private:
            found.append(host)
    return list(dict.fromkeys(found))


def within_file_roots(path: Path, roots: list[Path]) -> bool:
    """Whether a build may read the file at ``path``: it lies inside one of the pack's
    ``fetch.file_roots`` (resolved: a link out of them is outside)."""
    return any(path.resolve().is_relative_to(root.resolve()) for root in roots)


def folders_outside(sources: list[Source], roots: list[Path]) -> list[str]:
    """The folders of the ``file:`` sources a build refuses because they lie outside
    ``roots`` (the pack's file roots), in the order first named."""
    found = []
    for source in sources:
        parts = urlsplit(source.url)
        if parts.scheme != "file":
            continue
        path = Path(unquote(parts.path))
        if not within_file_roots(path, roots):
            found.append(str(path.parent.resolve()))
    return list(dict.fromkeys(found))


def parse_urls(text: str, base_dir: Path) -> tuple[list[Source], list[LineProblem]]:
    """Parse urls.txt: one URL a line, '#' comments. Bad lines are reported, never fatal.

    ``file:relative/path`` is resolved against ``base_dir`` (the pack folder) so a pack that
    ships with a project works wherever the project is checked out. A file: path is a URL
    path: a space is written %20 (``file:docs/my%20notes.md``) and a percent sign %25.

    A line is one page, unless it is a seed: ``https://docs.example.com/guide/ depth=2``
    crawls the in-content links of the page, two hops deep, within its scope (see
    kpack.ingest.crawl, which also expands sitemap URLs).
    """
    sources: list[Source] = []
    problems: list[LineProblem] = []
    seen: dict[str, int] = {}
    for line_no, raw in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        target, *options = line.split()
        depth, reason = seed_depth(options)
        if reason is None:
            url, reason = resolve_url(target, base_dir)
        if reason:
            problems.append(LineProblem(line_no, line, reason))
            continue
        key = normalize_url(url)
        if key in seen:
            problems.append(LineProblem(line_no, line, f"duplicate of line {seen[key]}"))
            continue
        seen[key] = line_no
        sources.append(Source(line_no, url, depth))
    return sources, problems


MAX_SEED_DEPTH = 20
ONE_URL = "a line holds one URL and no spaces (write a space in a path as %20)"


def seed_depth(options: list[str]) -> tuple[int | None, str | None]:
    """The crawl depth the words after a line's URL ask for (``depth=N``), or the reason they
    are invalid. No words: None, a page line."""
    depth: int | None = None
    for option in options:
        key, equals, value = option.partition("=")
        if not equals:
            return None, ONE_URL
        if key != "depth":
            return None, f"unknown option {key!r} (a seed line is 'URL depth=N')"
        if not value.isdigit() or int(value) > MAX_SEED_DEPTH:
            return None, f"depth must be a whole number from 0 to {MAX_SEED_DEPTH}, got {value!r}"
        depth = int(value)
    return depth, None


def resolve_url(line: str, base_dir: Path) -> tuple[str, str | None]:
    """The URL a urls.txt line names (file: paths made absolute), or the reason it is invalid."""
    if any(ch.isspace() for ch in line):
        return line, ONE_URL
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
        path = Path(unquote(parts.path))
        if not path.is_absolute():
            path = (base_dir / path).resolve()
        return path.as_uri(), None
    if not parts.hostname:
        return line, "URL has no host"
    return line, None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


WEB, LOCAL = "web", "local"


def sources_location(folder: Path) -> str | None:
    """Where a build of the pack reads its pages: WEB when its urls.txt names an http(s) page
    on another machine (building it needs internet access), LOCAL for file: pages and servers
    on this machine; None when urls.txt cannot be read."""
    try:
        sources, _ = read_urls(folder)
    except PackError:
        return None
    remote = any(
        urlsplit(source.url).scheme in ("http", "https")
        and not is_loopback(urlsplit(source.url).hostname or "")
        for source in sources
    )
    return WEB if remote else LOCAL


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


def built_time(timestamp: object) -> datetime | None:
    """An ISO 8601 time with its offset as a datetime; None when it is not one."""
    try:
        when = datetime.fromisoformat(timestamp)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else None


def time_ago(timestamp: str | None) -> str:
    """'3h 12m ago' for an ISO 8601 time with its offset (a manifest's built_at); "not a date"
    for anything else (an installed archive's manifest may say anything)."""
    if not timestamp:
        return "-"
    when = built_time(timestamp)
    if when is None:
        return "not a date"
    seconds = int((datetime.now(UTC) - when).total_seconds())
    if seconds < 60:
        return f"{max(seconds, 0)}s ago"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if days:
        return f"{days}d {hours % 24}h ago"
    return f"{hours}h {minutes % 60}m ago" if hours else f"{minutes}m ago"
