"""The whole asset graph materialized for small packs served by the loopback site."""

from __future__ import annotations

import json

import pytest
import torch

import retrieval
from assets.evaluate import EVIDENCE_CODE_VERSION
from kpack.embedding import encode, load_model
from kpack.errors import PackNotReady
from kpack.graph_evidence import EVIDENCE_FILE
from kpack.graphdb import opened
from resources.llm import ClaudeResource
from resources.pack_store import PackStore
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import fake_anthropic_server


def torch_sees_a_gpu() -> bool:
    return torch.cuda.is_available() or torch.backends.mps.is_available()


PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md", "/docs/malformed.html"]


def site_pack(workspace, site, name="widgets", extra=(), config=None):
    urls = [site.url(p) for p in PAGES] + list(extra)
    return write_pack(workspace, name, urls, {"fetch": TEST_FETCH, **(config or {})})


def query(conn, cypher, params=None):
    return conn.execute(cypher, params or {}).get_all()


@pytest.fixture
def built(workspace, site, site_fetcher):
    folder = site_pack(
        workspace,
        site,
        extra=[site.url("/missing.html"), site.url("/acme/widget/blob/main/CONTRIBUTING.md")],
    )
    result = build(workspace, "widgets", fetcher=site_fetcher)
    return folder, result


def test_build_publishes_a_queryable_graph(built, site):
    folder, result = built
    assert result.success, (result.failed_steps, result.failed_checks)
    manifest = result.manifest
    assert manifest["version"] == 1
    assert manifest["sources"]["ok"] == 5 and manifest["sources"]["failed"] == 1
    assert "404" in manifest["sources"]["failures"][0]["error"]
    assert manifest["embedding"] == {**manifest["embedding"], "dimension": 384}
    assert set(manifest["stage_seconds"]) >= {
        "fetched_pages",
        "embeddings",
        "pack_graph",
        "pack_manifest",
    }
    assert (folder / "skill.md").read_text().startswith("---\nname: widgets-pack")

    with opened(folder / "pack.db", read_only=True) as conn:
        counts = manifest["counts"]
        assert counts["Article"] == 5
        assert query(conn, "MATCH (a:Article) RETURN count(a)")[0][0] == 5
        assert counts["Section"] == query(conn, "MATCH (s:Section) RETURN count(s)")[0][0] >= 10

        titles = dict(query(conn, "MATCH (a:Article) RETURN a.url, a.title"))
        assert titles[site.url("/docs/guide.html")] == "User Guide"
        assert titles[site.url("/acme/widget/blob/main/CONTRIBUTING.md")] == "Contributing"

        edges = {
            (s.rsplit("/", 1)[-1], t.rsplit("/", 1)[-1])
            for s, t in query(
                conn, "MATCH (a:Article)-[:LINKS_TO]->(b:Article) RETURN a.url, b.url"
            )
        }
        assert edges == {
            ("index.html", "guide.html"),
            ("index.html", "readme.md"),
            ("guide.html", "index.html"),
            ("readme.md", "index.html"),
        }

        contents = [c for (c,) in query(conn, "MATCH (s:Section) RETURN s.content")]
        assert not any("NOISE_" in c for c in contents)
        paths = [p for (p,) in query(conn, "MATCH (s:Section) RETURN s.heading_path")]
        assert "User Guide > Setup > Environment variables" in paths

        ranks = dict(query(conn, "MATCH (a:Article) RETURN a.url, a.pagerank"))
        assert all(0.0 <= r <= 1.0 for r in ranks.values())
        assert max(ranks, key=ranks.get) == site.url("/docs/index.html")

        # The retrieval indexes the build wrote beside the database (kpack.index_writer).
        question = encode(
            load_model("default"), ["Which variable sets where the sprocket cache lives?"]
        )[0]
        with retrieval.reading(folder) as reader:
            (nearest, _), *_ = reader.nearest("Chunk", question, 3)
            assert "WIDGET_HOME" in reader.chunk_text[nearest]
            (row, _), *_ = reader.keywords.search("gasket flanges", 3)
            assert "gasket" in reader.chunk_text[reader.chunk_ids[row]]

        entities = {n for (n,) in query(conn, "MATCH (e:Entity) RETURN e.name")}
        assert {"widget.frob", "SprocketValidator", "Sprocket Registry"} <= entities
        assert not any(n.startswith("#") for n in entities)  # code is not prose
        assert query(conn, "MATCH (:Article)-[:HAS_FACT]->(f:Fact) RETURN count(f)")[0][0] > 0


