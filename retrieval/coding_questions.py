"""Reading a developer's question: its own names apart from its words, its prose apart from its
code and data, and the APIs its code calls.

Developers ask in two shapes. A terse intent writes the asker's own variables and values in
backticks or quotes ("get the max key in dictionary `counts`", "hash the file 'setup.cfg'"):
those are no search terms, and no page of the docs holds them. A problem statement pastes data
frames, rows of values and code around a few sentences of prose: its data rows and variable
names would steer keyword search to whatever page shares a column name, while its code names
the very APIs whose pages are wanted (``df.pivot_table(...)``, ``pd.melt``).

:func:`read_question` separates them, by the shape of the text only (no word list of any
library): a line is code when it reads like code (an assignment, a call, an import, a
prompt, a fence or indentation) or like data (mostly numbers and punctuation); prose is the
rest. The calls written in the code, and the names written with a call's parentheses in the
prose (``value_counts()``), are the question's API names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kpack.text import code_names

# The asker's own names and values: a backticked span, or a quoted one without spaces (a
# file name, a value, an expression). A quoted phrase ("the song "Blue Moon"") is a title the
# pages may hold, and stays a search term.
ASKERS_SPAN = re.compile(r"`[^`\n]{1,80}`|'[^'\s]{1,60}'|\"[^\"\s]{1,60}\"")
# A line of code: an assignment, a call or subscript, an import, a prompt, a decorator, a
# keyword that opens a block, or a fenced/indented line.
CODE_LINE = re.compile(
    r"^\s*(?:>>>|\.\.\.|@\w|```|~~~|(?:import|from|def|class|return|for|if|with|print)\b)"
    r"|^\s{4,}\S|\w\s*=[^=]|\w\(|\)\s*$|\w\[|^\s*[\[{(]"
)
# A row of data: few letters among numbers, separators and brackets, or cells aligned in
# columns (two or more gaps of several spaces, which prose never writes).
LETTERS = re.compile(r"[A-Za-z]")
ALIGNED_GAP = re.compile(r"\S {2,}(?=\S)")
MIN_ALIGNED_GAPS = 2
# A call written in code: ``name(`` after a dot or at the start of an expression, with the
# object or module it is called on ("df.groupby(", "pd.melt(", "sorted(").
CODE_CALL = re.compile(r"(?:\b([A-Za-z_]\w*)\.)?\b([A-Za-z_]\w*)\s*\(")
# An attribute chain without a call ("pd.NaT", "df.columns"): its last name may be an API too.
ATTRIBUTE = re.compile(r"\b[A-Za-z_]\w*\.([A-Za-z_]\w*)\b")
# Names that are the language's syntax rather than an API a page documents.
SYNTAX = frozenset({"if", "for", "while", "with", "return", "print", "lambda", "def", "class"})
# A prose line shorter than this many letters among others is data, not prose.
MIN_PROSE_LETTER_SHARE = 0.5
# A question of more lines than this is a problem statement, not a terse intent.
LONG_QUESTION_LINES = 3


@dataclass(frozen=True)
class QuestionReading:
    """What :func:`read_question` made of a question."""

    prose: str  # the words to search for: no code, no data, no asker's names or values
    api_names: tuple[str, ...]  # the names the question calls or writes as calls, first first
    asker_names: tuple[str, ...]  # the backticked and quoted spans, left out of ``prose``
    long: bool  # more than LONG_QUESTION_LINES lines, read line by line
    code_lines: int = 0  # of a long question, the lines of code or data

    @property
    def changed(self) -> bool:
        return bool(self.asker_names or self.api_names or self.long)

    @property
    def problem_statement(self) -> bool:
        """A problem as agents paste them: several lines, some of them code or data."""
        return self.long and self.code_lines > 0


def is_code_line(line: str) -> bool:
    stripped = line.strip()
    if not stripped:
        return False
    if CODE_LINE.search(line) or len(ALIGNED_GAP.findall(stripped)) >= MIN_ALIGNED_GAPS:
        return True
    letters = len(LETTERS.findall(stripped))
    return letters < MIN_PROSE_LETTER_SHARE * len(stripped.replace(" ", ""))


def _api_names(code: str, prose: str) -> list[str]:
    names: list[str] = []
    for owner, name in CODE_CALL.findall(code):
        if name not in SYNTAX and not (name[0].isupper() and not owner):
            names.append(name)
    names += ATTRIBUTE.findall(code)
    names += [name for _, name in CODE_CALL.findall(prose) if name not in SYNTAX]
    # A dotted or underscored identifier written in prose ("jsonlite.loads") is code too.
    names += [name.rsplit(".", 1)[-1] for name in code_names(prose)]
    seen: dict[str, None] = {}
    for name in names:
        if len(name) > 1:
            seen.setdefault(name, None)
    return list(seen)


def read_question(text: str) -> QuestionReading:
    lines = text.split("\n")
    long = len([line for line in lines if line.strip()]) > LONG_QUESTION_LINES
    asker = tuple(span[1:-1] for span in ASKERS_SPAN.findall(text))
    if not long:
        prose = ASKERS_SPAN.sub(" ", text)
        return QuestionReading(" ".join(prose.split()), tuple(_api_names("", text)), asker, False)
    code_lines, prose_lines = [], []
    for line in lines:
        (code_lines if is_code_line(line) else prose_lines).append(line)
    prose = ASKERS_SPAN.sub(" ", " ".join(prose_lines))
    return QuestionReading(
        " ".join(prose.split()),
        tuple(_api_names("\n".join(code_lines), " ".join(prose_lines))),
        asker,
        True,
        len(code_lines),
    )
