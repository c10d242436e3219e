"""The names, numbers and identifiers of a text: what answers are checked and chosen by.

One home for the patterns the answer modules share: the offline answer looks for a question's
names and identifiers in the passages (retrieval.extractive), the answer type asks whether a
sentence holds a new number, name or identifier (retrieval.answer_type), and citation
validation requires every number, identifier and name of a statement to appear in the passage
it cites (retrieval.citations).
"""

from __future__ import annotations

import re

from kpack.text import DOTTED_NAME, SIGNATURE_KINDS

# A number as written: "3.11", "50,000"; not the digits of a word ("v0001") or a version tail.
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?!\w)")
# A version number: "3.11", "2.7.18" (a release, where NUMBER is any number).
VERSION = re.compile(r"(?<![\w.])\d+\.\d+(?:\.\d+)?(?![\w]|\.\d)")
# A release a question names: a version number after "Python", "version" or "release"
# ("Python 3.14", "version 2.7"), not any decimal ("round(2.5)").
RELEASE = re.compile(r"\b(?:python|version|release)\s+v?(\d+\.\d+(?:\.\d+)?)(?!\w|\.\d)", re.I)
# A name inside a sentence: a capitalised word after a lower-case word, a number or a comma
# (the first word of a sentence is capitalised whatever it is).
NAME = re.compile(r"(?<=[a-z0-9,;)]\s)[A-Z][\w'’-]+")
# A name in a question: a capitalised word inside a sentence of it ("Neo4j", "Windows"), not
# the first word of one ("What", "How" after a full stop), and not an abbreviation of one to
# three capitals ("GPU", "RSVP" is a name), which a page may write spelled out instead. Its letters may be any alphabet's ("Fécamp").
QUESTION_NAME = re.compile(r"(?<![.?!:;]\s)(?<=\s)(?![A-Z]{1,3}s?\b)[A-Z][^\W_]*")
# An identifier as documentation writes one: a code span, a dotted name (each part two
# characters or more, so "e.g" is none) or a call, an underscored name, a keyword argument or
# a CamelCase class. Each alternative's group is the identifier without its backticks or "()".
IDENTIFIER = re.compile(
    r"`(?P<span>[^`\n]+)`"
    r"|\b(?P<dotted>[A-Za-z_]\w+(?:\.[A-Za-z_]\w+)+)(?:\(\))?"
    r"|\b(?P<call>\w+)\(\)"
    r"|\b(?P<snake>[a-z]+_[a-z_0-9]+)\b"
    r"|\b(?P<keyword>\w+=\w*)"
    r"|\b(?P<camel>[A-Z]+[a-z]+[A-Z]\w*)\b"
)
# An identifier in a question: a dotted or underscored name ("requests.get", "save_as"), in
# the question's case; unlike kpack.text.code_names (a text's names, read in lower case) it
# takes capitalised parts ("Path.with_suffix") and no one-letter attribute ("df.x").
QUESTION_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w+(?:\.\w{2,})+\b|\b\w+_\w+\b")
# A definition line of API documentation (a Sphinx signature): a name with its parameters,
# perhaps a kind before it and a return type after it ("class shelf.Shelf(path, ...)",
# "shelf.size() → int", "exception ValueError"), or a dotted attribute
# ("csv.QUOTE_ALL"), alone on its line.
SIGNATURE = re.compile(
    rf"^(?:(?:{SIGNATURE_KINDS})\s+)*"
    r"(?:@?[A-Za-z_][\w.]*\([^()]*(?:\([^()]*\)[^()]*)*\)(?:\s*(?:→|->)\s*[\w.\[\], |]+)?"
    rf"|{DOTTED_NAME})$"
    r"|^(?:class|exception)\s+[A-Za-z_][\w.]*$"
)

# The name a definition line defines: "shelf.Shelf" of "class shelf.Shelf(path, ...)".
DEFINED_NAME = re.compile(rf"^(?:(?:{SIGNATURE_KINDS})\s+)*@?([A-Za-z_][\w.]*)")


def identifiers(text: str) -> list[str]:
    """The identifiers a text writes, as the names they are (no backticks, no "()")."""
    return [next(g for g in m.groups() if g) for m in IDENTIFIER.finditer(text)]


def is_signature(line: str) -> bool:
    """True for a line that defines an API name (see SIGNATURE)."""
    return bool(SIGNATURE.match(line.strip()))


def defined_name(signature: str) -> str:
    """The name a definition line defines, lower case ("" for no line)."""
    match = DEFINED_NAME.match(signature)
    return match.group(1).lower() if match else ""


def same_name(defined: str, asked: str) -> bool:
    """True when a defined name is the one asked about, written in full or without the
    module or class before it ("shelf.restore" and "restore"; "list.sort", "sort")."""
    return defined == asked or defined.endswith(f".{asked}") or asked.endswith(f".{defined}")