def test_failed_build_leaves_published_pack_intact(
    built, workspace, site, site_fetcher, monkeypatch
):
    folder, _first = built
    before = retrieval.search(folder, "Which variable sets where the sprocket cache lives?", k=3)

    class CrashingPackStore(PackStore):
        def publish(self, pack: str, version: int):
            raise RuntimeError("build killed before publish")

    (folder / "urls.txt").write_text(site.url("/docs/readme.md") + "\n")
    failed = build(
        workspace,
        "widgets",
        fetcher=site_fetcher,
        pack_store=CrashingPackStore(packs_dir=str(workspace / "packs")),
    )
    assert not failed.success and "pack_manifest" in failed.failed_steps
    assert json.loads((folder / "manifest.json").read_text())["version"] == 1
    after = retrieval.search(folder, "Which variable sets where the sprocket cache lives?", k=3)
    assert after == before

    # A model that cannot load fails the build before anything is staged or published. (Its
    # export's lock file is left in a model cache of the test's own, not the user's.)
    (folder / "kg_config.json").write_text(
        json.dumps({"fetch": TEST_FETCH, "embedding_model": str(workspace / "no-such-model")})
    )
    with monkeypatch.context() as patched:
        patched.setenv("KPACK_MODEL_CACHE", str(workspace / "model-cache"))
        assert not build(workspace, "widgets", fetcher=site_fetcher).success
    assert json.loads((folder / "manifest.json").read_text())["version"] == 1

    # The next good build publishes version 2 with the new sources, and keeps version 1.
    (folder / "kg_config.json").write_text(json.dumps({"fetch": TEST_FETCH}))
    second = build(workspace, "widgets", fetcher=site_fetcher)
    assert second.success and second.manifest["version"] == 2
    assert second.manifest["counts"]["Article"] == 1
    assert sorted(p.name for p in (folder / ".versions").glob("v*")) == ["v0001", "v0002"]


def test_an_unchanged_rebuild_measures_evidence_that_other_code_measured_again(
    built, workspace, site_fetcher
):
    """Upgrading kpack can change the retrieval stages without changing a pack's sources: the
    graph stages the version runs are then chosen again, and nothing is published."""
    folder, _ = built
    version = (folder / ".versions" / "current").resolve()
    measured = json.loads((version / EVIDENCE_FILE).read_text())
    assert measured["code_version"] == EVIDENCE_CODE_VERSION
    unchanged = build(workspace, "widgets", fetcher=site_fetcher)
    assert unchanged.outcome == "unchanged" and list(unchanged.stage_metadata) == ["fetched_pages"]
    # A record an older kpack wrote: no code version, and another choice of graph stages.
    older = {k: v for k, v in measured.items() if k != "code_version"}
    older["enable_doc_graph"] = not measured["enable_doc_graph"]
    (version / EVIDENCE_FILE).write_text(json.dumps(older))
    upgraded = build(workspace, "widgets", fetcher=site_fetcher)
    assert upgraded.outcome == "unchanged" and upgraded.manifest["version"] == 1
    assert list(upgraded.stage_metadata) == ["fetched_pages", "graph_evidence"]
    assert json.loads((version / EVIDENCE_FILE).read_text()) == measured
    assert list(build(workspace, "widgets", fetcher=site_fetcher).stage_metadata) == [
        "fetched_pages"
    ]


def test_mostly_failed_fetch_is_not_published(workspace, site):
    write_pack(
        workspace,
        "broken",
        [site.url("/docs/index.html")] + [site.url(f"/gone-{i}.html") for i in range(4)],
        {"fetch": TEST_FETCH},
    )
    result = build(workspace, "broken")
    assert not result.success
    assert "failed_url_share" in result.failed_checks
    assert not (workspace / "packs" / "broken" / "pack.db").exists()


