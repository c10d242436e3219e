"""Claude's extraction of a pack's sections: cached, in parallel or in message batches, resumable.

Sections of MIN_WORDS_FOR_LLM words or more go to Claude, each content once: results are cached
by section content hash (the model and prompt version name the cache, see
extraction_cache_namespace), so a rebuild pays only for sections whose text changed. The
sections still to extract are sent

* as parallel requests, LLM_WORKERS at a time, when there are fewer than the pack's
  ``extraction_batch_threshold``;
* otherwise through the Message Batches API, at half price: one request per section with its
  content hash as ``custom_id``. Each batch is recorded in the pack's batch ledger (the batches
  submitted and not yet collected, written atomically before polling starts), polled with
  backoff (``poll_s`` growing to ``poll_max_s``) until it ends or the build has waited
  ``extraction_batch_wait_s`` (BatchWaitExpired), and collected: what succeeded is cached at
  once. A build that is killed or stops waiting leaves its batches in the ledger, and the next
  build collects them instead of paying again; it submits only the sections no batch holds.

A batch request that errored (except as an invalid request), expired or was canceled is tried
once more, by the same rule (a new batch when enough failed, else requests); the SDK already
retried a failed request. A section Claude could not extract is extracted offline by the caller
and counted (``offline_fallbacks``, with the reason). A refused key (KeyRefused) stops it all at
the first refusal.

``estimate_extraction`` is the dry run's account of the same work: what is cached, what is in
a batch not yet collected, and the tokens and dollars of the rest, counted by the API's free
count_tokens endpoint on a sample when a key is set.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kpack.llm import (
    EXTRACTION_PROMPT_VERSION,
    Billing,
    ClaudeClient,
    ExtractionFailed,
    KeyRefused,
    LLMError,
    caches_extraction_prompt,
    estimate_cost_usd,
    estimate_input_tokens,
    extraction_prompt_tokens,
    extraction_request,
    parse_extraction,
)

MIN_WORDS_FOR_LLM = 20
LLM_WORKERS = 4
# One batch holds at most 100,000 requests and 256 MB (the API's limits); larger work is split.
MAX_BATCH_REQUESTS = 100_000
MAX_BATCH_BYTES = 128 * 1024 * 1024
POLL_BACKOFF = 1.5
# The dry run counts the input tokens of this many requests with the API (spread over the
# sizes) and scales its local estimate of the rest by what they showed.
COUNTED_SAMPLE = 20
# Output tokens per section when no earlier Claude build of the pack says: a full answer of the
# record_knowledge tool (about 15 entities, 10 relations and 8 facts) is 600-800 tokens, a short
# section's less.
ASSUMED_OUTPUT_TOKENS = 500
MAX_LISTED_FALLBACKS = 50


def extraction_cache_namespace(model: str) -> str:
    """Where Claude extractions are cached: a new model or prompt never reuses old results."""
    return f"extractions/{model}/{EXTRACTION_PROMPT_VERSION}"


def sections_to_send(sections: list[dict]) -> dict[str, dict]:
    """The sections worth a Claude call (long enough), by content hash."""
    return {s["content_hash"]: s for s in sections if s["word_count"] >= MIN_WORDS_FOR_LLM}


@dataclass(frozen=True)
class ExtractionSettings:
    model: str
    max_tokens: int
    batch_threshold: int  # this many sections to extract or more go in a message batch
    batch_wait_s: float  # the most a build waits for its batches
    poll_s: float = 10.0
    poll_max_s: float = 120.0


@dataclass
class ExtractionCache:
    """A pack's cached extractions (content hash -> JSON) and batch ledger (the batches
    submitted and not yet collected: {"id", "keys", "retry", "submitted_at"}), with what writes
    them back: the core keeps no storage of its own."""

    entries: dict[str, str]
    pending: list[dict]
    write_entries: Callable[[dict[str, str]], None]
    write_pending: Callable[[list[dict]], None]


class BatchWaitExpired(Exception):
    """The build waited its extraction_batch_wait_s and a batch has not ended: it stays in the
    ledger for the next build."""


@dataclass
class ClaudeExtractions:
    """What Claude extracted, by section content hash, and what it took."""

    by_hash: dict[str, dict]
    billing: Billing
    batch_ids: list[str] = field(default_factory=list)  # batches collected by this build
    failed_requests: int = 0  # requests Claude answered with no usable extraction, all tries
    fallbacks: list[dict] = field(default_factory=list)  # {"section", "error"}: extracted offline

    def metadata(self) -> dict[str, Any]:
        billing = self.billing
        return {
            "llm_calls": billing.requests,
            "llm_batch_requests": billing.batch_requests,
            "llm_input_tokens": billing.input_tokens,
            "llm_cache_write_tokens": billing.cache_write_tokens,
            "llm_cache_read_tokens": billing.cache_read_tokens,
            "llm_output_tokens": billing.output_tokens,
            "llm_cost_usd": None if billing.cost_usd is None else round(billing.cost_usd, 6),
            "llm_failures": self.failed_requests,
            "offline_fallbacks": len(self.fallbacks),
            "fallback_sections": self.fallbacks[:MAX_LISTED_FALLBACKS],
            "batches": self.batch_ids,
        }


@dataclass
class _Failure:
    error: str
    retryable: bool  # worth one more try (a batch request: the SDK retried the others)
    retried: bool  # this was the second try


def claude_extractions(
    client: ClaudeClient,
    settings: ExtractionSettings,
    sections: list[dict],
    cache: ExtractionCache,
    warn: Callable[[str], None],
) -> ClaudeExtractions:
    """Claude's extraction of every section long enough to send, by content hash (see the
    module docstring). ``cache`` is read and written as results arrive; ``warn`` is told of
    every section extracted offline and of batches resumed or not found."""
    return _Extraction(client, settings, sections_to_send(sections), cache, warn).run()


class _Extraction:
    def __init__(
        self,
        client: ClaudeClient,
        settings: ExtractionSettings,
        wanted: dict[str, dict],
        cache: ExtractionCache,
        warn: Callable[[str], None],
    ) -> None:
        self.client = client
        self.settings = settings
        self.wanted = wanted  # the sections to extract, by content hash
        self.cache = cache
        self.warn = warn
        self.deadline = time.monotonic() + settings.batch_wait_s
        self.result = ClaudeExtractions({}, Billing(settings.model))

    def run(self) -> ClaudeExtractions:
        for batch in self.cache.pending:
            self.warn(
                f"collecting message batch {batch['id']} ({len(batch['keys'])} sections), "
                f"submitted {batch['submitted_at']} by a build that did not finish"
            )
        in_flight = {key for batch in self.cache.pending for key in batch["keys"]}
        missing = [k for k in self.wanted if k not in self.cache.entries and k not in in_flight]
        failures = self._attempt(missing, retry=False)
        again = [k for k, f in failures.items() if f.retryable and not f.retried]
        failures = {k: f for k, f in failures.items() if k not in again}
        failures |= self._attempt([k for k in again if k in self.wanted], retry=True)
        for key, failure in failures.items():
            if key in self.wanted and key not in self.cache.entries:
                section = self.wanted[key]["heading_path"]
                self.warn(
                    f"Claude could not extract {section!r}; extracted offline: {failure.error}"
                )
                self.result.fallbacks.append({"section": section, "error": failure.error})
        self.result.by_hash = {
            k: json.loads(self.cache.entries[k]) for k in self.wanted if k in self.cache.entries
        }
        return self.result

    def _attempt(self, keys: list[str], retry: bool) -> dict[str, _Failure]:
        """Extract ``keys`` (a batch or requests, by the threshold), then collect every batch
        in the ledger; the failures by key."""
        failures: dict[str, _Failure] = {}
        if len(keys) >= self.settings.batch_threshold:
            self._submit(keys, retry)
        elif keys:
            failures |= self._request_each(keys, retry)
        return failures | self._collect_pending()

    def _save_entries(self) -> None:
        self.cache.write_entries(
            {k: self.cache.entries[k] for k in self.wanted if k in self.cache.entries}
        )

    def _request_each(self, keys: list[str], retry: bool) -> dict[str, _Failure]:
        failures: dict[str, _Failure] = {}
        refused = threading.Event()  # set by the first refusal: no later request is sent

        def extract(key: str) -> tuple[dict, Any] | None:
            if refused.is_set():
                return None
            section = self.wanted[key]
            try:
                return self.client.extract(
                    self.settings.model,
                    section["heading_path"],
                    section["content"],
                    self.settings.max_tokens,
                )
            except KeyRefused:
                refused.set()
                raise

        with ThreadPoolExecutor(max_workers=LLM_WORKERS) as pool:
            futures = {pool.submit(extract, key): key for key in keys}
            try:
                for future in as_completed(futures):
                    key = futures[future]
                    try:
                        answer = future.result()
                    except ExtractionFailed as exc:
                        self.result.failed_requests += 1
                        failures[key] = _Failure(str(exc), retryable=False, retried=retry)
                        continue
                    if answer is None:  # not sent: the key was refused meanwhile
                        continue
                    data, usage = answer
                    self.result.billing.add(usage)
                    self.cache.entries[key] = json.dumps(data)
            finally:  # what was paid for is kept, whatever stopped the requests
                self._save_entries()
        return failures

    def _submit(self, keys: list[str], retry: bool) -> None:
        requests = {
            key: extraction_request(
                self.settings.model,
                self.wanted[key]["heading_path"],
                self.wanted[key]["content"],
                self.settings.max_tokens,
            )
            for key in keys
        }
        for part in _batch_parts(requests):
            batch_id = self.client.submit_batch(part)
            submitted = datetime.now(UTC).isoformat(timespec="seconds")
            record = {"id": batch_id, "keys": list(part), "retry": retry, "submitted_at": submitted}
            self.cache.pending.append(record)
            self.cache.write_pending(self.cache.pending)

    def _collect_pending(self) -> dict[str, _Failure]:
        """Poll every batch of the ledger until it ends, collecting each as it does."""
        failures: dict[str, _Failure] = {}
        interval = self.settings.poll_s
        waiting = list(self.cache.pending)
        while waiting:
            for batch in list(waiting):
                try:
                    ended = self.client.batch_ended(batch["id"])
                except KeyRefused:
                    raise
                except LLMError as exc:
                    if exc.status != 404:  # a network or server failure: poll again later
                        self.warn(f"polling message batch {batch['id']} failed: {exc}")
                        continue
                    self.warn(
                        f"message batch {batch['id']} is unknown to the API (another key or "
                        "workspace?): its sections are sent again"
                    )
                    failures |= dict.fromkeys(batch["keys"], _Failure(str(exc), True, False))
                    self._forget(batch)
                    waiting.remove(batch)
                    continue
                if ended:
                    failures |= self._collect(batch)
                    waiting.remove(batch)
            if waiting:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    ids = ", ".join(b["id"] for b in waiting)
                    raise BatchWaitExpired(
                        f"message batch {ids} has not ended after the "
                        f"{self.settings.batch_wait_s:g} s the build waits "
                        "(extraction_batch_wait_s); it stays recorded, and the next build "
                        "collects it without paying again"
                    )
                time.sleep(min(interval, left))
                interval = min(interval * POLL_BACKOFF, self.settings.poll_max_s)
        return failures

    def _collect(self, batch: dict) -> dict[str, _Failure]:
        """An ended batch's results into the cache (and the bill); its failures by key."""
        keys = set(batch["keys"])
        failures: dict[str, _Failure] = {}
        answered: set[str] = set()
        for key, result in self.client.batch_results(batch["id"]):
            if key not in keys:
                continue
            answered.add(key)
            if result.type == "succeeded":
                self.result.billing.add(result.message.usage, batch=True)
                try:
                    self.cache.entries[key] = json.dumps(parse_extraction(result.message))
                    continue
                except ExtractionFailed as exc:
                    error, retryable = str(exc), True
            elif result.type == "errored":
                detail = result.error.error
                error = self.client.redact(f"{detail.type}: {detail.message}")
                retryable = detail.type != "invalid_request_error"
            else:  # expired (the batch's 24 hours ran out first) or canceled
                error, retryable = f"the batch request {result.type}", True
            self.result.failed_requests += 1
            failures[key] = _Failure(error, retryable, batch["retry"])
        for key in keys - answered:
            failures[key] = _Failure("the batch returned no result", True, batch["retry"])
        self._save_entries()  # before the ledger forgets the batch: a kill between re-collects
        self._forget(batch)
        self.result.batch_ids.append(batch["id"])
        return failures

    def _forget(self, batch: dict) -> None:
        self.cache.pending.remove(batch)
        self.cache.write_pending(self.cache.pending)


