"""Crawling from seed lines and sitemaps, against a generated docs site on 127.0.0.1."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import partial
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from cli.main import main
from kpack.config import CrawlConfig, FetchConfig, parse_config
from kpack.graphdb import opened
from kpack.ingest.crawl import CrawlReport, crawl
from kpack.ingest.fetch import Fetcher
from kpack.packs import PackError, Source, current_version, page_key, parse_urls
from tests.conftest import TEST_FETCH, build, write_pack
from tests.docsite import DocSite, serve
from tests.loopback import LoopbackServer
from tests.test_build_report import summary_rows

FETCH = FetchConfig(**TEST_FETCH)


@pytest.fixture
def docsite():
    with serve(DocSite(chapters=3, pages_per_chapter=3)) as site:
        yield site


def run_crawl(
    site: DocSite, urls_txt: str, config: CrawlConfig | None = None, stored: list[dict] = ()
) -> tuple[dict[str, dict], CrawlReport]:
    """The rows of a crawl by URL path, and its report."""
    sources, problems = parse_urls(urls_txt, Path("."))
    assert problems == []
    with Fetcher(FETCH) as fetcher:
        rows, report = crawl(
            sources,
            fetcher,
            config or CrawlConfig(),
            {r["url"]: r for r in stored},
            datetime.now(UTC),
        )
    return {r["url"].removeprefix(site.base): r for r in rows}, report


def keys(site: DocSite, paths) -> set[str]:
    return {page_key(site.base + p) for p in paths}


def test_seed_lines_parse_with_their_depth_and_bad_options_are_named(tmp_path: Path):
    text = (
        "https://docs.example.org/guide/ depth=2\n"
        "https://docs.example.org/api.html\n"
        "https://docs.example.org/a depth=two\n"
        "https://docs.example.org/b scope=all\n"
        "https://docs.example.org/c https://docs.example.org/d\n"
        "https://docs.example.org/e depth=99\n"
    )
    sources, problems = parse_urls(text, tmp_path)
    assert sources == [
        Source(1, "https://docs.example.org/guide/", 2),
        Source(2, "https://docs.example.org/api.html", None),
    ]
    assert [(p.line_no, p.reason) for p in problems] == [
        (3, "depth must be a whole number from 0 to 20, got 'two'"),
        (4, "unknown option 'scope' (a seed line is 'URL depth=N')"),
        (5, "a line holds one URL and no spaces (write a space in a path as %20)"),
        (6, "depth must be a whole number from 0 to 20, got '99'"),
    ]


def test_page_key_ignores_fragments_trailing_slashes_and_index_pages():
    same = [
        "https://Docs.Example.org:443/guide/",
        "https://docs.example.org/guide",
        "https://docs.example.org/guide/index.html#install",
    ]
    assert len({page_key(url) for url in same}) == 1
    assert page_key("https://docs.example.org/guide?v=2") != page_key(same[0])


def test_a_seed_crawls_its_scope_once_per_page_and_records_depth_seed_and_state(docsite):
    rows, report = run_crawl(docsite, f"{docsite.base}/docs/ depth=2")
    assert {page_key(docsite.base + p) for p in rows} == keys(docsite, docsite.page_paths())
    assert rows["/docs/"]["expansion_depth"] == 0
    assert rows["/docs/chapter-01/"]["expansion_depth"] == 1
    assert rows["/docs/chapter-01/page-002.html"]["expansion_depth"] == 2
    assert {r["seed"] for r in rows.values()} == {f"{docsite.base}/docs/"}
    assert {r["expansion_state"] for r in rows.values() if r["expansion_depth"] < 2} == {"expanded"}
    assert {r["expansion_state"] for r in rows.values() if r["expansion_depth"] == 2} == {
        "discovered"
    }
    assert {r["line_no"] for r in rows.values()} == {1}
    # robots.txt refused the private page; it was never requested.
    assert report.robots_refused == [f"{docsite.base}/docs/private/secret.html"]
    assert "/docs/private/secret.html" not in docsite.hits
    # Off-scope links (another folder, another host, a redirect to another folder, the
    # navigation's link out of the seed's folder) are not followed or kept.
    assert report.off_scope == 4
    assert docsite.hits["/docs/moved.html"] == 1 and "/docs/moved.html" not in rows
    assert docsite.hits.get("/blog/post.html", 0) <= 1  # only as the redirect's target
    assert "/nav-only.html" not in docsite.hits
    # The alias names an already crawled page as canonical; the binary download is no page.
    assert report.aliases == 1 and report.not_text == 1
    assert "/docs/alias.html" not in rows and "/docs/logo.png" not in docsite.hits
    # Loops (pages link back to their chapter and their neighbours) fetch each page once.
    assert all(docsite.hits[p] == 1 for p in ("/docs/chapter-00/page-001.html", "/docs/"))
    assert report.max_depth == 2 and report.pages == len(rows) == 13


def test_depth_bounds_the_crawl_and_a_canonical_alias_brings_its_page(docsite):
    rows, _ = run_crawl(docsite, f"{docsite.base}/docs/index.html depth=1")
    # The chapters, and page 0 of chapter 0 through the alias whose canonical link names it.
    expected = ["/docs/index.html"] + [docsite.chapter_path(c) for c in range(3)]
    assert {page_key(docsite.base + p) for p in rows} == keys(
        docsite, [*expected, docsite.page_path(0, 0)]
    )
    assert rows[docsite.page_path(0, 0)]["expansion_depth"] == 1


def test_a_sitemap_index_expands_to_every_listed_page(docsite):
    sitemap = f"{docsite.base}/docs/sitemap_index.xml"
    rows, report = run_crawl(docsite, sitemap)
    assert set(rows) == set(docsite.page_paths())
    assert {(r["seed"], r["expansion_depth"], r["expansion_state"]) for r in rows.values()} == {
        (sitemap, 0, "discovered")
    }
    assert report.sitemaps == 1 + 3


def test_listed_pages_stay_listed_and_the_cap_limits_crawled_pages(docsite):
    page = f"{docsite.base}{docsite.page_path(2, 2)}"
    rows, report = run_crawl(
        docsite, f"{page}\n{docsite.base}/docs/ depth=2", CrawlConfig(max_pages=5)
    )
    assert len(rows) == 5
    assert rows[docsite.page_path(2, 2)]["expansion_state"] == "listed"
    assert rows[docsite.page_path(2, 2)]["line_no"] == 1
    assert report.capped > 0


def test_include_and_exclude_patterns_replace_and_narrow_the_scope(docsite):
    config = CrawlConfig(
        include=(f"{docsite.base}/docs/*",), exclude=("*/chapter-01/*", "*/chapter-02/*")
    )
    rows, _ = run_crawl(docsite, f"{docsite.base}/docs/ depth=2", config)
    assert not any("chapter-01" in p or "chapter-02" in p for p in rows)
    assert docsite.page_path(0, 2) in rows


def test_a_recrawl_is_conditional_and_only_a_changed_page_is_fetched_in_full(docsite):
    seed = f"{docsite.base}/docs/ depth=2"
    first, _ = run_crawl(docsite, seed)
    full = docsite.full_answers
    docsite.revisions[docsite.page_path(1, 1)] = 2
    again, report = run_crawl(docsite, seed, stored=list(first.values()))
    assert list(again) == list(first)  # the same pages, in the same order
    # 304s for every unchanged page; the changed page and the alias (never stored) in full.
    assert docsite.full_answers - full == 2
    assert report.not_modified == len(first) - 1
    changes = {p: r["change"] for p, r in again.items()}
    assert changes.pop(docsite.page_path(1, 1)) == "changed"
    assert set(changes.values()) == {"unchanged"}


def test_crawl_settings_are_validated_with_the_key_named():
    with pytest.raises(PackError, match=r"crawl\.max_pages"):
        parse_config({"crawl": {"max_pages": 0}})
    with pytest.raises(PackError, match=r"did you mean 'crawl\.exclude'"):
        parse_config({"crawl": {"exclud": ["*"]}})


def test_a_pack_built_from_one_seed_line_records_the_crawl_on_its_articles(workspace, docsite):
    folder = write_pack(
        workspace, "crawled", [f"{docsite.base}/docs/ depth=1"], {"fetch": TEST_FETCH}
    )
    result = build(workspace, "crawled")
    assert result.outcome == "published", result.cause
    fetch_meta = result.stage_metadata["fetched_pages"]
    assert fetch_meta["crawl_pages"] == 5 and fetch_meta["crawl_robots_refused"] == 1
    with opened(current_version(folder) / "pack.db", read_only=True) as conn:
        rows = conn.execute(
            "MATCH (a:Article) RETURN a.url, a.seed, a.expansion_depth, a.expansion_state "
            "ORDER BY a.url"
        ).get_all()
    assert len(rows) == 5
    assert {(r[1], r[3]) for r in rows if r[2] == 0} == {(f"{docsite.base}/docs/", "expanded")}
    assert {r[3] for r in rows if r[2] == 1} == {"discovered"}

    again = build(workspace, "crawled")
    assert again.outcome == "unchanged"
    assert again.stage_metadata["fetched_pages"]["not_modified"] == 5


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


STUB_SITE = {
    "index.html": ["guide.html", "moved.html", "genindex.html", "gone.html", "print.html"],
    "guide.html": ["extra-1.html", "extra-2.html"],
    "api.html": [],
    "genindex.html": [],
    "extra-1.html": [],
    "extra-2.html": [],
}


def test_the_build_summary_says_what_the_crawl_found_skipped_and_capped(
    workspace, tmp_path, capsys, monkeypatch
):
    """A redirect stub brings the page it points to (and is no page itself), an excluded page,
    a 404, a duplicate (a canonical alias) and the pages past crawl.max_pages are each counted
    in the manifest and the summary of `kpack build`."""
    site = tmp_path / "site"
    site.mkdir()
    for name, links in STUB_SITE.items():
        anchors = "".join(f'<p><a href="{link}">{link}</a></p>' for link in links)
        words = f"The {name[:-5]} page of the gearbox manual explains shafts and gear ratios."
        (site / name).write_text(
            f"<html><head><title>{name}</title></head><body><main><h1>{name}</h1>"
            f"<p>{words}</p>{anchors}</main></body></html>"
        )
    (site / "moved.html").write_text(
        '<html><head><meta http-equiv="refresh" content="0; URL=api.html"/></head>'
        '<body><p>The page has been moved to <a href="api.html">this page</a></p></body></html>'
    )
    (site / "print.html").write_text(
        '<html><head><link rel="canonical" href="guide.html"></head>'
        "<body><main><p>The guide, for printing.</p></main></body></html>"
    )
    handler = partial(QuietFiles, directory=str(site))
    with LoopbackServer(handler) as server:  # type: ignore[arg-type]
        write_pack(
            workspace,
            "gearbox",
            [f"{server.base}/index.html depth=2"],
            {
                "fetch": TEST_FETCH,
                "max_failed_fraction": 0.5,  # the 404 is one page of four
                "crawl": {"exclude": ["*/genindex.html"], "max_pages": 5},
            },
        )
        monkeypatch.setenv("COLUMNS", "120")
        assert main(["build", "gearbox", "--no-progress"]) == 0
    rows = summary_rows(capsys.readouterr().out)
    manifest = json.loads((workspace / "packs" / "gearbox" / "manifest.json").read_text())
    pages = manifest["sources"]["pages"]
    # Kept: index, guide and api, fetched in the place of the stub that leads to it.
    assert pages["kept"] == 3 and pages["capped"] == 2  # extra-1 and extra-2
    assert pages["skipped"] | {} == {
        **pages["skipped"],
        "not_found": 1,
        "excluded": 1,
        "redirect_stubs": 1,
        "duplicates": 1,
    }
    assert pages["found"] == 3 + 4 + 2
    assert rows["pages found / kept"] == "9 / 3"
    assert rows["skipped 404 / excluded / stub / duplicate"] == "1 / 1 / 1 / 1"
    assert rows["capped by crawl.max_pages"] == "2"


def book_page(title: str, chapters: list[str], next_page: str | None) -> str:
    """A page as mdBook writes one: the table of contents in a <nav> sidebar, the next
    chapter in a <nav> of its own, and a body that links nowhere."""
    toc = "".join(f'<li><a href="{c}">{c.removesuffix(".html")}</a></li>' for c in chapters)
    after = f'<nav class="nav-wrapper"><a rel="next" href="{next_page}">Next</a></nav>'
    return (
        f"<html><head><title>{title}</title></head><body>"
        f'<nav id="sidebar"><ol class="chapter">{toc}</ol></nav>'
        f"<main><h1>{title}</h1><p>The {title.lower()} of the gearbox book, in prose that a "
        f"reader reads from the top.</p></main>{after if next_page else ''}</body></html>"
    )


def test_a_book_whose_pages_link_only_through_their_navigation_is_crawled_whole(
    workspace, tmp_path
):
    """A book site (mdBook, rustdoc) links its chapters from a table of contents in a <nav>
    sidebar, which the pack's text leaves out; the crawl follows it, also when a rebuild's
    pages answer 304, while the pack's link graph keeps the body's links only."""
    site = tmp_path / "book"
    site.mkdir()
    chapters = [f"ch{n:02d}.html" for n in range(1, 6)]
    (site / "index.html").write_text(book_page("Introduction", chapters, chapters[0]))
    for n, chapter in enumerate(chapters):
        following = chapters[n + 1] if n + 1 < len(chapters) else None
        (site / chapter).write_text(book_page(f"Chapter {n + 1}", chapters, following))
    handler = partial(QuietFiles, directory=str(site))
    with LoopbackServer(handler) as server:  # type: ignore[arg-type]
        write_pack(workspace, "book", [f"{server.base}/index.html depth=1"], {"fetch": TEST_FETCH})
        first = build(workspace, "book")
        assert first.published, first.cause
        assert first.manifest["sources"]["pages"]["kept"] == 6
        again = build(workspace, "book")
        assert again.stage_metadata["fetched_pages"]["not_modified"] == 6
        assert again.manifest["sources"]["pages"]["kept"] == 6
    with opened(current_version(workspace / "packs" / "book") / "pack.db", read_only=True) as db:
        assert db.execute("MATCH ()-[l:LINKS_TO]->() RETURN count(l)").get_all() == [[0]]


def test_a_page_outside_one_seeds_folder_is_still_crawled_from_the_seed_whose_folder_holds_it(
    tmp_path,
):
    """Two seed lines (a library's API and its book): the API's pages link into the book's
    folder, out of their own seed's scope. The book's seed still crawls those pages."""
    for folder, links in (("api", ["../book/ch02.html"]), ("book", ["ch01.html", "ch02.html"])):
        (tmp_path / folder).mkdir()
        anchors = "".join(f'<a href="{link}">{link}</a>' for link in links)
        (tmp_path / folder / "index.html").write_text(
            f"<html><body><main><p>The {folder} begins here.</p>{anchors}</main></body></html>"
        )
    for chapter in ("ch01", "ch02"):
        (tmp_path / "book" / f"{chapter}.html").write_text(
            f"<html><body><main><p>Chapter {chapter} of the book.</p></main></body></html>"
        )
    handler = partial(QuietFiles, directory=str(tmp_path))
    with LoopbackServer(handler) as server:  # type: ignore[arg-type]
        sources, problems = parse_urls(
            f"{server.base}/api/index.html depth=1\n{server.base}/book/index.html depth=1\n",
            Path("."),
        )
        assert problems == []
        with Fetcher(FETCH) as fetcher:
            rows, report = crawl(sources, fetcher, CrawlConfig(), {}, datetime.now(UTC))
    paths = {r["url"].removeprefix(server.base): r["seed"] for r in rows}
    book = f"{server.base}/book/index.html"
    assert paths == {
        "/api/index.html": f"{server.base}/api/index.html",
        "/book/index.html": book,
        "/book/ch01.html": book,
        "/book/ch02.html": book,
    }
    assert report.off_scope == 1  # the API's link into the book, counted once


def test_pages_of_one_folder_that_share_a_query_link_each_reach_their_own_page(tmp_path):
    """Links are resolved once per folder, except those that mean the page itself: a
    paginated listing's "?page=2" leads from each listing to its own second page."""
    (tmp_path / "docs").mkdir()
    for name in ("news", "events"):
        (tmp_path / "docs" / f"{name}.html").write_text(
            f"<html><body><main><p>The {name} listing.</p>"
            '<a href="?page=2">next</a> <a href="http://">broken</a></main></body></html>'
        )
    (tmp_path / "docs" / "index.html").write_text(
        '<html><body><main><p>Start.</p><a href="news.html">news</a>'
        '<a href="events.html">events</a></main></body></html>'
    )
    handler = partial(QuietFiles, directory=str(tmp_path))
    with LoopbackServer(handler) as server:  # type: ignore[arg-type]
        sources, problems = parse_urls(f"{server.base}/docs/index.html depth=2\n", Path("."))
        assert problems == []
        with Fetcher(FETCH) as fetcher:
            rows, _ = crawl(sources, fetcher, CrawlConfig(), {}, datetime.now(UTC))
    assert {r["url"].removeprefix(server.base) for r in rows} == {
        "/docs/index.html",
        "/docs/news.html",
        "/docs/events.html",
        "/docs/news.html?page=2",
        "/docs/events.html?page=2",
    }
