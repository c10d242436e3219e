"""The retrieval indexes a build writes and a reader maps (kpack.index_writer, kpack.mapped_tables, kpack.vector_index, issue 20)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest

import retrieval
from kpack.errors import PackError
from kpack.index_files import CHUNK_ANN, CHUNK_VECTORS, SENTENCE_OFFSETS, SENTENCE_VECTORS
from kpack.mapped_tables import load_array
from kpack.packs import INDEX_DIR
from kpack.sentence_index import SentenceIndex
from kpack.vector_index import load_ann, nearest_rows, write_ann
from tests.conftest import TEST_FETCH, build, write_pack

PROJECT = Path(__file__).resolve().parent.parent
PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
QUESTION = "Which environment variable sets where the sprocket cache lives?"


def clustered_unit_vectors(count: int, dim: int, seed: int) -> np.ndarray:
    """Unit vectors around a few hundred centres, as passages of a few hundred topics are."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((300, dim)).astype(np.float32)
    vectors = centres[rng.integers(0, len(centres), count)]
    vectors = vectors + 0.6 * rng.standard_normal((count, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_the_ann_index_served_from_its_file_finds_what_the_exact_scan_finds(tmp_path):
    # Near-duplicates, as a site with versioned copies of its pages has: 300 passages with
    # 20 noisy copies each (an HNSW graph found under half of the exact top 10 of such data).
    passages = clustered_unit_vectors(300, 64, seed=1)
    rng = np.random.default_rng(3)
    vectors = np.concatenate([passages + rng.normal(0, 0.02, passages.shape) for _ in range(20)])
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    write_ann(tmp_path / CHUNK_ANN, vectors)
    ann = load_ann(tmp_path, CHUNK_ANN)
    assert ann is not None and ann.ntotal == len(vectors)
    # Served from the file's pages (a memory map), not read into the process.
    assert str(tmp_path / CHUNK_ANN) in Path("/proc/self/maps").read_text()
    questions = clustered_unit_vectors(100, 64, seed=2)
    found = exact = 0
    for question in questions:
        rows, similarity = nearest_rows(vectors, question, 10, ann)
        truth, _ = nearest_rows(vectors, question, 10)
        found += len(set(rows.tolist()) & set(truth.tolist()))
        exact += len(truth)
        # Re-scored exactly: the similarities are the float32 matrix's, best first.
        np.testing.assert_allclose(similarity, vectors[rows] @ question, rtol=1e-6)
        assert list(similarity) == sorted(similarity, reverse=True)
    assert found / exact >= 0.98


def test_saved_arrays_map_as_np_save_wrote_them_and_a_damaged_one_is_an_error(tmp_path):
    saved = {
        "vectors.npy": np.arange(12, dtype=np.float32).reshape(3, 4),
        "empty.npy": np.zeros((0, 384), dtype=np.float32),
        "columns.npy": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        "hashes.npy": np.array([2**63 + 1, 7], dtype="<u8"),
    }
    for name, array in saved.items():
        np.save(tmp_path / name, array)
    with (tmp_path / "wide_header.npy").open("wb") as file:  # format 2.0: a header over 64 KiB
        np.lib.format.write_array(file, saved["vectors.npy"], version=(2, 0))
    saved["wide_header.npy"] = saved["vectors.npy"]
    mapped = {name: load_array(tmp_path, name) for name in saved}
    for name, array in saved.items():
        assert mapped[name].dtype == array.dtype and mapped[name].shape == array.shape, name
        np.testing.assert_array_equal(mapped[name], array)
        assert not mapped[name].flags.writeable
    assert str(tmp_path / "vectors.npy") in Path("/proc/self/maps").read_text()

    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        load_array(tmp_path, "objects.npy")
    whole = (tmp_path / "vectors.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(whole[:-8])  # the last two floats lost
    with pytest.raises(ValueError):
        load_array(tmp_path, "cut.npy")


def test_a_passages_best_sentence_is_read_from_its_run_and_a_mismatched_index_is_refused(
    tmp_path,
):
    sentences = clustered_unit_vectors(7, 8, seed=3)
    # Chunk row 0 has sentences 0-2, row 1 none, row 2 sentences 3-6.
    np.save(tmp_path / SENTENCE_VECTORS, sentences.astype(np.float16))
    np.save(tmp_path / SENTENCE_OFFSETS, np.array([0, 3, 3, 7], dtype=np.int64))
    index = SentenceIndex.load(tmp_path, chunks=3)
    question = sentences[5]
    best = index.best_similarity(np.array([2, 1, 0]), question)
    exact = sentences @ question
    np.testing.assert_allclose(best[[0, 2]], [exact[3:7].max(), exact[0:3].max()], atol=2e-3)
    assert np.isnan(best[1])  # a passage without sentences has no best one
    assert best[0] == pytest.approx(1.0, abs=2e-3)  # the question is one of row 2's sentences
    assert SentenceIndex.load(tmp_path / "elsewhere", chunks=3) is None  # a version without one
    with pytest.raises(PackError, match=r"sentence index is damaged .* rebuild the pack"):
        SentenceIndex.load(tmp_path, chunks=4)  # the offsets of another version's passages


def test_a_pack_above_the_ann_crossover_answers_as_the_exact_scan_does(
    site, workspace, monkeypatch
):
    monkeypatch.setenv("KPACK_ANN_MIN_VECTORS", "2")
    write_pack(workspace, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert build(workspace, "widgets").published
    retrieval.close_all()
    with retrieval.reading("widgets") as reader:
        assert reader.ann is not None and reader.section_ann is not None
        vector = reader.embed([QUESTION])[0]
        with_ann = reader.nearest("Chunk", vector, 5)
        reader.ann = None  # the exact scan of the same mapped matrix
        exact = reader.nearest("Chunk", vector, 5)
        assert with_ann == exact and len(exact) == min(5, len(reader.chunk_ids))
        assert reader._kuzu.connection is None  # nothing a search does opens Kuzu
        mapped = Path("/proc/self/maps").read_text()  # mapped, not copied
        assert str((reader.version_dir / INDEX_DIR / CHUNK_VECTORS).resolve()) in mapped
        assert not reader.chunk_vectors.flags.writeable
        assert not hasattr(reader, "cache")


def test_after_its_first_answer_a_reader_reads_its_index_files_once_in_the_background(
    site, workspace
):
    """A cold first search reads only its own rows of the maps; the files are then read whole
    into the page cache, so the searches after it wait on no disk."""
    write_pack(workspace, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert build(workspace, "widgets").published
    retrieval.close_all()

    def cache_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "cache widgets"]

    def bytes_read() -> int:  # by read calls, from the page cache or the disk
        return int(re.search(r"rchar: (\d+)", Path("/proc/self/io").read_text())[1])

    with retrieval.reading("widgets") as reader:
        index_files = list((reader.version_dir / INDEX_DIR).iterdir())
        reader.embed([QUESTION])  # the model loaded: the search below reads little else
        assert not cache_threads()  # opening reads nothing ahead
    before = bytes_read()
    assert retrieval.search("widgets", QUESTION, k=3)
    for thread in cache_threads():
        thread.join(timeout=60)
    assert bytes_read() - before >= sum(f.stat().st_size for f in index_files)
    assert retrieval.search("widgets", QUESTION, k=3)
    assert not cache_threads()  # once per version


def test_stages_hold_their_indexes_through_typed_reader_attributes():
    """No stage shares state through string keys of a reader cache (issue 20)."""
    stage_code = [p for p in (PROJECT / "retrieval").rglob("*.py")]
    offenders = [p.name for p in stage_code if re.search(r"\.cache\b", p.read_text())]
    assert offenders == []


GERMAN_PAGES = {
    "strassenbahn.md": "# Straßenbahn in Zürich\n\nDie Straßenbahn fährt jeden Tag vom "
    "Hauptbahnhof über den Paradeplatz bis zum Zoo. Fahrkarten gibt es an jedem Automaten "
    "und in der App der Verkehrsbetriebe. Kinder unter sechs Jahren fahren kostenlos mit.",
    "kaese.md": "# Käse aus der Schweiz\n\nGreyerzer und Emmentaler reifen monatelang in "
    "feuchten Kellern. Der Käse wird in großen Laiben verkauft und oft zum Fondue geschmolzen. "
    "Die Käserei in Gruyères zeigt Besuchern, wie Milch zu Käse wird.",
    "cafe.md": "# Café am See\n\nDas Café öffnet um sieben Uhr und schließt bei Sonnenuntergang. "
    "Es serviert Kuchen, Gipfeli und heiße Schokolade mit Blick auf den See und die Berge.",
}


def test_a_german_pack_answers_through_keyword_search(workspace):
    """Words of any script are search terms: "Käse", "Straßenbahn" and "Gruyères" find their
    page by keyword search alone (an ASCII tokenizer cut them into "k", "se", "stra" ...)."""
    folder = workspace / "packs" / "schweiz"
    docs = folder / "docs"
    docs.mkdir(parents=True)
    for name, text in GERMAN_PAGES.items():
        (docs / name).write_text(text, encoding="utf-8")
    config = {"fetch": {**TEST_FETCH, "file_roots": ["docs"]}}
    write_pack(workspace, "schweiz", [(docs / name).as_uri() for name in GERMAN_PAGES], config)
    assert build(workspace, "schweiz").published
    retrieval.close_all()
    with retrieval.reading("schweiz") as reader:
        for asked, page in (
            ("Wo reift der Käse in Gruyères?", "kaese.md"),
            # Spelled without ß and accents: the words meet only once folded.
            ("Strassenbahn?", "strassenbahn.md"),
            ("Cafe schliesst?", "cafe.md"),
        ):
            (row, score), *_ = reader.keywords.search(asked, 3)
            url = reader.sections[reader.chunk_ids[row].rsplit("-", 1)[0]].article_url
            assert url.endswith(page) and score > 0, (asked, url)
    found = retrieval.search("schweiz", "Käserei in Gruyères", k=1)
    page = found[0]["url"].split("#", 1)[0]  # a deep link: the page and its section's anchor
    assert page.endswith("kaese.md") and "bm25 #1" in found[0]["why"]


def test_keys_found_by_their_hashes_are_the_rows_bisection_finds(tmp_path, monkeypatch):
    import pyarrow as pa

    from kpack import mapped_tables as ix
    from kpack.index_files import CHUNKS

    keys = sorted({f"https://example.org/page{i % 97}.html#part-{i}" for i in range(2_000)})
    table = pa.table({"chunk_id": keys, "content": [f"text {i}" for i in range(len(keys))]})
    ix.write_keyed(tmp_path, CHUNKS, table)
    hashed = ix.keys_of(tmp_path, CHUNKS, ix.load_table(tmp_path, CHUNKS))
    bisected = ix.SortedKeys(table["chunk_id"])
    assert hashed._hashes is not None and bisected._hashes is None
    asked = [*keys, "https://example.org/absent.html", "", "ünïcode"]
    for key in asked:
        assert hashed.row(key) == bisected.row(key)
    # Looked up all at once (one vectorised search), the same rows; absent keys left out.
    assert (
        hashed.rows_of_many(asked)
        == bisected.rows_of_many(asked)
        == {key: row for row, key in enumerate(keys)}
    )
    # Keys that share a hash are told apart by the key itself, not taken for each other.
    monkeypatch.setattr(ix, "key_hash", lambda key: len(key) % 3)
    ix.write_keyed(tmp_path, CHUNKS, table)
    colliding = ix.keys_of(tmp_path, CHUNKS, ix.load_table(tmp_path, CHUNKS))
    assert [colliding.row(key) for key in keys] == list(range(len(keys)))
    assert colliding.row("https://example.org/absent.html") is None
    assert colliding.rows_of_many(asked) == {key: row for row, key in enumerate(keys)}


def test_a_record_lookup_reads_only_its_columns_and_defaults_one_an_older_table_lacks():
    import dataclasses

    import pyarrow as pa

    from kpack import mapped_tables as ix

    @dataclasses.dataclass
    class Entry:
        key: str
        title: str
        anchor: str | None = None  # a column later versions added

    old = pa.table({"key": ["a", "b"], "title": ["Alpha", "Beta"], "text": ["x" * 50, "y"]})
    entries = ix.RowMap(old, Entry, columns=["key", "title", "anchor"])
    assert entries["b"] == Entry("b", "Beta") and entries.get("c") is None
    texts = ix.RowMap(old, str, columns=["text"])
    assert texts["a"] == "x" * 50
