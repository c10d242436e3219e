"""FetcherResource against the real loopback site: every URL yields a response, none raises."""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from kpack.config import FetchConfig
from kpack.ingest.content import decode, page_format
from kpack.ingest.fetch import Fetcher, Validators
from kpack.ingest.fetch_errors import FetchError
from kpack.ingest.html import html_blocks, main_content
from kpack.ingest.network_guard import is_public_address
from kpack.ingest.sections import split_sections
from kpack.ingest.throttle import HostThrottle
from resources.fetcher import FetcherResource
from tests.hostile_site import HostileHandler
from tests.loopback import LoopbackServer

CONFIG = FetchConfig(
    allow_private_hosts=True, timeout_s=1.0, retries=2, max_bytes=200_000, per_host_delay_s=0.0
)


@pytest.fixture
def fetcher() -> FetcherResource:
    return FetcherResource(backoff_s=0.05)


def fetch_one(fetcher, url, config=CONFIG, roots=()):
    [response] = fetcher.fetch_all([url], config, list(roots))
    return response


def test_html_page_is_fetched_with_status_etag_and_format(fetcher, site):
    response = fetch_one(fetcher, site.url("/docs/index.html"))
    assert response.error is None
    assert response.status == 200
    assert response.format == "html"
    assert response.etag and response.etag.startswith('"')
    assert response.final_url == site.url("/docs/index.html")
    assert response.redirects == []
    assert "Widget Toolkit" in response.text
    assert response.elapsed_ms > 0


def test_markdown_page_has_markdown_format(fetcher, site):
    response = fetch_one(fetcher, site.url("/docs/readme.md"))
    assert response.error is None
    assert response.format == "markdown"
    assert response.text.startswith("# Widget Readme")


def test_redirect_is_followed_and_recorded(fetcher, site):
    response = fetch_one(fetcher, site.url("/old-guide"))
    assert response.error is None
    assert response.url == site.url("/old-guide")
    assert response.final_url.endswith("/docs/guide.html")
    assert response.redirects and response.redirects[-1].endswith("/docs/guide.html")
    assert "User Guide" in response.text


def test_not_found_is_an_error_naming_the_status(fetcher, site):
    response = fetch_one(fetcher, site.url("/docs/missing.html"))
    assert response.status == 404
    assert "404" in response.error
    assert response.text is None


def test_server_error_is_retried_until_it_succeeds(fetcher, site):
    # /flaky.html answers 500 on its first hit of the session only: request it in this test alone.
    response = fetch_one(fetcher, site.url("/flaky.html"))
    assert response.error is None, response.error
    assert response.status == 200
    assert "worked on the retry" in response.text
    assert site.hits["/flaky.html"] >= 2


def test_slow_page_times_out_within_a_bounded_time(fetcher, site):
    started = time.perf_counter()
    response = fetch_one(fetcher, site.url("/slow.html"))
    elapsed = time.perf_counter() - started
    assert response.error is not None and "timed out" in response.error
    assert response.text is None
    assert elapsed < 10


def test_binary_content_is_refused_as_not_text(fetcher, site):
    response = fetch_one(fetcher, site.url("/logo.png"))
    assert response.text is None
    assert "not text" in response.error
    assert "image/png" in response.error


def test_page_over_the_size_cap_is_refused(fetcher, site):
    response = fetch_one(fetcher, site.url("/huge.html"))
    assert response.text is None
    assert "size cap" in response.error and "200000" in response.error
    # The same page fits under a larger cap.
    bigger = FetchConfig(**{**CONFIG.__dict__, "max_bytes": 1_000_000})
    assert fetch_one(fetcher, site.url("/huge.html"), bigger).error is None


def test_malformed_html_is_still_parsed(fetcher, site):
    response = fetch_one(fetcher, site.url("/docs/malformed.html"))
    assert response.error is None
    title_hint, body = main_content(response.text)
    assert title_hint == "Broken page"
    title, sections = split_sections(html_blocks(body), title_hint, "malformed")
    assert title == "Broken Page"
    assert any("gasket" in s.content for s in sections)


