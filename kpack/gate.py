"""The confidence gate's rule, as every query applies it: the threshold in force and the
question's coverage.

The gate (retrieval.gate) refuses to answer from a pack when the best cosine similarity of any
passage to the question is below a threshold. Where that line falls depends on the embedding
model (MiniLM's similarities run lower than BGE's) and on the pack. This module is the one
place that decides which threshold a query uses (:func:`threshold_in_force`), the first of:

1. ``context_confidence_threshold`` passed with the call (an agent option, a query flag);
2. ``query.context_confidence_threshold`` set in kg_config.json, as the version recorded it
   (``kpack eval --write-config`` writes the best of its sweep there, retrieval.eval.calibrate);
3. a KnowledgeGraphAgent subclass's ``CONTEXT_CONFIDENCE_THRESHOLD`` (the seed's way of
   tuning the gate; retrieval.agent);
4. the threshold calibrated when the version was built, recorded in its manifest (``gate``;
   the build's half of the gate, kpack.ingest.gate_calibration, measures it);
5. the embedding model's default (:data:`MODEL_THRESHOLDS`, else :data:`FALLBACK_THRESHOLD`).

The similarity is one piece of evidence; the words are the other (:func:`coverage`). A
question whose specific terms the best passages do not cover (a name no passage contains, a
term the pack has only on pages about something else) must reach a higher similarity than the
threshold, by one rule for every pack (:data:`COVERAGE_WEIGHT`), and the gate says which
terms raised the bar; a question whose best passage holds nearly all its specific terms needs
a little less (:data:`COVERAGE_RELIEF`). The terms' weights come from the pack's own passages
(their idf), read once per version by the reader (retrieval.gate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kpack.embedding import model_label
from kpack.text import search_words, stem, term_set

# The default gate threshold per embedding model (the name a manifest records): what applies
# when a version carries no calibration (a pack too small to calibrate, or built before it).
# - all-MiniLM-L6-v2: 0.30, measured with the build's calibration (kpack.ingest.gate_calibration)
#   on two packs' own text and the out-of-domain probes, no graded question involved (2026-11,
#   160 in-domain probes each): the demo pack (this project's docs, 179 sections) calibrated
#   to 0.32 (in-domain 5th percentile 0.321, best out-of-domain probe 0.335); the SQuAD pack
#   (6 Wikipedia articles, 147 passages) to 0.23 (5th percentile 0.239; sports and history
#   probes reach 0.364). 0.30 is the documentation pack's value rounded down: documentation is
#   what packs are mostly built from, and an uncalibrated pack should rather answer an
#   off-topic question than refuse its own (BGE's 0.5 gated 10% of the held-out Python docs
#   questions with MiniLM).
# - BGE: the seed's 0.5, which was tuned for BGE models.
MODEL_THRESHOLDS: dict[str, float] = {
    "sentence-transformers/all-MiniLM-L6-v2": 0.30,
    "BAAI/bge-small-en-v1.5": 0.5,
    "BAAI/bge-base-en-v1.5": 0.5,
    "BAAI/bge-large-en-v1.5": 0.5,
}
# A model not in the table: between the two measured scales, until a build calibrates it.
FALLBACK_THRESHOLD = 0.4

# Where a threshold came from (the trace and `kpack status` name it).
FROM_OPTION = "option"  # passed with the call (agent options, kpack query flags)
FROM_CONFIG = "kg_config.json"
FROM_AGENT = "agent class constant"
FROM_CALIBRATION = "build calibration"
FROM_MODEL = "model default"


@dataclass(frozen=True)
class GateThreshold:
    """The threshold in force, where it came from and why (for the trace and status)."""

    threshold: float
    source: str
    why: str


def model_threshold(model: str) -> float:
    """The default gate threshold of an embedding model (its name or "default")."""
    return MODEL_THRESHOLDS.get(model_label(model), FALLBACK_THRESHOLD)


def pack_threshold(manifest: Mapping) -> GateThreshold:
    """The threshold of a published version when no kg_config.json setting applies: the one
    its build calibrated, else its embedding model's default."""
    model = (manifest.get("embedding") or {}).get("model") or "default"
    gate = manifest.get("gate")
    if isinstance(gate, dict) and gate.get("calibrated") and _is_threshold(gate.get("threshold")):
        return GateThreshold(
            float(gate["threshold"]),
            FROM_CALIBRATION,
            f"calibrated when v{manifest.get('version', 0):04d} was built: {gate.get('why', '')}",
        )
    known = model_label(model) in MODEL_THRESHOLDS
    return GateThreshold(
        model_threshold(model),
        FROM_MODEL,
        f"the default of {model}" if known else f"{model} is not in the table: the fallback",
    )


