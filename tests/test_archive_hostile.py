"""Archives from strangers (issue 36): an archive is data, never policy. A resealed archive
whose index has the wrong shape is refused by validate and install; an archive's kg_config.json
cannot widen what the installed pack's next build reads unless the user trusts it at install.
Real archives written byte for byte, real installs and a real build."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from kpack.archive import install, validate
from kpack.config import load_config
from kpack.packs import PackError, current_version
from tests.conftest import build
from tests.test_archive import leftovers, rewrite

SECRET = "AWS_SECRET_ACCESS_KEY=invented-for-this-test-0001"


def wrong_shape(files: dict[str, bytes]) -> None:
    """The chunk vectors replaced by a (3, 7) float32 array (the checksums recomputed)."""
    out = io.BytesIO()
    np.save(out, np.ones((3, 7), dtype=np.float32))
    data = out.getvalue()
    manifest = json.loads(files["manifest.json"])
    manifest["indexes"]["indexes/chunk_vectors.npy"] = {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    files["manifest.json"] = json.dumps(manifest).encode()
    files["indexes/chunk_vectors.npy"] = data


def test_a_resealed_archive_with_a_wrong_shape_index_is_refused(archive, tmp_path):
    bad = rewrite(archive, tmp_path / "bad.kpack", edit=wrong_shape)
    report = validate(bad, tmp_path / "packs")
    assert not report.ok
    assert "indexes/chunk_vectors.npy has shape (3, 7)" in report.failures(), report.checks
    assert "the manifest implies 11 along axis 0" in report.failures()
    with pytest.raises(PackError, match=r"indexes: indexes/chunk_vectors.npy has shape \(3, 7\)"):
        install(bad, packs_root=tmp_path / "packs")
    assert leftovers(tmp_path / "packs") == []
    good = validate(archive, tmp_path / "packs")
    assert good.ok and any(c.name == "indexes" for c in good.checks)


def widening(secret_file: Path):
    def edit(files: dict[str, bytes]) -> None:
        config = json.loads(files.get("kg_config.json", b"{}"))
        config["fetch"] = {**config.get("fetch", {}), "file_roots": ["/"]}
        config["fetch"]["allow_private_hosts"] = True
        files["kg_config.json"] = json.dumps(config).encode()
        urls = files["urls.txt"].decode() + f"file://{secret_file}\nhttp://10.0.0.1/admin\n"
        files["urls.txt"] = urls.encode()

    return edit


def test_an_installed_archive_cannot_widen_what_its_build_reads(archive, tmp_path):
    secret = tmp_path / "home" / "creds.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    stranger = rewrite(archive, tmp_path / "stranger.kpack", edit=widening(secret))
    workspace = tmp_path / "work"
    packs = workspace / "packs"
    result = install(stranger, packs_root=packs)
    assert result.dropped == ["fetch.allow_private_hosts true", 'fetch.file_roots ["/"]']
    fetch = load_config(result.folder).fetch
    assert fetch.file_roots == (".",) and not fetch.allow_private_hosts
    before = current_version(result.folder)
    outcome = build(workspace, "widgets", force=True)
    # Nothing it may read is left (the loopback pages are a private address too): the build
    # fails, the installed version stays current, and the secret was never read.
    assert not outcome.published
    assert current_version(result.folder) == before
    for version in (result.folder / ".versions").iterdir():
        for path in version.rglob("*"):
            assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
    # Granted at install, the settings are kept as the archive has them.
    trusted = install(stranger, packs_root=tmp_path / "trusted", trust_config=True)
    assert trusted.dropped == []
    assert load_config(trusted.folder).fetch.file_roots == ("/",)


def test_the_cli_says_what_install_dropped(archive, tmp_path, monkeypatch, capsys):
    secret = tmp_path / "creds.txt"
    secret.write_text(SECRET)
    stranger = rewrite(archive, tmp_path / "stranger.kpack", edit=widening(secret))
    monkeypatch.setenv("KPACK_PACKS_DIR", str(tmp_path / "packs"))
    assert main(["install", str(stranger)]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert 'fetch.allow_private_hosts true, fetch.file_roots ["/"] (they would let' in said
    assert "--trust-config" in said
