"""eval/questions.jsonl: one question a line, read and checked line by line.

A question is answerable from the pack (``ground_truth``, ``answers``, ``gold_urls``), or
``out_of_domain`` (far from the pack's subject: the gate should refuse it), or ``unanswerable``
(a near miss: on the pack's subject, but the pack does not say; the pack should refuse it, by
the gate or by saying that no passage answers).

A bad line (not JSON, no question, a field of the wrong type, an unknown field, a question too
long to ask, both out_of_domain and unanswerable) is skipped with a message naming its line number; the other lines are still
evaluated. A file that is not UTF-8 is one clear error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kpack.errors import PackError
from kpack.packs import resolve_url
from retrieval.query import MAX_QUESTION_CHARS

QUESTION_FIELDS = {
    "question": str,
    "ground_truth": str,
    "answers": list,
    "gold_urls": list,
    "out_of_domain": bool,
    "unanswerable": bool,
    "id": (str, int),
    "difficulty": (str, int),
    "answer_terms": list,  # groups of terms: a full answer holds one term of every group
    "generated": str,  # how a candidate was made ("offline from headings"), when it was
}


@dataclass
class Question:
    line_no: int
    question: str
    id: str
    ground_truth: str | None = None
    answers: list[str] = field(default_factory=list)
    gold_urls: list[str] = field(default_factory=list)
    out_of_domain: bool = False
    unanswerable: bool = False
    difficulty: str | None = None
    answer_terms: list[list[str]] = field(default_factory=list)

    @property
    def answerable(self) -> bool:
        return not (self.out_of_domain or self.unanswerable)

    @property
    def references(self) -> list[str]:
        return [a for a in [*self.answers, self.ground_truth] if a]


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (a BOM is allowed); PackError when it is not UTF-8."""
    if not path.is_file():
        raise PackError(f"no question file at {path}")
    try:
        return path.read_bytes().decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise PackError(
            f"{path} is not UTF-8 text (line {line}, byte {exc.start}); save it as UTF-8"
        ) from None


def load_questions(path: Path, pack_folder: Path | None = None) -> tuple[list[Question], list[str]]:
    """Valid questions and a message per bad line (with its number); bad lines are skipped.

    gold_urls are read like urls.txt lines: ``file:relative/path`` is relative to the pack folder.
    """
    questions, problems = [], []
    for line_no, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path.name} line {line_no}: not JSON ({exc.msg})")
            continue
        problem = _invalid(item)
        if problem:
            problems.append(f"{path.name} line {line_no}: {problem}")
            continue
        questions.append(
            Question(
                line_no=line_no,
                question=item["question"].strip(),
                id=str(item.get("id", f"line-{line_no}")),
                ground_truth=item.get("ground_truth"),
                answers=[str(a) for a in item.get("answers", [])],
                gold_urls=[
                    resolve_url(u, pack_folder or path.parent)[0] for u in item.get("gold_urls", [])
                ],
                out_of_domain=bool(item.get("out_of_domain", False)),
                unanswerable=bool(item.get("unanswerable", False)),
                difficulty=None if item.get("difficulty") is None else str(item["difficulty"]),
                answer_terms=item.get("answer_terms", []),
            )
        )
    return questions, problems


def _invalid(item: object) -> str | None:
    if not isinstance(item, dict):
        return "expected a JSON object"
    if not isinstance(item.get("question"), str) or not item["question"].strip():
        return "needs a non-empty 'question'"
    if len(item["question"]) > MAX_QUESTION_CHARS:
        return (
            f"the question is {len(item['question']):,} characters long; "
            f"the limit is {MAX_QUESTION_CHARS:,}"
        )
    for key, value in item.items():
        kind = QUESTION_FIELDS.get(key)
        if kind is None:
            return f"unknown field {key!r} (known: {', '.join(QUESTION_FIELDS)})"
        if key == "answer_terms":
            if not isinstance(value, list) or not all(
                isinstance(g, list) and g and all(isinstance(t, str) for t in g) for g in value
            ):
                return "'answer_terms' must be a list of lists of terms"
            continue
        if not isinstance(value, kind) or (
            kind is list and not all(isinstance(v, str) for v in value)
        ):
            return f"{key!r} has the wrong type"
    if item.get("out_of_domain") and item.get("unanswerable"):
        return "a question is out_of_domain or unanswerable, not both"
    return None
