"""The MCP server for Claude Code (`kpack mcp`, stdio), on the official ``mcp`` SDK.

Tools:

- ``list_packs``: every pack with its published version, its documentation's release and figures;
- ``find_packs``: the packs that hold a library or a topic, best first (serving.resolve);
- ``pack_info``: one pack's figures, embedding model and build record;
- ``search_pack``: ranked passages for a question (title, heading, URL, text, score);
- ``query_pack``: an answer with citations, written by Claude when the server has
  ``ANTHROPIC_API_KEY`` and quoted from the pack's passages when not.

Resources: each published pack's ``skill.md`` as ``kpack://packs/{name}/skill.md``.

A tool's mistake (unknown pack, empty question, pack never built) comes back as a tool error
with the CLI's message, for the model to read and correct; nothing else of the server is
exposed (an unknown pack's message names neither the packs folder nor the other packs). A
pack whose version fails to open or search is reported by list_packs and its tools' errors
(serving.health); the other packs answer. The SDK runs the synchronous tools in worker threads, off its event loop, and while it
serves stdio it points the process's stdout at stderr, so nothing a library prints can corrupt
the protocol stream.

A line on stdin that is not a JSON-RPC message gets the JSON-RPC 2.0 error reply: -32700
(parse error) when it is not JSON, -32600 (invalid request) when it is JSON but not a message
(with the line's ``id`` when it has a usable one, else null). The SDK only logs such lines and
answers nothing, so a client would wait forever; :class:`CheckedLines` answers them before the
SDK reads its input.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from io import TextIOWrapper
from pathlib import Path
from typing import Annotated, Any

import anyio
import mcp_types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import Resource
from pydantic import Field, ValidationError

import retrieval
from kpack import version
from kpack.packs import PackError
from retrieval.query import MAX_QUESTION_CHARS, MAX_SERVED_K, MAX_TOKENS, clean_question
from retrieval.registry import open_versions_in_background
from serving import catalog
from serving.catalog import ProfileName, served_k
from serving.health import PackHealth
from serving.resolve import resolve

SKILL_URI = "kpack://packs/{name}/skill.md"
INSTRUCTIONS = (
    "Knowledge packs are documentation sets indexed for retrieval. Call list_packs to see them "
    "(or find_packs with a library's name or a topic to find the right ones), then search_pack "
    "for ranked passages or query_pack for an answer with citations. Answer from the passages, "
    "cite each one you use as [Source: title], and say so when the pack does not cover a "
    "question. Each pack's skill.md resource describes what it holds."
)

Question = Annotated[
    str, Field(description=f"the question, at most {MAX_QUESTION_CHARS:,} characters")
]
PackName = Annotated[
    str,
    Field(
        description="the pack's name, as list_packs gives it; several names joined by commas "
        "(pandas,python) ask those packs together"
    ),
]
K = Annotated[
    int, Field(ge=1, le=MAX_SERVED_K, description="how many passages (5; 20 with tokens)")
]
Tokens = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_TOKENS,
        description="a budget: whole passages, best first, up to this many tokens",
    ),
]


class PacksServer(MCPServer):
    """MCPServer whose resource list is the packs published now, not those at start-up."""

    def __init__(self, root: Path) -> None:
        super().__init__(
            name="kpack", version=version(), instructions=INSTRUCTIONS, log_level="WARNING"
        )
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

    async def run_stdio_async(self) -> None:
        """The SDK's stdio loop, reading stdin through CheckedLines."""
        stdin = TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
        lines = CheckedLines(anyio.wrap_file(stdin))
        async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
            lines.answer_through(write_stream)
            await self._lowlevel_server.run(
                read_stream, write_stream, self._lowlevel_server.create_initialization_options()
            )


def rejection(line: str) -> mcp_types.JSONRPCError | None:
    """The JSON-RPC error reply to a line that is not a JSON-RPC message; None for a message."""
    try:
        mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        return None
    except ValidationError as exc:
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            code, message, given = mcp_types.PARSE_ERROR, "Parse error: the line is not JSON", None
        else:
            code, message = mcp_types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message"
            try:
                data = json.loads(line)
            except (ValueError, RecursionError):  # JSON to pydantic, too deep for Python's
                data = None
            given = data.get("id") if isinstance(data, dict) else None
    usable = isinstance(given, str) or (isinstance(given, int) and not isinstance(given, bool))
    return mcp_types.JSONRPCError(
        jsonrpc="2.0",
        id=given if usable else None,
        error=mcp_types.ErrorData(code=code, message=message),
    )


