"""The kpack command line: new, list, build and search errors, without running a build."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cli.main import main
from kpack.config import PROFILE_NAMES
from kpack.packs import within_file_roots
from kpack.store import PackStore
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
    # The rejected values are named as given, not by a line of the urls.txt just written.
    assert "skipped --url 'docs.example.org/b': not a URL" in err
    assert "skipped --url 'ftp://example.org/c': unsupported scheme 'ftp'" in err
    assert "line" not in err


ALLOW_PRIVATE = '{"fetch": {"allow_private_hosts": true}}'


def test_new_warns_that_a_file_outside_the_file_roots_needs_a_setting(workspace, capsys):
    """A file: page outside the folders a build reads is named at `kpack new`, with the
    setting that lets the build read it; the setting, written as said, does."""
    elsewhere = workspace.parent / f"{workspace.name}-html"
    elsewhere.mkdir()
    (elsewhere / "guide.html").write_text("<h1>Guide</h1><p>Text.</p>")
    inside = workspace / "docs" / "intro.md"
    inside.parent.mkdir()
    inside.write_text("# Intro\n\nText.\n")
    code, out, err = run(
        capsys,
        "new",
        "local",
        "--url",
        (elsewhere / "guide.html").as_uri(),
        "--url",
        inside.as_uri(),
    )
    assert code == 0 and "2 URLs" in out
    assert f"warning: {elsewhere}: outside the folders a build reads files from" in err
    setting = err[err.index('{"fetch"') :]
    folder = workspace / "packs" / "local"
    (folder / "kg_config.json").write_text(setting)
    roots = PackStore(packs_dir=str(folder.parent)).file_roots("local")
    assert within_file_roots(elsewhere / "guide.html", roots)
    assert within_file_roots(inside, roots)
    code, out, err = run(capsys, "new", "inside", "--url", inside.as_uri())
    assert code == 0 and "warning" not in err


def test_new_warns_that_a_loopback_or_private_url_needs_a_setting(workspace, capsys):
    code, out, err = run(
        capsys,
        "new",
        "intranet",
        "--url",
        "http://127.0.0.1:8000/docs/",
        "--url",
        "http://localhost/wiki/",
        "--url",
        "http://10.1.2.3/manual.html",
        "--url",
        "https://docs.example.org/a",
    )
    assert code == 0 and "4 URLs" in out
    assert "warning: 127.0.0.1, localhost, 10.1.2.3: not a public host" in err
    assert ALLOW_PRIVATE in err
    code, out, err = run(capsys, "new", "public", "--url", "https://docs.example.org/a")
    assert code == 0 and "warning" not in err


def test_a_build_whose_urls_all_fail_alike_says_the_error_once_with_the_setting(
    workspace, capsys, site
):
    urls = [site.url(f"/docs/page-{n}.html") for n in range(6)]
    assert run(capsys, "new", "loopback", *[f"--url={u}" for u in urls])[0] == 0
    code, _, err = run(capsys, "build", "loopback", "--no-progress")
    assert code == 1
    assert err.count("not globally routable") == 1, err
    assert ALLOW_PRIVATE in err
    assert "failed 6 URLs: the error above" in err and all(url in err for url in urls)


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
    assert "skipped --url 'nonsense'" in err and "skipped --url 'ftp://x.org/'" in err
    assert "nothing was created" in err
    assert not (workspace / "packs" / "widgets").exists()


def test_a_folder_without_urls_txt_is_named_as_such(workspace, capsys):
    (workspace / "packs" / "drafts").mkdir()
    code, _, err = run(capsys, "build", "drafts", "--no-progress")
    assert code == 2
    assert f"no urls.txt in {workspace / 'packs' / 'drafts'}" in err and "unknown" not in err


def test_storage_and_run_history_live_beside_a_packs_folder_elsewhere(tmp_path, monkeypatch):
    from kpack import settings

    for name in ("KPACK_STORAGE", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KPACK_PACKS_DIR", str(tmp_path / "team" / "packs"))
    assert settings.storage_base() == str(tmp_path / "team" / ".kpack_storage")
    assert settings.dagster_home() == tmp_path / "team" / ".dagster_home"
    monkeypatch.delenv("KPACK_PACKS_DIR")
    assert settings.storage_base() == str(settings.PROJECT_ROOT / ".kpack_storage")


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


def test_list_shows_each_packs_own_description(workspace, capsys):
    write_pack(
        workspace, "widgets", ["https://docs.example.org/a"], {"description": "Widget\n docs"}
    )
    write_pack(workspace, "gadgets", ["https://docs.example.org/b"])
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "widgets: Widget docs" in out and "gadgets:" not in out


def test_the_readme_and_the_help_name_every_profile(capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for command in ("search", "query"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        profile_help = help_text[help_text.index("--profile") :]
        assert all(f"`{name}`" in readme for name in PROFILE_NAMES)
        assert all(f"{name}," in profile_help for name in PROFILE_NAMES), profile_help


def test_new_explains_its_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["new", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "the pack's name" in help_text and "one URL a line" in help_text


def test_list_with_no_packs(workspace, capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "pack" in out and "never built" not in out


def kpack_at(columns: int, *argv: str) -> subprocess.CompletedProcess:
    """kpack in a child process whose terminal is ``columns`` wide (COLUMNS, as a shell sets
    it), over the packs folder of the environment."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *argv],
        env={**os.environ, "COLUMNS": str(columns), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_list_is_readable_at_80_columns_and_marks_packs_that_need_the_internet(workspace):
    write_pack(workspace, "python-expert", ["https://docs.python.org/3/tutorial/"])
    publish_fake_version(
        workspace, "python-expert", counts={"Article": 1, "Section": 0, "Chunk": 0}
    )
    write_pack(workspace, "local-notes", ["file:notes.md", "http://127.0.0.1:8000/guide.html"])
    done = kpack_at(80, "list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= 80, done.stdout
    header = lines[0].split()
    assert header[:3] == ["pack", "version", "built"] and header[-1] == "sources", lines[0]
    rows = {line.split()[0]: line for line in lines if line.split()[:1] != ["pack"]}
    published = rows["python-expert"].split()
    # every figure whole on the pack's first line: 1 article, 0 sections, 0 chunks, 1 failed
    assert published[1] == "v0001" and published[-5:] == ["1", "0", "0", "1", "web"], lines
    assert rows["local-notes"].split()[-1] == "local"
    assert "web: building the pack fetches its pages from the internet" in done.stdout


def test_query_explain_is_readable_at_80_columns(built, monkeypatch):
    monkeypatch.setenv("KPACK_PACKS_DIR", str(built))
    question = "How do I install the toolkit?"
    done = kpack_at(80, "query", "widgets", question, "--explain", "--no-llm", "--k", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [re.sub(r"[│┃]", " ", line) for line in done.stdout.splitlines()]
    assert max(map(len, lines)) <= 80, done.stdout
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["passage"])
    assert lines[at].split() == ["passage", "sim", "bm25", "pr", "xenc", "qual", "comb", "dropped"]
    end = next(i for i, line in enumerate(lines) if line.startswith(("Why", "timings ms")))
    rows = lines[at + 2 : end]
    scores = [word for row in rows for word in row.split() if re.fullmatch(r"[-\d.]+", word)]
    assert scores and all(re.fullmatch(r"-?\d+\.\d{3}", word) for word in scores), rows
    # A passage is one row: its section's heading, never its title wrapped over lines.
    assert all(re.search(r"\d\.\d{3}", row) for row in rows if row.strip()), rows
    assert any(row.split()[:2] == ["Environment", "variables"] for row in rows), rows
    # Its sources: a URL whole, on the line of its section when that fits 80 columns.
    sources = lines[lines.index("Sources") + 1 : at]
    assert all(
        re.search(r"http://127\.0\.0\.1:\d+/\S+", line) for line in sources if "http" in line
    )


def test_eval_without_questions_shows_the_format_and_the_offline_start(workspace, capsys):
    write_pack(workspace, "widgets", ["https://docs.example.org/a"])
    code, _, err = run(capsys, "eval", "widgets", "--no-llm")
    assert code == 2
    path = workspace / "packs" / "widgets" / "eval" / "questions.jsonl"
    assert f"no question file at {path}" in err
    example = err[err.index("{") : err.index("}") + 1]
    assert json.loads(example)["question"]  # a line of the format, as it is written
    assert "kpack eval generate widgets --offline" in err
    path.parent.mkdir()
    path.write_text("\n")
    code, _, err = run(capsys, "eval", "widgets", "--no-llm")
    assert code == 2 and "no valid question to evaluate" in err and '{"question": ' in err


def publish_fake_version(workspace: Path, name: str, **manifest) -> int:
    """Publish a version with the real publish path but a placeholder database."""
    from kpack.store import PackStore

    store = PackStore(packs_dir=str(workspace / "packs"))
    version = store.next_version(name)
    staging = store.new_staging(name, "fake-run")
    (staging / "pack.db").write_bytes(b"placeholder")
    (staging / "skill.md").write_text("---\n")
    (staging / "manifest.json").write_text(
        json.dumps(
            {
                "name": name,
                "version": version,
                "previous_version": version - 1 or None,
                "built_at": (datetime.now(UTC) - timedelta(hours=2)).isoformat(),
                "sources": {"urls": 2, "ok": 1, "failed": 1, "failures": [], "invalid_lines": []},
                "changes": {
                    "fetched": 2,
                    "new": 0,
                    "changed": 1,
                    "unchanged": 0,
                    "failed": 1,
                    "not_modified": 0,
                    "removed": 3,
                    "changed_urls": ["https://docs.example.org/a"],
                },
                "extraction": {
                    "method": "claude:claude-haiku-4-5",
                    "llm_calls": 4,
                    "llm_input_tokens": 400,
                    "llm_output_tokens": 80,
                    "estimated_cost_usd": 0.0008,
                },
                **manifest,
            }
        )
    )
    store.publish(name, version, staging)
    return version


FAILURE = {"line": 2, "url": "https://docs.example.org/b", "error": "HTTP 404 Not Found"}


def test_status_shows_freshness_changes_failures_and_schedule(workspace, capsys):
    from kpack.store import PackStore, build_lock

    folder = write_pack(workspace, "widgets", ["https://docs.example.org/a"])
    code, out, _ = run(capsys, "status", "widgets")
    assert code == 0 and "never" in out and "kpack build widgets" in out

    publish_fake_version(workspace, "widgets")
    sources = {"urls": 2, "ok": 1, "failed": 1, "failures": [FAILURE], "invalid_lines": []}
    publish_fake_version(workspace, "widgets", sources=sources)
    PackStore(packs_dir=str(workspace / "packs")).record_build(
        "widgets",
        {
            "outcome": "unchanged",
            "version": 2,
            "checked_at": datetime.now(UTC).isoformat(),
            "run_id": "run-123",
        },
    )
    code, out, err = run(capsys, "status", "widgets")
    text = " ".join(out.split())
    assert code == 0
    assert "version v0002" in text and "previous kept version v0001" in text
    assert "(2h 0m ago)" in text
    assert "0 / 1 / 0 / 3" in text  # new / changed / unchanged / removed
    assert "changed pages (1): https://docs.example.org/a" in text  # which page changed
    assert "pages answered 304 Not Modified 0" in text
    assert "failed URLs 1" in text and "HTTP 404 Not Found" in err
    assert "4 / 400+80 / $0.0008" in text
    assert "nothing changed since v0002, nothing published (run run-123)" in text
    assert "build running no" in text
    # The schedule is off until turned on in the UI: no "next run" is promised.
    assert "0 3 * * 1 UTC, but pack_refresh_schedule is off" in text and "next run" not in text

    with build_lock(folder):
        code, out, _ = run(capsys, "status", "widgets", "--json")
    status = json.loads(out)
    assert code == 0 and status["build_running"] is True
    assert (status["version"], status["previous_version"]) == (2, 1)
    assert status["schedule"]["cron"] == "0 3 * * 1" and status["failures"] == [FAILURE]
    assert status["schedule"]["running"] is False and status["schedule"]["next"] is None
    assert json.loads(run(capsys, "status", "widgets", "--json")[1])["build_running"] is False


def test_rollback_restores_the_previous_version_atomically(workspace, capsys):
    from kpack.store import build_lock

    folder = write_pack(workspace, "widgets", ["https://docs.example.org/a"])
    code, _, err = run(capsys, "rollback", "widgets")
    assert code == 2 and "no published version" in err
    publish_fake_version(workspace, "widgets")
    code, _, err = run(capsys, "rollback", "widgets")
    assert code == 2 and "no previous version to roll back to" in err
    publish_fake_version(workspace, "widgets")

    with build_lock(folder):
        code, _, err = run(capsys, "rollback", "widgets")
    assert code == 2 and "already being built" in err
    assert os.readlink(folder / ".versions" / "current") == "v0002"

    code, out, _ = run(capsys, "rollback", "widgets")
    assert code == 0
    assert "rolled back from v0002 to v0001; version 1 is now current" in " ".join(out.split())
    assert os.readlink(folder / ".versions" / "current") == "v0001"
    assert json.loads((folder / "manifest.json").read_text())["version"] == 1
    assert json.loads(run(capsys, "status", "widgets", "--json")[1])["rolled_back_from"] == "v0002"
    code, _, err = run(capsys, "rollback", "widgets")
    assert code == 2 and "no previous version" in err

    # The next publish keeps the version it replaces (v0001), not the rolled-back one.
    assert publish_fake_version(workspace, "widgets") == 3
    assert sorted(p.name for p in (folder / ".versions").glob("v*")) == ["v0001", "v0003"]


@pytest.mark.parametrize("command", ["status", "rollback"])
def test_status_and_rollback_refuse_invalid_names(workspace, capsys, command):
    code, out, err = run(capsys, command, "../widgets")
    assert code == 2 and "invalid pack name" in err and "Traceback" not in out + err