def test_github_blob_url_is_rewritten_to_the_raw_file(site_fetcher, site):
    blob = site.url("/acme/widget/blob/main/CONTRIBUTING.md")
    response = fetch_one(site_fetcher, blob)
    assert response.error is None
    assert response.url == blob
    assert response.final_url == site.url("/raw/acme/widget/main/CONTRIBUTING.md")
    assert response.redirects == [response.final_url]
    assert response.format == "markdown"
    assert response.text.startswith("# Contributing")
    assert "GitHub chrome" not in response.text


def test_rewrite_github_blob_leaves_other_urls_alone():
    fetcher = Fetcher(CONFIG)
    assert (
        fetcher.rewrite_github_blob("https://github.com/owner/repo/blob/main/docs/guide.md")
        == "https://raw.githubusercontent.com/owner/repo/main/docs/guide.md"
    )
    for url in (
        "https://github.com/owner/repo",
        "https://github.com/owner/repo/tree/main/docs",
        "https://raw.githubusercontent.com/owner/repo/main/README.md",
        "https://example.org/owner/repo/blob/main/README.md",
    ):
        assert fetcher.rewrite_github_blob(url) == url


def test_file_url_inside_the_roots_is_read(fetcher, tmp_path: Path):
    root = tmp_path / "project"
    (root / "docs").mkdir(parents=True)
    page = root / "docs" / "notes.md"
    page.write_text("# Notes\n\nLocal notes about sprockets.\n")
    response = fetch_one(fetcher, page.as_uri(), roots=[root])
    assert response.error is None
    assert response.status == 200
    assert response.format == "markdown"
    assert "Local notes about sprockets." in response.text
    assert response.last_modified


def test_file_url_outside_the_roots_is_refused(fetcher, tmp_path: Path):
    root = tmp_path / "project"
    root.mkdir()
    secret = tmp_path / "secret.md"
    secret.write_text("# Secret\n")
    response = fetch_one(fetcher, secret.as_uri(), roots=[root])
    assert response.text is None
    assert "outside the allowed file roots" in response.error
    # A path that climbs out of the root with .. is refused too.
    climbing = f"file://{root}/../secret.md"
    assert "outside the allowed file roots" in fetch_one(fetcher, climbing, roots=[root]).error
    # And a symlink inside the root that points outside it.
    (root / "link.md").symlink_to(secret)
    linked = fetch_one(fetcher, (root / "link.md").as_uri(), roots=[root])
    assert "outside the allowed file roots" in linked.error


def test_missing_file_is_an_error(fetcher, tmp_path: Path):
    response = fetch_one(fetcher, (tmp_path / "nope.md").as_uri(), roots=[tmp_path])
    assert response.text is None
    assert "no such file" in response.error
    assert "fetch.file_roots" in response.error  # the hint a moved pack folder needs


def test_connection_refused_is_a_clear_error(fetcher):
    started = time.perf_counter()
    response = fetch_one(fetcher, "http://127.0.0.1:9/")
    assert response.text is None
    assert response.error.startswith("connection failed")
    assert time.perf_counter() - started < 10


def test_private_address_is_refused_unless_allowed(fetcher, site):
    strict = FetchConfig(timeout_s=1.0, retries=0)
    page = site.url("/docs/index.html")
    for url in (page, page.replace("127.0.0.1", "localhost")):
        response = fetch_one(fetcher, url, strict)
        assert response.text is None
        assert "127.0.0.1" in response.error
        assert "allow_private_hosts" in response.error


def test_private_refusal_sends_no_request(fetcher, site):
    strict = FetchConfig(timeout_s=1.0, retries=0)
    response = fetch_one(fetcher, site.url("/docs/private-probe.html"), strict)
    assert "allow_private_hosts" in response.error
    assert "/docs/private-probe.html" not in site.hits


def test_fetch_all_keeps_the_input_order(fetcher, site):
    paths = [
        "/docs/guide.html",
        "/docs/nope.html",
        "/docs/readme.md",
        "/logo.png",
        "/docs/index.html",
    ]
    urls = [site.url(p) for p in paths]
    responses = fetcher.fetch_all(urls, CONFIG, [])
    assert [r.url for r in responses] == urls
    assert [r.error is None for r in responses] == [True, False, True, False, True]


