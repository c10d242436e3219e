"""The confidence gate's threshold calibrated for a pack when it is built (the build's half of
the gate; kpack.gate holds the rule queries apply and the model defaults).

Calibration needs no labelled questions. In-domain probes are synthesised from the pack's own
headings and sentences, and each is scored against every passage except those of the section it
was taken from (and that section's subsections): a probe always matches its own words, and a
real question finds no passage that quotes it. Out-of-domain probes are a fixed list of
everyday questions (:data:`OUT_OF_DOMAIN_PROBES`), far from any documentation. The threshold is
then put midway between the highest out-of-domain similarity and the in-domain cap (the
similarity under which IN_DOMAIN_REFUSAL_LIMIT, 4%, of in-domain probes fall), so that every
out-of-domain probe and at most 4% of in-domain probes are refused; when the two overlap,
refusing in-domain questions is the worse mistake and the cap wins. Everything is numpy over
the vectors the build already has, and deterministic: the same pack gives the same threshold.
The record (:class:`Calibration`) goes into the version's manifest as ``gate``, where
kpack.gate.pack_threshold reads it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kpack.contracts import content_hash
from kpack.embedding import model_label, vector_namespace
from kpack.gate import model_threshold
from kpack.ingest.shards import embed_shard
from kpack.text import prose_lines, split_sentences

# At most this share of in-domain probes is refused. Chosen on the development halves
# (bench/gate_bench.py's sweep of the limit, stop 51; every pack calibrates at its cap, the
# out-of-domain probes reaching past it): 0.04 refused 6 rather than 9 of conala_dev's 73
# development intents and 1 rather than 2 of SQuAD's 253 answerable ones, with every
# out-of-domain question of the demo pack and of bench/python_docs_questions.jsonl and as many
# of bench/everyday_questions.jsonl on each pack still refused; at 0.03 one of the demo's
# out-of-domain questions is answered. 0.05 was the design's first choice.
IN_DOMAIN_REFUSAL_LIMIT = 0.04
OUT_OF_DOMAIN_MARGIN = 0.01  # the threshold clears the best out-of-domain probe by this much
MAX_IN_DOMAIN_PROBES = 160  # a stable cap; with 60 out-of-domain probes ~2 s
MIN_IN_DOMAIN_PROBES = 20  # fewer: too little text to calibrate, the model default applies
PROBE_WORDS = (4, 16)  # a sentence probe keeps up to 16 words; shorter than 4 is no question
MIN_SECTION_WORDS = 20
MAX_HEADING_HIDDEN = 4  # a heading probe hides at most this many passages (see pack_probes)
CALIBRATION_METHOD = (
    "build-time probes: questions from the pack's headings and sentences, each scored without "
    "its own section, vs fixed out-of-domain questions; threshold midway between the best "
    "out-of-domain similarity and the in-domain cap, under which 4% of in-domain probes fall (the "
    "cap when they overlap)"
)

# Everyday questions no documentation or reference pack is about: diverse topics, phrased as
# users ask. No software topics, so a pack about any programming subject still finds them
# foreign. Never edit them to fit an evaluation set.
OUT_OF_DOMAIN_PROBES = (
    "How long do I roast a whole chicken at 200 degrees?",
    "Can I freeze cooked rice and eat it next week?",
    "What herbs go well in a tomato soup?",
    "How do I keep avocados from turning brown?",
    "Why does my bread crust come out too hard?",
    "How much coffee is too much in one day?",
    "How many sets are played in a men's tennis final?",
    "What is a hat-trick in ice hockey?",
    "How long is a marathon in miles?",
    "Which country hosted the cricket world cup in 2011?",
    "How do I improve my swimming breaststroke kick?",
    "What is the deepest lake in Europe?",
    "Which mountain range separates Spain from France?",
    "What currency is used in Switzerland?",
    "How many time zones does Russia span?",
    "Where is the driest desert on the planet?",
    "Who built the pyramids of Giza?",
    "What was the Silk Road used for?",
    "When did the printing press reach England?",
    "Why did the Titanic sink so fast?",
    "Who was Queen Victoria married to?",
    "How did people keep food cold before refrigerators?",
    "How do I soothe a sunburn quickly?",
    "What foods are rich in vitamin C?",
    "How many steps a day keep an adult healthy?",
    "Why do my knees ache after running downhill?",
    "Is it normal for a toddler to wake up at night?",
    "How do tides follow the phases of the moon?",
    "Why do leaves change colour in autumn?",
    "How hot is the surface of the sun?",
    "What makes a rainbow appear after rain?",
    "How do earthquakes start under the sea?",
    "How long do tortoises usually live?",
    "Why do dogs wag their tails?",
    "What do hedgehogs eat in the garden?",
    "How do migrating birds find their way south?",
    "When is the right time to prune apple trees?",
    "How do I grow basil on a windowsill?",
    "What flowers attract butterflies to a garden?",
    "Should I rent or buy a flat in a big city?",
    "How does compound interest grow my savings?",
    "What is a good first budget for a student?",
    "How do I ask my boss for a pay rise?",
    "How often should I check my tyre pressure?",
    "Why does my washing machine smell damp?",
    "How do I unblock a kitchen sink without chemicals?",
    "What is the best way to hang a heavy mirror?",
    "How do I fold a fitted sheet neatly?",
    "Who sang the song Bohemian Rhapsody?",
    "How do I learn to play the piano as an adult?",
    "Which painter cut off part of his own ear?",
    "Who wrote the novel War and Peace?",
    "What is the story of the opera Carmen?",
    "What should I see on a weekend trip to Lisbon?",
    "Do I need a visa to travel to Iceland?",
    "How do I get over jet lag after a long flight?",
    "How do I start a conversation at a wedding?",
    "What is a good gift for a retiring teacher?",
    "How do I crochet a granny square?",
    "How do I teach my parrot to talk?",
)


# -- probes ------------------------------------------------------------------------------------

MARKUP = re.compile(r"[`*#>\[\]()|]+")
HEADING_TEMPLATES = ("How does {} work?", "What is {}?", "Tell me about {}.")


Unit = tuple[str, int]  # a passage's place: (section_id, -1 for the section's own vector or
# the chunk's index)
SECTION_VECTOR = -1


@dataclass(frozen=True)
class Probe:
    text: str
    hidden: frozenset[Unit]  # the passages it was taken from: never scored against them
    # The section whose heading it asks about (None for a sentence probe): a pack's other
    # questions made from headings keep away from these (retrieval.eval.generate).
    section: str | None = None


def _words(text: str) -> list[str]:
    return MARKUP.sub(" ", text).split()


def pack_probes(
    sections: pa.Table, chunks: pa.Table, limit: int = MAX_IN_DOMAIN_PROBES
) -> list[Probe]:
    """In-domain questions from the pack's own text: at most ``limit``, sampled over all of it.

    A section's heading asked about hides the section and its subsections (their passages all
    start with that heading); a heading over more than a few passages is not asked about. A
    sentence from the middle of a chunk hides that chunk, its neighbours (chunks overlap) and,
    near the top, the section's own vector (the model embedded the section's beginning).
    """
    rows = sorted(
        sections.select(
            ["section_id", "article_url", "heading_path", "title", "word_count"]
        ).to_pylist(),
        key=lambda r: r["section_id"],
    )
    chunks_of: dict[str, list[tuple[int, str]]] = {}
    for row in chunks.select(["section_id", "chunk_index", "content"]).to_pylist():
        chunks_of.setdefault(row["section_id"], []).append(
            (row["chunk_index"], row["content"] or "")
        )
    below = _subsections(rows)
    candidates: list[Probe] = []
    for number, row in enumerate(rows):
        if (row["word_count"] or 0) < MIN_SECTION_WORDS:
            continue
        section_id = row["section_id"]
        heading = " ".join(_words(row["title"] or ""))
        hidden = {(s, i) for s in below[section_id] for i, _ in chunks_of.get(s, [])}
        hidden |= {(s, SECTION_VECTOR) for s in below[section_id]}
        # A heading over a whole page (or a whole Wikipedia article) hides everything on its
        # topic: the probe would measure a question the pack does not cover.
        if len(heading.split()) >= 2 and len(hidden) <= MAX_HEADING_HIDDEN:
            template = HEADING_TEMPLATES[number % len(HEADING_TEMPLATES)]
            candidates.append(Probe(template.format(heading), frozenset(hidden), section_id))
        section_chunks = sorted(chunks_of.get(section_id, []))
        indexes = {index for index, _ in section_chunks}
        for index, content in section_chunks:
            sentence = _middle_sentence(content)
            if sentence:
                hidden = {(section_id, i) for i in (index - 1, index, index + 1) if i in indexes}
                if index <= 1:
                    hidden.add((section_id, SECTION_VECTOR))
                candidates.append(Probe(sentence, frozenset(hidden)))
    # The sample is the candidates with the smallest text hashes: spread over the whole pack,
    # and stable when pages come and go (a cut by position would shift every probe, and the
    # next build would embed them all again).
    return sorted(candidates, key=lambda p: content_hash(p.text))[:limit]


def _middle_sentence(content: str) -> str | None:
    """The prose sentence in the middle of a passage (away from the text it shares with its
    neighbours), cut to 16 words, as a question; None when it has none of 4 words or more."""
    sentences = [
        words
        for line in prose_lines(content)
        for sentence in split_sentences(line.strip())
        if len(words := _words(sentence.rstrip(".!?:;"))) >= PROBE_WORDS[0]
    ]
    if not sentences:
        return None
    return " ".join(sentences[len(sentences) // 2][: PROBE_WORDS[1]]) + "?"


def _subsections(rows: list[dict]) -> dict[str, set[str]]:
    """section_id -> itself and every section below it on the same page."""
    by_page: dict[str, list[dict]] = {}
    for row in rows:
        by_page.setdefault(row["article_url"], []).append(row)
    below: dict[str, set[str]] = {}
    for page in by_page.values():
        for row in page:
            prefix = (row["heading_path"] or "") + " > "
            below[row["section_id"]] = {row["section_id"]} | {
                other["section_id"]
                for other in page
                if (other["heading_path"] or "").startswith(prefix)
            }
    return below


# -- calibration -------------------------------------------------------------------------------


def passage_vectors(
    sections: pa.Table, chunks: pa.Table, embeddings: pa.Table
) -> tuple[np.ndarray, list[set[Unit]]]:
    """The pack's distinct passage vectors (sections and chunks), with the places each
    passage stands in (a section of one chunk, or a text repeated, stands in several)."""
    owners: dict[str, set[Unit]] = {}
    for text_hash, section_id in zip(
        sections["content_hash"].to_pylist(), sections["section_id"].to_pylist(), strict=True
    ):
        owners.setdefault(text_hash, set()).add((section_id, SECTION_VECTOR))
    for text_hash, section_id, index in zip(
        chunks["content_hash"].to_pylist(),
        chunks["section_id"].to_pylist(),
        chunks["chunk_index"].to_pylist(),
        strict=True,
    ):
        owners.setdefault(text_hash, set()).add((section_id, index))
    hashes = embeddings["content_hash"].to_pylist()
    keep = [i for i, h in enumerate(hashes) if h in owners]
    return vector_rows(embeddings, keep), [owners[hashes[i]] for i in keep]


def vector_rows(table: pa.Table, rows: list[int]) -> np.ndarray:
    """The ``embedding`` column's ``rows`` as a float32 matrix."""
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    column = table["embedding"].take(pa.array(rows, type=pa.int64())).combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(rows), -1)


