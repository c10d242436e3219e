"""What kind of answer a question asks for, and whether a sentence holds one.

A who / which / where question is answered by a sentence that holds a name the question does
not already hold; a how-many / how-much question by one that holds a count or an amount, not
the numbers of a date ("On May 21, 2013" counts nothing); a when / what-year / what-day
question by one that holds a date (a year, a month, a day of the week) or a version ("Since
when has shelf.restore existed?": "New in version 3.8"), not just any number ("a 30-metre
lead" dates nothing), where "when" asks and does not open the condition of another question
(in "When the upload stalls, what exception does the client raise?" the clause before the
comma is the condition and "what exception" is asked); a "which version" question by one that
holds a version number ("New in version 3.11"); a "what exception" / "which error" question by
one that names an exception the question does not (``TransferStalledError``, ``ShelfClosedError``);
a documentation how-to ("How do I ...", "What should I use ...") by one that names an
identifier (``Palette``, ``shelf.open()``, ``mode='a'``); a why-question by one that gives a
reason or the condition something depends on ("... only at the start of the string", "...
evaluated only once", "... because fog covered the buoys"). The
offline answer (retrieval.extractive) prefers such a sentence and quotes it first; no kind is
guessed for other questions ("What is the difference ...").
"""

from __future__ import annotations

import re
from typing import Literal

from retrieval.key_items import NAME, NUMBER, VERSION, identifiers

Kind = Literal["version", "date", "number", "exception", "name", "identifier", "reason"]

# A version is asked for: "which version", "since which release", "what Python version".
VERSION_QUESTION = re.compile(r"\b(which|what) (\w+ )?(version|release)\b", re.IGNORECASE)
# "When" asks for a date where it opens the question or a part of it, or after "since" ("Since
# when has math.dist existed?": "New in version 3.8"), not as a conjunction ("Which exception
# do I get when ...") nor where it opens a condition the question then asks about ("When the
# upload stalls, what exception does the client raise?"): a clause before a comma that a
# question word follows is a condition, in any question.
DATE_QUESTION = re.compile(
    r"\b((what|which) (year|day|month|date|decade|century)s?\b|"
    r"(?:^|[.?!,;]\s+|\band\s+|\bsince\s+)when\b"
    r"(?!(?:[^?.,;]|\.(?=\w))*,\s*(what|which|how|why|who|where|is|are|does|do|can|should|will)\b))",
    re.IGNORECASE,
)
NUMBER_QUESTION = re.compile(
    r"\bhow (many|much|long|old|far|big|large|often)|what (percentage|number|age)\b",
    re.IGNORECASE,
)
# An error is asked for by its kind ("what exception does the client raise", "What error is
# that").
EXCEPTION_QUESTION = re.compile(
    r"\b(which|what) ((kind|type|sort)s? of |\w+ )?(exception|error)s?\b", re.IGNORECASE
)
# An exception's name: "ShelfError", "shelf.ClosedError", "KeyboardInterrupt", "StopIteration".
EXCEPTION_NAME = re.compile(
    r"\b[A-Z]\w*(Error|Exception|Warning|Exit|Interrupt|Iteration)(Group)?\b"
)
NAME_QUESTION = re.compile(
    r"\b(who|whom|whose|where)\b|^(which|what) [a-z]+ (is|was|were|did|won)\b", re.I
)
# A date written with numbers: a year, a month with its day ("May 21", "21 May").
MONTH = "January|February|March|April|May|June|July|August|September|October|November|December"
DATE_WITH_NUMBERS = re.compile(
    rf"\b(\d{{1,2}}\s+({MONTH})|({MONTH})\s+\d{{1,2}}\b|(1\d{{3}}|20\d{{2}})s?\b)"
)
# What dates a sentence: a year, a month or a day of the week.
DATE = re.compile(
    rf"\b(1\d{{3}}|20\d{{2}})s?\b|\b({MONTH}|Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|"
    r"Sunday)\b"
)
# What a how-to asks for by name: "which exception", "what methods", "what kind of error".
NAMED_THINGS = "function method class module exception error option argument parameter attribute"
HOWTO_QUESTION = re.compile(
    rf"\b(how (do|can|should|would) (i|we|you|my)|what should i use|"
    rf"(which|what) ((kind|type|sort)s? of )?({'|'.join(NAMED_THINGS.split())})s?)\b",
    re.IGNORECASE,
)

# A why-question asks for a reason or the condition something depends on.
REASON_QUESTION = re.compile(r"\bwhy\b|\bhow come\b", re.IGNORECASE)
REASON = re.compile(
    r"\b(because|unless|only|so that|therefore|due to|as a result|otherwise|which means|"
    r"this means|in order to)\b",
    re.IGNORECASE,
)

# Counts written out ("one" is left out: far more often a pronoun, "the old one", than a count).
NUMBER_WORDS = frozenset(
    re.findall(
        r"\w+",
        "two three four five six seven eight nine ten eleven twelve twenty thirty forty "
        "fifty hundred thousand million billion first second third",
    )
)


# The question patterns in the order they are tried: the first that matches names the kind.
QUESTION_KINDS: tuple[tuple[re.Pattern[str], Kind], ...] = (
    (VERSION_QUESTION, "version"),
    (DATE_QUESTION, "date"),
    (NUMBER_QUESTION, "number"),
    (EXCEPTION_QUESTION, "exception"),
    (NAME_QUESTION, "name"),
    (HOWTO_QUESTION, "identifier"),
    (REASON_QUESTION, "reason"),
)


def answer_kind(question: str) -> Kind | None:
    """The kind of answer a question asks for, or None."""
    return next((kind for pattern, kind in QUESTION_KINDS if pattern.search(question)), None)


def holds_answer(kind: Kind, sentence: str, question: str) -> bool:
    """True when the sentence holds a new item of the kind: one the question does not hold."""
    asked = question.lower()
    if kind == "version":
        return any(v not in asked for v in VERSION.findall(sentence))
    if kind == "date":
        dates = [m.group(0) for m in DATE.finditer(sentence)] + VERSION.findall(sentence)
        return any(d.lower() not in asked for d in dates)
    if kind == "exception":
        return any(e.group(0).lower() not in asked for e in EXCEPTION_NAME.finditer(sentence))
    if kind == "reason":
        return any(m.group(0).lower() not in asked for m in REASON.finditer(sentence))
    if kind == "number":
        # A count or an amount, not the numbers of a date ("On May 21, 2013, ...").
        numbers = NUMBER.findall(DATE_WITH_NUMBERS.sub(" ", sentence))
        numbers += [w for w in re.findall(r"[a-z]+", sentence.lower()) if w in NUMBER_WORDS]
        return any(n.lower() not in asked for n in numbers)
    found = NAME.findall(sentence) if kind == "name" else identifiers(sentence)
    return any(item.lower() not in asked for item in found)