def test_conditional_request_sends_the_stored_validators_and_304_has_no_body(fetcher, site):
    path = "/live/conditional/fetcher.html"
    first = fetch_one(fetcher, site.url(path))
    assert first.status == 200 and first.etag and first.last_modified and not first.not_modified
    [again] = fetcher.fetch_all(
        [site.url(path)], CONFIG, [], {site.url(path): Validators(first.etag, first.last_modified)}
    )
    assert again.status == 304 and again.not_modified and again.error is None
    assert again.text is None and again.etag == first.etag
    assert site.conditional[path][-1] == {
        "If-None-Match": first.etag,
        "If-Modified-Since": first.last_modified,
    }
    # Last-Modified alone is enough for a server that honours it.
    [by_date] = fetcher.fetch_all(
        [site.url(path)], CONFIG, [], {site.url(path): Validators(None, first.last_modified)}
    )
    assert by_date.status == 304 and by_date.not_modified


def test_a_changed_page_answers_a_stale_etag_with_the_new_body(fetcher, site):
    path = "/live/changing/fetcher.html"
    first = fetch_one(fetcher, site.url(path))
    site.revisions[path] = 7
    [again] = fetcher.fetch_all(
        [site.url(path)], CONFIG, [], {site.url(path): Validators(first.etag, None)}
    )
    assert again.status == 200 and not again.not_modified
    assert "revision 7" in again.text and again.etag != first.etag


class KeepAliveHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, as documentation hosts serve: /page/N answers its ETag's
    If-None-Match with 304, anything else 404 with a small page; connections are counted."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        with self.server.owner.lock:
            self.server.owner.hits["connections"] = self.server.owner.hits.get("connections", 0) + 1

    def do_GET(self) -> None:
        self.server.owner.count("requests")
        if not self.path.startswith("/page/"):
            body = b"<html><body>No such page.</body></html>"
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        etag = f'"{self.path.rsplit("/", 1)[1]}"'
        if self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.end_headers()
            return
        body = f"<html><body><p>Page {etag}.</p></body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_rebuilds_conditional_requests_share_kept_alive_connections(fetcher):
    """A 304 or an error page leaves no body to read, so its connection serves the next
    request: a rebuild asking about every page opens a connection per fetching thread, not one
    per page (against a real site, a TLS handshake each)."""
    one_at_a_time = FetchConfig(**{**CONFIG.__dict__, "max_workers": 1})
    with LoopbackServer(KeepAliveHandler) as server:
        urls = [server.url(f"/page/{n}") for n in range(20)] + [server.url("/gone.html")]
        first = fetcher.fetch_all(urls, one_at_a_time, [])
        assert [r.status for r in first] == [200] * 20 + [404]
        stored = {r.url: Validators(r.etag, None) for r in first if r.etag}
        connections = server.hits["connections"]
        again = fetcher.fetch_all(urls, one_at_a_time, [], stored)
        assert [r.not_modified for r in again] == [True] * 20 + [False]
        assert server.hits["requests"] == 42
        assert server.hits["connections"] - connections <= 1


def test_file_url_is_not_modified_while_mtime_and_size_match(fetcher, tmp_path: Path):
    page = tmp_path / "notes.md"
    page.write_text("# Notes\n\nFirst text.\n")
    first = fetch_one(fetcher, page.as_uri(), roots=[tmp_path])
    assert first.status == 200 and first.etag.startswith('"file-')
    stored = {page.as_uri(): Validators(first.etag, first.last_modified)}
    [same] = fetcher.fetch_all([page.as_uri()], CONFIG, [tmp_path], stored)
    assert same.status == 304 and same.not_modified and same.text is None
    page.write_text("# Notes\n\nSecond text.\n")
    os.utime(page, ns=(1, 1))  # a different mtime, whatever the clock's resolution
    [changed] = fetcher.fetch_all([page.as_uri()], CONFIG, [tmp_path], stored)
    assert changed.status == 200 and "Second text." in changed.text


