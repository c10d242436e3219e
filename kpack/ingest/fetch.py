"""Fetching the web (and local files): polite, bounded, retrying fetches that never raise.

Every URL yields a FetchResponse; failures carry their error text instead of an exception, so
one bad URL never stops a build. The fetcher puts together the parts of a fetch, each in a
module of its own: what a body is and its charset (kpack.ingest.content), the private-network
guard (kpack.ingest.network_guard), the deadline watchdog (kpack.ingest.deadline), the per-host
throttle (kpack.ingest.throttle), retries (kpack.ingest.retries), the GitHub blob rewrite
(kpack.ingest.github) and its errors (kpack.ingest.fetch_errors).

Rebuilds are conditional: given the validators of the previous fetch of a URL (its ETag and
Last-Modified), a request carries If-None-Match / If-Modified-Since, and a ``304 Not Modified``
answer comes back as ``not_modified`` with no body, for the caller to reuse its stored copy. A
``file:`` URL is not modified when its modification time and size equal the previous ones (kept
in the ETag slot as ``"file-<mtime_ns>-<size>"``); its status is then 304 as well.

Bounds: every read waits at most ``fetch.timeout_s``, and a whole fetch (redirects, retries,
the body and reading a PDF) at most ``fetch.deadline_s`` from its first request: a server that
trickles a byte a second has its connection shut when the deadline passes. Waiting for the
host's turn before that first request is politeness, not the page's time. A PDF is read into
HTML (kpack.ingest.pdf); a gzipped sitemap is unpacked, its unpacked size under
``fetch.max_bytes`` as well.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import requests

from kpack.config import FetchConfig
from kpack.ingest.content import FILE_TYPES, GZIP_MAGIC, Decoded, decode, gunzip, page_format
from kpack.ingest.deadline import Deadline
from kpack.ingest.fetch_errors import FetchError
from kpack.ingest.github import GITHUB_HOST, GITHUB_RAW_BASE, rewrite_github_blob
from kpack.ingest.network_guard import guarded, guarded_session, public_addresses
from kpack.ingest.pdf import PdfError, pdf_html
from kpack.ingest.retries import get_with_retries
from kpack.ingest.throttle import HostThrottle
from kpack.packs import within_file_roots


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
    warning: str | None = None  # what was wrong but did not fail it (a mis-declared charset)


@dataclass(frozen=True)
class Validators:
    """What the previous fetch of a URL recorded, to make the next request conditional."""

    etag: str | None = None
    last_modified: str | None = None


def file_etag(path: Path) -> str:
    """A validator for a local file: changes when its modification time or size does."""
    stat = path.stat()
    return f'"file-{stat.st_mtime_ns}-{stat.st_size}"'


USER_AGENT = "knowledge-packs/0.1 (documentation pack builder)"


class Fetcher:
    """HTTP(S) and file: fetching with timeouts, retries, size and redirect caps.

    One Fetcher holds one connection pool and one per-host throttle for a run's fetches; use
    it as a context manager (or call ``close``).
    """

    def __init__(
        self,
        config: FetchConfig,
        file_roots: Sequence[Path] = (),
        *,
        user_agent: str = USER_AGENT,
        backoff_s: float = 0.5,
        # GitHub blob pages are HTML around the file; the raw file is what a pack wants.
        github_host: str = GITHUB_HOST,
        github_raw_base: str = GITHUB_RAW_BASE,
    ) -> None:
        self.config = config
        self.file_roots = [Path(root) for root in file_roots]
        self.backoff_s = backoff_s
        self.github_host = github_host
        self.github_raw_base = github_raw_base
        self.throttle = HostThrottle(config.per_host_delay_s)
        self.session = guarded_session(user_agent, pool_size=max(config.max_workers, 4))

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    def fetch_all(
        self, urls: list[str], previous: dict[str, Validators] | None = None
    ) -> list[FetchResponse]:
        """Fetch every URL, in order; ``previous`` (by URL) makes the requests conditional."""
        previous = previous or {}
        pool = ThreadPoolExecutor(max_workers=self.config.max_workers)
        try:
            return list(pool.map(lambda u: self.fetch(u, previous.get(u)), urls))
        finally:
            # Not waiting: on Ctrl-C the build stops now, not after every URL still queued.
            pool.shutdown(wait=False, cancel_futures=True)

    @property
    def deadline_s(self) -> float:
        """The most one fetch may take: fetch.deadline_s, else every attempt's timeout."""
        config = self.config
        return config.deadline_s or config.timeout_s * (config.retries + 1)

    def fetch(
        self, url: str, previous: Validators | None = None, *, xml: bool = False
    ) -> FetchResponse:
        """One URL; ``xml``: the URL names an XML document (a sitemap, gzipped or not), read
        as text whatever type the server gives it."""
        started = time.perf_counter()
        deadline = Deadline(self.deadline_s)
        try:
            with guarded(deadline, allow_private=self.config.allow_private_hosts):
                if urlsplit(url).scheme == "file":
                    response = self._fetch_file(url, previous, deadline, xml)
                else:
                    response = self._fetch_http(url, previous, deadline, xml)
        except (FetchError, ValueError) as exc:  # ValueError: a URL urllib cannot parse
            response = FetchResponse(url=url, final_url=url, error=str(exc))
        except requests.RequestException as exc:
            # A connection shut by the deadline surfaces as whatever the read was doing.
            error = deadline.message if deadline.expired else _describe(exc)
            response = FetchResponse(url=url, final_url=url, error=error)
        response.elapsed_ms = (time.perf_counter() - started) * 1000
        return response

    def rewrite_github_blob(self, url: str) -> str:
        return rewrite_github_blob(url, self.github_host, self.github_raw_base)

    def _fetch_file(
        self, url: str, previous: Validators | None, deadline: Deadline, xml: bool
    ) -> FetchResponse:
        config, roots = self.config, self.file_roots
        deadline.start()
        path = Path(unquote(urlsplit(url).path)).resolve()
        if not within_file_roots(path, roots):
            allowed = ", ".join(str(r) for r in roots)
            raise FetchError(
                f"file {path} is outside the allowed file roots ({allowed}); "
                "add its folder to fetch.file_roots in kg_config.json"
            )
        if not path.is_file():
            # A relative file: URL is resolved against the pack folder: a pack folder copied
            # away from the files it names fails every such URL.
            raise FetchError(
                f"no such file: {path} (relative file: URLs are read from the pack folder; "
                "moved the pack? fix urls.txt or fetch.file_roots in kg_config.json)"
            )
        if path.stat().st_size > config.max_bytes:
            raise FetchError(f"page exceeds the size cap of {config.max_bytes} bytes")
        fmt = "xml" if xml else page_format(None, url)
        if fmt is None:
            raise FetchError(f"unsupported file type {path.suffix or '(none)'} (not text or PDF)")
        etag = file_etag(path)
        response = FetchResponse(
            url=url,
            final_url=url,
            status=200,
            format=fmt,
            content_type=FILE_TYPES.get(fmt, "text/plain"),
            etag=etag,
            last_modified=time.strftime(
                "%a, %d %b %Y %H:%M:%S GMT", time.gmtime(path.stat().st_mtime)
            ),
        )
        if previous is not None and previous.etag == etag:
            response.status, response.not_modified = 304, True
            return response
        decoded = self._text(url, path.read_bytes(), fmt, None, deadline)
        response.text, response.warning = decoded.text, decoded.warning
        return response

    def _text(
        self, url: str, body: bytes, fmt: str, content_type: str | None, deadline: Deadline
    ) -> Decoded:
        """The text of a fetched body: a PDF read into HTML, a gzipped XML document unpacked,
        anything else decoded (see decode)."""
        config = self.config
        if fmt == "pdf":
            try:
                limits = (config.max_pdf_pages, config.max_bytes, deadline.check)
                return Decoded(pdf_html(body, url, *limits))
            except PdfError as exc:
                raise FetchError(str(exc)) from None
        if fmt == "xml" and body.startswith(GZIP_MAGIC):
            body = gunzip(body, config.max_bytes)
        return decode(body, content_type)

    def _fetch_http(
        self, url: str, previous: Validators | None, deadline: Deadline, xml: bool
    ) -> FetchResponse:
        config = self.config
        target = self.rewrite_github_blob(url)
        redirects: list[str] = [target] if target != url else []
        headers = {}
        if previous is not None and previous.etag:
            headers["If-None-Match"] = previous.etag
        if previous is not None and previous.last_modified:
            headers["If-Modified-Since"] = previous.last_modified
        for _ in range(config.max_redirects + 1):
            if not config.allow_private_hosts and self._proxied(target):
                parts = urlsplit(target)
                public_addresses(parts.hostname or "", parts.port)
            response = get_with_retries(
                self.session,
                target,
                headers,
                deadline,
                throttle=self.throttle,
                timeout_s=config.timeout_s,
                retries=config.retries,
                backoff_s=self.backoff_s,
            )
            if response.is_redirect and "location" in response.headers:
                release(response)
                target = urljoin(target, response.headers["location"])
                redirects.append(target)
                continue
            return self._read(url, target, redirects, response, deadline, xml)
        raise FetchError(f"more than {config.max_redirects} redirects")

    def _proxied(self, url: str) -> bool:
        """Whether requests will send this URL through a proxy from the environment."""
        return self.session.proxy_for(url) is not None

    def _read(
        self,
        url: str,
        final_url: str,
        redirects: list[str],
        response: requests.Response,
        deadline: Deadline,
        xml: bool,
    ) -> FetchResponse:
        config = self.config
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
                release(response)
                return result
            if response.status_code == 304:
                result.not_modified = True
                release(response)
                return result
            result.format = "xml" if xml else page_format(result.content_type, final_url)
            if result.format is None:
                result.error = f"unsupported content type {result.content_type!r} (not text or PDF)"
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
            # A body cut short by the deadline can end like a complete one.
            deadline.check()
            try:
                decoded = self._text(
                    final_url, bytes(body), result.format, result.content_type, deadline
                )
                result.text, result.warning = decoded.text, decoded.warning
            except FetchError as exc:
                result.error = str(exc)
            return result


# An answer whose body the fetch has no use for (a 304, a redirect, an error page) is read to
# its end when it declares at most this many bytes, so that its connection goes back to the
# pool: requests closes a connection whose body was left unread, and a rebuild asking about
# every page would open one per page (a TLS handshake each against a real site; 11,086 new
# connections for the ten documentation sites, stop 51). A larger body is not worth reading.
REUSABLE_BODY_BYTES = 65_536


def release(response: requests.Response) -> None:
    """Close ``response``, keeping its connection for the next request where its unread body
    is small enough to read (:data:`REUSABLE_BODY_BYTES`)."""
    declared = response.headers.get("content-length", "")
    small = declared.isdigit() and int(declared) <= REUSABLE_BODY_BYTES
    if response.status_code == 304 or small:
        with suppress(requests.RequestException):
            response.content  # noqa: B018 (read to its end; the body itself is not wanted)
    response.close()


def _describe(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.Timeout):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, requests.ConnectionError):
        return f"connection failed: {str(exc).splitlines()[0][:200]}"
    return f"{type(exc).__name__}: {str(exc)[:200]}"
