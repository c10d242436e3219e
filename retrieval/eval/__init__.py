"""Evaluating a pack: ``kpack eval`` and the ``eval_results`` asset run the same code.

- questions: eval/questions.jsonl read and checked line by line;
- runner: every question under every condition (profiles, and no_pack with a key);
- metrics: hit@k, MRR, containment, token F1, judge accuracy, gate and citation rates;
- calibrate: the gate threshold sweep, and writing the best one to kg_config.json;
- report: the summary table (Markdown, DataFrame), per-question DataFrame, the chart and the
  result files;
- generate: candidate questions drafted by Claude.
"""

from retrieval.eval.calibrate import (
    best_threshold,
    calibrate,
    write_query_settings,
    write_threshold,
)
from retrieval.eval.generate import candidate_sections, generate_questions
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
    "headline",
    "leak_filter",
    "load_questions",
    "load_results",
    "markdown_summary",
    "questions_frame",
    "summarize",
    "summary_frame",
    "write_query_settings",
    "write_results",
    "write_threshold",
]