def best_similarities(
    probe_vectors: np.ndarray, vectors: np.ndarray, hidden: list[np.ndarray] | None = None
) -> np.ndarray:
    """Each probe's best cosine similarity over the passages, without its ``hidden`` ones."""
    if not len(vectors) or not len(probe_vectors):
        return np.full(len(probe_vectors), -1.0, dtype=np.float32)
    scores = probe_vectors @ vectors.T
    for row, columns in enumerate(hidden or []):
        scores[row, columns] = -1.0
    return scores.max(axis=1)


def in_domain_cap(inside: np.ndarray, limit: float = IN_DOMAIN_REFUSAL_LIMIT) -> float:
    """The highest threshold that refuses at most ``limit`` of the in-domain probes (those
    below it)."""
    return float(np.sort(inside)[int(limit * len(inside))])


def choose_threshold(
    inside: np.ndarray, outside: np.ndarray, limit: float = IN_DOMAIN_REFUSAL_LIMIT
) -> tuple[float, str]:
    """The threshold (2 decimals) and why: see the module docstring (bench/gate_bench.py
    varies ``limit``)."""
    cap = in_domain_cap(inside, limit)
    out_of_domain_floor = float(outside.max()) + OUT_OF_DOMAIN_MARGIN if len(outside) else 0.0
    if out_of_domain_floor <= cap:
        value = round((out_of_domain_floor + cap) / 2, 2)
        why = (
            f"midway between the best out-of-domain probe ({outside.max():.3f}) and the "
            f"in-domain cap ({cap:.3f}, {limit:.0%} of in-domain probes below it)"
        )
    else:
        value = float(np.floor(cap * 100) / 100)
        why = (
            f"the in-domain cap ({cap:.3f}, {limit:.0%} of in-domain probes below it): "
            f"out-of-domain probes reach "
            f"{outside.max():.3f}, refusing them all would refuse more in-domain questions"
        )
    return value, why