def test_claude_extraction_through_the_sdk_and_its_cache(workspace, site, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    site_pack(workspace, site, name="llm")
    with fake_anthropic_server() as fake:
        claude = ClaudeResource(base_url=fake.base, max_retries=0)
        first = build(workspace, "llm", claude=claude)
        calls_after_first = len(fake.requests)
        second = build(workspace, "llm", claude=claude)
        forced = build(workspace, "llm", claude=claude, force=True)
    assert first.success and second.success and forced.success
    extraction = first.manifest["extraction"]
    assert extraction["method"] == "claude:claude-haiku-4-5"
    assert extraction["llm_calls"] == calls_after_first > 0
    assert extraction["llm_input_tokens"] == 100 * calls_after_first
    headers = fake.requests[0]["headers"]
    sent_key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    assert sent_key == "test-key-not-real"
    assert fake.requests[0]["body"]["tool_choice"]["name"] == "record_knowledge"
    # With nothing changed the rebuild stopped after the fetch and published nothing (version 1
    # stays current); a forced one ran every stage and reused every extraction and vector: not
    # one more call, no text embedded.
    assert len(fake.requests) == calls_after_first
    assert second.outcome == "unchanged" and second.manifest["version"] == 1
    assert list(second.stage_metadata) == ["fetched_pages"]  # its "unchanged" observation
    assert forced.published and forced.manifest["version"] == 2
    assert forced.stage_metadata["entities"]["llm_calls"] == 0
    assert forced.stage_metadata["embeddings"]["embedded"] == 0

    with opened(workspace / "packs" / "llm" / "pack.db", read_only=True) as conn:
        names = {n for (n,) in query(conn, "MATCH (e:Entity) RETURN e.name")}
        relations = query(conn, "MATCH ()-[r:ENTITY_RELATION]->() RETURN r.relation")
    assert any(n.startswith("LLM ") for n in names)
    assert ["PRECEDES"] in relations
    manifest_text = (workspace / "packs" / "llm" / "manifest.json").read_text()
    assert "test-key-not-real" not in manifest_text


def test_claude_errors_fall_back_to_offline_extraction(workspace, site, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    site_pack(workspace, site, name="llmfail")
    with fake_anthropic_server(fail_with=500) as fake:
        result = build(
            workspace, "llmfail", claude=ClaudeResource(base_url=fake.base, max_retries=0)
        )
    assert result.success
    assert result.manifest["extraction"]["llm_failures"] == len(fake.requests) > 0
    assert result.manifest["counts"]["Entity"] > 0


@pytest.mark.skipif(torch_sees_a_gpu(), reason="the build would embed on this machine's GPU")
def test_the_manifest_records_how_the_vectors_were_made(
    built, workspace, site_fetcher, monkeypatch
):
    """Device, precision and throughput in the manifest; the default is auto, which on a
    machine without a GPU means int8, whose pack answers with fp32 question vectors; fp32 is
    one setting away, and its vectors are cached apart from int8 ones, so a precision change
    embeds every text again and never mixes the two; a device that cannot be had fails the
    build."""
    folder, first = built
    texts = first.manifest["embedding"]["texts"]
    assert first.manifest["config"]["embedding_precision"] == "auto"
    assert first.manifest["embedding"] == {
        **first.manifest["embedding"],
        "precision": "int8",
        "encoder": "onnxruntime",
        "device": "cpu",
        "embedded_this_build": texts,
        "section_vectors": "derived",
    }
    assert first.manifest["embedding"]["texts_per_second"] > 0
    hits = retrieval.search(folder, "Which variable sets where the sprocket cache lives?", k=3)
    assert "WIDGET_HOME" in hits[0]["text"]
    config = folder / "kg_config.json"
    settings = json.loads(config.read_text())

    config.write_text(json.dumps({**settings, "embedding_precision": "fp32"}))
    fp32 = build(workspace, "widgets", fetcher=site_fetcher)
    assert fp32.published, fp32.cause
    embedding = fp32.manifest["embedding"]
    # No int8 vector is reused for an fp32 pack: every text was embedded again.
    assert (embedding["precision"], embedding["encoder"], embedding["device"]) == (
        "fp32",
        "sentence-transformers",
        "cpu",
    )
    assert embedding["embedded_this_build"] == texts and embedding["texts_per_second"] > 0
    hits = retrieval.search(folder, "Which variable sets where the sprocket cache lives?", k=3)
    assert "WIDGET_HOME" in hits[0]["text"]

    # Back to the default: its cached vectors are all still there, so no model runs.
    config.write_text(json.dumps(settings))
    again = build(workspace, "widgets", fetcher=site_fetcher)
    assert again.published and again.manifest["embedding"]["embedded_this_build"] == 0
    assert again.manifest["embedding"]["precision"] == "int8"
    assert again.manifest["embedding"]["device"] is None  # nothing was embedded
    assert again.manifest["embedding"]["texts_per_second"] is None

    # A device that cannot be had fails the build with its reason; the pack stays as it was.
    monkeypatch.setenv("KPACK_EMBED_DEVICE", "cuda:7")
    # Shorter chunks and fp32 (int8 refuses a GPU request before asking for the device).
    config.write_text(
        json.dumps(
            {
                **settings,
                "embedding_precision": "fp32",
                "chunk_tokens": 30,
                "chunk_overlap_tokens": 5,
            }
        )
    )
    failed = build(workspace, "widgets", fetcher=site_fetcher)
    assert not failed.success and "KPACK_EMBED_DEVICE=cuda:7" in (failed.cause or "")
    assert json.loads((folder / "manifest.json").read_text())["version"] == 3


def test_a_reader_refuses_a_precision_it_does_not_know(built):
    folder, _ = built
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["config"]["embedding_precision"] = "int4"
    manifest_path.write_text(json.dumps(manifest))
    retrieval.close_all()
    with pytest.raises(PackNotReady, match=r"records settings this kpack cannot read .*rebuild"):
        retrieval.search(folder, "Which variable sets where the sprocket cache lives?", k=3)
