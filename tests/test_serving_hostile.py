"""The servers against hostile clients and broken packs (issue 36): the Host names `kpack serve`
answers, a pack that fails to open never takes the others down, and an unknown pack's error
names neither the packs folder nor the other packs. Real uvicorn on loopback, httpx as the
client, the MCP server's own tool calls."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import httpx
import numpy as np
import pytest
from mcp.server.mcpserver.exceptions import ToolError

from kpack.errors import PackError
from kpack.packs import current_version
from kpack.store import seal_version
from serving.http import create_app
from serving.mcp import create_server
from serving.middleware import served_hosts
from tests.test_serving_http import running

QUESTION = "How do I install the toolkit?"


def resealed_with_wrong_shape(folder: Path) -> None:
    """The pack's chunk vectors replaced by a (3, 7) array and the version sealed again, as a
    stranger's archive would arrive: every checksum matches, the shape is wrong."""
    version = current_version(folder)
    np.save(version / "indexes" / "chunk_vectors.npy", np.ones((3, 7), dtype=np.float32))
    (version / ".verified.json").unlink(missing_ok=True)
    seal_version(version)


@pytest.fixture
def packs(built, tmp_path) -> Path:
    """widgets (good), broken (its vectors resealed with a wrong shape) and unbuilt."""
    packs = tmp_path / "packs"
    shutil.copytree(built, packs, symlinks=True)
    shutil.copytree(packs / "widgets", packs / "broken", symlinks=True)
    resealed_with_wrong_shape(packs / "broken")
    return packs


def test_a_server_with_one_broken_pack_serves_the_others(packs):
    with running(create_app(packs, warmup=True)) as url, httpx.Client(base_url=url) as client:
        assert client.get("/healthz").json() == {
            "status": "degraded",
            "failing_packs": ["broken"],
        }
        rows = {row["name"]: row for row in client.get("/packs").json()["packs"]}
        assert rows["widgets"]["serving"] and not rows["broken"]["serving"]
        assert "kpack validate broken" in rows["broken"]["error"]
        good = client.post("/packs/widgets/search", json={"question": QUESTION}, timeout=60)
        assert good.status_code == 200 and good.json()["results"]
        bad = client.post("/packs/broken/query", json={"question": QUESTION}, timeout=60)
        assert bad.status_code == 409
        assert "'broken' cannot answer" in bad.json()["detail"]
        assert str(packs) not in bad.json()["detail"]


def test_mcp_reports_a_broken_pack_and_answers_from_the_others(packs):
    server = create_server(packs)

    async def session() -> None:
        with pytest.raises(ToolError, match="'broken' cannot answer: its version 1 failed"):
            await server.call_tool("search_pack", {"pack": "broken", "question": QUESTION})
        found = await server.call_tool("search_pack", {"pack": "widgets", "question": QUESTION})
        assert found
        listed = await server.call_tool("list_packs", {})
        assert "cannot answer" in str(listed) and "kpack validate broken" in str(listed)

    anyio.run(session)


def test_an_unknown_pack_names_neither_the_folder_nor_the_other_packs(packs):
    with running(create_app(packs)) as url:
        response = httpx.get(f"{url}/packs/no-such-pack")
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert "unknown pack 'no-such-pack'" in detail
    assert str(packs) not in detail and "widgets" not in detail and "unbuilt" not in detail

    async def ask() -> None:
        await create_server(packs).call_tool("search_pack", {"pack": "nope", "question": "x"})

    with pytest.raises(ToolError) as raised:
        anyio.run(ask)
    assert str(packs) not in str(raised.value) and "widgets" not in str(raised.value)


def test_the_server_answers_only_the_host_names_it_is_served_as(packs):
    with running(create_app(packs)) as url:
        port = url.rsplit(":", 1)[1]
        for name in ("127.0.0.1", "localhost"):
            assert httpx.get(f"{url}/packs", headers={"Host": f"{name}:{port}"}).is_success
        # DNS rebinding: a page of attacker.example whose name now points at 127.0.0.1.
        rebound = httpx.get(f"{url}/packs", headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 400 and "widgets" not in rebound.text
    allowed = served_hosts("127.0.0.1", ["docs.internal"])
    with running(create_app(packs, allowed_hosts=allowed)) as url:
        assert httpx.get(f"{url}/packs", headers={"Host": "docs.internal"}).is_success
        assert httpx.get(f"{url}/packs", headers={"Host": "other.internal"}).status_code == 400


def test_served_hosts():
    assert served_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "[::1]"]
    assert served_hosts("::1") == ["localhost", "127.0.0.1", "[::1]"]
    assert served_hosts("0.0.0.0", ["Docs.Example"]) == [
        "localhost",
        "127.0.0.1",
        "[::1]",
        "docs.example",
    ]
    assert served_hosts("192.0.2.7")[-1] == "192.0.2.7"
    assert served_hosts("2001:db8::1")[-1] == "[2001:db8::1]"
    with pytest.raises(PackError, match="invalid host name 'a\\*b'"):
        served_hosts("127.0.0.1", ["a*b"])
