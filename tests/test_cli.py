"""The kpack command line: new, list, build and search errors, without running a build."""

from __future__ import annotations

from pathlib import Path

import pytest

from kpack.cli import main
from tests.conftest import write_pack


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_new_creates_urls_txt_and_skips_invalid_urls(workspace, capsys):
    code, out, err = run(
        capsys,
        "new",
        "widgets",
        "--url",
        "https://docs.example.org/a",
        "--url",
        "docs.example.org/b",
        "--url",
        "ftp://example.org/c",
        "--url",
        "https://docs.example.org/d",
    )
    assert code == 0
    urls = workspace / "packs" / "widgets" / "urls.txt"
    assert urls.read_text() == "https://docs.example.org/a\nhttps://docs.example.org/d\n"
    assert "created" in out and "2 URLs" in out and "kpack build widgets" in out
    assert "skipped urls.txt line 2: not a URL" in err and "'docs.example.org/b'" in err
    assert "skipped urls.txt line 3: unsupported scheme 'ftp'" in err


def test_new_reads_a_urls_file(workspace, capsys, tmp_path):
    source = tmp_path / "list.txt"
    source.write_text("# my sources\nhttps://docs.example.org/a\n\nhttps://docs.example.org/a#x\n")
    code, _, err = run(capsys, "new", "listed", "--urls-file", str(source))
    assert code == 0
    assert (
        workspace / "packs" / "listed" / "urls.txt"
    ).read_text() == "https://docs.example.org/a\n"
    assert "duplicate of line 2" in err


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "bad name"])
def test_new_with_an_invalid_name_exits_2(workspace, capsys, name):
    code, out, err = run(capsys, "new", name, "--url", "https://docs.example.org/a")
    assert code == 2
    assert "invalid pack name" in err
    assert "Traceback" not in out + err
    assert tree(workspace / "packs") == []
    assert not (workspace / "escape").exists()


def test_new_refuses_an_existing_pack(workspace, capsys):
    folder = write_pack(workspace, "widgets", ["https://docs.example.org/a"])
    code, _, err = run(capsys, "new", "widgets", "--url", "https://other.example.org/")
    assert code == 2
    assert "already exists" in err
    assert (folder / "urls.txt").read_text() == "https://docs.example.org/a\n"


def test_new_without_urls_exits_2(workspace, capsys):
    code, _, err = run(capsys, "new", "widgets")
    assert code == 2
    assert "--url" in err
    assert not (workspace / "packs" / "widgets").exists()


def test_new_with_only_invalid_urls_creates_nothing(workspace, capsys):
    code, _, err = run(capsys, "new", "widgets", "--url", "nonsense", "--url", "ftp://x.org/")
    assert code == 2
    assert "skipped urls.txt line 1" in err and "skipped urls.txt line 2" in err
    assert "nothing was created" in err
    assert not (workspace / "packs" / "widgets").exists()


def test_new_with_a_missing_urls_file_exits_2(workspace, capsys):
    code, _, err = run(capsys, "new", "widgets", "--urls-file", str(workspace / "missing.txt"))
    assert code == 2
    assert "missing.txt" in err


def test_skipped_lines_are_shown_verbatim(workspace, capsys):
    markdown_link = "[guide](https://x.org/guide)"
    code, _, err = run(capsys, "new", "widgets", "--url", markdown_link, "--url", "https://x.org/")
    assert code == 0
    assert "'[guide](https://x.org/guide)'" in err


def test_build_error_with_brackets_in_urls_txt_exits_2(workspace, capsys):
    write_pack(workspace, "widgets", ["see docs [/b]"])
    code, _, err = run(capsys, "build", "widgets", "--no-progress")
    assert code == 2
    assert "[/b]" in err


def test_new_keeps_relative_file_urls_relative(workspace, capsys):
    code, _, _ = run(capsys, "new", "local", "--url", "file:../../docs/index.md")
    assert code == 0
    assert (workspace / "packs" / "local" / "urls.txt").read_text() == "file:../../docs/index.md\n"


def test_build_of_an_unknown_pack_lists_the_available_ones(workspace, capsys):
    write_pack(workspace, "python-expert", ["https://docs.python.org/3/"])
    write_pack(workspace, "demo", ["https://example.org/"])
    code, out, err = run(capsys, "build", "pyton-expert", "--no-progress")
    assert code == 2
    assert "unknown pack 'pyton-expert'" in err
    assert "(available: demo, python-expert)" in err
    assert "Traceback" not in out + err


def test_build_with_no_valid_url_exits_2_and_creates_nothing(workspace, capsys):
    folder = write_pack(workspace, "widgets", ["# only junk here", "not-a-url", "ftp://x.org/f"])
    code, _, err = run(capsys, "build", "widgets", "--no-progress")
    assert code == 2
    assert "no valid URL" in err
    assert "line 2" in err and "line 3" in err
    assert tree(folder) == ["urls.txt"]
    assert not (workspace / "storage").exists()


def test_search_of_a_pack_never_built_says_to_build_it(workspace, capsys):
    write_pack(workspace, "widgets", ["https://docs.example.org/a"])
    code, _, err = run(capsys, "search", "widgets", "how do I configure it?")
    assert code == 2
    assert "has not been built yet" in err
    assert "kpack build widgets" in err


def test_search_of_an_unknown_pack_lists_the_available_ones(workspace, capsys):
    write_pack(workspace, "widgets", ["https://docs.example.org/a"])
    code, _, err = run(capsys, "search", "gadgets", "anything")
    assert code == 2
    assert "unknown pack 'gadgets'" in err and "available: widgets" in err


@pytest.mark.parametrize("question", ["", "   "])
def test_search_with_an_empty_question_exits_2(workspace, capsys, question):
    write_pack(workspace, "widgets", ["https://docs.example.org/a"])
    code, out, err = run(capsys, "search", "widgets", question)
    assert code == 2
    assert "Traceback" not in out + err
    # Which check comes first is the search's business: the question, or the unbuilt pack.
    assert "question is empty" in err or "kpack build widgets" in err


def test_list_shows_packs_that_were_never_built(workspace, capsys):
    write_pack(workspace, "widgets", ["https://docs.example.org/a"])
    write_pack(workspace, "gadgets", ["https://docs.example.org/b"])
    (workspace / "packs" / "not-a-pack").mkdir()
    code, out, _ = run(capsys, "list")
    assert code == 0
    rows = [line for line in out.splitlines() if "never" in line]
    assert [row.split()[0] for row in rows] == ["gadgets", "widgets"]
    assert "not-a-pack" not in out
    assert " ".join(out.split()).count("never built") == 2


def test_list_with_no_packs(workspace, capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "pack" in out and "never built" not in out
