"""What `kpack build` prints when it ends: every failed URL (bounded), stage times that add up
to the total, and page counts that count each page once."""

from __future__ import annotations

import re

from cli.main import main
from kpack.ingest import shards
from kpack.packs import read_manifest
from tests.conftest import TEST_FETCH, write_pack
from tests.docsite import DocSite, serve

PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
MISSING = 25


def summary_rows(out: str) -> dict[str, str]:
    """The summary table's rows, what -> value."""
    return dict(re.findall(r"^\s*(.+?)\s*│\s*(.+?)\s*$", out, flags=re.MULTILINE))


def test_a_failed_build_lists_every_failed_url_up_to_twenty(workspace, site, capsys):
    missing = [site.url(f"/missing/page-{n}.html") for n in range(MISSING)]
    write_pack(workspace, "broken", [site.url(p) for p in PAGES] + missing, {"fetch": TEST_FETCH})

    assert main(["build", "broken", "--no-progress"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"{MISSING}/{MISSING + len(PAGES)} URLs failed" in err
    # One error, said once, then the lines and URLs that met it.
    assert err.count("HTTP 404") == 1 and "failed 20 URLs: the error above" in err
    listed = re.findall(r"line (\d+): \S+/missing/page-(\d+)\.html", err)
    assert [int(line) for line, _ in listed] == list(range(len(PAGES) + 1, len(PAGES) + 21))
    assert f"... and {MISSING - 20} more" in err
    assert "Traceback" not in err


def test_the_summary_times_add_up_and_count_each_page_once(workspace, site, capsys, monkeypatch):
    write_pack(workspace, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["build", "widgets", "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = summary_rows(out)
    stages = {what: float(value) for what, value in rows.items() if what.endswith(" s")}
    total = stages.pop("total s")
    assert {"ingest s", "parse s", "embed s", "graph s", "publish s"} <= set(stages)
    # The shard steps that embed are the embed group's, never "other": the row holds at least
    # the embeddings stage's own seconds, which count its shards (the model may already be
    # loaded in this process, so no fixed minimum).
    embedded = read_manifest(workspace / "packs" / "widgets")["stage_seconds"]["embeddings"]
    assert stages["embed s"] >= embedded - 0.01
    assert abs(sum(stages.values()) - total) <= 0.1 * len(stages) + 0.1
    assert rows["pages new / changed / unchanged / removed"] == "3 / 0 / 0 / 0"

    # Each page answers 304 to the rebuild: unchanged, counted once, and 304 on its own row.
    assert main(["build", "widgets", "--no-progress", "--force"]) == 0
    out = capsys.readouterr().out
    rows = summary_rows(out)
    assert rows["pages new / changed / unchanged / removed"] == "0 / 0 / 3 / 0"
    assert rows["pages answered 304 Not Modified"] == "3"


def test_a_rebuild_names_the_page_that_changed_and_the_summary_fits_80_columns(
    workspace, site, capsys, monkeypatch
):
    live = "/live/changing/report.html"
    site.revisions[live] = 1
    urls = [site.url(p) for p in [*PAGES, live]]
    write_pack(workspace, "widgets", urls, {"fetch": TEST_FETCH})
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["build", "widgets", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "pages (" not in out  # a first build lists no page: they are all new
    site.revisions[live] = 2
    assert main(["build", "widgets", "--no-progress"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert f"changed pages (1):\n  {site.url(live)}\n" in out
    table = [line for line in lines if "│" in line]
    assert all(len(line) <= 80 for line in table), table
    # every row on one line: a label never wraps onto the next
    assert summary_rows(out)["pages new / changed / unchanged / removed"] == "0 / 1 / 3 / 0"
    assert summary_rows(out)["embedding"] == "all-MiniLM-L6-v2 (384d)"


def test_the_embedding_step_says_how_many_texts_are_embedded_and_the_time_left(
    workspace, site, capfd, monkeypatch
):
    monkeypatch.setattr(shards, "ENCODE_SLICE", 4)  # several slices of a small pack's texts
    write_pack(workspace, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert main(["build", "widgets"]) == 0  # not a terminal: the progress as lines
    out = capfd.readouterr().out
    said = re.findall(r"embeddings_shard_0  (\d+) of (\d+) texts embedded(.*)", out)
    assert len(said) >= 2, out
    (first, total, left), (last, _, at_end) = said[0], said[-1]
    assert int(first) == 4 and last == total and int(total) > 4
    assert re.fullmatch(r", about \d+ s left", left) and at_end == ""


def test_a_crawl_that_reaches_max_pages_says_so_in_words(workspace, capsys):
    with serve(DocSite(chapters=2, pages_per_chapter=3)) as docsite:
        config = {"fetch": TEST_FETCH, "crawl": {"max_pages": 4}}
        write_pack(workspace, "crawled", [f"{docsite.base}/docs/ depth=2"], config)
        assert main(["build", "crawled", "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the crawl stopped at crawl.max_pages (4 pages):" in out
    assert (
        'more pages in scope were left out; to take them, raise it in kg_config.json: {"crawl": {"max_pages": 8}}'
        in out
    )
