"""skill.md: a published pack described as a Claude Code skill.

Written next to manifest.json in every version by the pack_manifest stage, and written again by
``kpack install`` (the installed pack may carry another name and always another local version
number, and the skill must name the pack the way this machine knows it). It lives in the core
so both can produce the same text without the installer importing Dagster.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import kuzu

# How much of the pack skill.md names, so an agent reads what the pack covers at a glance:
# its most linked-to articles, its topics, the topics its one-line description names, terms.
TOP_ARTICLES, TOP_TOPICS, DESCRIPTION_TOPICS, TOP_TERMS = 10, 20, 8, 20
# A heading or term found in more than this share of the articles (of a pack of
# MIN_ARTICLES_FOR_SHARE or more) is the pack's common vocabulary ("Examples", "None", "True",
# "Python" in the Python docs), not what sets one part of it apart.
MAX_SHARE = 0.5
MIN_ARTICLES_FOR_SHARE = 4
# "5.1. More on Lists" -> "More on Lists"
HEADING_NUMBER = re.compile(r"^\s*(?:\d+(?:\.\d+)*\.?|[A-Z]\.)\s+")


class SkillInputs(NamedTuple):
    articles: list[tuple[str, str]]  # the most central (title, url) by PageRank
    topics: list[str]  # distinctive section headings, most distinctive first
    terms: list[str]  # distinctive entities, most distinctive first


def skill_inputs(conn: kuzu.Connection) -> SkillInputs:
    """What skill.md names: the most central articles, and the pack's topics and terms ranked
    by how distinctive they are (idf over the articles): a heading or a name found in every
    article says nothing of what the pack covers."""
    articles = [
        (title, url)
        for title, url in conn.execute(
            "MATCH (a:Article) RETURN a.title, a.url ORDER BY a.pagerank DESC, a.title "
            f"LIMIT {TOP_ARTICLES}"
        ).get_all()
    ]
    total = conn.execute("MATCH (a:Article) RETURN count(a)").get_all()[0][0]
    return SkillInputs(articles, _topics(conn, total), _terms(conn, total))


def _idf(articles: int, total: int) -> float:
    return math.log((total + 1) / articles)


def _most_articles(total: int) -> float:
    """In how many articles a heading or term may be found and still be distinctive."""
    return total * MAX_SHARE if total >= MIN_ARTICLES_FOR_SHARE else total


def _topics(conn: kuzu.Connection, total: int) -> list[str]:
    """Section headings (an article's introduction is titled with the article), weighted by
    the words under them and their idf; one in more than MAX_SHARE of the articles is left
    out."""
    shown: dict[str, str] = {}
    articles: dict[str, set[str]] = defaultdict(set)
    words: dict[str, int] = defaultdict(int)
    rows = conn.execute("MATCH (s:Section) RETURN s.title, s.article_url, s.word_count")
    for title, url, word_count in rows.get_all():
        heading = HEADING_NUMBER.sub("", title or "").strip()
        key = heading.casefold()
        if len(key) < 3 or not any(c.isalpha() for c in key):
            continue
        shown.setdefault(key, heading)
        articles[key].add(url)
        words[key] += word_count or 0
    score = {
        k: _idf(len(articles[k]), total) * math.log1p(words[k])
        for k in shown
        if len(articles[k]) <= _most_articles(total)
    }
    return [shown[k] for k in sorted(score, key=lambda k: (-score[k], k))[:TOP_TOPICS]]


def _terms(conn: kuzu.Connection, total: int) -> list[str]:
    """Entities (not the headings: those are topics), weighted by their damped mention count
    and their idf; one in more than MAX_SHARE of the articles is left out."""
    rows = conn.execute(
        "MATCH (a:Article)-[:HAS_ENTITY]->(e:Entity) WHERE e.type <> 'topic' "
        "RETURN e.name, e.mention_count, count(DISTINCT a)"
    ).get_all()
    score = {
        name: (1 + math.log(max(mentions, 1))) * _idf(articles, total)
        for name, mentions, articles in rows
        if articles <= _most_articles(total)
    }
    return sorted(score, key=lambda name: (-score[name], name))[:TOP_TERMS]


def skill_markdown(manifest: dict, inputs: SkillInputs) -> str:
    name, counts = manifest["name"], manifest["counts"]
    articles = "\n".join(f"- [{title}]({url})" for title, url in inputs.articles)
    topics = ", ".join(inputs.topics[:DESCRIPTION_TOPICS]) or name
    # The pack's own words first (kg_config.json's description), else its headings'.
    own = " ".join(((manifest.get("config") or {}).get("description") or "").split())
    description = (
        (f"{own.rstrip('.')}. " if own else "")
        + f"Answers questions about the {name} knowledge pack's documentation "
        f"({counts['Article']} articles, {counts['Section']} sections), citing its sources. "
        + ("" if own else f"Use for questions on {topics}.")
    ).strip()
    own_line = f"\n{own}\n" if own else ""
    # Quoted (a JSON string is a YAML one): a heading such as "Errors: a guide" would end a
    # plain YAML value at its colon.
    return f"""---
name: {name}-pack
description: {json.dumps(description, ensure_ascii=False)}
---

# {name} knowledge pack
{own_line}
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

- `search_pack` with `pack="{name}"` and the question: ranked passages with title, heading,
  a link to the section, text and confidence (0 to 1; the gate's verdict says whether the
  pack covers the question), to answer from; add `tokens=2000` for whole passages up to that
  many tokens;
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

## Topics (the most distinctive section headings)

{", ".join(inputs.topics)}

## Distinctive terms

{", ".join(inputs.terms)}
"""