class CheckedLines:
    """stdin's lines as the SDK reads them, minus those that are not JSON-RPC messages: each of
    those is answered with its error (see :func:`rejection`) through the SDK's own writer, so
    replies never interleave. Blank lines are skipped."""

    def __init__(self, source: AsyncIterable[str]) -> None:
        self.source = source
        self.replies: MemoryObjectSendStream[SessionMessage] | None = None
        self.ready = anyio.Event()

    def answer_through(self, replies: MemoryObjectSendStream[SessionMessage]) -> None:
        self.replies = replies
        self.ready.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self.source:
            if not line.strip():
                continue
            error = rejection(line)
            if error is None:
                yield line
                continue
            await self.ready.wait()
            assert self.replies is not None
            await self.replies.send(SessionMessage(error))


def one_line(text: str | None) -> str:
    """A docstring as a tool's description: one line, single spaces (a docstring's indentation
    would reach the model as runs of spaces)."""
    return " ".join((text or "").split())


def create_server(packs_dir: Path | None = None) -> PacksServer:
    root = catalog.packs_root(packs_dir)
    server = PacksServer(root)
    health = PackHealth()

    def tool(function: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        return server.tool(description=one_line(function.__doc__))(function)

    @tool
    def list_packs() -> dict[str, Any]:
        """List every knowledge pack: name, whether it is published, version, the title and
        release of its documentation, build time, article/section/chunk counts and embedding
        model."""
        return {"packs": health.summaries(root)}

    @tool
    def find_packs(
        library_or_topic: Annotated[
            str,
            Field(description="a library's name (pandas) or a topic (reading CSV files)"),
        ],
        limit: Annotated[int, Field(ge=1, le=50, description="how many packs at most")] = 5,
    ) -> dict[str, Any]:
        """Find the packs that document a library or a topic, best first: each with its
        documentation's title and release, name_match (2: the request is the pack's name, 1:
        its documentation's name), the words of the request it holds and how similar its best
        passage is. Call it before search_pack or query_pack when you do not know which pack
        to ask."""
        with _tool_errors():
            return {"packs": resolve(library_or_topic, root, limit)}

    @tool
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

    @tool
    def search_pack(
        pack: PackName, question: Question, k: K | None = None, tokens: Tokens | None = None
    ) -> dict[str, Any]:
        """Ranked passages of a pack for a question: title, heading, deep link (url), text,
        confidence, score and similarity of each, and whether the confidence gate would refuse
        the question. Give tokens for context: whole passages (code verbatim) up to that many
        tokens. Answer from them and cite them as [Source: title]. Several packs: their
        passages merged on similarity (the question's cosine with each passage, one scale for
        all), each naming its pack; version and gate are then each pack's, by name."""
        with _tool_errors():
            folder = catalog.pack_folders(pack, root)
            with health.failures_of(pack, folder):
                hits = retrieval.search(
                    folder, clean_question(question), k=served_k(k, tokens), tokens=tokens
                )
        return {
            "pack": pack,
            "version": hits.version,  # the version that answered, whatever is current now
            "gate": hits.gate,
            "results": [
                {
                    "pack": h.get("pack", pack),
                    "title": h["title"],
                    "heading": h["heading"],
                    "url": h["url"],
                    "score": h["score"],
                    "confidence": h["confidence"],
                    "similarity": h["similarity"],
                    "text": h["text"],
                    **({"tokens": h["tokens"]} if tokens is not None else {}),
                }
                for h in hits
            ],
        }

    @tool
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
        passages (vector_search) or not (a fallback). Several packs: the one whose passages
        are the most similar to the question answers, and ``pack`` names it."""
        with _tool_errors():
            folder = catalog.pack_folders(pack, root)
            with health.failures_of(pack, folder):
                result = retrieval.query(
                    folder,
                    clean_question(question),
                    profile=profile,
                    use_llm=use_llm,
                    max_results=k,
                )
        return {
            "pack": result.get("pack", pack),  # of several packs, the one that answered
            "version": result["version"],
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
    open_versions_in_background()  # a publish never makes a tool call wait for an open
    create_server(packs_dir).run("stdio")
