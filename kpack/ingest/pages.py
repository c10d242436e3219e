"""Fetch responses as rows of the fetched_pages table, compared with the previous fetch.

HTML (and the HTML a PDF is read into) is reduced to its main content
(kpack.ingest.html.main_content) so later stages and the
Parquet file carry only what a reader would read. A URL that fails is a row with its error.
A 304 reuses the stored row (body, hash, title) with status 304; each row's ``change`` says
whether the page is new, changed, unchanged (a 304 or the same content hash) or failed.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from kpack.contracts import PARQUET_SCHEMAS, content_hash
from kpack.ingest.fetch import FetchResponse, Validators
from kpack.ingest.html import HTML_FORMATS, main_content, navigation_hrefs, page_links
from kpack.packs import Source

CHANGE_KINDS = ("new", "changed", "unchanged", "failed")


def page_dicts(pages: pa.Table) -> list[dict]:
    """The rows of a fetched_pages table, without ``fetched_at``: nothing reads it back, and
    turning a timezone-aware timestamp into Python imports pandas (~0.5 s a process)."""
    return pages.drop_columns(["fetched_at"]).to_pylist()


def stored_pages(previous: pa.Table | None) -> dict[str, dict]:
    """The successfully fetched rows of the previous fetch, by URL: what a 304 may reuse.
    A previous table of another schema (an older version wrote it) is no previous fetch."""
    if previous is None or previous.schema.names != PARQUET_SCHEMAS["fetched_pages"].names:
        return {}
    return {row["url"]: row for row in page_dicts(previous) if row["error"] is None}


def validators(stored: dict[str, dict]) -> dict[str, Validators]:
    """The validators of the stored pages, to make the next requests conditional."""
    return {url: Validators(row["etag"], row["last_modified"]) for url, row in stored.items()}


def classify(before: dict | None, digest: str | None, error: str | None) -> str:
    """new, changed, unchanged or failed, against the previous fetch of the URL."""
    if error is not None:
        return "failed"
    if before is None:
        return "new"
    return "unchanged" if before["content_hash"] == digest else "changed"


def page_row(
    source: Source, response: FetchResponse, before: dict | None, fetched_at: datetime
) -> dict:
    """The fetched_pages row of one URL (``before``: its stored row from the previous fetch)."""
    reused = before if response.not_modified and before else {}
    title_hint, body, fmt = None, response.text, response.format
    navigation: list[str] = []
    error = response.error
    if response.not_modified:
        if before is None:
            error = "HTTP 304 Not Modified, but no stored copy to reuse"
        else:
            title_hint, body, fmt = before["title_hint"], before["body"], before["format"]
    elif body is not None and fmt in HTML_FORMATS:
        navigation = navigation_hrefs(body)
        title_hint, body = main_content(body)
    if body is not None and not body.strip() and error is None:
        error = "no text content found (the page is empty)"
    ok = error is None
    if not ok:
        links = None
    elif response.not_modified:
        links = before.get("page_links")
    else:
        links = [href for href, _text in page_links(fmt, body)] + navigation
    digest = content_hash(body) if ok else None
    return {
        "url": source.url,
        "line_no": source.line_no,
        "final_url": response.final_url,
        "redirects": response.redirects,
        "status": response.status,
        "change": classify(before, digest, error),
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
        "page_links": links,
        "error": error,
    }
