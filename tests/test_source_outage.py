"""A source outage on a rebuild never guts a pack: the pages a sitemap, a robots.txt or a crawl
seed brought in last time are kept from the last good fetch, and the failure is counted."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kpack.config import CrawlConfig, FetchConfig
from kpack.graphdb import opened
from kpack.ingest.crawl import crawl
from kpack.ingest.fetch import Fetcher
from kpack.packs import current_version, parse_urls
from tests.conftest import TEST_FETCH, build, write_pack
from tests.sources_site import OUTAGE, Answer, SourcesSite, serve


@pytest.fixture
def site():
    with serve(SourcesSite(articles=4)) as served:
        yield served


def published_urls(folder: Path) -> set[str]:
    with opened(current_version(folder) / "pack.db", read_only=True) as conn:
        return {row[0] for row in conn.execute("MATCH (a:Article) RETURN a.url").get_all()}


def fetched_states(workspace: Path, pack: str) -> dict[str, str]:
    table = pq.read_table(workspace / "storage" / "fetched_pages" / f"{pack}.parquet")
    return {row["url"]: row["expansion_state"] for row in table.to_pylist() if not row["error"]}


OVERSIZED_SITEMAP = Answer(
    content_type="application/xml",
    body=b'<?xml version="1.0"?><urlset>' + b"<!-- padding -->" * 20_000 + b"</urlset>",
)


@pytest.mark.parametrize(
    ("line", "broken", "answer", "error"),
    [
        ("/docs/sitemap.xml", "/docs/sitemap.xml", OUTAGE, "sitemap: HTTP 503"),
        ("/docs/sitemap.xml", "/docs/sitemap.xml", OVERSIZED_SITEMAP, "sitemap: page exceeds"),
        ("/docs/ depth=1", "/docs/", OUTAGE, "HTTP 503"),
        ("/docs/ depth=1", "/robots.txt", OUTAGE, "robots.txt: HTTP 503"),
    ],
    ids=["sitemap-503", "sitemap-over-cap", "seed-503", "robots-503"],
)
def test_a_rebuild_during_an_outage_keeps_the_pages_and_reports_the_failure(
    workspace, site, line, broken, answer, error
):
    folder = write_pack(workspace, "outage", [site.base + line], {"fetch": TEST_FETCH})
    first = build(workspace, "outage")
    assert first.outcome == "published", first.cause
    before = published_urls(folder)
    assert {site.url(p) for p in site.article_paths()} <= before

    site.answers[broken] = answer
    again = build(workspace, "outage")
    assert again.outcome == "published", again.cause
    assert published_urls(folder) == before  # not one article lost
    [failure] = again.manifest["sources"]["failures"]
    assert failure["url"] == site.url(broken) and failure["error"].startswith(error)
    assert failure["line"] == 1
    meta = again.stage_metadata["fetched_pages"]
    assert meta["failed"] == 1 and meta["crawl_kept"] >= len(site.article_paths())
    kept = {url for url, state in fetched_states(workspace, "outage").items() if state == "kept"}
    assert {site.url(p) for p in site.article_paths()} <= kept


def test_a_sitemap_back_from_an_outage_refreshes_its_pages(workspace, site):
    folder = write_pack(
        workspace, "recovers", [site.url("/docs/sitemap.xml")], {"fetch": TEST_FETCH}
    )
    assert build(workspace, "recovers").outcome == "published"
    site.answers["/docs/sitemap.xml"] = OUTAGE
    assert build(workspace, "recovers").outcome == "published"
    del site.answers["/docs/sitemap.xml"]
    site.answers["/docs/article-2.html"] = Answer(body=b"<h1>Article 2</h1><p>Rewritten.</p>")
    back = build(workspace, "recovers")
    assert back.outcome == "published", back.cause
    assert back.manifest["sources"]["failures"] == []
    assert back.manifest["changes"]["changed"] == 1
    assert set(fetched_states(workspace, "recovers").values()) == {"discovered"}
    assert len(published_urls(folder)) == 4


def test_an_outage_past_the_failed_share_publishes_nothing(workspace, site):
    config = {"fetch": TEST_FETCH, "max_failed_fraction": 0.1}
    folder = write_pack(workspace, "strict", [site.url("/docs/sitemap.xml")], config)
    first = build(workspace, "strict")
    assert first.outcome == "published"
    version = current_version(folder)

    site.answers["/docs/sitemap.xml"] = OUTAGE
    again = build(workspace, "strict")
    assert again.outcome == "failed"
    assert "failed_url_share" in again.failed_checks
    assert "sitemap: HTTP 503" in again.cause
    assert current_version(folder) == version and len(published_urls(folder)) == 4


def test_a_pack_whose_only_line_is_an_unreadable_sitemap_fails_with_a_clear_message(
    workspace, site
):
    site.answers["/docs/sitemap.xml"] = Answer(content_type="application/xml", body=b"<html>no")
    write_pack(workspace, "unreadable", [site.url("/docs/sitemap.xml")], {"fetch": TEST_FETCH})
    result = build(workspace, "unreadable")
    assert result.outcome == "failed"
    assert "1/1 URLs failed" in result.cause
    assert "sitemap: not a readable sitemap" in result.cause


def test_a_sitemap_that_lists_no_page_fails_with_a_clear_message(workspace, site):
    site.answers["/docs/sitemap.xml"] = Answer(
        content_type="application/xml",
        body=b"<urlset><url><loc>http://elsewhere.invalid/a</loc></url></urlset>",
    )
    write_pack(workspace, "empty", [site.url("/docs/sitemap.xml")], {"fetch": TEST_FETCH})
    result = build(workspace, "empty")
    assert result.outcome == "failed"
    assert result.cause == "pack 'empty': its urls.txt led to no page to fetch"


def crawl_states(site: SourcesSite, line: str, stored: list[dict] = ()) -> dict[str, tuple]:
    """(expansion state, error) of each row of one crawl, by URL path."""
    sources, _ = parse_urls(site.base + line, Path("."))
    config = FetchConfig(**{**TEST_FETCH, "timeout_s": 0.3, "retries": 1})
    with Fetcher(config, backoff_s=0.05) as fetcher:
        rows, _ = crawl(
            sources, fetcher, CrawlConfig(), {r["url"]: r for r in stored}, datetime.now(UTC)
        )
    return {r["url"].removeprefix(site.base): r for r in rows}


def test_a_sitemap_that_times_out_keeps_its_pages_and_one_that_is_gone_does_not(site):
    first = crawl_states(site, "/docs/sitemap.xml")
    assert set(first) == set(site.article_paths())
    site.answers["/docs/sitemap.xml"] = Answer(content_type="application/xml", delay_s=1.0)
    slow = crawl_states(site, "/docs/sitemap.xml", list(first.values()))
    assert "timed out" in slow["/docs/sitemap.xml"]["error"]
    assert {p: r["expansion_state"] for p, r in slow.items() if r["error"] is None} == {
        p: "kept" for p in site.article_paths()
    }
    # 404: the sitemap is gone, and so are its pages (the failure is still counted).
    site.answers["/docs/sitemap.xml"] = Answer(404, "text/plain", b"no sitemap here")
    gone = crawl_states(site, "/docs/sitemap.xml", list(first.values()))
    assert list(gone) == ["/docs/sitemap.xml"]
    assert gone["/docs/sitemap.xml"]["error"] == "sitemap: HTTP 404 Not Found"


def test_a_pack_none_of_whose_hosts_answer_says_the_build_needs_the_internet(workspace, site):
    """What a new user meets building go-expert offline: every host unreachable (a name that
    does not resolve, a port where nothing listens) is named as that, once."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        nothing_there = f"http://127.0.0.1:{closed.getsockname()[1]}/docs/"
    urls = ["https://docs.invalid/guide.html", nothing_there, site.url("/docs/sitemap.xml")]
    site.answers["/docs/sitemap.xml"] = Answer(404, "text/plain", b"not found")
    write_pack(workspace, "offline", urls[:2], {"fetch": TEST_FETCH})
    result = build(workspace, "offline")
    assert result.outcome == "failed"
    assert result.cause.startswith("check failed_url_share failed 2/2 URLs failed")
    assert result.cause.endswith(
        "no host of this pack could be reached: is this machine offline? Building a pack whose "
        "pages are on the web needs internet access"
    )
    # A host that answers, even with an error, is no sign of an offline machine.
    write_pack(workspace, "offline", urls, {"fetch": TEST_FETCH})
    result = build(workspace, "offline")
    assert result.outcome == "failed" and "offline" not in result.cause
