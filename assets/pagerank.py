"""Stage 6, pagerank: authority of each article from the links between articles.

Computed with Kuzu's algo extension on an in-memory graph of Article and LINKS_TO, so it needs
nothing but the two intermediate tables and the pack database is written by one step only.
Normalised to [0, 1] by the maximum (0 everywhere when the pack has no links).
"""

import time

import kuzu
import pyarrow as pa
from dagster import AssetExecutionContext, MetadataValue, Output, asset

from assets.partitions import follow_upstream, packs_partitions

DAMPING = 0.85


def page_rank(urls: list[str], edges: list[tuple[str, str]]) -> dict[str, float]:
    if not urls:
        return {}
    db = kuzu.Database(":memory:")
    conn = kuzu.Connection(db)
    conn.execute("LOAD algo")
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
    ranks = dict(result.get_all())
    conn.close()
    db.close()
    return ranks


@asset(
    partitions_def=packs_partitions,
    group_name="graph",
    compute_kind="kuzu",
    automation_condition=follow_upstream,
    description="PageRank of every article over LINKS_TO, raw and normalised to [0, 1].",
)
def pagerank(
    context: AssetExecutionContext, articles: pa.Table, links: pa.Table
) -> Output[list[dict]]:
    started = time.perf_counter()
    urls = articles["url"].to_pylist()
    edges = list(zip(links["source_url"].to_pylist(), links["target_url"].to_pylist(), strict=True))
    ranks = page_rank(urls, edges)
    top = max(ranks.values(), default=0.0)
    rows = [
        {
            "url": u,
            "pagerank_raw": ranks.get(u, 0.0),
            "pagerank": ranks.get(u, 0.0) / top if edges and top > 0 else 0.0,
        }
        for u in urls
    ]
    title_of = dict(zip(urls, articles["title"].to_pylist(), strict=True))
    leaders = sorted(rows, key=lambda r: -r["pagerank"])[:10]
    return Output(
        rows,
        metadata={
            "articles": len(rows),
            "links": len(edges),
            "top_articles": MetadataValue.md(
                "| article | pagerank |\n|---|---|\n"
                + "\n".join(f"| {title_of[r['url']]} | {r['pagerank']:.3f} |" for r in leaders)
            ),
            "duration_s": round(time.perf_counter() - started, 3),
        },
    )
