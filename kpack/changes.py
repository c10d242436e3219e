"""What a build changes against the published version: the page diff and the sources fingerprint.

* ``page_changes``: for every URL of urls.txt, whether its page is new (not an article of the
  current version), changed (another content hash), unchanged (the same hash; a 304 reuses the
  stored copy, so it is always unchanged) or failed; plus the articles of the current version
  whose URL left urls.txt (removed). It compares with the version that is current, not with the
  previous fetch, so a build that failed or was killed in between cannot hide a change.
* ``sources_fingerprint``: one hash over everything a build starts from (the fetched pages,
  the content settings, the extraction method, the embedding model and the build code). It is
  the one record of "nothing changed": a version's manifest carries the fingerprint it was built
  from, and a build whose fetch comes to the fingerprint of the current version stops after the
  fetch (see assets.fetch and kpack.store.PackStoreOps.built_from), so a no-change rebuild runs
  one step, not every stage. It is also the Dagster data version of fetched_pages.
* ``code_digest``: the version of some code. A stage records the digest of its inputs and
  code in its facts (kpack.contracts.with_facts), so a rebuild over the same inputs reuses its
  output; the build's packages' digest is the ``code`` of the sources fingerprint.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from types import ModuleType

import pyarrow as pa

from kpack.config import HOW_TO_EXTRACT, PackConfig

# Settings that never change what a pack holds by themselves: a new cron is not a new version,
# and what the fetch and crawl settings change (pages, their failures) is in the fetched pages.
NOT_CONTENT_SETTINGS = ("schedule", "fetch", "crawl", *HOW_TO_EXTRACT)
MAX_LISTED_URLS = 200
# fetched_pages columns that say nothing about what later stages read: how the page was fetched
# this time, and the body (its content hash stands for it).
VOLATILE_PAGE_COLUMNS = (
    "status",
    "change",
    "etag",
    "last_modified",
    "fetched_at",
    "elapsed_ms",
    "body",
    "error",
)


def table_digest(table: pa.Table) -> str:
    """SHA-256 of a table's contents (Arrow IPC of one record batch, schema metadata dropped)."""
    table = table.replace_schema_metadata(None).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def code_digest(*modules: ModuleType) -> str:
    """SHA-256 of the source of ``modules``, each file with its name: a module's file, or every
    file of a package (given as its package module). What they computed is stale once it
    changes: a stage's own modules (its facts' digest) or the build's packages (the code
    version of a build)."""
    digest = hashlib.sha256()
    for module in modules:
        path = Path(inspect.getfile(module))
        root = path.parent
        files = sorted(root.rglob("*.py")) if hasattr(module, "__path__") else [path]
        for file in files:
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def content_settings(config: PackConfig) -> dict:
    """The settings that can change what a pack holds (see NOT_CONTENT_SETTINGS)."""
    return {k: v for k, v in config.to_json().items() if k not in NOT_CONTENT_SETTINGS}


def sources_fingerprint(
    pages: list[dict], config: PackConfig, extraction: str, vectors: str, code: str
) -> str:
    """One hash over what a build starts from: ``pages`` (fetched_pages rows), the content
    settings, the extraction method (``claude:<model>`` or ``offline``), ``vectors`` (the
    embedding model and precision, kpack.embedding.vector_namespace) and ``code``, the version of the build code (a code_digest)."""
    parts = {
        "pages": [
            {
                **{k: v for k, v in page.items() if k not in VOLATILE_PAGE_COLUMNS},
                "failed": page["error"] is not None,
            }
            for page in pages
        ],
        "settings": content_settings(config),
        "extraction": extraction,
        "vectors": vectors,
        "code": code,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def page_changes(pages: list[dict], published: dict[str, str] | None) -> dict:
    """Counts of fetched / new / changed / unchanged / failed / removed pages, and the URLs.

    ``pages`` are the fetched_pages rows of this build (url, status, content_hash and error
    are read); ``published`` maps the current
    version's article URLs to their content hashes (None when nothing is published yet).
    ``fetched == new + changed + unchanged + failed``; ``removed`` counts the current
    version's articles whose URL is no longer in urls.txt. ``not_modified`` counts the 304s.
    """
    published = published or {}
    counts = {"new": 0, "changed": 0, "unchanged": 0, "failed": 0}
    listed: dict[str, list[str]] = {"new": [], "changed": []}
    for row in pages:
        if row["error"] is not None:
            kind = "failed"
        elif row["url"] not in published:
            kind = "new"
        elif published[row["url"]] == row["content_hash"]:
            kind = "unchanged"
        else:
            kind = "changed"
        counts[kind] += 1
        if kind in listed:
            listed[kind].append(row["url"])
    removed = sorted(set(published) - {row["url"] for row in pages})
    return {
        "fetched": len(pages),
        **counts,
        "not_modified": sum(row["status"] == 304 for row in pages),
        "removed": len(removed),
        "new_urls": listed["new"][:MAX_LISTED_URLS],
        "changed_urls": listed["changed"][:MAX_LISTED_URLS],
        "removed_urls": removed[:MAX_LISTED_URLS],
    }
