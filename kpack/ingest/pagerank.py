"""Authority of each article from the links between articles: PageRank.

Computed with Kuzu's algo extension on an in-memory graph of Article and LINKS_TO, so it needs
nothing but the articles and links tables and the pack database is written by one step only.
Normalised to [0, 1] by the maximum (0 everywhere when the pack has no links).
"""

from __future__ import annotations

import pyarrow as pa

from kpack.graphdb import IN_MEMORY, opened

DAMPING = 0.85


def page_rank(urls: list[str], edges: list[tuple[str, str]]) -> dict[str, float]:
    if not urls:
        return {}
    with opened(IN_MEMORY, read_only=False) as conn:
        conn.execute("CREATE NODE TABLE Article(url STRING, PRIMARY KEY (url))")
        conn.execute("CREATE REL TABLE LINKS_TO(FROM Article TO Article)")
        conn.execute("COPY Article FROM $t", {"t": pa.table({"url": urls})})
        if edges:
            sources, targets = zip(*edges, strict=True)
            conn.execute("COPY LINKS_TO FROM $t", {"t": pa.table({"from": sources, "to": targets})})
        conn.execute("CALL PROJECT_GRAPH('links', ['Article'], ['LINKS_TO'])")
        result = conn.execute(
            f"CALL page_rank('links', dampingFactor := {DAMPING}) RETURN node.url, rank"
        )
        return dict(result.get_all())


def pagerank_rows(urls: list[str], edges: list[tuple[str, str]]) -> list[dict]:
    """The rows of the pagerank table: raw PageRank and PageRank / max for every article."""
    ranks = page_rank(urls, edges)
    top = max(ranks.values(), default=0.0)
    return [
        {
            "url": u,
            "pagerank_raw": ranks.get(u, 0.0),
            "pagerank": ranks.get(u, 0.0) / top if edges and top > 0 else 0.0,
        }
        for u in urls
    ]
