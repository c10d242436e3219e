"""The crawl reads the web as its standards say (robots.txt by RFC 9309, sitemaps as XML,
canonical URLs, declared charsets, bounded retries), against a loopback site."""

from __future__ import annotations

import gzip
import time
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from urllib.robotparser import RobotFileParser

import pytest

from kpack.config import CrawlConfig, FetchConfig
from kpack.ingest.crawl import CrawlReport, crawl
from kpack.ingest.fetch import USER_AGENT, Fetcher
from kpack.packs import parse_urls
from tests.conftest import TEST_FETCH
from tests.sources_site import OUTAGE, Answer, SourcesSite, article_html, serve, urlset

FETCH = FetchConfig(**TEST_FETCH)


@pytest.fixture
def site():
    with serve(SourcesSite(articles=4)) as served:
        yield served


def run_crawl(
    site: SourcesSite, urls_txt: str, fetch: FetchConfig = FETCH
) -> tuple[dict[str, dict], CrawlReport]:
    """The rows of a crawl by URL path, and its report."""
    sources, problems = parse_urls(urls_txt, Path("."))
    assert problems == []
    with Fetcher(fetch, backoff_s=0.05) as fetcher:
        rows, report = crawl(sources, fetcher, CrawlConfig(), {}, datetime.now(UTC))
    return {r["url"].removeprefix(site.base): r for r in rows}, report


def links_page(*hrefs: str) -> Answer:
    anchors = "".join(f'<li><a href="{href}">link</a></li>' for href in hrefs)
    return Answer(body=f"<html><body><main><h1>Docs</h1><ul>{anchors}</ul></main>".encode())


# robots.txt --------------------------------------------------------------------------------

WILDCARD_ROBOTS = """User-agent: *
Disallow: /

User-agent: knowledge-packs
Disallow: /docs/
Allow: /docs/article-
Disallow: /docs/article-*3.html
"""


def test_robots_wildcards_and_the_longest_match_decide_as_rfc_9309_says(site):
    site.robots = WILDCARD_ROBOTS
    rows, report = run_crawl(site, f"{site.base}/docs/ depth=1")
    # The longer Allow beats "Disallow: /docs/"; the wildcard rule refuses article 3.
    assert set(rows) == {
        "/docs/",
        "/docs/article-1.html",
        "/docs/article-2.html",
        "/docs/article-4.html",
    }
    assert report.robots_refused == [site.url("/docs/article-3.html")]
    assert "/docs/article-3.html" not in site.hits
    # The standard library's parser (first match, no wildcards) would have refused them all.
    stdlib = RobotFileParser()
    stdlib.parse(WILDCARD_ROBOTS.splitlines())
    assert not any(stdlib.can_fetch(USER_AGENT, site.base + p) for p in site.article_paths())


def test_a_crawl_delay_spaces_the_requests_to_its_host(site):
    site.robots = "User-agent: *\nCrawl-delay: 0.3\n"
    rows, _ = run_crawl(site, f"{site.base}/docs/ depth=1")
    assert len(rows) == 5
    starts = sorted(site.started[p][0] for p in site.article_paths())
    assert min(b - a for a, b in pairwise(starts)) >= 0.25  # per_host_delay_s is 0


def test_the_sitemap_lines_of_robots_txt_bring_pages_no_link_reaches(site):
    site.answers["/docs/"] = links_page("article-1.html")
    site.answers["/docs/hidden.html"] = Answer(body=article_html(9).encode())
    site.answers["/maps/pages.xml"] = Answer(
        content_type="application/xml",
        body=urlset(
            site.base, ["/docs/hidden.html", "/docs/article-1.html", "/blog/off.html"]
        ).encode(),
    )
    site.robots = (
        f"User-agent: *\nAllow: /\nSitemap: {site.base}/maps/pages.xml\n"
        "Sitemap: http://elsewhere.invalid/sitemap.xml\n"
    )
    rows, report = run_crawl(site, f"{site.base}/docs/ depth=1")
    assert set(rows) == {"/docs/", "/docs/article-1.html", "/docs/hidden.html"}
    assert rows["/docs/hidden.html"]["expansion_depth"] == 1
    assert report.sitemaps == 1 and site.hits["/docs/article-1.html"] == 1
    assert "/blog/off.html" not in site.hits


