"""Query profiles: an ordered list of stages, with the settings they run with.

A profile is the pipeline written down: ``stages`` run in order over one Query
(retrieval.query), and ``settings`` are the profile's values of the query settings that differ
between profiles (seed 004's configuration matrix). Settings are combined in this order, each
overriding the one before: the profile's, those the pack's ``kg_config.json`` set when the
version was built (its manifest), then the caller's options.

Adding a stage is a one-line change: write it (a function decorated with
``retrieval.query.stage(name, phase, toggle)``, or a class with ``name``, ``phase`` and
``toggle`` attributes and ``__call__(self, query)``), and add one line to the list of each
profile that should run it, where it belongs in the order. A graph retrieval stage for
balanced, for example, goes among balanced's retrieval stages, before ``fuse`` (this is how
``GraphRetriever`` was added)::

        Profile(
            "balanced",
            (
                DECOMPOSE,
                *SEARCH,
                GraphRetriever(),  # <- the new stage
                fuse,
                ...

A retrieval stage appends its ranked hits to ``query.rankings`` as ``(source, candidates)``
(fuse merges every list by reciprocal rank fusion when keyword search took part); a rank stage
reorders ``query.candidates``; a context stage rewrites ``query.context``; each appends to a
candidate's ``reasons`` why it ranks where it does.

The ``enable_*`` toggles of kg_config.json (and of the options) switch a profile's stages off,
or switch on a stage the profile lacks: it is inserted where the first profile that has it
runs it, after the same predecessors. ``use_enhancements: false`` keeps the stages every
profile needs and hybrid search only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kpack.errors import PackError
from kpack.graph_evidence import GRAPH_TOGGLES
from retrieval.api_search import ApiSearch, DefinitionSearch
from retrieval.candidates import (
    bm25_search,
    embed_question,
    fuse,
    read_the_question,
    vector_search,
)
from retrieval.crowding import page_crowding
from retrieval.decompose import QueryDecomposer, SubQuestionCoverage
from retrieval.docgraph import DocGraphExpansion
from retrieval.entity_graph import GraphRetriever, SecondHop
from retrieval.expansion import MultiQueryExpander
from retrieval.fewshot import FewShotManager
from retrieval.gate import ConfidenceGate
from retrieval.multidoc import MultiDocSynthesizer
from retrieval.quality import QualityFilter
from retrieval.query import Stage
from retrieval.rerank import CrossEncoderReranker, GraphReranker, top_k
from retrieval.synthesis import synthesize

if TYPE_CHECKING:
    # pydantic is imported on first use, which keeps `import retrieval` fast.
    from kpack.config import QueryConfig
    from kpack.gate import GateThreshold
    from kpack.graph_evidence import GraphChoice

TOGGLES = (
    "use_enhancements",
    "enable_reranker",
    "enable_multidoc",
    "enable_fewshot",
    "enable_cross_encoder",
    "enable_multi_query",
    "enable_hybrid",
    "enable_quality_filter",
    "enable_graph",
    "enable_doc_graph",
    "enable_api_search",
)
# What use_enhancements=false keeps besides the stages without a toggle.
# Search itself rather than an enhancement of it: keyword search and API search (the
# passages defining the APIs a question names) stay on with use_enhancements false.
NOT_AN_ENHANCEMENT = ("enable_hybrid", "enable_api_search")
ALIASES = {"maximum": "max", "max_quality": "max", "default": "balanced"}


@dataclass(frozen=True)
class Profile:
    name: str
    stages: tuple[Stage, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    summary: str = ""


# The seed's balanced settings: every profile starts from these.
BALANCED_SETTINGS = {
    "num_docs": 5,
    "sections_per_doc": 3,
    "reranker_alpha": 0.7,
    "reranker_beta": 0.3,
    "few_shot_examples": 3,
    # The graph stages' settings (retrieval.entity_graph), for every profile that runs them or
    # switches them on; chosen on the shared benchmarks (HotpotQA, SQuAD, the demo pack).
    "graph_damping": 0.5,
    "graph_weight": 1.0,
    "graph_expand": 3,
    "graph_bridge_threshold": 0.3,
    # Fusion weights, chosen on the development halves of conala_dev and ds1000_pandas_dev
    # (their odd lines; bench/external_bench.py reports the even lines). Every list at 1 did
    # better on those halves with the packs' graph evidence held fixed, but a build with it
    # chose other graph stages on its self-check, and conala_dev lost more than ds1000 gained
    # (bench/HISTORY.md, stop 46).
    "keyword_weight": 1.0,
    "api_weight": 0.5,
    "definition_weight": 1.5,
    # A problem statement's code names the APIs it uses, so its API list counts more, and the
    # definitions reading closest to its long prose less. Chosen on ds1000_pandas_dev's
    # development half alone (api 3 to 6 with definitions 0.25 to 1 did equally well there;
    # the middle kept), which leaves terse questions, conala_dev's and the build's self-check,
    # as they were (bench/HISTORY.md, stop 47).
    "problem_api_weight": 3.0,
    "problem_definition_weight": 0.75,
    # Vector search ranks a passage by 0.4 x its own similarity + 0.6 x its best sentence's
    # (retrieval.candidates.vector_score), where the version has a sentence index. Chosen on
    # the development halves (conala_dev, ds1000_pandas_dev and python_docs_qa odd lines,
    # SQuAD even positions) by their mean hit@5: 0.765 at 0.6, 0.761 at 0.55, 0.751 at 0.65,
    # 0.744 for the passage's own similarity alone (bench/HISTORY.md, stop 49).
    "sentence_weight": 0.6,
    # Page crowding is off unless the version's own evidence keeps it (kpack.graph_evidence):
    # it costs a pack of a few long articles what it gains a documentation site.
    "passages_per_page": 0,
}

# The profiles with the graph stages (retrieval.entity_graph) give the GraphReranker's PageRank, a
# prior that ignores the question, no weight: on the shared benchmarks any weight on it cost
# hit@1 (demo pack 0.938 -> 0.719 at 0.3) and recall (HotpotQA). At weight 0 the reranker
# leaves the ranking as it is (and the trace says so); it stays in their lists because `kpack
# eval PACK --write-config` calibrates the weight per pack with the graph settings
# (retrieval.eval.graph_calibration), and a pack's weight applies there.
GRAPH_SETTINGS = {"reranker_beta": 0.0}

# Stage runs that several profiles share; a profile lists them in its own order, so a stage
# for one profile is still one line in that profile's list.
SEARCH = (
    read_the_question,
    embed_question,
    vector_search,
    bm25_search,
    ApiSearch(),
    DefinitionSearch(),
)
# Query decomposition (retrieval.decompose): with a key, a multi-part question's sub-questions
# are searched as phrasings, and each keeps its best passage after top k.
DECOMPOSE = QueryDecomposer()
KEEP_PARTS = SubQuestionCoverage()
CONTEXT_AND_ANSWER = (MultiDocSynthesizer(), QualityFilter(), FewShotManager(), synthesize)
# Top k (each sub-question keeping its best passage), then the context and the answer.
ANSWER_TAIL = (page_crowding, top_k, KEEP_PARTS, *CONTEXT_AND_ANSWER)
# Fused, gated and ranked by the graph's authority, then answered: the tail of the profiles
# that tune balanced's context without the graph retrieval stages.
RANKED_ANSWER = (fuse, ConfidenceGate(), GraphReranker(), *ANSWER_TAIL)
# After the gate in the profiles with the graph retrieval stages: the graph's authority, its
# second hop and the documentation graph's expansion, then answered.
GRAPH_RANKED_ANSWER = (GraphReranker(), SecondHop(), DocGraphExpansion(), *ANSWER_TAIL)

# One profile for each name of kpack.config.PROFILE_NAMES, the one list of names (kg_config.json,
# the CLI, the HTTP API and the MCP server accept those; tests/test_retrieval.py checks that the
# two agree). ALIASES are other names the Python API accepts.
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "baseline",
            (
                DECOMPOSE,
                *SEARCH,
                fuse,
                ConfidenceGate(),
                page_crowding,
                top_k,
                KEEP_PARTS,
                synthesize,
            ),
            BALANCED_SETTINGS
            | {"num_docs": 1, "reranker_alpha": 1.0, "reranker_beta": 0.0, "few_shot_examples": 0},
            "hybrid search, the gate, and an answer from the top passages",
        ),
        Profile(
            "balanced",
            (
                DECOMPOSE,
                *SEARCH,
                GraphRetriever(),
                fuse,
                ConfidenceGate(),
                *GRAPH_RANKED_ANSWER,
            ),
            BALANCED_SETTINGS | GRAPH_SETTINGS,
            "plus graph retrieval (entity PageRank, second hop), multi-document context, quality "
            "filter, few-shot examples",
        ),
        Profile(
            "max",
            (
                DECOMPOSE,
                MultiQueryExpander(),
                *SEARCH,
                GraphRetriever(),
                fuse,
                ConfidenceGate(),
                CrossEncoderReranker(),
                *GRAPH_RANKED_ANSWER,
            ),
            BALANCED_SETTINGS | GRAPH_SETTINGS,
            "balanced plus multi-query expansion and the cross-encoder",
        ),
        Profile(
            "latency_optimized",
            (DECOMPOSE, *SEARCH, *RANKED_ANSWER),
            BALANCED_SETTINGS
            | {"num_docs": 3, "reranker_alpha": 0.8, "reranker_beta": 0.2, "few_shot_examples": 2},
            "balanced's stages over a smaller context: 3 articles, 2 examples",
        ),
        Profile(
            "coverage_optimized",
            (DECOMPOSE, MultiQueryExpander(), *SEARCH, *RANKED_ANSWER),
            BALANCED_SETTINGS
            | {"num_docs": 7, "reranker_alpha": 0.6, "reranker_beta": 0.4, "few_shot_examples": 5},
            "multi-query expansion and a wider context: 7 articles, 5 examples, more authority",
        ),
    )
}


def profile_named(name: str) -> Profile:
    canonical = ALIASES.get(name, name)
    if canonical not in PROFILES:
        raise PackError(f"unknown profile {name!r} (use {', '.join(PROFILES)})")
    return PROFILES[canonical]


def pipeline(profile: Profile, toggles: dict[str, bool]) -> tuple[Stage, ...]:
    """The profile's stages with the toggles applied (see the module docstring)."""
    stages = list(profile.stages)
    if toggles.get("use_enhancements") is False:
        stages = [s for s in stages if s.toggle is None or s.toggle in NOT_AN_ENHANCEMENT]
    enhancements_off = toggles.get("use_enhancements") is False
    for toggle, on in toggles.items():
        if toggle == "use_enhancements" or (
            on and enhancements_off and toggle not in NOT_AN_ENHANCEMENT
        ):
            continue  # the master switch wins over a stage's own
        if not on:
            stages = [s for s in stages if s.toggle != toggle]
        elif not any(s.toggle == toggle for s in stages):
            stages = _insert(stages, toggle)
    return tuple(stages)


