"""Serving published packs to other programs: an HTTP API (``serving.http``, `kpack serve`) and
an MCP server for Claude Code (``serving.mcp``, `kpack mcp`).

Both only read published versions through the ``retrieval`` package and ``kpack`` core, so a
build that publishes a new version is picked up by the next request, without a restart.
"""
