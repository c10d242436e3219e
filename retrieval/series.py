"""The one of a series a question names, and which one a sentence speaks of.

A name of capitalised words and a number ("Lakeside Regatta 7", "Apollo 11", "World War II")
names one of a series: its words are shared by every one of them, its number tells which.
A sentence of the same page that writes the words with another number ("the Lakeside Regatta
VI was cancelled") speaks of another one of the series, whatever else it shares with the
question; one that writes the number asked ("Lakeside Regatta 7", "Lakeside Regatta VII"), or
follows the sentence that does, speaks of the one asked (retrieval.unit_scoring). A number is
compared by its value, so Roman numerals name the same one as digits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# Capitalised words and the number after them, inside the question: not its first word, which
# is capitalised whatever it is ("In 1985 who ..." names no series), and not a version ("Python
# 3.11" is a release, which the answer's checks compare whole: retrieval.key_items.RELEASE).
# Several numbers after the words ("Lakeside Regatta 6 and 7") name several of the series.
NUMBER = r"(\d+|[IVXLCDM]+)\b(?![.,]\d)"
NUMBERS = rf"({NUMBER}(?:(?:\s*,\s*|\s+(?:and|or)\s+){NUMBER})*)"
SERIES_NAME = re.compile(rf"(?<![.?!:;]\s)(?<=\s)((?:[A-Z][^\W_]*\s+)+){NUMBERS}")
ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


@dataclass(frozen=True)
class Series:
    """The ones of a series a question names: the series' words and the values of the
    numbers after them (one for most questions: "Lakeside Regatta 7")."""

    words: tuple[str, ...]
    numbers: frozenset[int]
    written: str  # as the question writes it ("Lakeside Regatta VII")

    @property
    def mention(self) -> re.Pattern[str]:
        """The series' words with the numbers after them, the words in any case, the last one
        perhaps in the plural ("Lakeside Regattas 6 and 7")."""
        return _mention(self.words)


@lru_cache(maxsize=1024)
def _mention(words: tuple[str, ...]) -> re.Pattern[str]:
    spaced = r"\s+".join(re.escape(w) for w in words)
    return re.compile(rf"\b(?i:{spaced})s?\s+{NUMBERS}")


def value(number: str) -> int:
    """The value of a number written in digits or in Roman numerals ("XIX": 19)."""
    if number.isdigit():
        return int(number)
    values = [ROMAN[c] for c in number]
    # A numeral before a larger one is subtracted ("IX": 9).
    return sum(-v if v < after else v for v, after in zip(values, [*values[1:], 0], strict=True))


def series_named(question: str) -> tuple[Series, ...]:
    """The ones of a series the question names (none for most questions)."""
    return tuple(
        Series(
            tuple(m.group(1).split()),
            frozenset(value(n) for n in re.findall(NUMBER, m.group(2))),
            m.group(0),
        )
        for m in SERIES_NAME.finditer(question)
    )


def speaks_of(text: str, series: tuple[Series, ...]) -> tuple[bool, bool]:
    """Whether the text writes one of the ``series`` asked, and whether it writes another one
    of the same series."""
    asked = other = False
    for one in series:
        for match in one.mention.finditer(text):
            for number in re.findall(NUMBER, match.group(1)):
                if value(number) in one.numbers:
                    asked = True
                else:
                    other = True
    return asked, other
