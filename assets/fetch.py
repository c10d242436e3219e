"""Stage 1, fetched_pages: every URL of urls.txt fetched once, its main content kept.

A URL that fails is a row with its error; the build goes on. HTML is reduced to its main
content here (main, [role=main] or article; scripts, styles, navigation, headers, footers and
asides dropped) so later stages and the Parquet file carry only what a reader would read.

Rebuilds are incremental: the stage reads its own previous output for the pack (through the
shared storage, see resources.storage.IntermediatesResource) and makes every request
conditional on the stored ETag / Last-Modified. A 304 reuses the stored row (body, hash, title)
with status 304; each row's ``change`` says whether the page is new, changed, unchanged (a 304
or the same content hash) or failed, compared with that previous fetch.
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
    asset_check,
)
from selectolax.lexbor import LexborHTMLParser

from assets.partitions import packs_partitions
from kpack.contracts import content_hash
from resources.fetcher import FetcherResource, Validators
from resources.pack_store import PackStore
from resources.storage import IntermediatesResource

NOISE_TAGS = ["script", "style", "noscript", "template", "svg", "nav", "aside", "footer", "form"]
MAIN_SELECTORS = ("main", "[role=main]", "article")
# Permalink anchors (Sphinx, MkDocs) add a pilcrow to every heading.
PERMALINK_SELECTORS = ("a.headerlink", "a.anchor", "a.header-anchor")


def main_content(html: str) -> tuple[str | None, str]:
    """The page title hint and the cleaned HTML of its main content."""
    tree = LexborHTMLParser(html)
    title_node = tree.css_first("title")
    title = title_node.text(strip=True) if title_node else None
    tree.strip_tags(NOISE_TAGS)
    root = next((n for s in MAIN_SELECTORS if (n := tree.css_first(s)) is not None), None)
    if root is None:
        # No main landmark: the page header is site chrome, not content.
        tree.strip_tags(["header"])
        root = tree.body
    if root is None:
        return title, ""
    for selector in PERMALINK_SELECTORS:
        for node in root.css(selector):
            node.decompose()
    return title, root.html or ""


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
    responses = fetcher.fetch_all(
        [s.url for s in sources],
        config.fetch,
        pack_store.file_roots(pack),
        {url: Validators(row["etag"], row["last_modified"]) for url, row in stored.items()},
    )
    fetched_at = datetime.now(UTC)
    rows = []
    for source, response in zip(sources, responses, strict=True):
        before = stored.get(source.url)
        reused = before if response.not_modified and before else {}
        title_hint, body, fmt = None, response.text, response.format
        if response.not_modified:
            if before is None:
                response.error = "HTTP 304 Not Modified, but no stored copy to reuse"
            else:
                title_hint, body, fmt = before["title_hint"], before["body"], before["format"]
        elif body is not None and fmt == "html":
            title_hint, body = main_content(body)
        if body is not None and not body.strip() and not response.error:
            response.error = "no text content found"
        ok = response.error is None
        digest = content_hash(body) if ok else None
        rows.append(
            {
                "url": source.url,
                "line_no": source.line_no,
                "final_url": response.final_url,
                "redirects": response.redirects,
                "status": response.status,
                "change": classify(before, digest, response.error),
                # A 304 may omit headers the stored copy has: keep the stored ones then.
                "content_type": response.content_type or reused.get("content_type"),
                "format": fmt,
                "etag": response.etag or reused.get("etag"),
                "last_modified": response.last_modified or reused.get("last_modified"),
                "content_hash": digest,
                "fetched_at": fetched_at,
                "elapsed_ms": response.elapsed_ms,
                "title_hint": title_hint,
                "body": body if ok else None,
                "error": response.error,
            }
        )
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
            "preview": MetadataValue.md(_preview(rows)),
            "duration_s": round(time.perf_counter() - started, 3),
        },
    )


CHANGE_KINDS = ("new", "changed", "unchanged", "failed")


def stored_pages(previous: pa.Table | None) -> dict[str, dict]:
    """The successfully fetched rows of the previous fetch, by URL: what a 304 may reuse."""
    if previous is None:
        return {}
    return {row["url"]: row for row in previous.to_pylist() if row["error"] is None}


def classify(before: dict | None, digest: str | None, error: str | None) -> str:
    """new, changed, unchanged or failed, against the previous fetch of the URL."""
    if error is not None:
        return "failed"
    if before is None:
        return "new"
    return "unchanged" if before["content_hash"] == digest else "changed"


def _preview(rows: list[dict], limit: int = 20) -> str:
    lines = ["| line | url | status | change | result |", "|---|---|---|---|---|"]
    for row in rows[:limit]:
        result = row["error"] or f"{row['format']}, {len(row['body'] or '')} chars"
        lines.append(
            f"| {row['line_no']} | {row['url']} | {row['status']} | {row['change']} | {result} |"
        )
    return "\n".join(lines)


@asset_check(
    asset=fetched_pages,
    partitions_def=packs_partitions,
    blocking=True,
    description="At most max_failed_fraction of the URLs failed (default 20%).",
)
def failed_url_share(
    context: AssetCheckExecutionContext, fetched_pages: pa.Table, pack_store: PackStore
) -> AssetCheckResult:
    errors = fetched_pages.column("error").to_pylist()
    share = sum(e is not None for e in errors) / max(len(errors), 1)
    limit = pack_store.config(context.partition_key).max_failed_fraction
    return AssetCheckResult(
        passed=share <= limit,
        severity=AssetCheckSeverity.ERROR,
        description=f"{share:.0%} of URLs failed (limit {limit:.0%}); a pack this broken is not published",
        metadata={"failed_share": share, "limit": limit},
    )
