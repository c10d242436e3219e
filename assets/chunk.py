"""Stage 3, chunks: sections cut into overlapping passages of about ``chunk_tokens`` tokens.

A section that fits is one chunk (the same text as the section, so it is embedded once).
Longer ones are packed greedily from sentences and code lines, each chunk starting with the
last ``chunk_overlap_tokens`` of the previous one so no statement is cut off from its context.
Tokens are estimated as words / 0.75, close to WordPiece counts for English prose.
"""

import re
import time

import pyarrow as pa
from dagster import AssetExecutionContext, Output, asset

from assets.partitions import follow_upstream, packs_partitions
from kpack.contracts import content_hash, passage_text
from resources.pack_store import PackStore

WORDS_PER_TOKEN = 0.75
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\"'(\[])")


def estimate_tokens(text: str) -> int:
    return round(len(text.split()) / WORDS_PER_TOKEN)


def _units(content: str, max_words: int) -> list[str]:
    """Sentences of prose and lines of code, none longer than max_words."""
    units: list[str] = []
    in_code = False
    for line in content.split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or line.startswith("```"):
            units.append(line)
            continue
        for sentence in SENTENCE_END.split(line):
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


@asset(
    partitions_def=packs_partitions,
    group_name="parse",
    automation_condition=follow_upstream,
    description="Sections split into overlapping passages for retrieval.",
)
def chunks(
    context: AssetExecutionContext, sections: pa.Table, pack_store: PackStore
) -> Output[list[dict]]:
    started = time.perf_counter()
    config = pack_store.config(context.partition_key)
    rows = []
    for section in sections.to_pylist():
        pieces = split_into_chunks(
            section["content"], config.chunk_tokens, config.chunk_overlap_tokens
        )
        for index, piece in enumerate(pieces):
            rows.append(
                {
                    "chunk_id": f"{section['section_id']}-{index:03d}",
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
    split = sum(1 for r in rows if r["chunk_index"] == 1)
    return Output(
        rows,
        metadata={
            "chunks": len(rows),
            "sections_split": split,
            "max_tokens": max((r["token_estimate"] for r in rows), default=0),
            "duration_s": round(time.perf_counter() - started, 3),
        },
    )
