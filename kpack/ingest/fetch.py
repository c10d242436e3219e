"""Fetching the web (and local files): polite, bounded, retrying fetches that never raise.

Every URL yields a FetchResponse; failures carry their error text instead of an exception, so
one bad URL never stops a build.

Rebuilds are conditional: given the validators of the previous fetch of a URL (its ETag and
Last-Modified), a request carries If-None-Match / If-Modified-Since, and a ``304 Not Modified``
answer comes back as ``not_modified`` with no body, for the caller to reuse its stored copy. A
``file:`` URL is not modified when its modification time and size equal the previous ones (kept
in the ETag slot as ``"file-<mtime_ns>-<size>"``); its status is then 304 as well.

Politeness: request starts to one host are spaced by ``fetch.per_host_delay_s`` (or the longer
``Crawl-delay`` its robots.txt asks for, HostThrottle.set_delay) across all worker threads,
retries and redirect hops included. Retries (tenacity) follow connection errors, timeouts and
RETRY_STATUSES with exponential backoff, or the server's ``Retry-After`` (at most 30 s).

Bounds: every read waits at most ``fetch.timeout_s``, and a whole fetch (redirects, retries,
the body and reading a PDF) at most ``fetch.deadline_s`` from its first request: a server that
trickles a byte a second has its connection shut when the deadline passes. Waiting for the
host's turn before that first request is politeness, not the page's time.

Text: a page's charset comes from its byte-order mark, its Content-Type, its ``<meta charset>``
/ ``<meta http-equiv>`` or XML declaration (w3lib, as browsers read them), else UTF-8 when it
is, else windows-1252. A PDF is read into HTML (kpack.ingest.pdf); a gzipped sitemap is
unpacked, its unpacked size under ``fetch.max_bytes`` as well.

Private networks: unless ``fetch.allow_private_hosts`` is set, a connection resolves its host
once, refuses every address that is not globally routable (loopback, private, link-local,
100.64.0.0/10, and the IPv4-mapped, NAT64 and 6to4 forms of such addresses) and connects to
exactly the address it checked, so a name that answers a public address to the check and a
private one to the connection (DNS rebinding) never reaches the private one. Through an HTTP
proxy the proxy resolves names: the name is checked before the request, but rebinding cannot
be ruled out there.
"""

from __future__ import annotations

import codecs
import contextlib
import ipaddress
import re
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.utils import get_environ_proxies, select_proxy
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_any,
    wait_exponential,
)
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, InvalidHeader, NewConnectionError
from urllib3.util.retry import Retry
from w3lib.encoding import html_to_unicode

from kpack.config import FetchConfig, setting_json
from kpack.ingest.pdf import PdfError, pdf_html

RETRY_STATUSES = {429, 500, 502, 503, 504}
RETRIED_ERRORS = (requests.ConnectionError, requests.Timeout)
MAX_RETRY_AFTER_S = 30
# urllib3's parser of Retry-After (seconds or an HTTP date), capped at MAX_RETRY_AFTER_S.
RETRY_AFTER = Retry(retry_after_max=MAX_RETRY_AFTER_S)
TEXT_TYPES = {
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/plain": "text",
    "text/x-rst": "text",
}
# Documents read into text: a PDF becomes HTML (kpack.ingest.pdf), its row's format "pdf".
DOCUMENT_TYPES = {"application/pdf": "pdf"}
MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdown")
HTML_SUFFIXES = (".html", ".htm", ".xhtml")
# A type that says nothing: the URL's suffix decides (raw file hosts serve PDFs this way).
UNTYPED = ("", "application/octet-stream")
GZIP_MAGIC = b"\x1f\x8b"
FILE_TYPES = {
    "html": "text/html",
    "markdown": "text/markdown",
    "pdf": "application/pdf",
    "xml": "application/xml",
}


class FetchError(Exception):
    """A fetch that failed for a reason worth telling the user (not retried)."""


# The errors that say a page's host could not be reached at all: its name does not resolve or
# nothing answers a connection (what every page of a web pack gets on a machine that is
# offline), maybe as the failure of a sitemap or robots.txt ("sitemap: ...").
UNREACHABLE = re.compile(
    r"^(?:(?:sitemap|robots\.txt): )?(?:cannot resolve host|connection failed)"
)