PROBE_CACHE_COLUMNS = ("content_hash", "embedding")


def probe_cache_namespace(model: str, precision: str) -> str:
    """The content cache (resources.storage) keeping the probes' vectors between builds."""
    return f"gate_probes/{vector_namespace(model, precision)}"


@dataclass
class Calibration:
    record: dict  # the manifest's ``gate``
    probe_vectors: pa.Table | None  # content_hash, embedding of every probe: the cache to keep
    embedded: int  # probes the model embedded (0: it was never loaded)


@dataclass
class ProbeSimilarities:
    """Each probe's best similarity to the pack's passages (an in-domain probe's own passages
    hidden), and the probe vectors they came from."""

    inside: np.ndarray  # in-domain probes, in pack_probes' order
    outside: np.ndarray  # OUT_OF_DOMAIN_PROBES, in order
    probe_vectors: pa.Table  # content_hash, embedding of every probe: the cache to keep
    embedded: int  # probes the model embedded (0: every vector came from the cache)


def probe_similarities(
    probes: list[Probe],
    passages: tuple[np.ndarray, list[set[Unit]]],
    encode: Callable[[list[str]], np.ndarray],
    cached: pa.Table | None = None,
) -> ProbeSimilarities:
    """The best similarity of every in-domain and out-of-domain probe to the pack's passages
    (:func:`passage_vectors`).

    Probe vectors come from ``cached`` (content_hash, embedding) where it has them, so a
    rebuild that embedded nothing does not load the model for the probes either."""
    vectors, owners = passages
    texts = [p.text for p in probes] + list(OUT_OF_DOMAIN_PROBES)
    hashes = [content_hash(t) for t in texts]
    shard = embed_shard(dict(zip(hashes, texts, strict=True)), cached, encode)
    row_of = {h: i for i, h in enumerate(shard.table["content_hash"].to_pylist())}
    kept = shard.table.select(["content_hash", "embedding"])
    columns_of: dict[Unit, list[int]] = {}
    for column, units in enumerate(owners):
        for unit in units:
            columns_of.setdefault(unit, []).append(column)
    hidden = [
        np.array(sorted({c for u in p.hidden for c in columns_of.get(u, ())}), dtype=np.int64)
        for p in probes
    ]
    probe_vectors = vector_rows(kept, [row_of[h] for h in hashes])
    return ProbeSimilarities(
        best_similarities(probe_vectors[: len(probes)], vectors, hidden),
        best_similarities(probe_vectors[len(probes) :], vectors),
        kept,
        shard.embedded,
    )


