"""Stage 1, fetched_pages: every URL of urls.txt fetched once, its main content kept.

Seed lines (``URL depth=N``) and sitemap URLs expand into the pages they reach
(kpack.ingest.crawl); a plain line is that page only.
A URL that fails is a row with its error, and so is a sitemap or robots.txt that cannot be
read; the build goes on (kpack.ingest.pages), and the blocking check failed_url_share counts
them all. During an outage of a source, its pages of the previous fetch are kept (state
``kept``, kpack.ingest.crawl). Rebuilds are
incremental: the stage reads its own previous output for the pack (through the shared storage,
see resources.storage.IntermediatesResource) and makes every request conditional on the stored
ETag / Last-Modified.

This stage makes the build's one decision about "nothing changed". It computes the sources
fingerprint (kpack.changes.sources_fingerprint: the pages, content settings, extraction method,
embedding model and build code), which is also its Dagster data version. When the current
version's manifest records the same fingerprint and that version verifies
(kpack.store.PackStoreOps.built_from), nothing after the fetch can come out different: the stage
records an observation (outcome "unchanged", the same data version) instead of a materialization,
so every later stage is skipped and nothing is published. A no-change rebuild therefore runs one
step. Otherwise every stage runs and the build publishes. The run tag ``kpack/force=true``
(``kpack build --force``) skips the decision.
"""

import time
from datetime import UTC, datetime

import pyarrow as pa
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    DataVersion,
    Failure,
    MetadataValue,
    Output,
)

from assets.partitions import (
    BUILD_CODE_VERSION,
    build_stage,
    observe_unchanged,
    pack_check,
)
from kpack.changes import page_changes, sources_fingerprint
from kpack.embedding import effective_precision, vector_namespace
from kpack.errors import PackNotReady
from kpack.ingest.crawl import CrawlReport, crawl
from kpack.ingest.doc_version import documentation_title, documentation_version
from kpack.ingest.fetch_errors import unreachable
from kpack.ingest.pages import CHANGE_KINDS, stored_pages
from kpack.packs import Source
from resources.fetcher import FetcherResource
from resources.llm import ClaudeResource
from resources.pack_store import PackStore
from resources.storage import IntermediatesResource

# A run with this tag set to "true" runs every stage and publishes a new version, changed or not.
FORCE_TAG = "kpack/force"


def forced(context: AssetExecutionContext) -> bool:
    """Whether the run carries FORCE_TAG; a value other than true or false is an error."""
    value = context.run.tags.get(FORCE_TAG, "false")
    if value.lower() not in ("true", "false"):
        raise Failure(f"run tag {FORCE_TAG} must be true or false, not {value!r}")
    return value.lower() == "true"