def unreachable(error: str) -> bool:
    """Whether the fetch error ``error`` says its host could not be reached at all."""
    return UNREACHABLE.match(error) is not None


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
    """Spaces request starts to one host by ``delay_s``, or by the longer delay the host asked
    for (set_delay), whichever worker thread sends them."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._next_at: dict[str, float] = {}
        self._host_delays: dict[str, float] = {}

    def set_delay(self, host: str, delay_s: float) -> None:
        """Space the requests to ``host`` by at least ``delay_s`` from now on."""
        with self._lock:
            self._host_delays[host.lower()] = delay_s

    def wait(self, url: str) -> None:
        host = (urlsplit(url).hostname or "").lower()
        with self._lock:
            delay = max(self.delay_s, self._host_delays.get(host, 0.0))
            if delay <= 0:
                return
            now = time.monotonic()
            start = max(now, self._next_at.get(host, 0.0))
            self._next_at[host] = start + delay
        if start > now:
            time.sleep(start - now)


def file_etag(path: Path) -> str:
    """A validator for a local file: changes when its modification time or size does."""
    stat = path.stat()
    return f'"file-{stat.st_mtime_ns}-{stat.st_size}"'


def page_format(content_type: str | None, url: str) -> str | None:
    """html, markdown, text or pdf; None for content that is no page."""
    path = urlsplit(url).path.lower()
    if path.endswith(MARKDOWN_SUFFIXES):
        return "markdown"
    mime = (content_type or "").split(";")[0].strip().lower()
    if mime in TEXT_TYPES:
        return TEXT_TYPES[mime]
    if mime in DOCUMENT_TYPES:
        return DOCUMENT_TYPES[mime]
    if not mime and path.endswith(HTML_SUFFIXES):
        return "html"
    if not mime and path.endswith((".txt", ".rst")):
        return "text"
    if mime in UNTYPED and path.endswith(".pdf"):
        return "pdf"
    return None


# Encodings whose text is full of NUL bytes: declared, they are text, not binary.
WIDE_ENCODINGS = ("utf-16", "utf-32")


def _undeclared_encoding(body: bytes) -> str:
    """A page that declares no charset: UTF-8 when it is, else windows-1252 (what browsers
    assume for an undeclared Western page)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return "cp1252"
    return "utf-8"


def decode(body: bytes, content_type: str | None) -> str:
    """The text of a page: by its byte-order mark, else the charset its Content-Type, its
    ``<meta charset>`` / ``<meta http-equiv>`` or its XML declaration names (w3lib), else
    UTF-8, else windows-1252. NUL bytes in a page that is not UTF-16/32 mean binary content."""
    encoding, text = html_to_unicode(content_type, body, auto_detect_fun=_undeclared_encoding)
    if not codecs.lookup(encoding).name.startswith(WIDE_ENCODINGS) and b"\x00" in body[:4096]:
        raise FetchError("binary content (NUL bytes), not text")
    return text


def gunzip(body: bytes, max_bytes: int) -> bytes:
    """A gzipped document unpacked; FetchError when it is damaged or unpacks past
    ``max_bytes`` (never more than that is held in memory)."""
    unpacker = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = unpacker.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise FetchError(f"not a readable gzip file ({exc})") from None
    if len(data) > max_bytes:
        raise FetchError(f"unpacked, the file exceeds the size cap of {max_bytes} bytes")
    return data


# The IPv6 ranges that carry an IPv4 address in their last 32 bits (NAT64 well-known and
# local-use prefixes, and the deprecated IPv4-compatible form).
IPV4_CARRIERS = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96"))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in IPV4_CARRIERS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Globally routable unicast; an IPv6 address that carries an IPv4 one is judged by it."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return is_public_address(embedded)
    return address.is_global and not address.is_multicast


