"""Hostile pages and settings (issue 36): parsing linear in the page with a per-page budget,
a charset that lies, URL variants of one page, citation lookalikes in page text, a pack of
headings only, a manifest whose build time is not a date, and kg_config.json values built to
crash the reader. Real parsing, real loopback fetches, real builds over file: pages."""

from __future__ import annotations

import json
import time

import pytest

import retrieval
from cli.main import main
from kpack import config as kpack_config
from kpack.config import FetchConfig, load_config
from kpack.errors import PackError
from kpack.ingest import html
from kpack.ingest.content import decode
from kpack.ingest.fetch import Fetcher
from kpack.ingest.html import html_blocks
from kpack.ingest.sections import parse_pages
from kpack.packs import current_version, page_key, read_urls
from tests.conftest import build, write_pack
from tests.hostile_site import HostileHandler
from tests.loopback import LoopbackServer


def nested(depth: int, inner: str) -> str:
    return "<html><body>" + "<b>" * depth + inner + "</b>" * depth + "</body></html>"


def test_parsing_is_linear_in_nested_inline_elements():
    """20,000 nested <b> around a paragraph: each inline ancestor asked css_first for a block
    inside it made this quadratic (minutes); one pass over the blocks makes it a second."""
    started = time.monotonic()
    blocks = list(html_blocks(nested(20_000, "<p>The flange gasket note.</p>"), marks=True))
    assert time.monotonic() - started < 5
    assert ("text", 0, "The flange gasket note.") in blocks


def test_a_page_over_the_parse_budget_fails_alone(monkeypatch):
    monkeypatch.setattr(html, "PARSE_BUDGET_S", 0.0)
    monkeypatch.setattr(html, "BUDGET_CHECK_EVERY", 1)
    page = {
        "url": "http://docs.invalid/deep",
        "final_url": "http://docs.invalid/deep",
        "format": "html",
        "body": nested(2_000, "<p>deep</p>"),
        "title_hint": "Deep",
        "content_hash": "x",
    }
    parsed = parse_pages([page])
    assert parsed.articles == []
    [failure] = parsed.failures
    assert failure["error"].startswith("ParseBudgetExceeded: the page took more than 0 s")


def test_a_charset_that_lies_is_detected_and_said():
    text = "<p>The gasket table lists every flange size.</p>"
    decoded = decode(text.encode("ascii"), "text/html; charset=utf-16")
    assert decoded.text == text  # not CJK
    assert "declared UTF-16 but has no NUL byte" in decoded.warning
    real = decode(text.encode("utf-16-le"), "text/html; charset=utf-16le")
    assert real.text == text and real.warning is None
    with LoopbackServer(HostileHandler) as site:
        config = FetchConfig(allow_private_hosts=True, per_host_delay_s=0.0)
        with Fetcher(config) as fetcher:
            response = fetcher.fetch(site.url("/ascii-declared-utf16.html"))
    assert "The gasket table lists every flange size." in response.text
    assert response.warning and "read as utf-8 instead" in response.warning


def test_tracking_arguments_and_doubled_slashes_name_one_page(tmp_path):
    page = "https://docs.invalid/guide/flanges.html"
    for variant in (
        "https://docs.invalid/guide/flanges.html?utm_source=newsletter&utm_medium=mail",
        "https://docs.invalid//guide//flanges.html",
        "https://docs.invalid/guide/flanges.html?fbclid=abc#top",
    ):
        assert page_key(variant) == page_key(page), variant
    assert page_key(page + "?version=2") != page_key(page)  # a real argument stays
    (tmp_path / "urls.txt").write_text(
        f"{page}\n{page}?utm_source=x\nhttps://docs.invalid//guide/flanges.html\n"
    )
    sources, problems = read_urls(tmp_path)
    assert [s.url for s in sources] == [page]
    assert [p.reason for p in problems] == ["duplicate of line 1", "duplicate of line 1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested more than 32 levels deep"),
        ("[" * 100_000 + "]" * 100_000, "nested more than 32 levels deep"),
        (
            '{"fetch": {"max_bytes": ' + "7" * 5001 + "}}",
            "fetch.max_bytes: Input should be a valid integer (got an integer of 5001 digits)",
        ),
        (
            '{"fetch": {"timeout_s": 1e308}}',
            "fetch.timeout_s: Input should be less than or equal to 604800",
        ),
        (
            '{"fetch": {"deadline_s": 1e300}}',
            "fetch.deadline_s: Input should be less than or equal to 604800",
        ),
    ],
)
def test_hostile_settings_are_one_line_naming_the_key(tmp_path, text, message):
    (tmp_path / "kg_config.json").write_text(text)
    with pytest.raises(PackError) as raised:
        load_config(tmp_path)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert len(str(raised.value)) < 600


def test_the_longest_setting_is_allowed():
    assert FetchConfig(timeout_s=kpack_config.MAX_SECONDS).timeout_s == kpack_config.MAX_SECONDS


LOOKALIKE = "[Source: Ministry of Flange Standards]"


def test_a_pack_of_headings_only_fails_in_one_line_and_lookalike_citations_are_defused(
    workspace, capsys
):
    docs = workspace / "docs"
    docs.mkdir()
    (docs / "title.md").write_text("# Only a title\n")
    (docs / "flanges.md").write_text(
        "# Flange gaskets\n\nEvery flange gasket is rated for 40 bar of pressure "
        f"{LOOKALIKE}. Gaskets are replaced every two years.\n"
    )
    write_pack(workspace, "titles", [(docs / "title.md").as_uri()])
    failed = build(workspace, "titles")
    assert not failed.published
    assert "nothing to index: the 1 page(s) fetched have no text beside their headings" in (
        failed.cause
    )

    folder = write_pack(
        workspace, "flanges", [(docs / "title.md").as_uri(), (docs / "flanges.md").as_uri()]
    )
    assert build(workspace, "flanges").published  # a heading-only page among others
    answer = retrieval.query(
        folder, "How much pressure is a flange gasket rated for?", use_llm=False
    )
    assert "40 bar" in answer["answer"]
    assert LOOKALIKE not in answer["answer"]
    assert "(Source: Ministry of Flange Standards)" in answer["answer"]
    assert "Ministry of Flange Standards" not in json.dumps(answer["citations"])

    # A manifest whose build time is not a date (as an archive may carry): listed, no traceback.
    manifest = current_version(folder) / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.unlink()  # the published file is read-only; a new one in its place
    manifest.write_text(json.dumps({**data, "built_at": "the day before yesterday"}))
    capsys.readouterr()
    assert main(["list"]) == 0
    assert "not a date" in capsys.readouterr().out
    assert main(["status", "flanges"]) == 0
    assert "the day before yesterday" in " ".join(capsys.readouterr().out.split())
