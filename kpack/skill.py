"""skill.md: a published pack described as a Claude Code skill.

Written next to manifest.json in every version by the pack_manifest stage, and written again by
``kpack install`` (the installed pack may carry another name and always another local version
number, and the skill must name the pack the way this machine knows it). It lives in the core
so both can produce the same text without the installer importing Dagster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import kuzu

TOP_ARTICLES = 10
TOP_ENTITIES = 20


def skill_inputs(conn: kuzu.Connection) -> tuple[list[tuple[str, str]], list[str]]:
    """The most central articles (title, url) by PageRank and the most frequent entities."""
    top_articles = [
        (title, url)
        for title, url in conn.execute(
            "MATCH (a:Article) RETURN a.title, a.url ORDER BY a.pagerank DESC, a.title "
            f"LIMIT {TOP_ARTICLES}"
        ).get_all()
    ]
    top_entities = [
        row[0]
        for row in conn.execute(
            "MATCH (e:Entity) WHERE e.type <> 'topic' "
            f"RETURN e.name ORDER BY e.mention_count DESC, e.name LIMIT {TOP_ENTITIES}"
        ).get_all()
    ]
    return top_articles, top_entities


def skill_markdown(
    manifest: dict, top_articles: list[tuple[str, str]], top_entities: list[str]
) -> str:
    name, counts = manifest["name"], manifest["counts"]
    articles = "\n".join(f"- [{title}]({url})" for title, url in top_articles)
    return f"""---
name: {name}-pack
description: Answers questions about the {name} knowledge pack's documentation ({counts["Article"]} articles, {counts["Section"]} sections), citing its sources. Use for questions on {", ".join(top_entities[:8]) or name}.
---

# {name} knowledge pack

A Knowledge Pack built from {manifest["sources"]["ok"]} documentation pages (version {manifest["version"]}, built {manifest["built_at"]}).
It holds {counts["Article"]} articles, {counts["Section"]} sections, {counts["Chunk"]} chunks, {counts["Entity"]} entities and {counts["Fact"]} facts,
embedded with {manifest["embedding"]["model"]} ({manifest["embedding"]["dimension"]} dimensions).

## How to query it

Answer from the pack's passages and cite each one you use as [Source: title]. If the best
passages do not address the question, say the pack does not cover it.

### From Claude Code, through the MCP server

The `kpack mcp` server (stdio) serves every pack of the packs folder. Register it once:

```bash
claude mcp add kpack -- kpack mcp
```

(use the full path of `kpack`, such as `/path/to/knowledge-packs/.venv/bin/kpack`, when it is
not on PATH; for another packs folder put `--env KPACK_PACKS_DIR=/path/to/packs` before the
server name `kpack`). Then call:

- `search_pack` with `pack="{name}"` and the question: ranked passages with title, heading, URL
  and text, to answer from;
- `query_pack` with `pack="{name}"` and the question: an answer with citations (written by
  Claude when the server has `ANTHROPIC_API_KEY`, quoted from the passages when not);
- `pack_info` with `pack="{name}"`: version, counts, embedding model; `list_packs`: every pack.

This file is also the MCP resource `kpack://packs/{name}/skill.md`.

### From the shell

```bash
kpack search {name} "your question" --k 5 --json   # ranked passages
kpack query {name} "your question" --json          # answer with citations
```

### From Python

```python
import retrieval
for hit in retrieval.search("{name}", "your question", k=5):
    print(hit["score"], hit["heading"], hit["url"])  # heading starts with the title
```

### Over HTTP (while `kpack serve` runs)

```bash
curl -s http://127.0.0.1:8000/packs/{name}/search -H 'content-type: application/json' \\
  -d '{{"question": "your question", "k": 5}}'
```

## Most central articles (PageRank over the links between articles)

{articles}

## Frequent entities

{", ".join(top_entities)}
"""
