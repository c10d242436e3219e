"""PDFs linked from urls.txt or a crawl are read into titled sections (pypdf), within caps."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from kpack.config import CrawlConfig, FetchConfig
from kpack.graphdb import opened
from kpack.ingest.crawl import crawl
from kpack.ingest.fetch import Fetcher
from kpack.ingest.pages import page_row
from kpack.ingest.sections import parse_page
from kpack.packs import Source, current_version, parse_urls
from tests.conftest import TEST_FETCH, build, write_pack
from tests.sources_site import Answer, SourcesSite, serve

FETCH = FetchConfig(**TEST_FETCH)
MANUAL_PAGES = [
    ["Gaskets seal the widget housing.", "A gasket is replaced every spring."],
    ["Sprockets drive the widget chain.", "Each sprocket has forty teeth."],
    ["The sprocket pitch is five millimetres.", "Measure it between two teeth."],
    ["Flanges join two pipes of the widget.", "Tighten the flange bolts crosswise."],
]


def make_pdf(
    pages: list[list[str]], outline: list[tuple[str, int, int]] = (), title: str | None = None
) -> bytes:
    """A PDF whose pages show ``pages`` (lines of Helvetica text); ``outline``: (title, page,
    level) bookmarks, level 0 at the top."""
    writer = PdfWriter()
    font = writer._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )
    for lines in pages:
        page = writer.add_blank_page(612, 792)
        stream = DecodedStreamObject()
        shown = " ".join(f"({line}) Tj T*" for line in lines)
        stream.set_data(f"BT /F1 12 Tf 72 720 Td 14 TL {shown} ET".encode())
        page[NameObject("/Contents")] = writer._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
    parents: list = []
    for heading, page_number, level in outline:
        parent = parents[level - 1] if level else None
        parents[level:] = [writer.add_outline_item(heading, page_number, parent=parent)]
    if title:
        writer.add_metadata({"/Title": title})
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


MANUAL = make_pdf(
    MANUAL_PAGES,
    [("Gaskets", 0, 0), ("Sprockets", 1, 0), ("Sprocket pitch", 2, 1), ("Flanges", 3, 0)],
    title="Widget Manual",
)


@pytest.fixture
def site():
    with serve(SourcesSite(articles=2)) as served:
        served.answers["/docs/manual.pdf"] = Answer(content_type="application/pdf", body=MANUAL)
        yield served


def fetch_and_parse(url: str, config: FetchConfig = FETCH) -> tuple[dict, dict, list[dict]]:
    """The fetched_pages row of one URL, and the article and sections parsed from it."""
    with Fetcher(config) as fetcher:
        response = fetcher.fetch(url)
    row = page_row(Source(1, url), response, None, datetime.now(UTC))
    if row["error"] is not None:
        return row, {}, []
    article, sections, *_ = parse_page(row)
    return row, article, sections


def test_a_pdf_is_read_into_sections_under_its_outline_headings(site):
    row, article, sections = fetch_and_parse(site.url("/docs/manual.pdf"))
    assert row["error"] is None and row["format"] == "pdf"
    assert row["content_type"] == "application/pdf"
    assert article["title"] == "Widget Manual"
    assert [s["heading_path"] for s in sections] == [
        "Widget Manual > Gaskets",
        "Widget Manual > Sprockets",
        "Widget Manual > Sprockets > Sprocket pitch",
        "Widget Manual > Flanges",
    ]
    by_title = {s["title"]: s["content"] for s in sections}
    assert "A gasket is replaced every spring." in by_title["Gaskets"]
    assert "sprocket pitch is five millimetres" in by_title["Sprocket pitch"]


def test_a_pdf_without_an_outline_has_a_section_per_page(site, tmp_path: Path):
    site.answers["/files/plain.pdf"] = Answer(
        content_type="application/octet-stream",  # a raw file host: the .pdf name decides
        body=make_pdf(MANUAL_PAGES[:2]),
    )
    _, article, sections = fetch_and_parse(site.url("/files/plain.pdf"))
    assert article["title"] == "plain"  # no Title metadata: the file's name
    assert [s["title"] for s in sections] == ["Page 1", "Page 2"]
    # A local PDF reads the same way.
    local = tmp_path / "notes.pdf"
    local.write_bytes(make_pdf(MANUAL_PAGES[:1], title="Local Notes"))
    with Fetcher(FETCH, file_roots=[tmp_path]) as fetcher:
        response = fetcher.fetch(local.as_uri())
    assert response.format == "pdf" and "Gaskets seal the widget housing." in response.text


@pytest.mark.parametrize(
    ("body", "config", "error"),
    [
        (MANUAL, {"max_pdf_pages": 3}, "the PDF has 4 pages, over the cap of 3"),
        (MANUAL[: len(MANUAL) // 3], {}, "not a readable PDF"),
        (b"%PDF-1.7\n" + b"\x00garbage" * 100, {}, "not a readable PDF"),
        (make_pdf([[]]), {}, "the PDF has no text"),
        (MANUAL, {"max_bytes": 1000}, "exceeds the size cap of 1000 bytes"),
    ],
    ids=["pages", "truncated", "garbage", "no-text", "size"],
)
def test_a_pdf_past_a_cap_or_unreadable_is_one_failed_url(site, body, config, error):
    site.answers["/docs/bad.pdf"] = Answer(content_type="application/pdf", body=body)
    row, _, _ = fetch_and_parse(site.url("/docs/bad.pdf"), FetchConfig(**{**TEST_FETCH, **config}))
    assert error in row["error"]
    assert row["body"] is None


def test_a_crawl_follows_a_link_to_a_pdf(site):
    site.answers["/docs/"] = Answer(
        body=b'<main><h1>Docs</h1><a href="manual.pdf">The manual</a></main>'
    )
    sources, _ = parse_urls(f"{site.base}/docs/ depth=1", Path("."))
    with Fetcher(FETCH) as fetcher:
        rows, _ = crawl(sources, fetcher, CrawlConfig(), {}, datetime.now(UTC))
    states = {r["url"].removeprefix(site.base): (r["format"], r["expansion_state"]) for r in rows}
    assert states["/docs/manual.pdf"] == ("pdf", "discovered")


def test_a_pack_with_a_pdf_answers_from_its_sections(workspace, site):
    folder = write_pack(workspace, "manual", [site.url("/docs/manual.pdf")], {"fetch": TEST_FETCH})
    result = build(workspace, "manual")
    assert result.outcome == "published", result.cause
    with opened(current_version(folder) / "pack.db", read_only=True) as conn:
        titles = conn.execute("MATCH (s:Section) RETURN s.title ORDER BY s.title").get_all()
    assert [t[0] for t in titles] == ["Flanges", "Gaskets", "Sprocket pitch", "Sprockets"]
