"""KnowledgeGraphAgent: the seed's public facade over a pack, running a profile's stages.

    agent = KnowledgeGraphAgent("packs/demo/pack.db", profile="balanced")
    agent.query("How is a pack built?")   # the seed's dict, plus citations, timings_ms, trace
    agent.search("How is a pack built?")  # ranked passages, no gate and no answer

The agent holds no pipeline logic: it resolves the profile and settings against the pack
version it reads (retrieval.profiles.plan) and runs the stages over a Query
(retrieval.query). An agent made from a pack name or folder reads the pack's current version
at every call, so it answers from a newly published version without being rebuilt; one made
from a PackReader stays on that version.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kpack.gate import GateThreshold
from kpack.graph_evidence import GraphChoice
from kpack.llm import ClaudeClient, LLMError
from retrieval.gate import ConfidenceGate
from retrieval.profiles import Plan, plan
from retrieval.query import Query, check_k, check_tokens, clean_question, run
from retrieval.reader import PackReader
from retrieval.registry import reading, resolve_folder
from retrieval.results import QueryResult, SearchResults, query_result, search_results
from retrieval.synthesis import answer_without_pack, api_failure_note

SEARCH_PHASES = ("retrieve", "gate", "rank")


class KnowledgeGraphAgent:
    # None: the pack's own gate threshold. A subclass that sets a number (the seed's way of
    # tuning the gate) is used in place of the calibrated or model value; kg_config.json and
    # per-call options still win over it (the order is kpack.gate.threshold_in_force's).
    CONTEXT_CONFIDENCE_THRESHOLD: float | None = None

    def __init__(
        self,
        pack: str | Path | PackReader,
        anthropic_api_key: str | None = None,
        profile: str | None = None,
        use_llm: bool = True,
        anthropic_base_url: str | None = None,
        **options: object,
    ) -> None:
        """``pack``: a pack's name, its folder or the path of its pack.db (the seed's form), or
        a PackReader (the agent then stays on that version)."""
        self.source: Path | PackReader = (
            pack if isinstance(pack, PackReader) else resolve_folder(pack)
        )
        self.requested_profile = profile
        self.options = options
        self.llm = ClaudeClient(anthropic_api_key, anthropic_base_url, enabled=use_llm)
        # ((version folder, its graph choice), plan): keyed by path, so an idle agent keeps no
        # closed reader (and its tables) alive after a newer version replaced it.
        self._plans: tuple[tuple[Path, GraphChoice], Plan] | None = None
        with reading(self.source) as reader:  # a bad profile, option or pack fails here
            self._plan(reader)

    def _plan(self, reader: PackReader) -> Plan:
        """The plan for this reader's version (kept until the agent reads another version)."""
        cached = self._plans
        choice = reader.graph_choice
        if cached is None or cached[0] != (reader.version_dir, choice):
            constant = type(self).CONTEXT_CONFIDENCE_THRESHOLD
            cached = (
                (reader.version_dir, choice),
                plan(
                    reader.config.query,
                    self.requested_profile,
                    self.options,
                    reader.manifest,
                    None if constant is None else (constant, type(self).__name__),
                    choice,
                ),
            )
            self._plans = cached
        return cached[1]

    @property
    def settings(self) -> dict:
        """The query settings in force for the version last read, with the profile name."""
        assert self._plans is not None
        return self._plans[1].settings.model_dump()

    @property
    def gate(self) -> GateThreshold:
        """The gate threshold in force for the version last read, where it came from and why."""
        assert self._plans is not None
        return self._plans[1].gate

    @property
    def profile(self) -> str:
        assert self._plans is not None
        return self._plans[1].profile.name

    @property
    def stages(self) -> list[str]:
        """The names of the stages a query runs, in order."""
        assert self._plans is not None
        return [stage.name for stage in self._plans[1].stages]

    def _new_query(self, reader: PackReader, question: str, k: int, **extra: object) -> Query:
        active = self._plan(reader)
        return Query(
            text=clean_question(question),
            k=check_k(k),
            reader=reader,
            settings=active.settings,
            gate=active.gate,
            llm=self.llm,
            depth=check_k(k) * active.depth_factor,
            **extra,  # type: ignore[arg-type]
        )

    def query(
        self,
        question: str,
        max_results: int = 5,
        exclude_examples=None,
        on_text: Callable[[str], object] | None = None,
        reader: PackReader | None = None,
    ) -> QueryResult:
        """Answer with citations; ``exclude_examples(example) -> True`` withholds a few-shot
        example (the evaluation's hold-out). ``on_text(piece)`` streams the answer: it gets
        Claude's text as it is written (an offline answer in one piece); the pieces join to
        the result's answer unless Claude failed part-way (the result then holds the offline
        answer with the failure note, as without streaming). ``reader``: answer from that open
        version rather than the agent's (the caller holds it)."""
        usage_before = self.llm.usage.as_dict()
        with reading(reader or self.source) as reader:
            query = self._new_query(
                reader, question, max_results, exclude_examples=exclude_examples, on_text=on_text
            )
            run(query, self._plan(reader).stages)
            query.finish_answer()
            reader.answered()
            return query_result(query, self._usage_since(usage_before))

    def search(
        self,
        question: str,
        k: int = 5,
        reader: PackReader | None = None,
        tokens: int | None = None,
    ) -> SearchResults:
        """The k best passages: the profile's retrieval and ranking stages only (from
        ``reader``'s version when given, as :meth:`query`); with ``tokens``, those of them
        that fit in that many tokens, each whole (retrieval.results.within_budget)."""
        with reading(reader or self.source) as reader:
            query = self._new_query(reader, question, k)
            # The gate only says whether it would refuse: a search keeps its passages.
            stages = [
                ConfidenceGate(refuse=False) if s.phase == "gate" else s
                for s in self._plan(reader).stages
                if s.phase in SEARCH_PHASES
            ]
            found = search_results(run(query, stages), check_tokens(tokens))
            reader.answered()
            return found

    def answer_without_pack(self, question: str) -> QueryResult:
        """Claude's answer with no pack content (what the pack adds is measured against it);
        the same response keys, ``query_type`` ``no_pack``."""
        usage_before = self.llm.usage.as_dict()
        with reading(self.source) as reader:
            query = self._new_query(reader, question, 1)
            query.query_type = "no_pack"
            try:
                query.answer = answer_without_pack(
                    self.llm, query.settings.synthesis_model, query.text
                )
            except LLMError as exc:
                query.answer = api_failure_note(exc)
            return query_result(query, self._usage_since(usage_before))

    def _usage_since(self, before: dict[str, int]) -> dict[str, int]:
        return {k: v - before[k] for k, v in self.llm.usage.as_dict().items()}