def _batch_parts(requests: dict[str, dict]) -> list[dict[str, dict]]:
    """The requests in batches within the API's limits on requests and bytes."""
    parts: list[dict[str, dict]] = [{}]
    size = 0
    for key, request in requests.items():
        request_bytes = len(json.dumps(request))
        if parts[-1] and (
            len(parts[-1]) >= MAX_BATCH_REQUESTS or size + request_bytes > MAX_BATCH_BYTES
        ):
            parts.append({})
            size = 0
        parts[-1][key] = request
        size += request_bytes
    return parts


@dataclass
class ExtractionEstimate:
    """What a build's Claude extraction would send and cost (see estimate_extraction)."""

    model: str
    sections: int  # long enough to send
    cached: int  # extracted by an earlier build
    in_flight: int  # in a batch an earlier build submitted and did not collect (paid)
    to_extract: int
    batch: bool  # sent as a message batch (half price)
    input_tokens: int
    output_tokens: int
    counted: int  # requests whose input tokens the API counted (0: all estimated locally)
    output_per_request: float
    output_measured: bool  # from the pack's last Claude build (else ASSUMED_OUTPUT_TOKENS)
    caches_prompt: bool
    cost_usd: float | None
    count_error: str | None = None  # why the API counted none (or fewer) of the sample


