"""The web (and local files) as a resource: polite, bounded, retrying fetches that never raise.

Every URL yields a FetchResponse; failures carry their error text instead of an exception, so
one bad URL never stops a build.

Rebuilds are conditional: given the validators of the previous fetch of a URL (its ETag and
Last-Modified), a request carries If-None-Match / If-Modified-Since, and a ``304 Not Modified``
answer comes back as ``not_modified`` with no body, for the caller to reuse its stored copy. A
``file:`` URL is not modified when its modification time and size equal the previous ones (kept
in the ETag slot as ``"file-<mtime_ns>-<size>"``); its status is then 304 as well.

Politeness: request starts to one host are spaced by ``fetch.per_host_delay_s`` across all
worker threads, retries and redirect hops included.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import requests
from dagster import ConfigurableResource
from requests.adapters import HTTPAdapter

from kpack.config import FetchConfig

RETRY_STATUSES = {429, 500, 502, 503, 504}
MAX_RETRY_AFTER_S = 30.0
TEXT_TYPES = {
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/plain": "text",
    "text/x-rst": "text",
}
MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdown")
HTML_SUFFIXES = (".html", ".htm", ".xhtml")


class FetchError(Exception):
    """A fetch that failed for a reason worth telling the user (not retried)."""


@dataclass
class FetchResponse:
    url: str
    final_url: str
    redirects: list[str] = field(default_factory=list)
    status: int | None = None
    content_type: str | None = None
    format: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    text: str | None = None
    error: str | None = None
    elapsed_ms: float = 0.0
    not_modified: bool = False  # 304: the caller's stored copy is current; text is None


@dataclass(frozen=True)
class Validators:
    """What the previous fetch of a URL recorded, to make the next request conditional."""

    etag: str | None = None
    last_modified: str | None = None


class HostThrottle:
    """Spaces request starts to one host by ``delay_s``, whichever worker thread sends them."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._next_at: dict[str, float] = {}

    def wait(self, url: str) -> None:
        if self.delay_s <= 0:
            return
        host = (urlsplit(url).hostname or "").lower()
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_at.get(host, 0.0))
            self._next_at[host] = start + self.delay_s
        if start > now:
            time.sleep(start - now)


def file_etag(path: Path) -> str:
    """A validator for a local file: changes when its modification time or size does."""
    stat = path.stat()
    return f'"file-{stat.st_mtime_ns}-{stat.st_size}"'


def page_format(content_type: str | None, url: str) -> str | None:
    """html, markdown or text; None for content that is not text."""
    path = urlsplit(url).path.lower()
    if path.endswith(MARKDOWN_SUFFIXES):
        return "markdown"
    mime = (content_type or "").split(";")[0].strip().lower()
    if mime in TEXT_TYPES:
        return TEXT_TYPES[mime]
    if not mime and path.endswith(HTML_SUFFIXES):
        return "html"
    if not mime and path.endswith((".txt", ".rst")):
        return "text"
    return None


def decode(body: bytes, content_type: str | None) -> str:
    if b"\x00" in body[:4096]:
        raise FetchError("binary content (NUL bytes), not text")
    charset = None
    for param in (content_type or "").split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip('"')
    if charset:
        try:
            return body.decode(charset, errors="replace")
        except LookupError:
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("cp1252", errors="replace")


