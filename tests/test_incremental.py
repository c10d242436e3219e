"""Incremental rebuilds: conditional requests, what changed, removed pages, no-change builds."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from assets import fetch
from kpack.archive import export_pack, install
from kpack.contracts import stable_id
from kpack.graphdb import opened
from kpack.sentence_index import passage_sentences
from resources.embedder import EmbedderResource
from resources.llm import ClaudeResource
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import SiteHandler, fake_anthropic_server

STATIC = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
CHANGING = "/live/changing/alpha.html"
VANISHING = "/live/vanishing/beta.html"
CONDITIONAL = "/live/conditional/gamma.html"

EMBEDDED: list[int] = []  # texts per embed() call of CountingEmbedder


class CountingEmbedder(EmbedderResource):
    def embed(self, texts, name=None, precision="fp32"):
        EMBEDDED.append(len(texts))
        return super().embed(texts, name, precision)


def probes_embedded(result) -> int:
    """Texts the build's gate calibration embedded (kpack.ingest.gate_calibration: its probes,
    cached after)."""
    return result.manifest["gate"].get("probes", {}).get("embedded_this_build", 0)


def section_texts(folder, words: str) -> list[str]:
    """The texts of the sections that hold ``words``."""
    return [c for (c,) in rows(folder, "MATCH (s:Section) RETURN s.content") if words in c]


def rows(folder, cypher, params=None):
    with opened(folder / "pack.db", read_only=True) as conn:
        return conn.execute(cypher, params or {}).get_all()


def fetched(workspace, pack) -> dict[str, dict]:
    table = pq.read_table(workspace / "storage" / "fetched_pages" / f"{pack}.parquet")
    return {row["url"]: row for row in table.to_pylist()}


def article_footprint(folder, url: str) -> dict[str, int]:
    """How many nodes and edges of the pack belong to one article."""
    by_url = {"u": url}
    by_prefix = {"p": stable_id(url)}  # section ids start with the article's stable id
    one = lambda cypher, params: rows(folder, cypher, params)[0][0]  # noqa: E731
    return {
        "Article": one("MATCH (a:Article) WHERE a.url = $u RETURN count(a)", by_url),
        "Section": one("MATCH (s:Section) WHERE s.article_url = $u RETURN count(s)", by_url),
        "Chunk": one("MATCH (c:Chunk) WHERE c.article_url = $u RETURN count(c)", by_url),
        "Fact": one("MATCH (f:Fact) WHERE f.section_id STARTS WITH $p RETURN count(f)", by_prefix),
        "edges": one("MATCH (a:Article)-[r]-() WHERE a.url = $u RETURN count(r)", by_url),
    }


@pytest.fixture
def claude(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server() as fake:
        yield fake, ClaudeResource(base_url=fake.base, max_retries=0)


def test_incremental_rebuilds(workspace, site, claude, monkeypatch):
    fake, claude_resource = claude
    url = site.url
    folder = write_pack(
        workspace,
        "inc",
        [url(p) for p in [*STATIC, CHANGING, VANISHING, CONDITIONAL]],
        {"fetch": TEST_FETCH},
    )

    def rebuild(**kwargs):
        EMBEDDED.clear()
        calls_before = len(fake.requests)
        result = build(
            workspace, "inc", claude=claude_resource, embedder=CountingEmbedder(), **kwargs
        )
        assert result.success, (result.failed_steps, result.failed_checks)
        return result, len(fake.requests) - calls_before

    # --- 1. The first build: every page is new.
    first, first_calls = rebuild()
    assert first.published and first.manifest["version"] == 1
    assert first.manifest["previous_version"] is None
    assert first.manifest["changes"] | {"new_urls": None} == {
        "fetched": 6,
        "new": 6,
        "changed": 0,
        "unchanged": 0,
        "failed": 0,
        "not_modified": 0,
        "removed": 0,
        "new_urls": None,
        "changed_urls": [],
        "removed_urls": [],
    }
    assert {r["change"] for r in fetched(workspace, "inc").values()} == {"new"}
    assert first_calls > 1
    assert sum(EMBEDDED) == first.manifest["embedding"]["texts"] + probes_embedded(first)
    body_before = fetched(workspace, "inc")[url(CONDITIONAL)]["body"]
    (notes_before,) = section_texts(folder, "revision 1 of the alpha page")
    beta_before = article_footprint(folder, url(VANISHING))
    assert beta_before["Section"] and beta_before["Chunk"] and beta_before["Fact"]
    assert rows(folder, "MATCH (e:Entity) WHERE e.name = 'LLM Beta' RETURN count(e)") == [[1]]

    # --- 2. One page changes, one starts answering 404, the rest are unchanged.
    site.revisions[CHANGING] = 2
    site.gone.add(VANISHING)
    second, second_calls = rebuild()
    assert second.published and second.manifest["version"] == 2
    assert second.manifest["previous_version"] == 1
    changes = second.manifest["changes"]
    assert {k: changes[k] for k in ("fetched", "new", "changed", "unchanged", "failed")} == {
        "fetched": 6,
        "new": 0,
        "changed": 1,
        "unchanged": 4,
        "failed": 1,
    }
    assert changes["not_modified"] == 4 and changes["changed_urls"] == [url(CHANGING)]
    pages = fetched(workspace, "inc")
    assert {u: (r["status"], r["change"]) for u, r in pages.items()} == {
        **{url(p): (304, "unchanged") for p in [*STATIC, CONDITIONAL]},
        url(CHANGING): (200, "changed"),
        url(VANISHING): (404, "failed"),
    }
    # A 304 reuses the stored page; the requests carried the stored validators.
    assert pages[url(CONDITIONAL)]["body"] == body_before
    assert pages[url(CONDITIONAL)]["title_hint"] == "Live Gamma"
    assert site.conditional[CONDITIONAL][-1] == {
        "If-None-Match": '"conditional-gamma-r1"',
        "If-Modified-Since": SiteHandler.LIVE_MODIFIED,
    }
    assert site.conditional[CHANGING][-1]["If-None-Match"] == '"changing-alpha-r1"'
    # Only the changed section ("Revision notes": one text, its own single chunk) was
    # re-extracted by Claude and re-embedded, with its sentences (kpack.sentence_index).
    assert second_calls == 1 == second.manifest["extraction"]["llm_calls"]
    assert second.manifest["extraction"]["llm_input_tokens"] == 100
    (notes,) = section_texts(folder, "revision 2 of the alpha page")
    # Its chunk, and its sentences that are not the first revision's.
    changed_texts = 1 + len(set(passage_sentences(notes)) - set(passage_sentences(notes_before)))
    assert changed_texts > 1
    assert second.manifest["embedding"]["embedded_this_build"] == changed_texts
    assert second.stage_metadata["embeddings"]["embedded"] == changed_texts
    # and the probes of the changed section
    assert sum(EMBEDDED) == changed_texts + probes_embedded(second)
    # The page that now fails is gone with its sections, chunks, facts, edges and entities.
    assert article_footprint(folder, url(VANISHING)) == dict.fromkeys(beta_before, 0)
    assert rows(folder, "MATCH (e:Entity) WHERE e.name = 'LLM Beta' RETURN count(e)") == [[0]]

    # --- 3. A URL leaves urls.txt: its article and everything hanging off it are removed.
    ranks_before = dict(rows(folder, "MATCH (a:Article) RETURN a.url, a.pagerank_raw"))
    alpha_before = article_footprint(folder, url(CHANGING))
    assert alpha_before["Section"] and alpha_before["edges"]
    (folder / "urls.txt").write_text(
        "".join(f"{url(p)}\n" for p in [*STATIC, VANISHING, CONDITIONAL])
    )
    third, third_calls = rebuild()
    assert third.manifest["version"] == 3 and third.manifest["previous_version"] == 2
    changes = third.manifest["changes"]
    assert changes["removed"] == 1 and changes["removed_urls"] == [url(CHANGING)]
    assert (changes["fetched"], changes["unchanged"], changes["failed"]) == (5, 4, 1)
    assert third_calls == 0 and sum(EMBEDDED) == 0
    assert article_footprint(folder, url(CHANGING)) == dict.fromkeys(alpha_before, 0)
    assert rows(folder, "MATCH (e:Entity) WHERE e.name = 'LLM Alpha' RETURN count(e)") == [[0]]
    # Entities are exactly those still mentioned (nothing left dangling).
    assert rows(
        folder,
        "MATCH (e:Entity) WHERE NOT EXISTS { MATCH (:Article)-[:HAS_ENTITY]->(e) } RETURN count(e)",
    ) == [[0]]
    # PageRank was recomputed over the remaining articles.
    ranks_after = dict(rows(folder, "MATCH (a:Article) RETURN a.url, a.pagerank_raw"))
    assert third.stage_metadata["pagerank"]["articles"] == len(ranks_after) == 4
    assert ranks_after[url("/docs/index.html")] != ranks_before[url("/docs/index.html")]

    # --- 4. Nothing changed: the current version's manifest records the sources fingerprint of
    # this very fetch, so the build stops after the fetch: nothing else runs, nothing is published.
    fourth, fourth_calls = rebuild()
    assert fourth.outcome == "unchanged" and not fourth.published
    assert fourth_calls == 0 and EMBEDDED == []
    assert list(fourth.stage_metadata) == ["fetched_pages"]  # an observation: "unchanged"
    observed = fourth.stage_metadata["fetched_pages"]
    assert observed["unchanged"] is True
    assert observed["sources_fingerprint"] == third.manifest["sources_fingerprint"]
    assert fourth.manifest["version"] == 3
    assert sorted(p.name for p in (folder / ".versions").glob("v*")) == ["v0002", "v0003"]
    record = json.loads((folder / ".versions" / "last_build.json").read_text())
    assert record["outcome"] == "unchanged" and record["version"] == 3
    assert record["run_id"] == fourth.run_id
    assert record["changes"]["unchanged"] == 4 and record["changes"]["failed"] == 1

    # The outcome record plays no part: after a failed build (or none recorded) the same.
    (folder / ".versions" / "last_build.json").write_text('{"outcome": "failed"}')
    assert list(rebuild()[0].stage_metadata) == ["fetched_pages"]

    # Another build code (an upgrade of kpack) is another fingerprint: every stage runs,
    # reusing what it computed before (no Claude call, nothing embedded), and publishes.
    monkeypatch.setattr(fetch, "BUILD_CODE_VERSION", "the next release")
    upgraded, upgraded_calls = rebuild()
    assert upgraded.published and upgraded.manifest["version"] == 4
    assert upgraded_calls == 0 and sum(EMBEDDED) == 0
    assert upgraded.stage_metadata["entities"]["reused"] is True
    assert second.stage_metadata["entities"]["reused"] is False
    assert upgraded.manifest["changes"]["unchanged"] == 4
    again = rebuild()[0].stage_metadata  # the new version records the new fingerprint
    assert list(again) == ["fetched_pages"] and again["fetched_pages"]["unchanged"] is True

    # --- 5. --force runs every stage and publishes; a settings change is a change too.
    forced, _ = rebuild(force=True)
    assert forced.published and forced.manifest["version"] == 5
    assert forced.manifest["changes"]["unchanged"] == 4
    config = json.loads((folder / "kg_config.json").read_text())
    (folder / "kg_config.json").write_text(json.dumps({**config, "schedule": "0 5 * * *"}))
    assert rebuild()[0].outcome == "unchanged"  # a new cron is not new content
    slower = {**config, "fetch": {**config.get("fetch", {}), "timeout_s": 9.0}}
    (folder / "kg_config.json").write_text(json.dumps(slower))
    assert rebuild()[0].outcome == "unchanged"  # the same pages fetched with another timeout
    (folder / "kg_config.json").write_text(json.dumps({**config, "chunk_tokens": 200}))
    resized, _ = rebuild()
    assert resized.published and resized.manifest["version"] == 6
    assert resized.manifest["changes"]["unchanged"] == 4


def test_manifest_records_tokens_cost_and_previous_version(workspace, site, claude):
    _, claude_resource = claude
    write_pack(workspace, "cost", [site.url("/docs/guide.html")], {"fetch": TEST_FETCH})
    result = build(workspace, "cost", claude=claude_resource)
    extraction = result.manifest["extraction"]
    calls = extraction["llm_calls"]
    assert calls > 0 and extraction["llm_input_tokens"] == 100 * calls
    # claude-haiku-4-5 at $1 in / $5 out per million tokens (fake usage: 100 in, 20 out).
    assert extraction["price_usd_per_mtok"] == {"input": 1.0, "output": 5.0}
    assert extraction["estimated_cost_usd"] == pytest.approx(calls * (100 * 1 + 20 * 5) / 1e6)
    assert result.manifest["previous_version"] is None
    assert len(result.manifest["sources_fingerprint"]) == 64


def test_an_installed_pack_first_build_reuses_the_vectors_its_archive_carries(
    workspace, site, tmp_path
):
    """A pack installed from a .kpack archive has no embedding cache on its new machine: its
    first build takes the vectors of the published version it carries, and embeds only what
    changed since, as the pack's own rebuild does."""
    page = "/live/changing/installed.html"
    urls = [site.url(p) for p in [*STATIC, page]]
    write_pack(workspace, "origin", urls, {"fetch": TEST_FETCH})
    assert build(workspace, "origin").published
    archive = export_pack("origin", tmp_path / "origin.kpack", workspace / "packs").path

    site.revisions[page] = 2  # one section of one page changes
    own = build(workspace, "origin")
    assert own.published
    changed = own.manifest["embedding"]["embedded_this_build"]
    assert 0 < changed < own.manifest["embedding"]["texts"]

    elsewhere = tmp_path / "elsewhere"  # another machine: its own packs folder and storage
    (elsewhere / "packs").mkdir(parents=True)
    # Trusted: the pack's loopback site is a private host an untrusted archive may not reach
    # (kpack.archive.policy).
    install(archive, elsewhere / "packs", trust_config=True)
    installed = build(elsewhere, "origin")
    assert installed.published, installed.cause
    embedding = installed.manifest["embedding"]
    assert embedding["embedded_this_build"] == changed
    assert embedding["from_published"] == embedding["texts"] - changed


