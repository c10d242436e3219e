"""Claude extraction that costs less and says when it failed: message batches (submit, poll,
partial failure, resume after a kill), prompt caching and the batch discount in the cost, the
dry run's estimate, and a refused key.

Everything goes through the real anthropic SDK to the loopback fake of the Messages API
(tests.loopback.FakeAnthropic), which serves the Message Batches and count_tokens endpoints and
counts tokens its own way (fake_token_count), independently of kpack's estimate.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.main import main
from kpack import llm
from kpack.ingest.claude_extraction import COUNTED_SAMPLE, LLM_WORKERS
from resources.llm import ClaudeResource
from tests.conftest import build, write_pack
from tests.loopback import UNEXTRACTABLE, fake_anthropic_server

PROJECT = Path(__file__).resolve().parent.parent
MODEL = "claude-haiku-4-5"
PRICE_IN, PRICE_OUT = 1.00, 5.00  # claude-haiku-4-5, USD per million tokens
REFUSED = "ANTHROPIC_API_KEY was refused (401): unset it to build offline, or fix it"
FAST_POLLS = {"max_retries": 0, "batch_poll_s": 0.01, "batch_poll_max_s": 0.05}
# A build of the pack in a child process, polling fast against the fake at argv[2].
CHILD_BUILD = """
import sys
from pipelines.build import build_pack
from resources.llm import ClaudeResource

claude = ClaudeResource(base_url=sys.argv[2], max_retries=0, batch_poll_s=0.05,
                        batch_poll_max_s=0.05)
build_pack(sys.argv[1], resource_overrides={"claude": claude})
"""


def section(topic: str, page: int, n: int, extra: str = "") -> str:
    """A section of 35 words or more; pages differ in length and in how much code they hold."""
    code = " Call `widget.frob(retry_count=3, flange=None)` first." * (page % 4)
    prose = " Each gasket is checked twice by the nightly run." * (page % 3)
    return (
        f"## {topic} Notes {page}-{n}\n\n"
        f"The {topic} Assembly of page {page} explains how Gizmo Framework part {n} joins the "
        f"Sprocket Registry and the Flange Catalogue, so that a Widget Builder can check each "
        f"Gasket Seal before the Calibration Rig runs its nightly test.{code}{prose} {extra}\n"
    )


def docs_pack(workspace: Path, name: str, pages: int, per_page: int, config: dict) -> Path:
    """A pack of markdown files with ``pages`` x ``per_page`` sections of 30 words or more."""
    folder = workspace / f"docs-{name}"
    folder.mkdir()
    for page in range(pages):
        text = f"# Handbook {page}\n\n" + "".join(
            section(topic, page, n) for n, topic in enumerate(["Alpha", "Beta", "Gamma"][:per_page])
        )
        (folder / f"page{page}.md").write_text(text)
    urls = [f"file:../../docs-{name}/page{page}.md" for page in range(pages)]
    return write_pack(workspace, name, urls, config)


def billed_usd(billed: list[dict]) -> float:
    """What the fake's answers cost at list prices, as the manifest should count it."""
    total = 0.0
    for usage in billed:
        usd = (
            usage["input_tokens"] * PRICE_IN
            + usage.get("cache_creation_input_tokens", 0) * PRICE_IN * 1.25
            + usage.get("cache_read_input_tokens", 0) * PRICE_IN * 0.10
            + usage["output_tokens"] * PRICE_OUT
        ) / 1e6
        total += usd * (0.5 if usage["batch"] else 1.0)
    return total


def ledger(workspace: Path, pack: str) -> Path:
    return (
        workspace
        / "storage"
        / "_cache"
        / "extractions_claude-haiku-4-5_extract-v1"
        / f"{pack}.batches.json"
    )


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")


