"""Stage 6, pagerank: authority of each article over LINKS_TO (kpack.ingest.pagerank)."""

import time

import pyarrow as pa
from dagster import AssetExecutionContext, MetadataValue, Output, asset

from assets.partitions import BUILD_CODE_VERSION, follow_upstream, packs_partitions
from kpack.ingest.pagerank import pagerank_rows


@asset(
    partitions_def=packs_partitions,
    group_name="graph",
    compute_kind="kuzu",
    code_version=BUILD_CODE_VERSION,
    automation_condition=follow_upstream,
    description="PageRank of every article over LINKS_TO, raw and normalised to [0, 1].",
)
def pagerank(
    context: AssetExecutionContext, articles: pa.Table, links: pa.Table
) -> Output[list[dict]]:
    started = time.perf_counter()
    urls = articles["url"].to_pylist()
    edges = list(zip(links["source_url"].to_pylist(), links["target_url"].to_pylist(), strict=True))
    rows = pagerank_rows(urls, edges)
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