def calibrate(
    sections: pa.Table,
    chunks: pa.Table,
    embeddings: pa.Table,
    encode: Callable[[list[str]], np.ndarray],
    model: str,
    cached: pa.Table | None = None,
) -> Calibration:
    """The gate threshold calibrated for this pack (the model's default when it has too little
    text), with how it was chosen; probe vectors come from ``cached`` where it has them
    (:func:`probe_similarities`)."""
    started = time.perf_counter()
    default = model_threshold(model)
    record: dict = {"model": model_label(model), "model_default": default}
    probes = pack_probes(sections, chunks)
    passages = passage_vectors(sections, chunks, embeddings)
    if len(probes) < MIN_IN_DOMAIN_PROBES or not len(passages[0]):
        record |= {
            "calibrated": False,
            "threshold": default,
            "method": "model default",
            "why": f"{len(probes)} in-domain probes: too little text to calibrate "
            f"(at least {MIN_IN_DOMAIN_PROBES} are needed)",
        }
        return Calibration(record, None, 0)
    measured = probe_similarities(probes, passages, encode, cached)
    inside, outside = measured.inside, measured.outside
    threshold, why = choose_threshold(inside, outside)
    record |= {
        "calibrated": True,
        "threshold": threshold,
        "method": CALIBRATION_METHOD,
        "why": why,
        "probes": {
            "in_domain": len(probes),
            "out_of_domain": len(outside),
            "embedded_this_build": measured.embedded,  # the rest came from the probe cache
        },
        "refused": {
            "in_domain": round(float(np.mean(inside < threshold)), 4),
            "out_of_domain": round(float(np.mean(outside < threshold)), 4),
        },
        "similarity": {
            "in_domain_cap": round(in_domain_cap(inside), 4),
            "in_domain_median": round(float(np.median(inside)), 4),
            "out_of_domain_max": round(float(outside.max()), 4),
            "out_of_domain_median": round(float(np.median(outside)), 4),
        },
        "seconds": round(time.perf_counter() - started, 3),
    }
    return Calibration(record, measured.probe_vectors, measured.embedded)
