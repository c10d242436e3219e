"""Citation validation: every statement of an answer checked against the passage it cites.

An answer cites as ``[Source: title]`` after the statement it supports (the text since the
previous citation). Each statement is checked against the context passages of that title:

- a title that is not in the context cites no passage the answer was given: never valid;
- every number, identifier (``json.dumps``, ``indent=4``) and name (a capitalised word inside
  the sentence) of the statement must appear in the passage: a wrong number is caught even
  when every other word matches;
- its support score is the share of its search terms the passage holds, blended half and half
  with the cosine similarity of the statement's and the passage's vectors when vectors are
  given (Claude's answers; the offline answer quotes, so its terms decide).

A statement with support below ``SUPPORT_THRESHOLD``, a missing item or no passage in the
context is unsupported: removed from the answer (the default) or marked ``[unsupported]``
(``unsupported_citations: mark``). Every statement's check goes to the trace
(``citations``), and the response carries the summary ``citations_checked``: checked,
supported, removed, support rate.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np

from kpack.text import normalize_entity, search_terms, words
from retrieval.key_items import NAME, NUMBER, identifiers
from retrieval.query import ContextSection

SUPPORT_THRESHOLD = 0.5
MARK = " [unsupported]"
# How an answer cites a passage, offline and as retrieval.synthesis asks Claude to.
CITATION = re.compile(r"\[Source: ([^\]]+)\]")


@dataclass
class StatementCheck:
    """One cited statement and what its check found."""

    statement: str
    cited: list[str]  # the titles it cites
    in_context: bool  # some cited title is a passage of the context
    missing: list[str] = field(default_factory=list)  # names, numbers, identifiers not found
    support: float = 0.0
    supported: bool = False
    start: int = 0  # where the statement and its citations sit in the answer
    end: int = 0


def key_items(statement: str) -> list[str]:
    """The numbers, identifiers and names a statement asserts (what its passage must hold)."""
    plain = CITATION.sub("", statement)
    items = NUMBER.findall(plain) + identifiers(plain) + NAME.findall(plain)
    return list(dict.fromkeys(i.strip() for i in items if i.strip()))


@lru_cache(maxsize=4096)
def _forms(passage: str) -> tuple[str, str, str, frozenset[str]]:
    """A passage as the checks read it (pack passages repeat across questions): lower case,
    without thousands separators, its words joined, its search terms."""
    lower = passage.lower()
    return (
        lower,
        passage.replace(",", ""),
        f" {' '.join(words(passage))} ",
        frozenset(search_terms(passage)),
    )


def _holds(passage: str, item: str) -> bool:
    """True when the passage holds the item: as written, or (a name) by its key."""
    lower, plain, joined, _ = _forms(passage)
    if item.lower() in lower:
        return True
    digits = item.replace(",", "")
    if digits.replace(".", "").isdigit():
        return digits in plain
    key = normalize_entity(item)
    return bool(key) and f" {key} " in joined


def term_share(statement: str, passage: str) -> float:
    """The share of the statement's search terms that the passage holds."""
    mine = set(search_terms(CITATION.sub("", statement)))
    if not mine:
        return 1.0
    return len(mine & _forms(passage)[3]) / len(mine)


def statements(answer: str) -> list[tuple[str, list[str], int, int]]:
    """(statement, cited titles, start, end) for every run of text that ends in citations."""
    found = []
    start = 0
    for match in re.finditer(r"(?:\s*\[Source: [^\]]+\])+[.!?;]?", answer):
        titles: list[str] = []
        for title in CITATION.findall(match.group(0)):
            titles += [t.strip() for t in title.split(";")] if ";" in title else [title.strip()]
        text = answer[start : match.start()].strip()
        if text:
            found.append((text, titles, start, match.end()))
        start = match.end()
    return found


def check_answer(
    answer: str,
    context: list[ContextSection],
    vectors: Callable[[list[str]], np.ndarray] | None = None,
    passage_vector: Callable[[ContextSection], np.ndarray | None] | None = None,
) -> list[StatementCheck]:
    """Check every cited statement of the answer against the context (module docstring)."""
    by_title: dict[str, list[ContextSection]] = {}
    for section in context:
        by_title.setdefault(_title_key(section.title), []).append(section)
    found = statements(answer)
    embedded = vectors([text for text, *_ in found]) if vectors is not None and found else None
    checks = []
    for number, (text, titles, start, end) in enumerate(found):
        passages = [p for t in titles for p in by_title.get(_title_key(t), [])]
        check = StatementCheck(text, titles, bool(passages), start=start, end=end)
        best: tuple[float, list[str]] | None = None
        for passage in passages:
            missing = [item for item in key_items(text) if not _holds(passage.text, item)]
            support = term_share(text, passage.text)
            held = passage_vector(passage) if passage_vector is not None else None
            if embedded is not None and held is not None:
                support = (support + max(0.0, float(embedded[number] @ held))) / 2
            if best is None or (len(missing), -support) < (len(best[1]), -best[0]):
                best = (support, missing)
        if best is not None:
            check.support, check.missing = round(best[0], 3), best[1]
            check.supported = not check.missing and check.support >= SUPPORT_THRESHOLD
        checks.append(check)
    return checks


def apply_checks(answer: str, checks: list[StatementCheck], mode: str) -> str:
    """The answer with each unsupported statement removed (``remove``) or marked (``mark``).
    Only the seams where a statement was taken out are tidied: the rest, the indentation of a
    quoted code block included, stays as written."""
    kept = ""
    at = 0
    for check in checks:
        if check.supported:
            continue
        kept = _joined(kept, answer[at : check.start])
        if mode == "mark":
            kept = _joined(kept, answer[check.start : check.end] + MARK)
        at = check.end
    return _joined(kept, answer[at:]).strip()


def _joined(left: str, right: str) -> str:
    """Two pieces of an answer with one space between them where they meet mid-line."""
    if not left or not right or left.endswith("\n") or right.startswith("\n"):
        return left + right
    return f"{left.rstrip(' ')} {right.lstrip(' ')}"


def summary(checks: list[StatementCheck], mode: str) -> dict:
    """The response's ``citations_checked``."""
    supported = sum(c.supported for c in checks)
    return {
        "checked": len(checks),
        "supported": supported,
        "removed": len(checks) - supported if mode == "remove" else 0,
        "marked": len(checks) - supported if mode == "mark" else 0,
        "support_rate": round(supported / len(checks), 3) if checks else None,
    }


def trace_rows(checks: list[StatementCheck]) -> list[dict]:
    return [{k: v for k, v in asdict(c).items() if k not in ("start", "end")} for c in checks]


def _title_key(title: str) -> str:
    return " ".join(title.split()).casefold()