class FetcherResource(ConfigurableResource):
    """HTTP(S) and file: fetching with timeouts, retries, size and redirect caps."""

    user_agent: str = "knowledge-packs/0.1 (documentation pack builder)"
    backoff_s: float = 0.5
    # GitHub blob pages are HTML around the file; the raw file is what a pack wants.
    github_host: str = "github.com"
    github_raw_base: str = "https://raw.githubusercontent.com"

    def fetch_all(
        self,
        urls: list[str],
        config: FetchConfig,
        file_roots: list[Path],
        previous: dict[str, Validators] | None = None,
    ) -> list[FetchResponse]:
        """Fetch every URL; ``previous`` (by URL) makes the requests conditional."""
        previous = previous or {}
        throttle = HostThrottle(config.per_host_delay_s)
        session = requests.Session()
        session.headers["User-Agent"] = self.user_agent
        adapter = HTTPAdapter(pool_connections=16, pool_maxsize=max(config.max_workers, 4))
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        with session, ThreadPoolExecutor(max_workers=config.max_workers) as pool:
            return list(
                pool.map(
                    lambda u: self.fetch(session, u, config, file_roots, previous.get(u), throttle),
                    urls,
                )
            )

    def fetch(
        self,
        session: requests.Session,
        url: str,
        config: FetchConfig,
        file_roots: list[Path],
        previous: Validators | None = None,
        throttle: HostThrottle | None = None,
    ) -> FetchResponse:
        started = time.perf_counter()
        throttle = throttle or HostThrottle(config.per_host_delay_s)
        try:
            if urlsplit(url).scheme == "file":
                response = self._fetch_file(url, config, file_roots, previous)
            else:
                response = self._fetch_http(session, url, config, previous, throttle)
        except (FetchError, ValueError) as exc:  # ValueError: a URL urllib cannot parse
            response = FetchResponse(url=url, final_url=url, error=str(exc))
        except requests.RequestException as exc:
            response = FetchResponse(url=url, final_url=url, error=_describe(exc))
        response.elapsed_ms = (time.perf_counter() - started) * 1000
        return response

    def rewrite_github_blob(self, url: str) -> str:
        parts = urlsplit(url)
        segments = parts.path.strip("/").split("/")
        if parts.netloc.lower() != self.github_host or len(segments) < 5 or segments[2] != "blob":
            return url
        owner, repo, _, ref, *path = segments
        return f"{self.github_raw_base.rstrip('/')}/{owner}/{repo}/{ref}/{'/'.join(path)}"

    def _fetch_file(
        self, url: str, config: FetchConfig, roots: list[Path], previous: Validators | None
    ) -> FetchResponse:
        path = Path(unquote(urlsplit(url).path)).resolve()
        if not any(path.is_relative_to(root.resolve()) for root in roots):
            allowed = ", ".join(str(r) for r in roots)
            raise FetchError(f"file {path} is outside the allowed file roots ({allowed})")
        if not path.is_file():
            raise FetchError(f"no such file: {path}")
        if path.stat().st_size > config.max_bytes:
            raise FetchError(f"page exceeds the size cap of {config.max_bytes} bytes")
        fmt = page_format(None, url)
        if fmt is None:
            raise FetchError(f"unsupported file type {path.suffix or '(none)'} (not text)")
        etag = file_etag(path)
        response = FetchResponse(
            url=url,
            final_url=url,
            status=200,
            format=fmt,
            content_type={"html": "text/html", "markdown": "text/markdown"}.get(fmt, "text/plain"),
            etag=etag,
            last_modified=time.strftime(
                "%a, %d %b %Y %H:%M:%S GMT", time.gmtime(path.stat().st_mtime)
            ),
        )
        if previous is not None and previous.etag == etag:
            response.status, response.not_modified = 304, True
            return response
        response.text = decode(path.read_bytes(), None)
        return response

    def _fetch_http(
        self,
        session: requests.Session,
        url: str,
        config: FetchConfig,
        previous: Validators | None = None,
        throttle: HostThrottle | None = None,
    ) -> FetchResponse:
        target = self.rewrite_github_blob(url)
        redirects: list[str] = [target] if target != url else []
        headers = {}
        if previous is not None and previous.etag:
            headers["If-None-Match"] = previous.etag
        if previous is not None and previous.last_modified:
            headers["If-Modified-Since"] = previous.last_modified
        throttle = throttle or HostThrottle(config.per_host_delay_s)
        for _ in range(config.max_redirects + 1):
            if not config.allow_private_hosts:
                _refuse_private(target)
            response = self._get_with_retries(session, target, config, headers, throttle)
            if response.is_redirect and "location" in response.headers:
                response.close()
                target = urljoin(target, response.headers["location"])
                redirects.append(target)
                continue
            return self._read(url, target, redirects, response, config)
        raise FetchError(f"more than {config.max_redirects} redirects")

    def _get_with_retries(
        self,
        session: requests.Session,
        url: str,
        config: FetchConfig,
        headers: dict[str, str],
        throttle: HostThrottle,
    ) -> requests.Response:
        for attempt in range(config.retries + 1):
            last = attempt == config.retries
            throttle.wait(url)
            try:
                response = session.get(
                    url,
                    headers=headers,
                    timeout=config.timeout_s,
                    stream=True,
                    allow_redirects=False,
                )
            except (requests.ConnectionError, requests.Timeout):
                if last:
                    raise
                time.sleep(self.backoff_s * 2**attempt)
                continue
            if response.status_code in RETRY_STATUSES and not last:
                delay = _retry_after(response) or self.backoff_s * 2**attempt
                response.close()
                time.sleep(min(delay, MAX_RETRY_AFTER_S))
                continue
            return response
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _read(
        self,
        url: str,
        final_url: str,
        redirects: list[str],
        response: requests.Response,
        config: FetchConfig,
    ) -> FetchResponse:
        with response:
            result = FetchResponse(
                url=url,
                final_url=final_url,
                redirects=redirects,
                status=response.status_code,
                content_type=response.headers.get("content-type"),
                etag=response.headers.get("etag"),
                last_modified=response.headers.get("last-modified"),
            )
            if response.status_code >= 400:
                result.error = f"HTTP {response.status_code} {response.reason or ''}".strip()
                return result
            if response.status_code == 304:
                result.not_modified = True
                return result
            result.format = page_format(result.content_type, final_url)
            if result.format is None:
                result.error = f"unsupported content type {result.content_type!r} (not text)"
                return result
            declared = int(response.headers.get("content-length") or 0)
            if declared > config.max_bytes:
                result.error = f"page exceeds the size cap of {config.max_bytes} bytes"
                return result
            body = bytearray()
            for block in response.iter_content(chunk_size=65536):
                body.extend(block)
                if len(body) > config.max_bytes:
                    result.error = f"page exceeds the size cap of {config.max_bytes} bytes"
                    return result
            try:
                result.text = decode(bytes(body), result.content_type)
            except FetchError as exc:
                result.error = str(exc)
            return result


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return float(value) if value.replace(".", "", 1).isdigit() else None


def _refuse_private(url: str) -> None:
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise FetchError(f"cannot resolve host {host!r}: {exc.strerror}") from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if address.is_private or address.is_loopback or address.is_link_local:
            raise FetchError(
                f"refusing private address {address} of {host!r} "
                "(set fetch.allow_private_hosts in kg_config.json to allow it)"
            )


def _describe(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.Timeout):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, requests.ConnectionError):
        return f"connection failed: {str(exc).splitlines()[0][:200]}"
    return f"{type(exc).__name__}: {str(exc)[:200]}"
