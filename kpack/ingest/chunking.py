"""Sections cut into overlapping passages of about ``chunk_tokens`` tokens.

A section that fits is one chunk (the same text as the section, so it is embedded once).
Longer ones are packed greedily from sentences and code lines, each chunk starting with the
last ``chunk_overlap_tokens`` of the previous one so no statement is cut off from its context.
Tokens are estimated as words / 0.75, close to WordPiece counts for English prose.
"""

from __future__ import annotations

from collections.abc import Iterable

from kpack.contracts import chunk_id, content_hash, passage_text
from kpack.text import fence_roles, split_sentences

WORDS_PER_TOKEN = 0.75


def estimate_tokens(text: str) -> int:
    return round(len(text.split()) / WORDS_PER_TOKEN)


def _units(content: str, max_words: int) -> list[str]:
    """Sentences of prose and lines of code (fences included), none longer than max_words."""
    units: list[str] = []
    for line, role in fence_roles(content.split("\n")):
        if role != "text":
            units.append(line)
            continue
        for sentence in split_sentences(line):
            words = sentence.split()
            for start in range(0, len(words), max_words):
                units.append(" ".join(words[start : start + max_words]))
    return [u for u in units if u.strip()]


def _overlap(units: list[str], overlap_words: int) -> list[str]:
    """The tail of a chunk that the next one repeats: whole units, or the last words of one."""
    carry: list[str] = []
    carried = 0
    for previous in reversed(units):
        carried += len(previous.split())
        if carried > overlap_words:
            break
        carry.insert(0, previous)
    if not carry and overlap_words:
        carry = [" ".join(units[-1].split()[-overlap_words:])]
    return carry


def split_into_chunks(content: str, chunk_tokens: int, overlap_tokens: int) -> list[str]:
    max_words = max(1, int(chunk_tokens * WORDS_PER_TOKEN))
    overlap_words = int(overlap_tokens * WORDS_PER_TOKEN)
    if len(content.split()) <= max_words:
        return [content]
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for unit in _units(content, max_words):
        words = len(unit.split())
        if current and size + words > max_words:
            chunks.append("\n".join(current))
            current = _overlap(current, overlap_words)
            size = sum(len(u.split()) for u in current)
            if size + words > max_words:  # no room for an overlap before this unit
                current, size = [], 0
        current.append(unit)
        size += words
    if current:
        chunks.append("\n".join(current))
    return chunks


def chunk_rows(sections: Iterable[dict], chunk_tokens: int, overlap_tokens: int) -> list[dict]:
    """The rows of the chunks table for rows of the sections table."""
    rows = []
    for section in sections:
        pieces = split_into_chunks(section["content"], chunk_tokens, overlap_tokens)
        for index, piece in enumerate(pieces):
            rows.append(
                {
                    "chunk_id": chunk_id(section["section_id"], index),
                    "article_url": section["article_url"],
                    "article_title": section["article_title"],
                    "section_id": section["section_id"],
                    "section_index": section["section_index"],
                    "chunk_index": index,
                    "content": piece,
                    "token_estimate": estimate_tokens(piece),
                    "content_hash": content_hash(passage_text(section["heading_path"], piece)),
                }
            )
    return rows
