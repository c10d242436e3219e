"""Hostile and careless input to a build: each bad page fails alone, damaged caches are
recomputed, and odd urls.txt files get one clear message."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance

from kpack.errors import PackError
from kpack.packs import read_urls
from pipelines.build import build_pack
from tests.conftest import TEST_FETCH, build
from tests.hostile_site import HostileHandler
from tests.loopback import LoopbackServer


@pytest.fixture(scope="module")
def hostile():
    with LoopbackServer(HostileHandler) as server:
        yield server


def write_urls(workspace: Path, name: str, text: str, config: dict | None = None) -> Path:
    folder = workspace / "packs" / name
    folder.mkdir(parents=True)
    (folder / "urls.txt").write_text(text, encoding="utf-8")
    (folder / "kg_config.json").write_text(json.dumps(config or {"fetch": TEST_FETCH}))
    return folder


def table(workspace: Path, asset: str, pack: str) -> list[dict]:
    return pq.read_table(workspace / "storage" / asset / f"{pack}.parquet").to_pylist()


def test_bad_pages_fail_alone_and_damaged_caches_are_recomputed(workspace, hostile):
    notes = workspace / "docs" / "my notes.md"
    notes.parent.mkdir()
    notes.write_text("# My Notes\n\nLocal notes about the gasket registry of the toolkit.\n")
    pages = ["/page-1.html", "/page-2.html", "/page-3.html", "/deep.html", "/utf16-bom.html"]
    urls = [hostile.url(p) for p in pages] + [
        hostile.url("/empty.html"),
        hostile.url("/trickle-body.html"),
        "file:../../docs/my%20notes.md",  # a space in a file: path, written as in any URL
    ]
    # Saved by an editor that starts the file with a byte-order mark.
    write_urls(
        workspace,
        "hostile",
        "\ufeff" + "\n".join(urls) + "\n",
        {"fetch": {**TEST_FETCH, "deadline_s": 1.5}, "max_failed_fraction": 0.3},
    )
    first = build(workspace, "hostile")
    assert first.success, (first.failed_steps, first.failed_checks, first.cause)

    fetched = {row["url"]: row for row in table(workspace, "fetched_pages", "hostile")}
    assert fetched[urls[0]]["line_no"] == 1 and fetched[urls[0]]["error"] is None
    assert fetched[hostile.url("/empty.html")]["error"] == (
        "no text content found (the page is empty)"
    )
    assert "fetch deadline of 1.5 s" in fetched[hostile.url("/trickle-body.html")]["error"]
    assert first.manifest["sources"]["ok"] == 6 and first.manifest["sources"]["failed"] == 2

    titles = {row["title"] for row in table(workspace, "articles", "hostile")}
    assert {"Deep Page", "Wide Page", "My Notes"} <= titles
    sections = table(workspace, "sections", "hostile")
    assert any("deepest paragraph explains the flange" in s["content"] for s in sections)
    assert any("Zürich gasket" in s["content"] for s in sections)

    # Damage the files a later build reads back: the previous fetch and the embedding cache.
    storage = workspace / "storage"
    damaged = [storage / "fetched_pages" / "hostile.parquet", *storage.glob("_cache/**/*.parquet")]
    assert len(damaged) >= 2
    for path in damaged:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])

    second = build(workspace, "hostile")  # no --force, no hand-deletion
    assert second.success, (second.failed_steps, second.failed_checks, second.cause)
    assert second.outcome in ("published", "unchanged")
    for path in damaged:
        assert pq.read_table(path).num_rows > 0  # recomputed and written whole again


def test_a_urls_file_that_is_not_utf8_is_one_clear_error(workspace):
    folder = workspace / "packs" / "latin"
    folder.mkdir(parents=True)
    (folder / "urls.txt").write_bytes(
        b"https://docs.example.org/a\nhttps://docs.example.org/caf\xe9\n"
    )
    message = re.escape("urls.txt: line 2 is not UTF-8 text (byte 0xe9); save the file as UTF-8")
    with pytest.raises(PackError, match=message):
        read_urls(folder)
    with pytest.raises(PackError, match=message):
        build_pack("latin", packs_dir=workspace / "packs", instance=DagsterInstance.ephemeral())


def test_a_file_path_with_spaces_is_written_percent_encoded(workspace):
    folder = write_urls(
        workspace,
        "spaces",
        "file:docs/my%20notes.md\nfile:docs/my notes.md\nfile:docs/100%25.md\n",
    )
    sources, problems = read_urls(folder)
    assert [s.url for s in sources] == [
        (folder / "docs" / "my notes.md").as_uri(),
        (folder / "docs" / "100%.md").as_uri(),
    ]
    assert [p.line_no for p in problems] == [2]
    assert "write a space in a path as %20" in problems[0].reason