def _insert(stages: list[Stage], toggle: str) -> list[Stage]:
    """Add the stages switched on by ``toggle`` after the same predecessors as in the first
    profile that runs them."""
    for source in PROFILES.values():
        order = list(source.stages)
        added = [s for s in order if s.toggle == toggle]
        if not added:
            continue
        for stage in added:
            before = {s.name for s in order[: order.index(stage)]}
            position = max((i + 1 for i, s in enumerate(stages) if s.name in before), default=0)
            stages.insert(position, stage)
        return stages
    raise PackError(f"no stage is switched by {toggle!r}")


def graph_defaults(profile: Profile, evidence: Mapping[str, bool] | None) -> dict[str, bool]:
    """Which graph stages run by default (graph toggle -> on) for ``profile`` on a version
    whose own evidence chose ``evidence`` (kpack.graph_evidence; None: no evidence applied).
    The one place this is decided: a graph stage runs by default when the profile lists it
    and the evidence did not switch it off; kg_config.json's settings and a caller's options
    win over it (:func:`plan`)."""
    return {
        toggle: any(stage.toggle == toggle for stage in profile.stages)
        and (evidence or {}).get(toggle, True)
        for toggle in GRAPH_TOGGLES
    }


@dataclass(frozen=True)
class Plan:
    """What one agent runs against one pack version: the profile, the settings in force and
    the stages with the toggles applied."""

    profile: Profile
    settings: QueryConfig
    stages: tuple[Stage, ...]
    gate: GateThreshold  # the gate's threshold (settings') and where it came from

    @property
    def depth_factor(self) -> int:
        """How many times k passages retrieval fetches (a reranker that cuts to k wants more)."""
        return max((getattr(s, "widens", 1) for s in self.stages), default=1)


