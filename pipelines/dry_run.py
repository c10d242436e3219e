"""``kpack build PACK --dry-run``: what a build would extract with Claude, and at what cost.

It fetches the pack's pages as a build does (each request conditional on the last fetch, so an
unchanged page answers 304), splits them into sections, and reads the pack's Claude extraction
cache and batch ledger; kpack.ingest.claude_extraction.estimate_extraction does the estimate.
No Messages request is sent (with a key, the API's free count_tokens endpoint counts a sample
of the requests), nothing is written (no intermediates, no cache, no Dagster run) and nothing
is published.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from assets.extract import extraction_cache, extraction_settings
from assets.fetch import fetch_pages
from kpack import settings
from kpack.config import PackConfig
from kpack.errors import PackError
from kpack.ingest.claude_extraction import (
    MIN_WORDS_FOR_LLM,
    ExtractionEstimate,
    estimate_extraction,
)
from kpack.ingest.pages import stored_pages
from kpack.ingest.sections import parse_pages
from kpack.llm import (
    API_KEY_ENV,
    CHARS_PER_TOKEN,
    KeyRefused,
    cache_minimum,
    extraction_prompt_tokens,
)
from kpack.llm import model_prices as prices_of
from kpack.packs import read_manifest
from pipelines.build import buildable_pack
from pipelines.definitions import make_resources


@dataclass
class DryRun:
    pack: str
    config: PackConfig
    pages_ok: int
    pages_failed: int
    sections: int
    key_set: bool
    estimate: ExtractionEstimate

    @property
    def method(self) -> str:
        return self.config.extraction_method(self.key_set)

    def report(self) -> str:
        """What the dry run found, as lines for the terminal."""
        e = self.estimate
        lines = [
            f"{self.pack}: dry run; nothing was sent to Claude and nothing was published",
            f"pages: {self.pages_ok} fetched, {self.pages_failed} failed",
            f"sections: {self.sections} ({e.sections} of {MIN_WORDS_FOR_LLM} words or more, "
            "the ones Claude extracts)",
        ]
        if self.config.extraction == "offline":
            return "\n".join([*lines, "extraction: offline (kg_config.json): nothing to pay"])
        if self.method == "offline":
            lines.append(f"extraction: offline (${API_KEY_ENV} is not set): nothing to pay")
            lines.append(f"with a key, Claude ({e.model}) would cost as follows")
        else:
            lines.append(f"extraction: {self.method}")
            if not self.key_set:
                lines.append(f"  the build would fail: ${API_KEY_ENV} is not set")
        share = f"{e.cached / e.sections:.0%}" if e.sections else "-"
        lines.append(f"  cached by earlier builds: {e.cached} of {e.sections} ({share})")
        if e.in_flight:
            lines.append(
                f"  in a message batch an earlier build did not collect: {e.in_flight} "
                "(already paid; the next build collects them)"
            )
        how = (
            "one message batch, at half price"
            if e.batch
            else f"parallel requests (a message batch from {self.config.extraction_batch_threshold})"
        )
        lines.append(f"  to extract: {e.to_extract}" + (f", as {how}" if e.to_extract else ""))
        if not e.to_extract:
            return "\n".join([*lines, "  cost: nothing to pay"])
        if e.counted:
            counted = f"the API counted {e.counted} of the {e.to_extract} requests, the rest scaled"
        elif e.count_error:
            counted = f"estimated at {CHARS_PER_TOKEN} characters a token: {e.count_error}"
        else:
            counted = f"estimated at {CHARS_PER_TOKEN} characters a token, without a key to count"
        lines.append(f"  input tokens: ~{e.input_tokens:,} ({counted})")
        output = (
            "the mean of the last Claude build"
            if e.output_measured
            else "assumed, no earlier build"
        )
        lines.append(
            f"  output tokens: ~{e.output_tokens:,} ({e.output_per_request:.0f} a request, {output})"
        )
        minimum = cache_minimum(e.model)
        if not e.caches_prompt:
            lines.append(
                f"  prompt caching: no (the shared prompt is ~{extraction_prompt_tokens()} tokens; "
                + (f"{e.model} caches {minimum:,} or more)" if minimum else "no known minimum)")
            )
        prices = prices_of(e.model)
        if e.cost_usd is None or prices is None:
            return "\n".join([*lines, f"  cost: unknown ({e.model} is not in the price table)"])
        discount = ", half price in a batch" if e.batch else ""
        return "\n".join(
            [
                *lines,
                f"  cost: ~${e.cost_usd:.4f} at list prices (${prices[0]:.2f} / ${prices[1]:.2f} "
                f"a million input / output tokens{discount})",
            ]
        )


def dry_run(
    pack: str,
    packs_dir: Path | None = None,
    storage: str | None = None,
    resource_overrides: dict | None = None,
) -> DryRun:
    """Fetch and section the pack and estimate its Claude extraction (see the module)."""
    packs_dir = packs_dir or settings.packs_dir()
    folder = buildable_pack(pack, packs_dir)
    resources = {
        **make_resources(packs_dir, storage or settings.storage_base()),
        **(resource_overrides or {}),
    }
    pack_store, claude, cache = (
        resources["pack_store"],
        resources["claude"],
        resources["content_cache"],
    )
    config = pack_store.config(pack)
    sources, _problems = pack_store.sources(pack)
    previous = resources["intermediates"].previous("fetched_pages", pack)
    rows, _report = fetch_pages(
        pack, sources, resources["fetcher"], pack_store, stored_pages(previous)
    )
    sections = parse_pages(r for r in rows if r["error"] is None).sections
    stored = extraction_cache(cache, config.extraction_model, pack)
    try:
        estimate = estimate_extraction(
            claude.client if claude.available else None,
            extraction_settings(config, claude),
            sections,
            set(stored.entries),
            stored.pending,
            _output_per_request(read_manifest(folder), config.extraction_model),
        )
    except KeyRefused as exc:
        raise PackError(exc.one_line(claude.client.api_key_env)) from None
    return DryRun(
        pack=pack,
        config=config,
        pages_ok=sum(r["error"] is None for r in rows),
        pages_failed=sum(r["error"] is not None for r in rows),
        sections=len(sections),
        key_set=claude.available,
        estimate=estimate,
    )


def _output_per_request(manifest: dict | None, model: str) -> float | None:
    """The mean output tokens of the last build's Claude requests with this model, if any."""
    extraction = (manifest or {}).get("extraction") or {}
    calls = extraction.get("llm_calls") or 0
    if extraction.get("method") != f"claude:{model}" or not calls:
        return None
    return extraction.get("llm_output_tokens", 0) / calls
