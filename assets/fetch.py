"""Stage 1, fetched_pages: every URL of urls.txt fetched once, its main content kept.

Seed lines (``URL depth=N``) and sitemap URLs expand into the pages they reach
(kpack.ingest.crawl); a plain line is that page only.
A URL that fails is a row with its error; the build goes on (kpack.ingest.pages). Rebuilds are
incremental: the stage reads its own previous output for the pack (through the shared storage,
see resources.storage.IntermediatesResource) and makes every request conditional on the stored
ETag / Last-Modified.
"""

import time
from datetime import UTC, datetime

import pyarrow as pa
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    Failure,
    MetadataValue,
    Output,
    asset,
)

from assets.partitions import pack_check, packs_partitions
from kpack.ingest.crawl import crawl
from kpack.ingest.pages import CHANGE_KINDS, stored_pages
from resources.fetcher import FetcherResource
from resources.pack_store import PackStore
from resources.storage import IntermediatesResource


@asset(
    partitions_def=packs_partitions,
    group_name="ingest",
    compute_kind="requests",
    description="Every URL of the pack's urls.txt fetched (or its error), main content kept.",
)
def fetched_pages(
    context: AssetExecutionContext,
    fetcher: FetcherResource,
    pack_store: PackStore,
    intermediates: IntermediatesResource,
) -> Output[list[dict]]:
    started = time.perf_counter()
    pack = context.partition_key
    sources, problems = pack_store.sources(pack)
    for problem in problems:
        context.log.warning(str(problem))
    if not sources:
        raise Failure(
            f"pack {pack!r} has no valid URL in urls.txt",
            metadata={"invalid_lines": MetadataValue.json([str(p) for p in problems])},
        )
    config = pack_store.config(pack)
    stored = stored_pages(intermediates.previous("fetched_pages", pack))
    with fetcher.fetcher(config.fetch, pack_store.file_roots(pack)) as pages_fetcher:
        rows, crawl_report = crawl(sources, pages_fetcher, config.crawl, stored, datetime.now(UTC))
    for problem in crawl_report.problems:
        context.log.warning(problem)
    failures = [
        {"line": r["line_no"], "url": r["url"], "error": r["error"]} for r in rows if r["error"]
    ]
    for failure in failures:
        context.log.warning(
            f"urls.txt line {failure['line']}: {failure['url']}: {failure['error']}"
        )
    changes = {kind: sum(r["change"] == kind for r in rows) for kind in CHANGE_KINDS}
    return Output(
        rows,
        metadata={
            "urls": len(rows),
            "ok": len(rows) - len(failures),
            "failed": len(failures),
            **{f"change_{kind}": n for kind, n in changes.items()},
            "not_modified": sum(r["status"] == 304 for r in rows),
            "previous_fetch": bool(stored),
            "failed_share": round(len(failures) / len(rows), 4),
            "failures": MetadataValue.json(failures[:200]),
            "invalid_lines": MetadataValue.json([str(p) for p in problems]),
            "redirected": sum(1 for r in rows if r["redirects"]),
            "bytes": sum(len(r["body"] or "") for r in rows),
            **crawl_report.metadata(),
            "robots_refused": MetadataValue.json(crawl_report.robots_refused[:200]),
            "preview": MetadataValue.md(_preview(rows)),
            "duration_s": round(time.perf_counter() - started, 3),
        },
    )


def _preview(rows: list[dict], limit: int = 20) -> str:
    lines = ["| line | url | status | change | result |", "|---|---|---|---|---|"]
    for row in rows[:limit]:
        result = row["error"] or f"{row['format']}, {len(row['body'] or '')} chars"
        lines.append(
            f"| {row['line_no']} | {row['url']} | {row['status']} | {row['change']} | {result} |"
        )
    return "\n".join(lines)


@pack_check(
    fetched_pages, "At most max_failed_fraction of the URLs failed (default 20%).", blocking=True
)
def failed_url_share(
    context: AssetCheckExecutionContext, fetched_pages: pa.Table, pack_store: PackStore
) -> AssetCheckResult:
    rows = fetched_pages.select(["url", "error"]).to_pylist()
    failed = [row for row in rows if row["error"] is not None]
    share = len(failed) / max(len(rows), 1)
    limit = pack_store.config(context.partition_key).max_failed_fraction
    # The first failure names the cause a user can fix ("no such file", "404", a hint).
    first = f"; first: {failed[0]['url']}: {failed[0]['error']}" if failed else ""
    return AssetCheckResult(
        passed=share <= limit,
        severity=AssetCheckSeverity.ERROR,
        description=f"{len(failed)}/{len(rows)} URLs failed (limit {limit:.0%}){first}",
        metadata={"failed_share": share, "limit": limit},
    )