def estimate_extraction(
    client: ClaudeClient | None,
    settings: ExtractionSettings,
    sections: list[dict],
    cached: set[str],
    pending: list[dict],
    output_per_request: float | None,
) -> ExtractionEstimate:
    """The dry run's estimate of a build's Claude extraction, sending nothing to Claude.

    The input tokens of every request to send are estimated locally (kpack.llm
    estimate_input_tokens); with a ``client`` that has a key, the API's count_tokens endpoint
    (free; it generates nothing) counts COUNTED_SAMPLE of them, spread over their sizes, and the
    local estimate of the others is scaled by the ratio those counts showed (a refused key
    raises KeyRefused; another failure leaves the estimate local, with the reason). Output tokens are
    ``output_per_request`` (the mean of the pack's last Claude build) or ASSUMED_OUTPUT_TOKENS.
    """
    wanted = sections_to_send(sections)
    in_flight = {key for batch in pending for key in batch["keys"]} & set(wanted)
    todo = [s for k, s in wanted.items() if k not in cached and k not in in_flight]
    requests = [
        extraction_request(settings.model, s["heading_path"], s["content"], settings.max_tokens)
        for s in todo
    ]
    local = [estimate_input_tokens(r) for r in requests]
    counted: dict[int, int] = {}
    count_error = None
    if client is not None and client.available:
        by_size = sorted(range(len(requests)), key=local.__getitem__)
        step = max(1, len(by_size) / COUNTED_SAMPLE)
        sample = sorted({by_size[int(n * step)] for n in range(min(COUNTED_SAMPLE, len(by_size)))})
        try:
            for i in sample:
                counted[i] = client.count_tokens(requests[i])
        except KeyRefused:
            raise
        except LLMError as exc:  # the estimate goes on with what was counted
            count_error = f"the API did not count ({exc})"
    scale = sum(counted.values()) / sum(local[i] for i in counted) if counted else 1.0
    input_tokens = sum(counted.get(i, round(tokens * scale)) for i, tokens in enumerate(local))
    per_request = output_per_request or ASSUMED_OUTPUT_TOKENS
    output_tokens = round(per_request * len(requests))
    batch = len(requests) >= settings.batch_threshold
    caches = caches_extraction_prompt(settings.model)
    # Cached: the first request writes the shared prompt, every later one reads it.
    prefix = round(extraction_prompt_tokens() * scale) if caches and requests else 0
    cost = estimate_cost_usd(
        settings.model,
        input_tokens - prefix * len(requests),
        output_tokens,
        cache_write_tokens=prefix,
        cache_read_tokens=prefix * max(len(requests) - 1, 0),
        batch=batch,
    )
    return ExtractionEstimate(
        model=settings.model,
        sections=len(wanted),
        cached=sum(1 for k in wanted if k in cached),
        in_flight=len(in_flight),
        to_extract=len(requests),
        batch=batch,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        counted=len(counted),
        output_per_request=per_request,
        output_measured=output_per_request is not None,
        caches_prompt=caches,
        cost_usd=cost,
        count_error=count_error,
    )