def public_addresses(host: str, port: int | None) -> list[str]:
    """The addresses ``host`` resolves to, once; FetchError if any is not globally routable."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise FetchError(f"cannot resolve host {host!r}: {exc.strerror}") from None
    addresses = list(dict.fromkeys(info[4][0].split("%")[0] for info in infos))
    for text in addresses:
        if not is_public_address(ipaddress.ip_address(text)):
            raise FetchError(
                f"refusing address {text} of {host!r}: not globally routable (to allow it, "
                f"kg_config.json: {setting_json('fetch.allow_private_hosts', True)})"
            )
    return addresses


class Deadline:
    """The end of one fetch, ``seconds`` after it starts (its first request, once the host's
    turn came): when it passes, the sockets the fetch reads are shut down, which wakes a read
    blocked on a server that trickles its answer. The timer starts with the first socket
    watched, so a fetch that opens none (a file: URL) costs no thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends_at: float | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer: threading.Timer | None = None
        self._fired = False  # the timer may wake a hair before ends_at

    @property
    def message(self) -> str:
        return f"timed out: no complete answer within the fetch deadline of {self.seconds:g} s"

    @property
    def expired(self) -> bool:
        return self._fired or self.remaining() <= 0

    def start(self) -> None:
        """Start the clock; later calls change nothing."""
        if self.ends_at is None:
            self.ends_at = time.monotonic() + self.seconds

    def remaining(self) -> float:
        if self.ends_at is None:
            return self.seconds
        return max(0.0, self.ends_at - time.monotonic())

    def check(self) -> None:
        if self.expired:
            raise FetchError(self.message)

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            if self._timer is None:
                self._timer = threading.Timer(self.remaining(), self._expire)
                self._timer.daemon = True
                self._timer.start()

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self._fired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # OSError: already closed, or handed back to the pool and closed since.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class _Scope:
    """What the connections of the fetch running on this thread must respect."""

    deadline: Deadline | None = None
    allow_private: bool = False


_thread = threading.local()


def _scope() -> _Scope:
    # Outside a Fetcher.fetch (no scope set), the strict policy applies.
    return getattr(_thread, "scope", None) or _Scope()


@contextlib.contextmanager
def guarded(deadline: Deadline, *, allow_private: bool) -> Iterator[None]:
    """While it is open, the requests of a :func:`guarded_session` made on this thread have
    their sockets shut when ``deadline`` passes, and connect only to globally routable
    addresses unless ``allow_private``."""
    _thread.scope = _Scope(deadline, allow_private)
    try:
        yield
    finally:
        deadline.cancel()
        _thread.scope = None


class _GuardedConnection:
    """Mixed into urllib3's connections: connect only to checked addresses, and let the fetch's
    deadline shut the socket it reads the answer from."""

    def _new_conn(self) -> socket.socket:
        if _scope().allow_private:
            return super()._new_conn()  # type: ignore[misc]
        name = self._dns_host  # type: ignore[attr-defined]
        failure: Exception | None = None
        for address in public_addresses(name, self.port):  # type: ignore[attr-defined]
            # urllib3 resolves _dns_host; an address literal resolves to itself, with no DNS.
            self._dns_host = address
            try:
                return super()._new_conn()  # type: ignore[misc]
            except (NewConnectionError, ConnectTimeoutError) as exc:
                failure = exc
            finally:
                self._dns_host = name
        raise failure or FetchError(f"host {name!r} has no address")

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        deadline = _scope().deadline
        if deadline is not None:
            deadline.watch(self.sock)  # type: ignore[attr-defined]
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]


