"""The units of a passage that an offline answer can quote (retrieval.extractive).

A unit is a prose sentence (kpack.text.split_sentences; a list item, read without its marker,
and a table row start their own), or a lead-in sentence ending in a colon together with the
fenced code block that follows it ("The simplest example of reading a settings file:" and its
code), quoted as a fenced block so a how-to keeps the code it needs; so is a sentence that ends
its paragraph and announces the code after it ("This example opens the shelf and prints its
first record."). A lead-in whose code is not in the passage (or is longer than
``MAX_CODE_LINES``) would end in nothing and is skipped. A definition line of API
documentation (retrieval.key_items.SIGNATURE: ``shelf.open(path, *, mode="r", ...)``,
``class shelf.Shelf(path, ...)``) is no sentence: the units after it explain it, so each keeps
it (``Unit.signature``). Sentences that only talk about the page ("This page describes ..."),
point elsewhere ("... is described in [pack layout](pack-layout.md)"), are navigation (a line
of links), are interactive-session lines or are the tail of a sentence cut at a passage
boundary are no units (:func:`is_boilerplate`); markdown links are quoted as their text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from kpack.text import fence_roles, split_sentences
from retrieval.key_items import identifiers, is_signature

# A unit of fewer words is a fragment ("See below."), one of more is a run-on the page did not
# punctuate (a table or a list flattened into one line): neither reads as an answer. Round
# values, not fitted to any question.
MIN_SENTENCE_WORDS, MAX_SENTENCE_WORDS = 4, 120
# A code block longer than this is a whole program rather than the example a lead-in
# introduces: quoting it would bury the answer's sentences under a screen of code.
MAX_CODE_LINES = 20

# Markdown links: quoted as their text, the way the page reads.
MARKDOWN_LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
# A sentence about the page or section it is on, not about the subject.
SELF_REFERENCE = re.compile(
    r"^(this|the (following|next|previous|present)|these)\s+(\w+\s+)?"
    r"(page|pages|section|sections|document|chapter|guide|article|tutorial|reference)\b",
    re.IGNORECASE,
)
# A sentence whose point is where something else is explained.
POINTER = re.compile(
    r"\b(is|are)\s+(also\s+)?(described|explained|covered|documented|detailed|introduced)"
    r"\s+(below|above|later|elsewhere|in|on)\b"
    r"|^(see|read)\b|^(if|for)\b[^,]*,\s*(see|read)\b",
    re.IGNORECASE,
)
# A link's target without its text ("as described in (building-packs.md)").
LINK_RESIDUE = re.compile(r"(?<!\])\([\w./-]+\.(md|html?|rst|txt)\)")
# A row of a table as the page's text writes it: its cells joined by " | ".
TABLE_ROW = re.compile(r"\S \| \S")
# What no sentence starts with but the tail of one that a passage boundary cut does.
CUT_START = frozenset("=,;:.)]}|/%&")
# A sentence with this many links is a list of links (a table of contents, "Next: [x](y)"):
# a sentence that explains something links one or two terms, a menu links every item.
NAVIGATION_LINKS = 3

# A sentence that announces the code after it without a colon ("This example gets the
# python.org main page ...", "Look at the following example, which ..."): quoted with it.
ANNOUNCES_CODE = re.compile(r"\b(examples?|following|below|as follows|like this|snippet)\b", re.I)
# A list item's marker at the start of its line ("- The sort is stable", "2. Open the file").
LIST_ITEM = re.compile(r"^\s*([-*+•]|\d{1,2}[.)])\s+")
# A release note of API documentation: "New in version 3.8.", "Changed in version 3.3: ...".
VERSION_NOTE = re.compile(r"(new|changed|deprecated) (in|since) version\b", re.IGNORECASE)
# Interactive-session lines left in prose (">>> print(row)"): code, not a sentence.
PROMPT = ">>>"


@dataclass(frozen=True)
class Unit:
    """What an answer quotes: one sentence, or a lead-in with the code block it introduces."""

    sentence: str  # as quoted: the passage's words, links shown as their text
    code: str | None = None  # the fenced block, fences included
    before: str = ""  # the sentence before it in its paragraph, which it may lean on
    signature: str = ""  # the definition line it explains ("shelf.open(path, *, ...)")

    @property
    def text(self) -> str:
        return f"{self.sentence}\n{self.code}" if self.code else self.sentence

    @property
    def subject(self) -> str:
        """What the unit says and the definition it says it of."""
        return f"{self.signature}\n{self.text}" if self.signature else self.text


def is_boilerplate(sentence: str, cut: bool = True) -> bool:
    """True for a sentence about the page itself, a pointer elsewhere, navigation, or (where
    a passage boundary can ``cut`` one) the tail of a sentence: it starts in lower case, or
    with the punctuation of a sentence's middle ("= expression, the function is said to ...")."""
    if cut and (sentence[:1].islower() or sentence[:1] in CUT_START):
        return True
    plain = MARKDOWN_LINK.sub(r"\1", sentence).strip(" -*")
    # A pointer to an API name ("For example, see shelf.restore().") names the answer.
    pointer = POINTER.search(plain) and not identifiers(plain)
    if SELF_REFERENCE.match(plain) or pointer or LINK_RESIDUE.search(sentence):
        return True
    links = MARKDOWN_LINK.findall(sentence)
    linked_words = sum(len(text.split()) for text, _ in links)
    return len(links) >= NAVIGATION_LINKS or linked_words >= 0.5 * len(plain.split())


