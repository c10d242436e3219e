"""A passage read with what its section holds around it that its units need.

Chunking cuts a long section into overlapping passages, and the cut often falls inside what a
sentence leans on: the definition line and opening of the entry a passage's first sentences
explain, the code block its last lead-in introduces, the release notes that close an entry
passages later. :func:`passage_in_context` takes them back from the passages next to it in
its section, so the offline answer still quotes only the pack's text. (The stitching runs per
query over the reader's passage texts; doing it once at build time would need a new column of
the chunk table, so it stays here until that column exists.)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from kpack.contracts import chunk_id
from kpack.text import FENCE, fence_roles
from retrieval.answer_units import MAX_CODE_LINES, VERSION_NOTE, blocks_of
from retrieval.key_items import is_signature

# A passage that begins inside an entry is read with the entry's opening: its definition line
# and at most this many lines of prose after it, where reference documentation says what the
# definition does (its first sentences); the rest of the entry is details. Sphinx entries open
# with one to three such lines; 4 keeps the opening and stops before the details.
ENTRY_OPENING_LINES = 4


def passage_in_context(
    chunk: str,
    text: str,
    chunk_text: Mapping[str, str],
    code_starts: dict[str, bool] | None = None,
    release_notes: bool = False,
) -> str:
    """The text of passage ``chunk`` with what its section holds around it that its units
    need (module docstring, point 1): the opening of the entry its first units explain (its
    definition line and what the entry first says of it), when the passage begins after it (a
    long entry is cut into several passages), and the code block
    its last lead-in introduces, when the passage ends before it; a code block it begins
    inside of is left out. With ``release_notes`` (for a question that asks when or since
    which version), also the release notes of the entry the passage ends inside, which a
    long entry writes at its end, passages later (:func:`_release_notes_after`). All of it
    comes from the passages next to it in its section (``chunk_text``: passage id to text),
    so the answer still quotes only the pack's text. ``code_starts`` keeps what is learnt of
    which passages begin inside a code block (retrieval.synthesis keeps one per version:
    ``reader.memo(code_starts)``)."""
    section, _, number = chunk.rpartition("-")
    if not number.isdigit():
        return text
    index = int(number)
    # Every passage before it in its section, nearest first, read only until the entry's
    # definition line: a long entry runs over several passages.
    earlier = (chunk_text.get(chunk_id(section, index - n), "") for n in range(1, index + 1))
    if _opens_inside_code(section, index, chunk_text, {} if code_starts is None else code_starts):
        text = _without_code_head(text)
    definition = _entry_opening(text, earlier)
    code = _code_after(text, chunk_text.get(chunk_id(section, index + 1), ""))
    # The opening is a paragraph of its own: the passage may begin inside a sentence whose
    # start the opening's lines stop before, and that tail is no sentence to quote.
    read = "\n".join(part for part in (f"{definition}\n" if definition else "", text, code) if part)
    notes = _release_notes_after(text, section, index, chunk_text) if release_notes else ""
    if notes and (definition or any(kind == "signature" for kind, _ in blocks_of(text))):
        # A blank line before the notes: they are paragraphs of their own, not the tail of
        # the passage's last one.
        return f"{read}\n\n{notes}"
    return read


def _release_notes_after(text: str, section: str, index: int, chunk_text: Mapping[str, str]) -> str:
    """The release notes ("New in version 3.11.", "Changed in version 3.10: Added the strict
    argument.") that the passages after passage ``index`` hold before the next definition
    line: those of the entry the passage ends inside, however many passages it runs over
    (reading stops at the next definition line or the section's end)."""
    notes: list[str] = []
    current = text
    for number in itertools.count(index + 1):
        following = chunk_text.get(chunk_id(section, number), "")
        if not following:
            break
        for line in _continuation(current, following).split("\n"):
            if is_signature(line):
                return "\n\n".join(notes)
            if VERSION_NOTE.match(line.strip()):
                notes.append(line.strip())
        current = following
    return "\n\n".join(notes)


def _overlap_start(text: str, previous: str) -> int:
    """Where the passage begins in the passage before it (they overlap): the first line from
    which the rest of that passage is how this one begins, else where its first line last
    stands there (a fence line "```" stands at both ends of a block, so the first rule goes
    first), or the end of that passage when they do not overlap."""
    starts = [0, *(i + 1 for i, char in enumerate(previous) if char == "\n")]
    shared = next(
        (at for at in starts if at < len(previous) and text.startswith(previous[at:])), None
    )
    if shared is not None:
        return shared
    opening = next((line for line in text.split("\n") if line.strip()), "")
    at = previous.rfind(opening) if opening else -1
    return at if at >= 0 else len(previous)


def _opens_inside_code(
    section: str, index: int, chunk_text: Mapping[str, str], known: dict[str, bool]
) -> bool:
    """True when passage ``index`` of a section begins inside a code block an earlier passage
    opened: whether a fence line opens or closes a block depends on all the section before
    it, so the state is carried through the section's passages from the nearest one whose
    state is ``known`` (the first begins outside any block), and learnt on the way."""
    start = index
    while start > 0 and chunk_id(section, start) not in known:
        start -= 1
    inside = known.get(chunk_id(section, start), False)
    previous = chunk_text.get(chunk_id(section, start), "")
    for number in range(start + 1, index + 1):
        current = chunk_text.get(chunk_id(section, number), "")
        head = previous[: _overlap_start(current, previous)].split("\n")
        roles = [role for _, role in fence_roles(["```", *head] if inside else head)]
        inside = bool(roles) and roles[-1] in ("open", "code")
        known[chunk_id(section, number)] = inside
        previous = current
    return inside


def _without_code_head(text: str) -> str:
    """The passage without the end of a code block it begins in (up to its closing fence)."""
    lines = text.split("\n")
    close = next((i for i, line in enumerate(lines) if FENCE.match(line)), len(lines) - 1)
    return "\n".join(lines[close + 1 :])


def _entry_opening(text: str, earlier: Iterable[str]) -> str:
    """The opening of the entry the passage begins inside (``ENTRY_OPENING_LINES``): the last
    definition line before the passage in the passages before it (nearest first) and the
    lines of prose after it, up to the first code block, when the passage's first sentences
    come before any definition line of its own."""
    first = next((kind for kind, _ in blocks_of(text) if kind != "code"), None)
    if first != "prose":
        return ""
    current = text
    heads: list[str] = []
    for previous in earlier:
        start = _overlap_start(current, previous)
        # Passages that do not overlap meet at a line's end.
        head = previous[:start] if start < len(previous) else f"{previous}\n"
        lines = head.split("\n")
        at = next((i for i in reversed(range(len(lines))) if is_signature(lines[i])), None)
        if at is not None:
            # Each head runs up to where the next passage begins, often inside a line: the
            # heads joined as they are give back the page's lines.
            entry = ("\n".join(lines[at:]) + "".join(reversed(heads))).split("\n")
            prose = next(
                (i for i, line in enumerate(entry[1:], 1) if FENCE.match(line)), len(entry)
            )
            return "\n".join(entry[: min(prose, 1 + ENTRY_OPENING_LINES)]).strip()
        heads.append(head)
        current = previous
    return ""


def _code_after(text: str, following: str) -> str:
    """The rest of the code block the passage's end needs from the next passage: the lines
    up to its closing fence when the passage ends inside a block, or the block that follows
    when it ends with prose (a lead-in); "" otherwise, or when the block would be longer than
    ``MAX_CODE_LINES``."""
    roles = [role for _, role in fence_roles(text.split("\n"))]
    inside = bool(roles) and roles[-1] in ("open", "code")
    last = next((line for line in reversed(text.split("\n")) if line.strip()), "")
    rest = _continuation(text, following).split("\n")
    while rest and not rest[0].strip():
        rest = rest[1:]
    if not rest or not (inside or (last and not FENCE.match(last) and FENCE.match(rest[0]))):
        return ""
    block: list[str] = []
    for line, role in fence_roles(["```", *rest] if inside else rest):
        block.append(line)
        if role == "close":
            break
    closed = len(block) >= 2 and FENCE.match(block[-1])
    if not closed or len(block) - 2 > MAX_CODE_LINES:
        return ""
    return "\n".join(block[1:] if inside else block)


def _continuation(text: str, following: str) -> str:
    """The next passage without the lines it repeats from the end of this one (passages
    overlap by whole lines, or by the last words of one)."""
    ends = [i for i, char in enumerate(following) if char == "\n"] + [len(following)]
    repeated = max((end for end in ends if text.endswith(following[:end])), default=0)
    return following[repeated:]
