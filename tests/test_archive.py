"""Packs that travel: export, validate and install over real files (and a loopback URL).

One pack is built for the session (tests/conftest.py: ``built`` and its ``archive``); every
test exports it or installs one of its archives into other packs folders, and the installed
pack must answer exactly as the built one.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

import retrieval
from cli.main import main
from kpack.archive import ARCHIVE_MANIFEST, export_pack, install, validate
from kpack.archive.staging import LOCK_FILE, STAGING_FOLDER
from kpack.index_files import ANN_FILES, INDEX_FILES
from kpack.packs import PackError

QUESTIONS = [
    "Which environment variable sets where the sprocket cache lives?",
    "How do I install the toolkit?",
    "When are releases cut?",
    "Who won the football world cup in 1998?",
]


def leftovers(packs: Path) -> list[str]:
    """What an install or validate left in the packs folder's staging area (its lock file is
    meant to stay)."""
    staging = packs / STAGING_FOLDER
    return (
        sorted(p.name for p in staging.iterdir() if p.name != LOCK_FILE) if staging.exists() else []
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def without_timings(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "timings_ms"}


def test_export_writes_one_archive_with_a_checksum_per_file(built, archive):
    with tarfile.open(archive, "r:gz") as tar:
        names = tar.getnames()
        header = json.loads(tar.extractfile(ARCHIVE_MANIFEST).read())
        contents = {name: tar.extractfile(name).read() for name in header["files"]}
    assert names[0] == ARCHIVE_MANIFEST
    assert set(header["files"]) == {
        "pack.db",
        "manifest.json",
        "skill.md",
        "articles.json",
        "graph_evidence.json",  # which graph stages it runs (kpack.graph_evidence)
        "urls.txt",
        "kg_config.json",
        "eval/questions.jsonl",
        # The retrieval indexes travel with the version (a small pack has no ANN index).
        *(f"indexes/{name}" for name in INDEX_FILES if name not in ANN_FILES.values()),
    }
    for name, data in contents.items():
        assert header["files"][name] == {
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
    version = (built / "widgets" / ".versions" / "current").resolve()
    assert contents["pack.db"] == (version / "pack.db").read_bytes()
    assert header["pack"] == "widgets" and header["version"] == 1
    assert header["embedding"]["model"] == "sentence-transformers/all-MiniLM-L6-v2"


def test_installed_pack_answers_exactly_as_the_built_one(built, archive, tmp_path):
    other = tmp_path / "elsewhere" / "packs"
    result = install(archive, packs_root=other)
    assert (result.pack, result.version, result.replaced) == ("widgets", 1, False)
    source, target = built / "widgets", other / "widgets"
    for name in ("urls.txt", "eval/questions.jsonl"):
        assert (target / name).read_bytes() == (source / name).read_bytes()
    # The query settings travel as they are; the fetch settings reaching outside the pack
    # (tests/test_archive_hostile.py) are dropped.
    settings, installed = (json.loads((f / "kg_config.json").read_text()) for f in (source, target))
    assert installed["query"] == settings["query"]
    assert result.dropped == ["fetch.allow_private_hosts true"]
    assert sha256(target / "pack.db") == sha256(source / "pack.db")
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["version"] == 1 and manifest["installed_from"]["archive"] == archive.name
    assert leftovers(other) == []
    for question in QUESTIONS:
        assert retrieval.search(target, question, k=5) == retrieval.search(source, question, k=5)
        here = retrieval.query(source, question, use_llm=False)
        there = retrieval.query(target, question, use_llm=False)
        assert without_timings(there) == without_timings(here), question
    assert retrieval.query(target, QUESTIONS[0], use_llm=False)["query_type"] == "vector_search"


def test_install_under_another_name_and_as_a_new_version(archive, tmp_path):
    other = tmp_path / "packs"
    copy = install(archive, packs_root=other, name="copy")
    skill = (copy.folder / "skill.md").read_text()
    assert skill.startswith("---\nname: copy-pack") and 'kpack search copy "' in skill
    assert json.loads((copy.folder / "manifest.json").read_text())["name"] == "copy"
    with pytest.raises(PackError, match=r"already exists .* --as NAME, or .* --replace"):
        install(archive, packs_root=other, name="copy")
    (copy.folder / "few_shot_examples.json").write_text("[]")  # not in the archive: removed
    again = install(archive, packs_root=other, name="copy", replace=True)
    assert (again.version, again.replaced) == (2, True)
    versions = sorted(p.name for p in (copy.folder / ".versions").glob("v*"))
    assert versions == ["v0001", "v0002"]
    assert (copy.folder / ".versions" / "current").resolve().name == "v0002"
    assert not (copy.folder / "few_shot_examples.json").exists()
    assert not list((copy.folder / ".versions").glob("staging*"))
    manifest = json.loads((copy.folder / "manifest.json").read_text())
    assert (manifest["version"], manifest["previous_version"]) == (2, 1)
    assert retrieval.search(copy.folder, QUESTIONS[1], k=3)


def test_validate_a_pack_and_an_archive(built, archive):
    for target in ("widgets", str(archive)):
        report = validate(target, built)
        assert report.ok, report.checks
        names = [c.name for c in report.checks]
        assert {"manifest", "embedding model", "database checksum", "database", "vectors"} <= set(
            names
        )
    report = validate("unbuilt", built)
    assert not report.ok and "never built" in report.checks[0].detail


def rewrite(
    source: Path,
    target: Path,
    edit: Callable[[dict[str, bytes]], None] = lambda files: None,
    rehash: bool = True,
    extra: Callable[[tarfile.TarFile], None] | None = None,
) -> Path:
    """A copy of an archive with its files edited; the checksums recomputed unless told not."""
    with tarfile.open(source, "r:gz") as tar:
        header = json.loads(tar.extractfile(ARCHIVE_MANIFEST).read())
        files = {name: tar.extractfile(name).read() for name in header["files"]}
    edit(files)
    if rehash:
        header["files"] = {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for name, data in files.items()
        }
    with tarfile.open(target, "w:gz") as tar:
        for name, data in [(ARCHIVE_MANIFEST, json.dumps(header).encode()), *files.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra:
            extra(tar)
    return target


def flip_a_byte(files: dict[str, bytes]) -> None:
    data = bytearray(files["pack.db"])
    data[len(data) // 2] ^= 0xFF
    files["pack.db"] = bytes(data)


def other_model(files: dict[str, bytes]) -> None:
    manifest = json.loads(files["manifest.json"])
    manifest["embedding"]["model"] = "no-such-org/no-such-model"
    files["manifest.json"] = json.dumps(manifest).encode()


def add_member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"x"):
    def extra(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

    return extra


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (partial(rewrite, edit=flip_a_byte, rehash=False), "checksum mismatch for pack.db"),
        (partial(rewrite, edit=flip_a_byte), r"database checksum: the version is damaged"),
        (partial(rewrite, edit=other_model), "no-such-org/no-such-model cannot be loaded"),
        (partial(rewrite, extra=add_member("../evil.txt")), "would write outside the pack folder"),
        (partial(rewrite, extra=add_member("/tmp/evil.txt")), "absolute path"),
        (partial(rewrite, extra=add_member("eval/../../evil.txt")), "outside the pack folder"),
        (
            partial(rewrite, extra=add_member("evil", tarfile.SYMTYPE, "/etc/passwd")),
            "'evil' is a symbolic link",
        ),
        (
            partial(rewrite, extra=add_member("hard", tarfile.LNKTYPE, "pack.db")),
            "'hard' is a hard link",
        ),
        (partial(rewrite, extra=add_member("notes.txt")), "unexpected member 'notes.txt'"),
        (
            partial(rewrite, edit=lambda files: files.pop("urls.txt")),
            r"the archive lacks \['urls.txt'\]",
        ),
    ],
)
def test_bad_archives_are_refused_and_nothing_is_written(archive, tmp_path, make, message):
    bad = make(archive, tmp_path / "bad.kpack")
    other = tmp_path / "packs"
    with pytest.raises(PackError, match=message):
        install(bad, packs_root=other)
    assert leftovers(other) == []  # no pack, no staging, no leftovers
    assert not other.exists() or [p.name for p in other.iterdir()] == [STAGING_FOLDER]
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil.txt").exists()
    report = validate(bad, other)
    assert not report.ok and re.search(message, report.failures()), report.checks


def test_not_an_archive(tmp_path):
    junk = tmp_path / "junk.kpack"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(PackError, match="is not a kpack archive"):
        install(junk, packs_root=tmp_path / "packs")
    with pytest.raises(PackError, match="no such file"):
        install(tmp_path / "missing.kpack", packs_root=tmp_path / "packs")


@contextmanager
def serving(folder: Path) -> Iterator[str]:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(folder)))
    thread = Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_install_from_a_url(archive, tmp_path):
    other = tmp_path / "packs"
    with serving(archive.parent) as base:
        result = install(f"{base}/{archive.name}", packs_root=other, name="fetched")
        with pytest.raises(PackError, match=r"cannot download .*404"):
            install(f"{base}/missing.kpack", packs_root=other)
    assert result.version == 1 and (other / "fetched" / "pack.db").is_file()
    assert leftovers(other) == []


def test_export_of_a_pack_never_built(built, tmp_path):
    with pytest.raises(PackError, match="has not been built yet"):
        export_pack("unbuilt", tmp_path / "x.kpack", built)


def test_cli_export_install_validate(built, tmp_path, monkeypatch, capsys):
    out = tmp_path / "cli.kpack"
    monkeypatch.setenv("KPACK_PACKS_DIR", str(built))
    assert main(["export", "widgets", "-o", str(out)]) == 0
    assert "exported widgets version 1" in capsys.readouterr().out
    assert main(["validate", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["pack"] == "widgets"
    monkeypatch.setenv("KPACK_PACKS_DIR", str(tmp_path / "packs"))
    assert main(["install", str(out), "--as", "viacli"]) == 0
    assert "as viacli version 1" in capsys.readouterr().out
    assert main(["validate", "viacli"]) == 0
    assert main(["install", str(tmp_path / "nope.kpack")]) == 2
    assert "no such file" in " ".join(capsys.readouterr().err.split())  # rich wraps lines
