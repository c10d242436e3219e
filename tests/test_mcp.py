"""The MCP server as Claude Code runs it: `kpack mcp` as a subprocess, driven over stdio by the
official SDK's own client."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client

import kpack
import retrieval
from kpack.config import PROFILE_NAMES
from tests.conftest import TEST_FETCH, build, write_pack

PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
QUESTION = "Which environment variable sets where the sprocket cache lives?"
TOOLS = {"list_packs", "find_packs", "pack_info", "search_pack", "query_pack"}
DESCRIPTION = "The widget toolkit's guides: installing it, its sprocket cache, releases."


@pytest.fixture(scope="module")
def packs(site, tmp_path_factory) -> Path:
    workspace = tmp_path_factory.mktemp("mcp")
    config = {"fetch": TEST_FETCH, "description": DESCRIPTION}
    write_pack(workspace, "widgets", [site.url(p) for p in PAGES], config)
    write_pack(workspace, "unbuilt", [site.url("/docs/index.html")])
    assert build(workspace, "widgets").published
    return workspace / "packs"


def server(packs: Path) -> StdioServerParameters:
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "ANTHROPIC_API_KEY"  # the offline answer: quoted, never invented
    }
    env |= {"KPACK_PACKS_DIR": str(packs), "HF_HUB_OFFLINE": "1"}
    return StdioServerParameters(
        command=str(Path(sys.executable).with_name("kpack")), args=["mcp"], env=env
    )


def payload(result) -> dict:
    """A tool's result as Claude Code reads it: the JSON text of its content."""
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    assert result.is_error
    return result.content[0].text


def test_mcp_server_over_stdio(packs):
    expected = retrieval.query(packs / "widgets", QUESTION, use_llm=False)

    async def session() -> None:
        async with (
            stdio_client(server(packs)) as (read, write),
            ClientSession(read, write) as client,
        ):
            init = await client.initialize()
            assert init.server_info.name == "kpack" and "search_pack" in init.instructions
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            assert {"pack", "question", "k", "tokens"} == set(
                tools["search_pack"].input_schema["properties"]
            )
            # Descriptions a model reads as they are, and a server that says which it is.
            assert all("  " not in tool.description for tool in tools.values())
            assert init.server_info.version == kpack.version() != ""

            listed = payload(await client.call_tool("list_packs", {}))
            by_name = {p["name"]: p for p in listed["packs"]}
            assert by_name["widgets"]["published"] and not by_name["unbuilt"]["published"]
            assert by_name["widgets"]["description"] == DESCRIPTION
            assert "description" not in by_name["unbuilt"]

            info = payload(await client.call_tool("pack_info", {"pack": "widgets"}))
            assert info["version"] == 1 and info["counts"]["Article"] == 3
            assert info["skill_resource"] == "kpack://packs/widgets/skill.md"

            hits = payload(
                await client.call_tool(
                    "search_pack", {"pack": "widgets", "question": QUESTION, "k": 3}
                )
            )
            assert len(hits["results"]) == 3
            assert hits["results"][0]["text"] and hits["results"][0]["url"].startswith("http")
            scores = [hit["score"] for hit in hits["results"]]
            assert scores == sorted(scores, reverse=True) and scores[0] < 1.0
            assert hits["gate"]["refused"] is False and hits["results"][0]["confidence"] > 0.5
            budget = {"pack": "widgets", "question": QUESTION, "tokens": 150}
            context = payload(await client.call_tool("search_pack", budget))
            assert sum(hit["tokens"] for hit in context["results"]) <= 150

            answer = payload(
                await client.call_tool("query_pack", {"pack": "widgets", "question": QUESTION})
            )
            assert answer["answer"] == expected["answer"] and "[Source: " in answer["answer"]
            assert answer["citations"] == expected["citations"] and answer["llm_calls"] == 0
            # Every profile the CLI and kg_config.json accept, and no other name.
            profile = json.dumps(tools["query_pack"].input_schema["properties"]["profile"])
            assert all(f'"{name}"' in profile for name in PROFILE_NAMES)
            for name in ("latency_optimized", "coverage_optimized"):
                asked = {"pack": "widgets", "question": QUESTION, "profile": name}
                assert "[Source: " in payload(await client.call_tool("query_pack", asked))["answer"]
            assert "profile" in error_text(
                await client.call_tool(
                    "query_pack", {"pack": "widgets", "question": QUESTION, "profile": "fast"}
                )
            )

            assert "unknown pack 'nope'" in error_text(
                await client.call_tool("search_pack", {"pack": "nope", "question": "x"})
            )
            assert "the question is empty" in error_text(
                await client.call_tool("query_pack", {"pack": "widgets", "question": "  "})
            )
            assert "has not been built yet" in error_text(
                await client.call_tool("query_pack", {"pack": "unbuilt", "question": "x"})
            )
            assert "k" in error_text(
                await client.call_tool("search_pack", {"pack": "widgets", "question": "x", "k": 0})
            )

            resources = [str(r.uri) for r in (await client.list_resources()).resources]
            assert resources == ["kpack://packs/widgets/skill.md"]
            skill = (await client.read_resource("kpack://packs/widgets/skill.md")).contents[0]
            assert skill.text.startswith("---\nname: widgets-pack")
            assert f"\n{DESCRIPTION}\n" in skill.text
            assert "claude mcp add kpack -- kpack mcp" in skill.text
            with pytest.raises(MCPError, match="unknown pack 'nope'"):
                await client.read_resource("kpack://packs/nope/skill.md")

    anyio.run(session)
