"""FewShotManager (seed 004): the pack's own worked examples, the most similar ones first.

The pool is the reader's (``few_shot_examples.json``, else ``eval/questions.jsonl``, read when
the version was opened), embedded once per reader the first time an LLM will use it: an
extractive answer uses no examples, so without Claude nothing is embedded. An example whose
question is the one being asked is never offered, and callers (the evaluation) can exclude
more, so a graded question can never see its own answer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from retrieval.query import Query
from retrieval.reader import PackReader


def normalize_question(text: str) -> str:
    return " ".join(text.lower().split()).rstrip("?!. ")


class FewShotManager:
    """As a stage it offers the query's ``few_shot_examples`` best examples to synthesis."""

    name, phase, toggle = "few_shot", "context", "enable_fewshot"

    def __init__(self, num_examples: int = 3) -> None:
        self.num_examples = num_examples

    def get_examples(
        self,
        reader: PackReader,
        question: str,
        question_vector: np.ndarray,
        exclude: Callable[[dict], bool] | None = None,
    ) -> list[dict]:
        if not reader.examples or self.num_examples <= 0:
            return []
        asked = normalize_question(question)
        order = np.argsort(-(reader.example_vectors @ question_vector))
        chosen = []
        for index in order:
            example = reader.examples[index]
            if normalize_question(example["question"]) == asked or (exclude and exclude(example)):
                continue
            chosen.append(example)
            if len(chosen) == self.num_examples:
                break
        return chosen

    def __call__(self, query: Query) -> None:
        if not query.llm.available:
            query.notes["few_shot_questions"] = []
            return  # the extractive answer uses no examples: nothing to embed
        manager = FewShotManager(query.settings.few_shot_examples)
        query.examples = manager.get_examples(
            query.reader, query.text, query.vector, query.exclude_examples
        )
        query.notes["few_shot_questions"] = [e["question"] for e in query.examples]