@build_stage(
    automation_condition=None,
    group_name="ingest",
    compute_kind="requests",
    output_required=False,
    description="Every URL of the pack's urls.txt fetched (or its error), main content kept; "
    "not materialized when the current version was built from these very sources.",
)
def fetched_pages(
    context: AssetExecutionContext,
    fetcher: FetcherResource,
    pack_store: PackStore,
    intermediates: IntermediatesResource,
    claude: ClaudeResource,  # whether a key is set decides the extraction method (a source)
):
    started = time.perf_counter()
    pack = context.partition_key
    force = forced(context)
    sources, problems = pack_store.sources(pack)
    for problem in problems:
        context.log.warning(str(problem))
    if not sources:
        raise Failure(
            f"pack {pack!r} has no valid URL in urls.txt",
            metadata={"invalid_lines": MetadataValue.json([str(p) for p in problems])},
        )
    pack_config = pack_store.config(pack)
    previous = intermediates.previous("fetched_pages", pack)
    stored = stored_pages(previous)
    rows, crawl_report = fetch_pages(pack, sources, fetcher, pack_store, stored)
    for problem in crawl_report.problems:
        context.log.warning(problem)
    if not rows:  # e.g. a sitemap that lists no page in its scope
        raise Failure(
            f"pack {pack!r}: its urls.txt led to no page to fetch",
            metadata={"problems": MetadataValue.json(crawl_report.problems[:200])},
        )
    failures = [
        {"line": r["line_no"], "url": r["url"], "error": r["error"]} for r in rows if r["error"]
    ]
    for failure in failures:
        context.log.warning(
            f"urls.txt line {failure['line']}: {failure['url']}: {failure['error']}"
        )
    changes = {kind: sum(r["change"] == kind for r in rows) for kind in CHANGE_KINDS}
    titles = [r["title_hint"] for r in rows if not r["error"]]
    fingerprint = sources_fingerprint(
        rows,
        pack_config,
        pack_config.extraction_method(claude.available),
        # The model and the arithmetic its vectors come from: a precision change re-embeds.
        vector_namespace(
            pack_config.embedding_model, effective_precision(pack_config.embedding_precision)
        ),
        BUILD_CODE_VERSION,
    )
    # A missing or damaged previous fetch is written again: the next conditional requests need it.
    unchanged_since = None
    if not force and previous is not None:
        try:
            unchanged_since = pack_store.built_from(pack, fingerprint)
        except PackNotReady as damage:
            context.log.warning(f"{damage}: building a new version to replace it")
    metadata = {
        "urls": len(rows),
        "ok": len(rows) - len(failures),
        "failed": len(failures),
        **{f"change_{kind}": n for kind, n in changes.items()},
        "not_modified": sum(r["status"] == 304 for r in rows),
        "previous_fetch": bool(stored),
        "failed_share": round(len(failures) / len(rows), 4),
        "invalid_lines": MetadataValue.json([str(p) for p in problems]),
        "redirected": sum(1 for r in rows if r["redirects"]),
        "bytes": sum(len(r["body"] or "") for r in rows),
        **crawl_report.metadata(),
        # Found, kept, skipped (and why) and capped: the build summary's pages.
        "pages": MetadataValue.json(crawl_report.page_counts(rows)),
        "robots_refused": MetadataValue.json(crawl_report.robots_refused[:200]),
        "preview": MetadataValue.md(_preview(rows)),
        "sources_fingerprint": fingerprint,  # the facts pack_manifest records it from
        # The docs' own name and release, from the pages' titles ("" when they name none).
        "documentation_title": documentation_title(titles) or "",
        "documentation_version": documentation_version(titles) or "",
        "duration_s": round(time.perf_counter() - started, 3),
    }
    data_version = DataVersion(fingerprint)
    if unchanged_since is not None:
        changes_since = page_changes(rows, pack_store.published_articles(pack))
        observe_unchanged(
            context, unchanged_since, data_version, changes_since, failures, **metadata
        )
        return
    yield Output(
        rows,
        metadata={**metadata, "failures": MetadataValue.json(failures[:200])},
        data_version=data_version,
    )


def fetch_pages(
    pack: str,
    sources: list[Source],
    fetcher: FetcherResource,
    pack_store: PackStore,
    stored: dict[str, dict],
) -> tuple[list[dict], CrawlReport]:
    """The pack's pages fetched (seeds and sitemaps expanded), each request conditional on
    the ``stored`` pages of its last fetch (kpack.ingest.pages.stored_pages)."""
    config = pack_store.config(pack)
    with fetcher.fetcher(config.fetch, pack_store.file_roots(pack)) as pages_fetcher:
        return crawl(sources, pages_fetcher, config.crawl, stored, datetime.now(UTC))


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
    if failed and len(failed) == len(rows) and all(unreachable(r["error"]) for r in failed):
        first += (
            "; no host of this pack could be reached: is this machine offline? Building a pack "
            "whose pages are on the web needs internet access"
        )
    return AssetCheckResult(
        passed=share <= limit,
        severity=AssetCheckSeverity.ERROR,
        description=f"{len(failed)}/{len(rows)} URLs failed (limit {limit:.0%}){first}",
        metadata={"failed_share": share, "limit": limit},
    )
