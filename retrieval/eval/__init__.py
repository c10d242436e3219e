"""Evaluating a pack: ``kpack eval`` and the ``eval_results`` asset run the same code.

- questions: eval/questions.jsonl read and checked line by line;
- runner: every question under every condition (profiles, and no_pack with a key);
- metrics: hit@k, MRR, containment, token F1, judge accuracy, gate and citation rates;
- calibrate: the gate threshold sweep, and writing the best one to kg_config.json;
- report: the summary table (Markdown, DataFrame), per-question DataFrame, the chart and the
  result files;
- generate: candidate questions drafted by Claude, or made offline from the headings;
- evidence: the graph stages measured against baseline on the pack's own questions (or a
  self-check), which decides the graph toggles a version runs by default.
"""

from retrieval.eval.calibrate import (
    best_threshold,
    calibrate,
    write_query_settings,
    write_threshold,
)
from retrieval.eval.evidence import PIPELINE_CODE_VERSION, graph_evidence, pack_evidence
from retrieval.eval.generate import (
    OFFLINE_MARK,
    candidate_sections,
    generate_questions,
    offline_questions,
    write_candidates,
)
from retrieval.eval.graph_calibration import calibrate_graph
from retrieval.eval.metrics import summarize
from retrieval.eval.questions import Question, load_questions
from retrieval.eval.report import (
    answer_score,
    chart_png,
    headline,
    load_results,
    markdown_summary,
    questions_frame,
    summary_frame,
    write_results,
)
from retrieval.eval.runner import COMPARED_PROFILES, check_profiles, evaluate, leak_filter

__all__ = [
    "COMPARED_PROFILES",
    "OFFLINE_MARK",
    "PIPELINE_CODE_VERSION",
    "Question",
    "answer_score",
    "best_threshold",
    "calibrate",
    "calibrate_graph",
    "candidate_sections",
    "chart_png",
    "check_profiles",
    "evaluate",
    "generate_questions",
    "graph_evidence",
    "headline",
    "leak_filter",
    "load_questions",
    "load_results",
    "markdown_summary",
    "offline_questions",
    "pack_evidence",
    "questions_frame",
    "summarize",
    "summary_frame",
    "write_candidates",
    "write_query_settings",
    "write_results",
    "write_threshold",
]