def threshold_in_force(
    manifest: Mapping,
    option: float | None = None,
    agent_constant: tuple[float, str] | None = None,
) -> GateThreshold:
    """The threshold a query of this version uses (the order in the module docstring):
    ``option``, passed with the call; kg_config.json's, as the version's manifest recorded
    it; ``agent_constant`` (value, agent class name); else :func:`pack_threshold`."""
    if option is not None:
        return GateThreshold(
            option, FROM_OPTION, "context_confidence_threshold passed by the caller"
        )
    query = ((manifest.get("config") or {}).get("query")) or {}
    if _is_threshold(query.get("context_confidence_threshold")):
        return GateThreshold(
            float(query["context_confidence_threshold"]),
            FROM_CONFIG,
            "set as query.context_confidence_threshold",
        )
    if agent_constant is not None:
        value, owner = agent_constant
        return GateThreshold(value, FROM_AGENT, f"{owner}'s constant")
    return pack_threshold(manifest)


def _is_threshold(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1


# -- lexical evidence --------------------------------------------------------------------------

# The similarity threshold alone lets an off-topic question through when it shares the pack's
# vocabulary of tasks: "How do I configure an ingress controller in Kubernetes?" reaches 0.36
# on this project's docs, which mention Kubernetes, above their calibrated 0.32. What gives
# such a question away is lexical: its specific words are in no passage of the pack
# ("ingress"), or in a passage about something else ("Rust" once in the Python docs, nowhere
# near "ownership" and "data races"). So the gate also measures the question's coverage: over
# the first COVERAGE_PASSAGES passages the search ranked, the best share of the question's
# content terms found in one passage, each term weighted by its idf over the pack's passages
# (a term of no passage weighs most, a word on every page almost nothing). A question whose
# coverage is below COVERAGE_TARGET must reach a higher similarity, one above it a lower:
#
#     required = threshold + COVERAGE_WEIGHT x max(0, COVERAGE_TARGET - coverage)
#                - COVERAGE_RELIEF x max(0, coverage - COVERAGE_TARGET) / (1 - COVERAGE_TARGET)
#
# The first two constants are one rule for every pack, chosen on the shared benchmarks together
# (bench/gate_bench.py, 2026-11-22, baseline and balanced profiles: the demo pack's 32
# in-domain and 6 out-of-domain questions, the Python docs pack's 40 and 6, SQuAD's ~500
# answerable sample and 702 unanswerable), with terms as keyword search cuts them
# (kpack.text.search_terms). At target 0.6, a weight above 0.216 refuses every out-of-domain
# question of both packs under both profiles (the Kubernetes ingress one on the demo pack, the
# JavaScript promises and Rust ownership ones on the Python docs, which the threshold alone
# answers), and a weight up to 0.394 refuses no in-domain question of either that the
# threshold answers; 0.3 is inside, near the middle. Target 0.5 leaves only 0.462 to 0.567,
# and at 0.4 the ingress question is covered enough that no weight refuses it. SQuAD pays two
# answerable questions in 505 (7 -> 9 refused) and refuses 19 more of its 702 unanswerable
# ones (21 -> 40).
#
# The words count the other way too: a question whose specific terms one passage holds nearly
# all of is asked for less, by COVERAGE_RELIEF at full coverage. MiniLM reads a long passage
# as an average, so a question about one sentence of it can sit under the threshold while
# every word of it is there. Chosen on the development halves (bench/HISTORY.md, stop 48;
# bench/gate_bench.py's coverage of every question): relief 0.08 to 0.12 refused 9 rather than
# 11 of conala_dev's 73 development intents and 2 rather than 4 of SQuAD's 253 answerable ones,
# and every out-of-domain question of the demo pack, the Python docs pack and
# bench/everyday_questions.jsonl stayed refused at each; 0.1 is the middle, and as much as the
# API words take off (retrieval.gate.API_WORD_MARGIN).
COVERAGE_PASSAGES = 10
COVERAGE_TARGET = 0.6
COVERAGE_WEIGHT = 0.3
COVERAGE_RELIEF = 0.1
SHOWN_TERMS = 3  # a reason names at most this many terms


def question_terms(text: str) -> dict[str, str]:
    """The search terms of a text (kpack.text.search_terms), each with its first spelling in
    the text, for a reason a reader recognises."""
    spelled: dict[str, str] = {}
    for word in search_words(text):
        spelled.setdefault(stem(word), word)
    return spelled


@dataclass(frozen=True)
class Vocabulary:
    """How many of a pack's passages contain each search term (a reader takes it from its
    keyword index, kpack.keyword_index)."""

    passages: int
    frequency: Mapping[str, int]

    def idf(self, term: str) -> float:
        return math.log((self.passages + 1) / (self.frequency.get(term, 0) + 0.5))


@dataclass(frozen=True)
class Coverage:
    """How well the best passages cover a question's specific terms, and the similarity the
    gate asks of the question for it."""

    share: float  # the best idf-weighted share of the question's terms in one passage
    absent: tuple[str, ...]  # terms in no passage of the pack, most specific first
    uncovered: tuple[tuple[str, int], ...]  # (term, passages with it) the best one lacks
    threshold: float
    required: float

    def explain(self, passages: int, best: float, source: str = "") -> str:
        """Why the question needs the similarity it needs, and whether ``best`` reached it
        (``source``: where the threshold came from, as the trace shows it)."""
        covered = f"the best passage covers {self.share:.0%} of the question's specific terms"
        verdict = "falls short" if best < self.required else "reaches it"
        if self.required < self.threshold:
            return (
                f"{covered}, so the gate asks for similarity {self.required:.3f} (threshold "
                f"{self.threshold}{source} - {COVERAGE_RELIEF} x ({self.share:.2f} - "
                f"{COVERAGE_TARGET}) / {1 - COVERAGE_TARGET:g}); best similarity {best:.3f} "
                f"{verdict}"
            )
        if self.required == self.threshold:
            sign = ">=" if best >= self.threshold else "<"
            return (
                f"{covered}; best similarity {best:.3f} {sign} threshold {self.threshold}{source}"
            )
        parts = []
        if self.absent:
            verb = "appears" if len(self.absent) == 1 else "appear"
            parts.append(f"{_quoted(self.absent)} {verb} in no passage of this pack")
        present = [f"'{t}' ({n} of {passages} passages)" for t, n in self.uncovered if n]
        if present:
            parts.append(
                "the passage sharing most of its terms lacks " + ", ".join(present[:SHOWN_TERMS])
            )
        return (
            "; ".join([*parts, covered])
            + f", so the gate asks for similarity {self.required:.3f} (threshold "
            f"{self.threshold}{source} + {COVERAGE_WEIGHT} x ({COVERAGE_TARGET} - {self.share:.2f})); "
            f"best similarity {best:.3f} {verdict}"
        )

    def as_dict(self) -> dict:
        return {
            "coverage": self.share,
            "required_similarity": round(self.required, 4),
            "absent_terms": list(self.absent),
            "uncovered_terms": [t for t, _ in self.uncovered],
        }


def _quoted(terms: Sequence[str]) -> str:
    shown = [f"'{t}'" for t in terms[:SHOWN_TERMS]]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def required_similarity(
    threshold: float,
    share: float,
    weight: float = COVERAGE_WEIGHT,
    target: float = COVERAGE_TARGET,
    relief: float = COVERAGE_RELIEF,
) -> float:
    """The similarity a question whose best passage covers ``share`` of its specific terms must
    reach (the rule above; bench/gate_bench.py varies its constants)."""
    return (
        threshold
        + weight * max(0.0, target - share)
        - relief * max(0.0, share - target) / (1 - target)
    )


def coverage(
    question: str, passages: Sequence[str], vocabulary: Vocabulary, threshold: float
) -> Coverage:
    """The question's coverage by the best of ``passages`` (the search's first ones) and the
    similarity it must reach (see COVERAGE_WEIGHT and COVERAGE_RELIEF); a question without
    content terms asks for the threshold."""
    spelled = question_terms(question)
    if not spelled:
        return Coverage(1.0, (), (), threshold, threshold)
    idf = {term: vocabulary.idf(term) for term in spelled}
    total = sum(idf.values())
    best, best_terms = 0.0, frozenset[str]()
    for text in passages[:COVERAGE_PASSAGES]:
        found = term_set(text) & idf.keys()
        share = sum(idf[t] for t in found) / total
        if share > best:
            best, best_terms = share, found
    lacking = sorted(set(spelled) - best_terms, key=lambda t: (-idf[t], t))
    share = round(best, 4)
    return Coverage(
        share,
        tuple(spelled[t] for t in lacking if t not in vocabulary.frequency),
        tuple((spelled[t], vocabulary.frequency.get(t, 0)) for t in lacking),
        threshold,
        required_similarity(threshold, share),
    )
