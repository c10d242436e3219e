"""The private-network guard of fetches: which addresses a fetch may connect to, and the
requests session whose connections obey it (and the fetch's deadline).

Unless ``fetch.allow_private_hosts`` is set, a connection resolves its host once, refuses every
address that is not globally routable (loopback, private, link-local, 100.64.0.0/10, and the
IPv4-mapped, NAT64 and 6to4 forms of such addresses) and connects to exactly the address it
checked, so a name that answers a public address to the check and a private one to the
connection (DNS rebinding) never reaches the private one. Through an HTTP proxy the proxy
resolves names: the name is checked before the request (kpack.ingest.fetch), but rebinding
cannot be ruled out there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.utils import select_proxy
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from kpack.config import setting_json
from kpack.ingest.deadline import Deadline
from kpack.ingest.fetch_errors import FetchError

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


class GuardedSession(requests.Session):
    """A session that reads the environment's proxy and CA-bundle settings once per origin
    (scheme, host and port), not on every request: requests rereads them each time (about
    0.3 ms, a tenth of a conditional request's client time in a crawl of 11,000 pages), and
    a build's settings do not change while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self._environment: dict[tuple[str, bool, Any, Any], dict[str, Any]] = {}
        self._environment_lock = threading.Lock()

    def merge_environment_settings(
        self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
    ) -> dict[str, Any]:
        if proxies or not self.trust_env:  # a request's own proxies: as requests does it
            return super().merge_environment_settings(url, proxies, stream, verify, cert)
        parts = urlsplit(url)
        key = (f"{parts.scheme}://{parts.netloc}", stream, verify, cert)
        with self._environment_lock:
            known = self._environment.get(key)
        if known is None:
            known = super().merge_environment_settings(url, proxies, stream, verify, cert)
            with self._environment_lock:
                self._environment[key] = known
        return {**known, "proxies": dict(known["proxies"])}

    def proxy_for(self, url: str) -> str | None:
        """The proxy from the environment a request for ``url`` goes through, if any."""
        return select_proxy(
            url, self.merge_environment_settings(url, {}, True, None, None)["proxies"]
        )


def guarded_session(user_agent: str, pool_size: int = 4) -> GuardedSession:
    """A requests session whose direct connections follow the rules of :func:`guarded`."""
    session = GuardedSession()
    session.headers["User-Agent"] = user_agent
    adapter = _GuardedAdapter(pool_connections=16, pool_maxsize=pool_size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