def test_an_unreadable_robots_txt_refuses_the_crawl_and_counts_as_a_failed_source(site):
    site.answers["/robots.txt"] = OUTAGE
    rows, report = run_crawl(site, f"{site.base}/docs/ depth=1")
    assert set(rows) == {"/docs/", "/robots.txt"}
    assert rows["/robots.txt"]["error"] == "robots.txt: HTTP 503 Service Unavailable"
    assert report.failed_sources == 1 and report.pages == 1
    assert not any(p in site.hits for p in site.article_paths())


def test_a_robots_txt_that_is_missing_allows_everything(site):
    site.answers["/robots.txt"] = Answer(404, "text/plain", b"no such file")
    rows, report = run_crawl(site, f"{site.base}/docs/ depth=1")
    assert len(rows) == 5 and report.failed_sources == 0


# Sitemaps ----------------------------------------------------------------------------------


def test_a_gzipped_sitemap_is_read(site):
    rows, report = run_crawl(site, f"{site.base}/docs/sitemap.xml.gz")
    assert set(rows) == set(site.article_paths()) and report.sitemaps == 1


def test_a_sitemap_sent_with_gzip_content_encoding_is_read(site):
    site.answers["/docs/sitemap.xml"] = Answer(
        content_type="application/xml",
        body=gzip.compress(site.sitemap().encode()),
        headers=(("Content-Encoding", "gzip"),),
    )
    rows, _ = run_crawl(site, f"{site.base}/docs/sitemap.xml")
    assert set(rows) == set(site.article_paths())


@pytest.mark.parametrize("encoded", [False, True], ids=["xml.gz", "content-encoding"])
def test_a_gzipped_sitemap_that_unpacks_past_the_size_cap_is_a_failed_source(site, encoded):
    bomb = gzip.compress(b"<urlset>" + b" " * 20_000_000 + b"</urlset>")
    assert len(bomb) < 50_000
    path = "/docs/sitemap.xml" if encoded else "/docs/sitemap.xml.gz"
    site.answers[path] = Answer(
        content_type="application/xml" if encoded else "application/gzip",
        body=bomb,
        headers=(("Content-Encoding", "gzip"),) if encoded else (),
    )
    rows, report = run_crawl(site, site.url(path))
    assert list(rows) == [path] and report.failed_sources == 1
    assert "exceeds the size cap of 200000 bytes" in rows[path]["error"]


def test_cdata_entities_and_an_index_whose_children_are_checked_against_the_scope(site):
    site.answers["/docs/sitemap_index.xml"] = Answer(
        content_type="application/xml",
        body=f"""<?xml version="1.0" encoding="UTF-8"?>
<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <sitemap><loc><![CDATA[ {site.base}/docs/sitemap-a.xml ]]></loc></sitemap>
  <sitemap><loc>{site.base}/other/sitemap.xml</loc></sitemap>
  <sitemap><loc>http://elsewhere.invalid/docs/sitemap.xml</loc></sitemap>
</sitemapindex>""".encode(),
    )
    site.answers["/docs/sitemap-a.xml"] = Answer(
        content_type="text/xml",
        body=f"""<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <url><loc><![CDATA[{site.base}/docs/article-1.html]]></loc></url>
  <url><loc>{site.base}/docs/article-2.html?a=1&amp;b=2</loc></url>
</urlset>""".encode(),
    )
    rows, report = run_crawl(site, f"{site.base}/docs/sitemap_index.xml")
    assert set(rows) == {"/docs/article-1.html", "/docs/article-2.html?a=1&b=2"}
    assert report.sitemaps == 2 and report.off_scope == 2
    assert "/other/sitemap.xml" not in site.hits
    assert any("/other/sitemap.xml is outside" in p for p in report.problems)


def test_a_sitemap_with_entity_expansion_is_refused_as_unreadable(site):
    site.answers["/docs/sitemap.xml"] = Answer(
        content_type="application/xml",
        body=b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
        b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><urlset><url><loc>&b;</loc></url></urlset>',
    )
    rows, _ = run_crawl(site, f"{site.base}/docs/sitemap.xml")
    assert rows["/docs/sitemap.xml"]["error"].startswith(
        "sitemap: not a readable sitemap (EntitiesForbidden"
    )


# URLs --------------------------------------------------------------------------------------