def test_a_large_extraction_goes_through_batches_and_counts_what_failed(workspace, keyed):
    folder = docs_pack(workspace, "batched", 4, 3, {"extraction_batch_threshold": 4})
    # One section Claude never extracts (the last one): it errors in every batch, and as a
    # request. In the first batch the first 5 requests fail too, errored or expired.
    page = folder.parent.parent / "docs-batched" / "page3.md"
    page.write_text(page.read_text() + section("Delta", 3, 9, UNEXTRACTABLE))
    with fake_anthropic_server(token_counting=True, failing_batch_items=5) as fake:
        result = build(
            workspace, "batched", claude=ClaudeResource(base_url=fake.base, **FAST_POLLS)
        )
        assert result.published, result.cause
        extraction = result.manifest["extraction"]
        first, second = fake.batches["msgbatch_fake0001"], fake.batches["msgbatch_fake0002"]
        # 13 sections in one batch, each keyed by its content hash; polled while in progress.
        assert len(first["requests"]) == 13 and not fake.requests
        assert all(re.fullmatch(r"[0-9a-f]{64}", r["custom_id"]) for r in first["requests"])
        assert fake.hits["/v1/messages/batches/msgbatch_fake0001"] >= 3
        # No prompt caching: the extraction prompt is shorter than Haiku 4.5 caches.
        assert isinstance(first["requests"][0]["params"]["system"], str)
        # 3 errored + 2 expired + the unextractable one were tried again, in a second batch;
        # all but the unextractable one succeeded there, and it was extracted offline.
        assert len(second["requests"]) == 6
        assert extraction["batches"] == ["msgbatch_fake0001", "msgbatch_fake0002"]
        assert extraction["llm_calls"] == extraction["llm_batch_requests"] == 12
        assert extraction["llm_failures"] == 7 and extraction["offline_fallbacks"] == 1
        [fallback] = extraction["fallback_sections"]
        assert "Delta Notes 3-9" in fallback["section"]
        assert "fake batch failure" in fallback["error"]
        # The bill: the tokens the fake counted, at half price.
        assert extraction["llm_input_tokens"] == sum(u["input_tokens"] for u in fake.billed)
        assert extraction["estimated_cost_usd"] == pytest.approx(billed_usd(fake.billed), abs=2e-6)
        assert not ledger(workspace, "batched").exists()  # every batch collected

        # A rebuild pays only for what failed: the one section, now a request (below 4).
        again = build(
            workspace,
            "batched",
            claude=ClaudeResource(base_url=fake.base, **FAST_POLLS),
            force=True,
        )
        assert again.published and len(fake.batches) == 2 and len(fake.requests) == 1
        assert again.manifest["extraction"]["offline_fallbacks"] == 1
        assert again.manifest["extraction"]["llm_calls"] == 0


def test_cached_prompts_and_the_batch_discount_are_in_the_cost(workspace, keyed, monkeypatch):
    # A prompt that qualifies for caching: here, a minimum the test lowers to 100 tokens.
    monkeypatch.setitem(llm.CACHE_MIN_TOKENS, MODEL, 100)
    docs_pack(workspace, "cached", 2, 3, {"extraction_batch_threshold": 4})
    with fake_anthropic_server(token_counting=True, cache_min_tokens=100) as fake:
        result = build(workspace, "cached", claude=ClaudeResource(base_url=fake.base, **FAST_POLLS))
    assert result.published, result.cause
    params = fake.batches["msgbatch_fake0001"]["requests"][0]["params"]
    assert params["system"][0]["cache_control"] == {"type": "ephemeral"}
    extraction = result.manifest["extraction"]
    writes = [u["cache_creation_input_tokens"] for u in fake.billed]
    reads = [u["cache_read_input_tokens"] for u in fake.billed]
    assert sum(1 for w in writes if w) == 1 and sum(1 for r in reads if r) == 5
    assert extraction["llm_cache_write_tokens"] == sum(writes)
    assert extraction["llm_cache_read_tokens"] == sum(reads)
    cost = extraction["estimated_cost_usd"]
    assert cost == pytest.approx(billed_usd(fake.billed), abs=2e-6)
    # The same tokens without the discounts: all input at the full price, outside a batch.
    full = sum(
        (
            (u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"])
            * PRICE_IN
            + u["output_tokens"] * PRICE_OUT
        )
        / 1e6
        for u in fake.billed
    )
    assert cost < 0.5 * full
    assert llm.estimate_cost_usd(MODEL, 1_000_000, 0, batch=True) == 0.5
    assert llm.estimate_cost_usd(MODEL, 0, 0, cache_write_tokens=1_000_000) == 1.25
    assert llm.estimate_cost_usd(MODEL, 0, 0, cache_read_tokens=1_000_000, batch=True) == 0.05


def test_a_build_killed_while_polling_resumes_its_batch(workspace, keyed):
    docs_pack(workspace, "resumed", 2, 3, {"extraction_batch_threshold": 4})
    with fake_anthropic_server(batch_polls=10**9) as fake:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD_BUILD, "resumed", fake.base],
            cwd=PROJECT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(PROJECT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        record = ledger(workspace, "resumed")
        deadline = time.monotonic() + 300
        polled = "/v1/messages/batches/msgbatch_fake0001"
        while not (record.exists() and fake.hits.get(polled, 0) >= 2):
            assert child.poll() is None, child.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the build never polled a batch"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stderr.close()
        [kept] = json.loads(record.read_text())
        assert kept["id"] == "msgbatch_fake0001" and len(kept["keys"]) == 6

        fake.batch_polls = 1  # the batch ends now
        result = build(
            workspace, "resumed", claude=ClaudeResource(base_url=fake.base, **FAST_POLLS)
        )
    assert result.published, result.cause
    assert list(fake.batches) == ["msgbatch_fake0001"]  # collected, not submitted again
    assert not fake.requests
    extraction = result.manifest["extraction"]
    assert extraction["batches"] == ["msgbatch_fake0001"]
    assert extraction["llm_batch_requests"] == 6 and extraction["offline_fallbacks"] == 0
    assert not record.exists()


def test_a_build_stops_waiting_at_its_deadline_and_the_next_collects_the_batch(workspace, keyed):
    folder = docs_pack(
        workspace, "waited", 2, 3, {"extraction_batch_threshold": 4, "extraction_batch_wait_s": 1.0}
    )
    polls = {"max_retries": 0, "batch_poll_s": 0.2, "batch_poll_max_s": 5.0}
    with fake_anthropic_server(batch_polls=10**9) as fake:
        stopped = build(workspace, "waited", claude=ClaudeResource(base_url=fake.base, **polls))
        assert not stopped.success and not (folder / "manifest.json").exists()
        assert "message batch msgbatch_fake0001 has not ended after the 1 s" in stopped.cause
        # Polled with a growing interval until the deadline: 0.2 s, 0.3 s, 0.45 s, ...
        assert 3 <= fake.hits["/v1/messages/batches/msgbatch_fake0001"] <= 6
        assert ledger(workspace, "waited").exists()
        fake.batch_polls = 0
        result = build(workspace, "waited", claude=ClaudeResource(base_url=fake.base, **polls))
    assert result.published, result.cause
    assert list(fake.batches) == ["msgbatch_fake0001"]
    assert result.manifest["extraction"]["llm_batch_requests"] == 6


def test_a_refused_key_fails_the_build_in_one_line(workspace, capsys, monkeypatch):
    folder = docs_pack(workspace, "refused", 3, 3, {})
    assert main(["build", "refused", "--no-progress"]) == 0  # offline: no key yet
    capsys.readouterr()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server(fail_with=401) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base)
        code = main(["build", "refused", "--no-progress"])
        err = capsys.readouterr().err
        dry_code = main(["build", "refused", "--dry-run"])
        dry_err = capsys.readouterr().err
    assert code == 1
    assert f"build of refused failed: {REFUSED}" in " ".join(err.split())
    assert "v0001 stays current" in err
    # The first refusal stops it: no request is sent after the ones already under way.
    assert 0 < len(fake.requests) <= LLM_WORKERS
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["version"] == 1 and manifest["extraction"]["method"] == "offline"
    # The dry run finds out too, before a build would.
    assert dry_code == 2 and REFUSED in " ".join(dry_err.split())


