"""The MCP server for Claude Code (`kpack mcp`, stdio), on the official ``mcp`` SDK.

Tools:

- ``list_packs``: every pack with its published version and figures;
- ``pack_info``: one pack's figures, embedding model and build record;
- ``search_pack``: ranked passages for a question (title, heading, URL, text, score);
- ``query_pack``: an answer with citations, written by Claude when the server has
  ``ANTHROPIC_API_KEY`` and quoted from the pack's passages when not.

Resources: each published pack's ``skill.md`` as ``kpack://packs/{name}/skill.md``.

A tool's mistake (unknown pack, empty question, pack never built) comes back as a tool error
with the CLI's message, for the model to read and correct; nothing else of the server is
exposed. The SDK runs the synchronous tools in worker threads, off its event loop, and while it
serves stdio it points the process's stdout at stderr, so nothing a library prints can corrupt
the protocol stream.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.types import Resource
from pydantic import Field

import retrieval
from kpack.packs import PackError
from retrieval.query import MAX_QUESTION_CHARS, MAX_SERVED_K, clean_question
from serving import catalog
from serving.catalog import ProfileName

SKILL_URI = "kpack://packs/{name}/skill.md"
INSTRUCTIONS = (
    "Knowledge packs are documentation sets indexed for retrieval. Call list_packs to see them, "
    "then search_pack for ranked passages or query_pack for an answer with citations. Answer "
    "from the passages, cite each one you use as [Source: title], and say so when the pack "
    "does not cover a question. Each pack's skill.md resource describes what it holds."
)

Question = Annotated[
    str, Field(description=f"the question, at most {MAX_QUESTION_CHARS:,} characters")
]
PackName = Annotated[str, Field(description="the pack's name, as list_packs gives it")]
K = Annotated[int, Field(ge=1, le=MAX_SERVED_K, description="how many passages")]


class PacksServer(MCPServer):
    """MCPServer whose resource list is the packs published now, not those at start-up."""

    def __init__(self, root: Path) -> None:
        super().__init__(name="kpack", instructions=INSTRUCTIONS, log_level="WARNING")
        self.root = root

    async def list_resources(self) -> list[Resource]:
        return [
            Resource(
                uri=SKILL_URI.format(name=row["name"]),
                name=f"{row['name']}-pack skill",
                description=f"What the {row['name']} pack holds and how to query it",
                mime_type="text/markdown",
            )
            for row in catalog.all_summaries(self.root)
            if row.get("published")
        ]


def create_server(packs_dir: Path | None = None) -> PacksServer:
    root = catalog.packs_root(packs_dir)
    server = PacksServer(root)

    @server.tool()
    def list_packs() -> dict[str, Any]:
        """List every knowledge pack: name, whether it is published, version, build time,
        article/section/chunk counts and embedding model."""
        return {"packs": catalog.all_summaries(root)}

    @server.tool()
    def pack_info(pack: PackName) -> dict[str, Any]:
        """Describe one pack: version, build time, counts, sources, embedding model, and the
        URI of its skill.md resource."""
        with _tool_errors():
            row = catalog.info(pack, root)
        manifest = row.pop("manifest", None) or {}
        row.pop("skill_md", None)  # available as the resource, not repeated here
        if manifest:
            row |= {
                "counts": manifest.get("counts"),
                "sources": {
                    k: manifest.get("sources", {}).get(k) for k in ("urls", "ok", "failed")
                },
                "embedding": manifest.get("embedding"),
                "extraction": (manifest.get("extraction") or {}).get("method"),
                "skill_resource": SKILL_URI.format(name=pack),
            }
        return row

    @server.tool()
    def search_pack(pack: PackName, question: Question, k: K = 5) -> dict[str, Any]:
        """Ranked passages of a pack for a question (vector search fused with BM25 and the
        pack's entity graph): title, heading, URL, text and score of each. Answer from them and cite
        them as [Source: title]."""
        with _tool_errors():
            folder = catalog.pack_folder(pack, root)
            hits = retrieval.search(folder, clean_question(question), k=k)
        return {
            "pack": pack,
            "version": catalog.version_of(folder),
            "results": [
                {
                    "title": h["title"],
                    "heading": h["heading"],
                    "url": h["url"],
                    "score": h["score"],
                    "text": h["text"],
                }
                for h in hits
            ],
        }

    @server.tool()
    def query_pack(
        pack: PackName,
        question: Question,
        profile: ProfileName | None = None,
        use_llm: bool = True,
        k: K = 5,
    ) -> dict[str, Any]:
        """Answer a question from a pack, with citations. Claude writes the answer when the
        server has ANTHROPIC_API_KEY; without one the answer quotes the pack's sentences,
        each followed by [Source: title]. query_type says whether the pack had relevant
        passages (vector_search) or not (a fallback)."""
        with _tool_errors():
            folder = catalog.pack_folder(pack, root)
            result = retrieval.query(
                folder,
                clean_question(question),
                profile=profile,
                use_llm=use_llm,
                max_results=k,
            )
        return {
            "pack": pack,
            "version": catalog.version_of(folder),
            "answer": result["answer"],
            "citations": result["citations"],
            "sources": result["sources"],
            "query_type": result["query_type"],
            "llm_calls": result["token_usage"]["api_calls"],
        }

    @server.resource(
        SKILL_URI,
        name="pack skill",
        description="A pack's skill.md: what it holds and how to query it",
        mime_type="text/markdown",
    )
    def skill(name: str) -> str:
        try:
            return catalog.skill_md(name, root)
        except PackError as exc:
            error = ResourceError if "not been built" in str(exc) else ResourceNotFoundError
            raise error(str(exc)) from exc

    return server


@contextmanager
def _tool_errors() -> Iterator[None]:
    """PackError (unknown pack, empty question, never built) -> a ToolError with its message."""
    try:
        yield
    except PackError as exc:
        raise ToolError(str(exc)) from exc


def run_stdio(packs_dir: Path | None = None) -> None:
    """Serve over stdin/stdout until the client closes the stream (what `kpack mcp` does)."""
    # Warnings and the SDK's own log lines go to stderr, which Claude Code shows as the
    # server's log; INFO lines per tool call would only be noise there.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    create_server(packs_dir).run("stdio")
