"""Sections cut into overlapping passages that the embedding model reads whole.

Sizes are the embedding model's own word pieces (kpack.ingest.word_pieces), counted over the
text the model embeds: the heading path and the body (kpack.contracts.passage_text). A
passage holds at most ``chunk_tokens`` pieces and never more than the model reads, so no part
of a chunk is cut off before its vector is computed.

A section that fits is one chunk (the same text as the section, so it is embedded once).
Longer ones are packed greedily from sentences and code lines, each chunk starting with the
last ``chunk_overlap_tokens`` pieces of the previous one so no statement is cut off from its
context. Word pieces add up across whitespace (the tokenizer splits there first), so a
chunk's size is the sum of its units' sizes.
"""

from __future__ import annotations

from collections.abc import Iterable

from kpack.contracts import chunk_id, content_hash, passage_text
from kpack.ingest.word_pieces import PieceCounter
from kpack.text import fence_roles, split_sentences

# A body always gets at least this many pieces, even under a heading path that takes the
# rest of what the model reads (the path is then what gets cut, not the body).
MIN_BODY_PIECES = 32


def _split_long(unit: str, size: int, budget: int, counter: PieceCounter) -> list[str]:
    """A unit longer than the budget cut at word boundaries into parts that fit."""
    if size <= budget:
        return [unit]
    words = unit.split()
    parts: list[str] = []
    current: list[str] = []
    used = 0
    for word, pieces in zip(words, counter.count(words), strict=True):
        if current and used + pieces > budget:
            parts.append(" ".join(current))
            current, used = [], 0
        current.append(word)
        used += pieces
    if current:
        parts.append(" ".join(current))
    return parts


def _units(content: str, budget: int, counter: PieceCounter) -> list[tuple[str, int]]:
    """Sentences of prose and lines of code (fences included) with their sizes in pieces,
    none larger than the budget."""
    raw: list[str] = []
    for line, role in fence_roles(content.split("\n")):
        if role != "text":
            raw.append(line)
        else:
            raw.extend(split_sentences(line))
    raw = [u for u in raw if u.strip()]
    units: list[tuple[str, int]] = []
    for unit, size in zip(raw, counter.count(raw), strict=True):
        for part in _split_long(unit, size, budget, counter):
            units.append((part, size if part is unit else counter.count_one(part)))
    return units


def _overlap(
    units: list[tuple[str, int]], overlap: int, counter: PieceCounter
) -> list[tuple[str, int]]:
    """The tail of a chunk that the next one repeats: whole units that fit in the overlap, or
    the last words of the last unit when even that one is longer."""
    carry: list[tuple[str, int]] = []
    carried = 0
    for unit in reversed(units):
        carried += unit[1]
        if carried > overlap:
            break
        carry.insert(0, unit)
    if carry or not units:
        return carry
    words = units[-1][0].split()
    tail: list[str] = []
    used = 0
    for word, pieces in zip(reversed(words), reversed(counter.count(words)), strict=True):
        if used + pieces > overlap:
            break
        tail.insert(0, word)
        used += pieces
    return [(" ".join(tail), used)] if tail else []


def body_budget(heading_path: str, chunk_tokens: int, counter: PieceCounter) -> int:
    """Pieces left for a chunk's body under its heading path."""
    passage = min(chunk_tokens, counter.reads)
    return max(MIN_BODY_PIECES, passage - counter.count_one(heading_path))


def split_into_chunks(content: str, budget: int, overlap: int, counter: PieceCounter) -> list[str]:
    """``content`` as chunks of at most ``budget`` pieces, adjacent ones sharing about
    ``overlap`` pieces of whole units."""
    units = _units(content, budget, counter)
    if sum(size for _, size in units) <= budget:
        return [content]
    chunks: list[str] = []
    current: list[tuple[str, int]] = []
    used = 0
    for unit in units:
        if current and used + unit[1] > budget:
            chunks.append("\n".join(u for u, _ in current))
            current = _overlap(current, overlap, counter)
            used = sum(size for _, size in current)
            if used + unit[1] > budget:  # no room for an overlap before this unit
                current, used = [], 0
        current.append(unit)
        used += unit[1]
    if current:
        chunks.append("\n".join(u for u, _ in current))
    return chunks


def chunk_rows(
    sections: Iterable[dict], chunk_tokens: int, overlap_tokens: int, counter: PieceCounter
) -> list[dict]:
    """The rows of the chunks table for rows of the sections table."""
    rows = []
    for section in sections:
        heading_path = section["heading_path"]
        budget = body_budget(heading_path, chunk_tokens, counter)
        pieces = split_into_chunks(section["content"], budget, overlap_tokens, counter)
        texts = [passage_text(heading_path, piece) for piece in pieces]
        for index, (piece, text, size) in enumerate(
            zip(pieces, texts, counter.count(texts), strict=True)
        ):
            rows.append(
                {
                    "chunk_id": chunk_id(section["section_id"], index),
                    "article_url": section["article_url"],
                    "article_title": section["article_title"],
                    "section_id": section["section_id"],
                    "section_index": section["section_index"],
                    "chunk_index": index,
                    "content": piece,
                    "word_pieces": size,
                    "content_hash": content_hash(text),
                }
            )
    return rows