def test_dry_run_estimates_the_tokens_the_api_counts(workspace, keyed, capsys, monkeypatch):
    folder = docs_pack(workspace, "estimated", 10, 3, {})  # 30 sections: more than the sample
    with fake_anthropic_server(token_counting=True) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base)
        assert main(["build", "estimated", "--dry-run"]) == 0
        plan = " ".join(capsys.readouterr().out.split())
        assert fake.hits["/v1/messages/count_tokens"] == COUNTED_SAMPLE
        assert not fake.requests and not fake.batches and not fake.billed  # nothing was sent
        assert not (folder / "manifest.json").exists()  # nor published
        assert "cached by earlier builds: 0 of 30 (0%)" in plan
        assert "to extract: 30, as parallel requests (a message batch from 100)" in plan
        estimated = int(re.search(r"input tokens: ~([\d,]+)", plan)[1].replace(",", ""))

        result = build(workspace, "estimated", claude=ClaudeResource(base_url=fake.base))
        assert result.published and len(fake.billed) == 30
        counted = sum(u["input_tokens"] for u in fake.billed)
        assert abs(estimated - counted) <= 0.10 * counted, (estimated, counted)

        # One page changed: its 3 sections are new, 27 are cached; in a batch from 2 sections.
        page = folder.parent.parent / "docs-estimated" / "page0.md"
        page.write_text(page.read_text().replace("nightly", "weekly"))
        (folder / "kg_config.json").write_text(json.dumps({"extraction_batch_threshold": 2}))
        assert main(["build", "estimated", "--dry-run"]) == 0
        plan = " ".join(capsys.readouterr().out.split())
    assert "cached by earlier builds: 27 of 30 (90%)" in plan
    assert "to extract: 3, as one message batch, at half price" in plan
    assert "output tokens: ~60 (20 a request, the mean of the last Claude build)" in plan
    tokens_in = int(re.search(r"input tokens: ~([\d,]+)", plan)[1].replace(",", ""))
    cost = float(re.search(r"cost: ~\$([\d.]+)", plan)[1])
    assert cost == pytest.approx((tokens_in * PRICE_IN + 60 * PRICE_OUT) / 1e6 * 0.5, abs=1e-4)
