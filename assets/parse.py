"""Stage 2, articles / sections / links / section_links: each fetched page split into titled
sections, and the links between pages and between sections (kpack.ingest.sections). A page the
parser cannot read is logged and left out; the build goes on.
"""

import time

import pyarrow as pa
from dagster import AssetExecutionContext, MetadataValue, Output, multi_asset

from assets.partitions import packs_partitions, stage_outputs
from kpack.ingest.pages import page_dicts
from kpack.ingest.sections import parse_pages


@multi_asset(
    outs=stage_outputs(
        {
            "articles": "One row per fetched URL.",
            "sections": "Articles split at h2/h3.",
            "links": "Links between articles of the pack.",
            "section_links": "Links from a section to the section holding their anchor.",
        }
    ),
    partitions_def=packs_partitions,
    group_name="parse",
    compute_kind="selectolax",
)
def parsed_pages(context: AssetExecutionContext, fetched_pages: pa.Table):
    started = time.perf_counter()
    parsed = parse_pages(r for r in page_dicts(fetched_pages) if r["error"] is None)
    for failure in parsed.failures:
        context.log.warning(f"{failure['url']}: page could not be parsed: {failure['error']}")
    articles, sections, links = parsed.articles, parsed.sections, parsed.links
    duration = round(time.perf_counter() - started, 3)
    yield Output(
        articles,
        output_name="articles",
        metadata={
            "articles": len(articles),
            "parse_failures": MetadataValue.json(parsed.failures[:200]),
            "preview": MetadataValue.md(
                "\n".join(
                    ["| title | sections | words |", "|---|---|---|"]
                    + [
                        f"| {a['title']} | {a['section_count']} | {a['word_count']} |"
                        for a in articles[:20]
                    ]
                )
            ),
            "duration_s": duration,
        },
    )
    yield Output(
        sections,
        output_name="sections",
        metadata={
            "sections": len(sections),
            "mean_words": round(sum(s["word_count"] for s in sections) / max(len(sections), 1), 1),
            "duration_s": duration,
        },
    )
    yield Output(links, output_name="links", metadata={"links": len(links), "duration_s": duration})
    yield Output(
        parsed.section_links,
        output_name="section_links",
        metadata={"section_links": len(parsed.section_links), "duration_s": duration},
    )