def test_percent_encoded_and_dot_segment_duplicates_are_fetched_once(site):
    site.answers["/docs/a~b.html"] = Answer(body=article_html(7).encode())
    site.answers["/docs/"] = links_page(
        "a%7Eb.html",
        "a~b.html",
        f"{site.base}/docs/x/../article-1.html",
        "article-1.html",
        "./article-1.html#intro",
        "http://[::1/broken",  # unparseable: skipped, the crawl goes on
    )
    rows, report = run_crawl(site, f"{site.base}/docs/ depth=1")
    assert set(rows) == {"/docs/", "/docs/a~b.html", "/docs/article-1.html"}
    assert site.hits["/docs/a~b.html"] == 1 and "/docs/a%7Eb.html" not in site.hits
    assert site.hits["/docs/article-1.html"] == 1
    assert report.pages == 3


def test_urls_txt_lines_that_differ_only_in_encoding_are_duplicates(tmp_path):
    text = (
        "https://docs.example.org/a%7Eb.html\n"
        "https://docs.example.org/a~b.html\n"
        "https://docs.example.org/x/../a~b.html\n"
        "https://BÜCHER.example/guide\n"
        "https://xn--bcher-kva.example/guide\n"
    )
    sources, problems = parse_urls(text, tmp_path)
    assert [s.line_no for s in sources] == [1, 4]
    assert [(p.line_no, p.reason) for p in problems] == [
        (2, "duplicate of line 1"),
        (3, "duplicate of line 1"),
        (5, "duplicate of line 4"),
    ]


# Charsets ----------------------------------------------------------------------------------

LATIN = "<h1>Café</h1><p>The Zürich gasket costs 5 €uro-cents… no: 5 Öre.</p>"


@pytest.mark.parametrize(
    "declaration",
    [
        '<meta charset="iso-8859-1">',
        '<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1">',
    ],
)
def test_a_page_declaring_its_charset_in_a_meta_tag_is_decoded_by_it(site, declaration):
    text = LATIN.replace("€uro-cents… no: 5 ", "")
    site.answers["/docs/latin.html"] = Answer(
        content_type="text/html",  # no charset parameter
        body=f"<html><head>{declaration}</head><body>{text}</body></html>".encode("latin-1"),
    )
    with Fetcher(FETCH) as fetcher:
        response = fetcher.fetch(site.url("/docs/latin.html"))
    assert response.error is None
    assert "Café" in response.text and "Zürich gasket" in response.text and "Öre" in response.text


def test_the_content_type_charset_wins_over_a_meta_tag(site):
    site.answers["/docs/utf8.html"] = Answer(
        content_type="text/html; charset=utf-8",
        body='<meta charset="iso-8859-1"><p>Zürich</p>'.encode(),
    )
    with Fetcher(FETCH) as fetcher:
        assert "Zürich" in fetcher.fetch(site.url("/docs/utf8.html")).text


# Retries -----------------------------------------------------------------------------------


def test_a_server_error_is_retried_as_configured_then_reported(site):
    site.answers["/docs/down.html"] = OUTAGE
    with Fetcher(FETCH, backoff_s=0.05) as fetcher:
        response = fetcher.fetch(site.url("/docs/down.html"))
    assert response.error == "HTTP 503 Service Unavailable"
    assert site.hits["/docs/down.html"] == FETCH.retries + 1


def test_retry_after_is_honoured_within_the_deadline(site):
    site.answers["/docs/busy.html"] = Answer(503, "text/plain", b"busy", (("Retry-After", "1"),))
    config = FetchConfig(**{**TEST_FETCH, "retries": 1})
    with Fetcher(config, backoff_s=0.05) as fetcher:
        fetcher.fetch(site.url("/docs/busy.html"))
    first, second = site.started["/docs/busy.html"]
    assert second - first >= 0.95
    # A Retry-After past the deadline is cut at the deadline.
    site.answers["/docs/busy.html"] = Answer(503, "text/plain", b"busy", (("Retry-After", "30"),))
    config = FetchConfig(**{**TEST_FETCH, "retries": 5, "deadline_s": 1.0})
    started = time.monotonic()
    with Fetcher(config, backoff_s=0.05) as fetcher:
        response = fetcher.fetch(site.url("/docs/busy.html"))
    assert response.error is not None and time.monotonic() - started < 2.0