def test_per_host_delay_spaces_requests_to_one_host(fetcher, site):
    urls = [site.url(f"/docs/{name}") for name in ("index.html", "guide.html", "readme.md")]
    polite = FetchConfig(**{**CONFIG.__dict__, "per_host_delay_s": 0.3})
    started = time.perf_counter()
    responses = fetcher.fetch_all(urls, polite, [])
    assert all(r.error is None for r in responses)
    assert time.perf_counter() - started >= 2 * 0.3  # three request starts, 0.3 s apart


def test_host_throttle_is_per_host():
    throttle = HostThrottle(0.5)
    started = time.perf_counter()
    for url in ("http://a.example/1", "http://b.example/1", "http://c.example/1"):
        throttle.wait(url)
    assert time.perf_counter() - started < 0.4  # three hosts: nobody waits
    throttle.wait("http://a.example/2")
    assert time.perf_counter() - started >= 0.5


def test_fetch_all_never_raises_on_an_unparseable_url(fetcher):
    responses = fetcher.fetch_all(["http://[::1/broken"], CONFIG, [])
    assert len(responses) == 1 and responses[0].error


def test_page_format():
    assert page_format("text/html; charset=utf-8", "https://x.org/a") == "html"
    raw = "https://raw.githubusercontent.com/o/r/main/README.md"
    assert page_format("text/plain", raw) == "markdown"
    assert page_format("text/markdown", "https://x.org/notes") == "markdown"
    assert page_format("text/plain", "https://x.org/notes.txt") == "text"
    assert page_format(None, "file:///docs/page.html") == "html"
    assert page_format("image/png", "https://x.org/logo.png") is None
    assert page_format("application/pdf", "https://x.org/paper") == "pdf"
    assert page_format("application/octet-stream", "https://x.org/paper.pdf") == "pdf"
    assert page_format("application/octet-stream", "https://x.org/paper.zip") is None


def test_decode():
    assert decode("café".encode("latin-1"), "text/html; charset=latin-1").text == "café"
    assert decode("café".encode(), "text/html").text == "café"
    assert decode("café".encode("cp1252"), None).text == "café"
    with pytest.raises(FetchError, match="binary"):
        decode(b"GIF89a\x00\x00", "text/plain")


@pytest.fixture(scope="module")
def hostile():
    with LoopbackServer(HostileHandler) as server:
        yield server


@pytest.mark.parametrize("path", ["/trickle-body.html", "/trickle-headers.html"])
def test_a_trickling_server_is_cut_off_at_the_fetch_deadline(fetcher, hostile, path):
    # Every byte arrives well within timeout_s, so only the overall deadline can stop it.
    config = FetchConfig(**{**CONFIG.__dict__, "deadline_s": 1.5})
    started = time.perf_counter()
    response = fetch_one(fetcher, hostile.url(path), config)
    elapsed = time.perf_counter() - started
    assert response.text is None
    assert response.error == "timed out: no complete answer within the fetch deadline of 1.5 s"
    assert elapsed < 3.0


def test_many_fetches_share_one_deadline_watchdog_that_still_cuts_off_a_trickle(
    fetcher, hostile, site
):
    import threading

    config = FetchConfig(**{**CONFIG.__dict__, "deadline_s": 1.5, "max_workers": 4})
    pages = fetcher.fetch_all(
        [site.url(f"/docs/index.html?copy={i}") for i in range(40)], config, []
    )
    assert all(page.text for page in pages), [page.error for page in pages if not page.text]
    # Forty finished fetches left their deadlines with one watchdog, not a thread each; a
    # fetch after them, from a server that trickles, is still cut off at its own deadline.
    started = time.perf_counter()
    response = fetch_one(fetcher, hostile.url("/trickle-body.html"), config)
    assert response.error == "timed out: no complete answer within the fetch deadline of 1.5 s"
    assert time.perf_counter() - started < 3.0
    watchdogs = [t for t in threading.enumerate() if t.name == "kpack-fetch-deadlines"]
    assert len(watchdogs) == 1