def test_a_pack_of_pages_another_pack_read_embeds_only_its_new_pages(workspace, site):
    """A combined pack of several libraries' pages, built where the libraries' packs were built,
    takes their vectors and embeds only the pages none of them holds; its answers are the same
    as if it had embedded everything."""
    library = [site.url(p) for p in STATIC[:2]]
    write_pack(workspace, "library", library, {"fetch": TEST_FETCH})
    first = build(workspace, "library")
    assert first.published, first.cause
    write_pack(workspace, "combined", [*library, site.url(STATIC[2])], {"fetch": TEST_FETCH})
    combined = build(workspace, "combined")
    assert combined.published, combined.cause
    embedding = combined.manifest["embedding"]
    assert embedding["from_other_packs"] == first.manifest["embedding"]["texts"]
    assert (
        0 < embedding["embedded_this_build"] == embedding["texts"] - embedding["from_other_packs"]
    )
    # The build's figures per stage are its materializations', not the shard's progress reports.
    shard = combined.stage_metadata["embeddings_shard_0"]
    assert shard["from_other_packs"] == embedding["from_other_packs"]

    # The same vectors as the library's own for the pages both hold.
    def vectors(pack: str) -> dict[str, list[float]]:
        table = pq.read_table(workspace / "storage" / "embeddings" / f"{pack}.parquet")
        return dict(
            zip(table["content_hash"].to_pylist(), table["embedding"].to_pylist(), strict=True)
        )

    ours, theirs = vectors("combined"), vectors("library")
    assert theirs and all(ours[h] == v for h, v in theirs.items())