def option_names() -> frozenset[str]:
    from kpack.config import QueryConfig

    return frozenset(QueryConfig.model_fields) - {"profile"}


def plan(
    pack_settings: QueryConfig,
    profile: str | None,
    options: dict[str, Any],
    manifest: Mapping,
    agent_constant: tuple[float, str] | None = None,
    evidence: GraphChoice | None = None,
) -> Plan:
    """Combine the profile's settings, the pack's (those its version recorded as set) and the
    call's options; the gate's threshold is kpack.gate's choice (threshold_in_force: the
    option, kg_config.json's, ``agent_constant``, the build's calibration, the model's
    default) for the version of ``manifest``. ``evidence``: what the version's own evidence
    chose (kpack.graph_evidence): its graph toggles switch off the profile's graph stages the
    evidence did not keep (they never add one to a profile without it), and its settings (page
    crowding) replace the profile's; the pack's settings and the options win over both."""
    from kpack.config import parse_config
    from kpack.gate import threshold_in_force

    unknown = sorted(set(options) - option_names())
    if unknown:
        raise PackError(f"unknown options {unknown} (known: {', '.join(sorted(option_names()))})")
    chosen = profile_named(profile or pack_settings.profile)
    pack_values = {
        k: v for k, v in pack_settings.model_dump().items() if v is not None and k != "profile"
    }
    listed = graph_defaults(chosen, None)
    kept = graph_defaults(chosen, evidence.toggles if evidence else None)
    switched_off = {toggle: False for toggle, on in kept.items() if listed[toggle] and not on}
    measured = evidence.settings if evidence else {}
    values = {**chosen.settings, **measured, **switched_off, **pack_values, **options}
    toggles = {t: values.pop(t) for t in TOGGLES if values.get(t) is not None}
    for toggle in TOGGLES:
        values.pop(toggle, None)
    settings = parse_config({"query": {**values, "profile": chosen.name}}, "query settings").query
    passed = options.get("context_confidence_threshold") is not None
    gate = threshold_in_force(
        manifest, settings.context_confidence_threshold if passed else None, agent_constant
    )
    settings = settings.model_copy(update={"context_confidence_threshold": gate.threshold})
    return Plan(chosen, settings, pipeline(chosen, toggles), gate)
