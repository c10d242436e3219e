"""What kind of answer a question asks for, and whether a sentence holds one.

A who / which / when / how-many question is answered by a sentence that holds a name, a
number or a date the question does not already hold; a documentation how-to ("How do I ...",
"What should I use ...") by one that names an identifier (``DictReader``, ``json.dumps()``,
``indent=4``). The offline answer (retrieval.extractive) prefers such a sentence and quotes it
first; no kind is guessed for other questions ("Why ...", "What is the difference ...").
"""

from __future__ import annotations

import re
from typing import Literal

Kind = Literal["number", "name", "identifier"]

NUMBER_QUESTION = re.compile(
    r"\b(how (many|much|long|old|far|big|large|often)|what (year|percentage|number|age)|"
    r"which (year|version|release)|when\b|since (which|what) (version|release)|"
    r"in which (year|version|release)|what (version|release)|starting with which)",
    re.IGNORECASE,
)
NAME_QUESTION = re.compile(
    r"\b(who|whom|whose)\b|^(which|what) [a-z]+ (is|was|were|did|won)\b", re.I
)
# What a how-to asks for by name: "which exception", "what methods".
NAMED_THINGS = "function method class module exception error option argument parameter attribute"
HOWTO_QUESTION = re.compile(
    rf"\b(how (do|can|should|would) (i|we|you|my)|what should i use|"
    rf"(which|what) ({'|'.join(NAMED_THINGS.split())})s?)\b",
    re.IGNORECASE,
)

NUMBER = re.compile(r"\b\d+(?:[.,]\d+)*\b")
NUMBER_WORDS = frozenset(
    re.findall(
        r"\w+",
        "one two three four five six seven eight nine ten eleven twelve twenty thirty forty "
        "fifty hundred thousand million billion first second third",
    )
)
# A name: a capitalised word that does not start the sentence.
NAME = re.compile(r"(?<=[a-z,;]\s)[A-Z][\w'-]+")
# An identifier as documentation writes one: a call, a dotted or underscored name, a keyword
# argument, a CamelCase class or a code span.
IDENTIFIER = re.compile(
    r"`[^`\n]+`|\b\w+\(\)|\b[A-Za-z_]\w*\.[A-Za-z_]\w*\b|\b[a-z]+_[a-z_]+\b|\b\w+=\w*"
    r"|\b[A-Z]+[a-z]+[A-Z]\w*\b"
)


def answer_kind(question: str) -> Kind | None:
    """The kind of answer a question asks for, or None."""
    if NUMBER_QUESTION.search(question):
        return "number"
    if NAME_QUESTION.search(question):
        return "name"
    if HOWTO_QUESTION.search(question):
        return "identifier"
    return None


def holds_answer(kind: Kind, sentence: str, question: str) -> bool:
    """True when the sentence holds a new item of the kind: one the question does not hold."""
    asked = question.lower()
    if kind == "number":
        numbers = NUMBER.findall(sentence)
        numbers += [w for w in re.findall(r"[a-z]+", sentence.lower()) if w in NUMBER_WORDS]
        return any(n.lower() not in asked for n in numbers)
    pattern = NAME if kind == "name" else IDENTIFIER
    return any(m.strip("`").lower() not in asked for m in pattern.findall(sentence))