class _GuardedHTTPConnection(_GuardedConnection, HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnection, HTTPSConnection):
    pass


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class _GuardedAdapter(HTTPAdapter):
    """requests' adapter whose direct connections are _GuardedConnection (not proxied ones)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _GuardedHTTPPool,
            "https": _GuardedHTTPSPool,
        }


def guarded_session(user_agent: str, pool_size: int = 4) -> requests.Session:
    """A requests session whose direct connections follow the rules of :func:`guarded`."""
    session = requests.Session()
    session.headers["User-Agent"] = user_agent
    adapter = _GuardedAdapter(pool_connections=16, pool_maxsize=pool_size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


USER_AGENT = "knowledge-packs/0.1 (documentation pack builder)"
GITHUB_HOST = "github.com"
GITHUB_RAW_BASE = "https://raw.githubusercontent.com"


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
        parts = urlsplit(url)
        segments = parts.path.strip("/").split("/")
        if parts.netloc.lower() != self.github_host or len(segments) < 5 or segments[2] != "blob":
            return url
        owner, repo, _, ref, *path = segments
        return f"{self.github_raw_base.rstrip('/')}/{owner}/{repo}/{ref}/{'/'.join(path)}"

    def _fetch_file(
        self, url: str, previous: Validators | None, deadline: Deadline, xml: bool
    ) -> FetchResponse:
        config, roots = self.config, self.file_roots
        deadline.start()
        path = Path(unquote(urlsplit(url).path)).resolve()
        if not any(path.is_relative_to(root.resolve()) for root in roots):
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
        response.text = self._text(url, path.read_bytes(), fmt, None, deadline)
        return response

    def _text(
        self, url: str, body: bytes, fmt: str, content_type: str | None, deadline: Deadline
    ) -> str:
        """The text of a fetched body: a PDF read into HTML, a gzipped XML document unpacked,
        anything else decoded (see decode)."""
        config = self.config
        if fmt == "pdf":
            try:
                return pdf_html(body, url, config.max_pdf_pages, config.max_bytes, deadline.check)
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
            response = self._get_with_retries(target, headers, deadline)
            if response.is_redirect and "location" in response.headers:
                response.close()
                target = urljoin(target, response.headers["location"])
                redirects.append(target)
                continue
            return self._read(url, target, redirects, response, deadline, xml)
        raise FetchError(f"more than {config.max_redirects} redirects")

    def _proxied(self, url: str) -> bool:
        """Whether requests will send this URL through a proxy from the environment."""
        return self.session.trust_env and select_proxy(url, get_environ_proxies(url)) is not None

    def _get_with_retries(
        self, url: str, headers: dict[str, str], deadline: Deadline
    ) -> requests.Response:
        """The answer to one request, retried (tenacity) after RETRIED_ERRORS and
        RETRY_STATUSES up to ``fetch.retries`` times within the deadline: the last retried
        status is returned as it is, the last error raised."""
        config = self.config

        def attempt() -> requests.Response:
            self.throttle.wait(url)
            deadline.start()
            deadline.check()
            return self.session.get(
                url,
                headers=headers,
                timeout=min(config.timeout_s, deadline.remaining()),
                stream=True,
                allow_redirects=False,
            )

        backoff = wait_exponential(multiplier=self.backoff_s, max=MAX_RETRY_AFTER_S)

        def wait(state: RetryCallState) -> float:
            answer = _answer(state)
            delay = _retry_after(answer) if answer is not None else None
            return min(backoff(state) if delay is None else delay, deadline.remaining())

        def close_answer(state: RetryCallState) -> None:
            answer = _answer(state)
            if answer is not None:
                answer.close()

        retrying = Retrying(
            retry=retry_if_exception_type(RETRIED_ERRORS)
            | retry_if_result(lambda answer: answer.status_code in RETRY_STATUSES),
            stop=stop_any(stop_after_attempt(config.retries + 1), lambda _: deadline.expired),
            wait=wait,
            before_sleep=close_answer,
            retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
        )
        return retrying(attempt)

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
                return result
            if response.status_code == 304:
                result.not_modified = True
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
                result.text = self._text(
                    final_url, bytes(body), result.format, result.content_type, deadline
                )
            except FetchError as exc:
                result.error = str(exc)
            return result


def _answer(state: RetryCallState) -> requests.Response | None:
    """The response an attempt returned; None when it raised."""
    outcome = state.outcome
    return None if outcome is None or outcome.failed else outcome.result()


def _retry_after(response: requests.Response) -> float | None:
    """The seconds a ``Retry-After`` header asks for (at most MAX_RETRY_AFTER_S), if any."""
    value = response.headers.get("retry-after")
    try:
        return RETRY_AFTER.parse_retry_after(value) if value else None
    except InvalidHeader:
        return None


def _describe(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.Timeout):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, requests.ConnectionError):
        return f"connection failed: {str(exc).splitlines()[0][:200]}"
    return f"{type(exc).__name__}: {str(exc)[:200]}"