def test_the_default_deadline_is_the_timeout_of_every_attempt(fetcher, hostile):
    config = FetchConfig(**{**CONFIG.__dict__, "timeout_s": 0.5, "retries": 1})
    started = time.perf_counter()
    response = fetch_one(fetcher, hostile.url("/trickle-body.html"), config)
    assert "fetch deadline of 1 s" in response.error
    assert time.perf_counter() - started < 2.5


def resolve_as(monkeypatch, name: str, *answers: str) -> list[str]:
    """Make ``name`` resolve to ``answers[0]``, then to ``answers[1]``... (the last one for
    good), in this process; other names resolve as usual. Returns the log of lookups."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host == name:
            asked.append(host)
            host = answers[min(len(asked), len(answers)) - 1]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def test_dns_rebinding_never_reaches_the_private_address(fetcher, site, monkeypatch):
    # The name answers a public address first and loopback afterwards: a check that resolves
    # separately from the connection passes, and the connection reaches the loopback site.
    asked = resolve_as(monkeypatch, "docs.rebinding.test", "93.184.216.34", "127.0.0.1")
    port = site.httpd.server_address[1]
    strict = FetchConfig(timeout_s=1.0, retries=0)
    response = fetch_one(fetcher, f"http://docs.rebinding.test:{port}/docs/rebound.html", strict)
    assert response.text is None and response.error
    assert "/docs/rebound.html" not in site.hits
    assert asked == ["docs.rebinding.test"]  # resolved once; the checked address was used


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "169.254.169.254",
        "100.64.0.1",  # shared address space (carrier-grade NAT)
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fd00::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
    ],
)
def test_an_address_that_is_not_globally_routable_is_refused(fetcher, site, monkeypatch, address):
    resolve_as(monkeypatch, "sneaky.test", address)
    port = site.httpd.server_address[1]
    strict = FetchConfig(timeout_s=1.0, retries=0)
    response = fetch_one(fetcher, f"http://sneaky.test:{port}/docs/sneaky.html", strict)
    assert response.error == (
        f"refusing address {address} of 'sneaky.test': not globally routable (to allow it, "
        'kg_config.json: {"fetch": {"allow_private_hosts": true}})'
    )
    assert "/docs/sneaky.html" not in site.hits


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700::1111", True),
        ("64:ff9b::808:808", True),  # NAT64 of a public address (DNS64 networks)
        ("::ffff:8.8.8.8", True),
        ("100.64.0.1", False),
        ("64:ff9b::c0a8:1", False),  # NAT64 of 192.168.0.1
        ("2002:c0a8:1::", False),  # 6to4 of 192.168.0.1
        ("ff02::1", False),
    ],
)
def test_is_public_address(address, public):
    assert is_public_address(ipaddress.ip_address(address)) is public


@pytest.mark.parametrize("path", ["/utf16-bom.html", "/utf16-charset.html"])
def test_a_utf16_page_is_decoded_not_refused_as_binary(fetcher, hostile, path):
    response = fetch_one(fetcher, hostile.url(path))
    assert response.error is None, response.error
    assert "the Zürich gasket" in response.text


def test_decode_by_byte_order_mark_and_wide_charset():
    text = "Zürich gasket"
    assert decode(text.encode("utf-16"), None).text == text
    assert decode(text.encode("utf-16-be"), "text/html; charset=UTF-16BE").text == text
    assert decode(text.encode("utf-8-sig"), "text/html").text == text
    assert decode(text.encode("utf-32"), None).text == text


def test_through_a_proxy_the_name_is_still_checked_before_the_request(fetcher, site, monkeypatch):
    # The loopback site stands in for an HTTP proxy from the environment: it would receive
    # the request for the private name, and the proxy would resolve it.
    resolve_as(monkeypatch, "intranet.test", "10.0.0.8")
    monkeypatch.setenv("HTTP_PROXY", site.base)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    strict = FetchConfig(timeout_s=1.0, retries=0)
    response = fetch_one(fetcher, "http://intranet.test/wiki.html", strict)
    assert "refusing address 10.0.0.8 of 'intranet.test'" in response.error
    assert not any("wiki.html" in path for path in site.hits)
