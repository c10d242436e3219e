"""FewShotManager (seed 004): the pack's own worked examples, the most similar ones first.

Examples come from ``few_shot_examples.json`` ({"examples": [{question, answer, ...}]}) or,
failing that, from ``eval/questions.jsonl`` (question with ground_truth or answers). An
example whose question is the one being asked is never offered, and callers (the evaluation)
can exclude more, so a graded question can never see its own answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from retrieval.pack import OpenPack

_cache: dict[str, tuple[list[dict], np.ndarray]] = {}


def normalize_question(text: str) -> str:
    return " ".join(text.lower().split()).rstrip("?!. ")


def load_examples(pack: OpenPack) -> list[dict]:
    curated = pack.folder / "few_shot_examples.json"
    if curated.is_file():
        data = json.loads(curated.read_text())
        items = data.get("examples", []) if isinstance(data, dict) else data
        return [e for e in items if isinstance(e, dict) and e.get("question") and e.get("answer")]
    questions = pack.folder / "eval" / "questions.jsonl"
    examples = []
    if questions.is_file():
        for line in questions.read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(item, dict) or item.get("out_of_domain"):
                continue
            answer = item.get("ground_truth") or (item.get("answers") or [None])[0]
            if item.get("question") and answer:
                examples.append(
                    {"id": item.get("id"), "question": item["question"], "answer": answer}
                )
    return examples


class FewShotManager:
    def __init__(self, pack: OpenPack, num_examples: int = 3):
        self.pack, self.num_examples = pack, num_examples

    def _pool(self) -> tuple[list[dict], np.ndarray]:
        key = str(self.pack.version_dir)
        if key not in _cache:
            examples = load_examples(self.pack)
            vectors = (
                self.pack.embed([e["question"] for e in examples]) if examples else np.zeros((0, 1))
            )
            _cache[key] = (examples, vectors)
        return _cache[key]

    def get_examples(
        self,
        question: str,
        question_vector: np.ndarray,
        exclude: Callable[[dict], bool] | None = None,
    ) -> list[dict]:
        examples, vectors = self._pool()
        if not examples:
            return []
        asked = normalize_question(question)
        order = np.argsort(-(vectors @ question_vector))
        chosen = []
        for index in order:
            example = examples[index]
            if normalize_question(example["question"]) == asked or (exclude and exclude(example)):
                continue
            chosen.append(example)
            if len(chosen) == self.num_examples:
                break
        return chosen