def blocks_of(text: str) -> list[tuple[str, str]]:
    """The passage as ("prose", paragraph), ("item", list item), ("row", table row), ("code",
    fenced block) and ("signature", definition line) pieces, in order; a code block the
    passage cuts off (no closing fence) is left out. A definition line of API documentation
    ends the paragraph before it: it is no sentence ("shelf.restore(path)" is not the tail
    of "New in version 3.5."); a table row is a piece of its own ("'x' | open for exclusive
    creation, failing if the file already exists"), and so is a list item, without its
    marker ("- The sort is stable" is not the tail of the sentence before the list)."""
    blocks: list[tuple[str, str]] = []
    prose: list[str] = []
    code: list[str] = []
    paragraph = ["prose"]  # what the lines gathered in prose are: a paragraph or a list item

    def flush_prose() -> None:
        if prose:
            blocks.append((paragraph[0], " ".join(" ".join(prose).split())))
            prose.clear()
        paragraph[0] = "prose"

    for line, role in fence_roles(text.split("\n")):
        if role == "text":
            if is_signature(line):
                flush_prose()
                blocks.append(("signature", line.strip()))
            elif TABLE_ROW.search(line):  # a row is read on its own, not as one long sentence
                flush_prose()
                blocks.append(("row", " ".join(line.split())))
            elif LIST_ITEM.match(line):
                flush_prose()
                paragraph[0] = "item"
                prose.append(LIST_ITEM.sub("", line, count=1))
            elif line.strip():
                if paragraph[0] == "item" and not line[:1].isspace():
                    flush_prose()  # an item goes on only on indented lines
                prose.append(line)
            else:
                flush_prose()
        elif role == "open":
            flush_prose()
            code[:] = [line.strip()]
        elif role == "code":
            code.append(line)
        else:
            code.append(line.strip())
            blocks.append(("code", "\n".join(code)))
            code.clear()
    flush_prose()
    return blocks


def quoted_words(text: str) -> str:
    """A text's words as a unit quotes them (markdown links as their text), one space apart:
    what a unit's sentence and the sentence index's sentence that holds it have in common."""
    return " ".join(MARKDOWN_LINK.sub(r"\1", text).split())


@lru_cache(maxsize=16384)
def units_of(text: str) -> tuple[Unit, ...]:
    """The units of a passage that could answer (module docstring, point 1), each with the
    definition line it explains: the last one before it in the passage."""
    units: list[Unit] = []
    blocks = blocks_of(text)
    signature = ""
    for index, (kind, body) in enumerate(blocks):
        if kind == "signature":
            signature = body
        if kind not in ("prose", "item", "row"):
            continue
        # A table row is one unit; it may start with a name in lower case ("defaultdict | dict
        # subclass that calls a factory function to supply missing values").
        sentences = [body] if kind == "row" else split_sentences(body)
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        for number, sentence in enumerate(sentences):
            before = MARKDOWN_LINK.sub(r"\1", sentences[number - 1]) if number else ""
            if not MIN_SENTENCE_WORDS <= len(sentence.split()) <= MAX_SENTENCE_WORDS:
                continue
            # An item may start with a name in lower case ("monotonic: time.monotonic()").
            cut = kind == "prose" or (kind == "item" and number > 0)
            if is_boilerplate(sentence, cut=cut) or PROMPT in sentence:
                continue
            quoted = MARKDOWN_LINK.sub(r"\1", sentence)
            code_after = (
                following[1]
                if number == len(sentences) - 1
                and following is not None
                and following[0] == "code"
                and following[1].count("\n") - 1 <= MAX_CODE_LINES
                else None
            )
            lead_in = quoted.rstrip().endswith(":")
            if code_after is not None and (lead_in or ANNOUNCES_CODE.search(quoted)):
                units.append(Unit(quoted, code_after, before, signature))
            elif not lead_in:  # a lead-in with nothing after it in the passage is no unit
                units.append(Unit(quoted, before=before, signature=signature))
    return tuple(units)
