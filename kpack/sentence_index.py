"""The sentence index: every passage's sentences embedded apart, so that vector search can
rank a passage by its best sentence as well as by its whole text (retrieval.candidates).

Why: all-MiniLM-L6-v2 reads a passage of up to 256 word pieces as one average, so a question
written about one of its sentences ("which year did ...", "return the largest item") is only
moderately close to the passage that holds the answer. Scoring a document by its best passage
beside the whole document is the classic remedy (Callan, SIGIR 1994; "MaxP", Dai & Callan,
SIGIR 2019); here the document is a passage and its parts are its sentences.

A sentence is embedded as a passage is, under its heading path (kpack.contracts.passage_text),
so "It returns None." still says what it is about; a piece of fewer than
``SENTENCE_MIN_WORDS`` words ("See also:", a two-word label) is not one. The
texts join the pack's other texts in the embedding step (kpack.ingest.vectors), keyed and
cached by content hash like them, so a rebuild embeds only new sentences.

The index is two files (kpack.index_files): ``sentence_vectors.npy``, float16 unit vectors
grouped by chunk row (chunk id order), and ``sentence_offsets.npy``, where each chunk row's
sentences start. float16 because a sentence's similarity only reorders passages vector search
already found (an error of about 1e-3 in a cosine does not move them) and the sentences are
about five times as many as the passages: half the disk and page cache of float32.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kpack.contracts import content_hash, passage_text
from kpack.errors import PackError
from kpack.index_files import SENTENCE_OFFSETS, SENTENCE_VECTORS
from kpack.mapped_tables import load_array
from kpack.text import split_sentences, words

# Shorter pieces are not embedded: a label ("See also:") says too little alone.
SENTENCE_MIN_WORDS = 3


def passage_sentences(content: str) -> list[str]:
    """The sentences of a passage that are embedded apart (kpack.text.split_sentences; a code
    block is one), in order."""
    return [
        sentence
        for sentence in (s.strip() for s in split_sentences(content))
        if len(words(sentence)) >= SENTENCE_MIN_WORDS
    ]


def sentence_texts_of(heading_path: str, content: str) -> list[str]:
    """The texts the model embeds for a passage's sentences: each under its heading path."""
    return [passage_text(heading_path, sentence) for sentence in passage_sentences(content)]


def _passages(sections: pa.Table, chunks: pa.Table) -> Iterable[tuple[str, str, str]]:
    """(chunk id, heading path, content) of every chunk, in the order of ``chunks``."""
    heading_of = dict(
        zip(sections["section_id"].to_pylist(), sections["heading_path"].to_pylist(), strict=True)
    )
    for row in chunks.select(["chunk_id", "section_id", "content"]).to_pylist():
        yield row["chunk_id"], heading_of.get(row["section_id"]) or "", row["content"] or ""


def sentence_texts(sections: pa.Table, chunks: pa.Table) -> dict[str, str]:
    """content_hash -> text of every passage's sentences (a sentence met in several passages
    under one heading path is one text)."""
    texts: dict[str, str] = {}
    for _, heading_path, content in _passages(sections, chunks):
        for text in sentence_texts_of(heading_path, content):
            texts.setdefault(content_hash(text), text)
    return texts


def sentence_hashes(sections: pa.Table, chunks: pa.Table) -> dict[str, list[str]]:
    """chunk id -> the content hashes of its sentences' texts, in order."""
    return {
        chunk: [content_hash(text) for text in sentence_texts_of(heading_path, content)]
        for chunk, heading_path, content in _passages(sections, chunks)
    }


def write_sentence_index(
    out: Path,
    chunk_ids: Iterable[str],
    sentences: Mapping[str, list[str]],
    vectors: pa.Table,
    dim: int,
) -> bool:
    """Write the sentence index of the chunks ``chunk_ids`` (in chunk id order, as the chunk
    vectors are), whose sentences' hashes ``sentences`` gives (:func:`sentence_hashes`), into
    ``out`` from ``vectors`` (content_hash, embedding); False, writing nothing, when
    ``vectors`` lacks any of them (a pack built with ``sentence_vectors: none``)."""
    hashes: list[str] = []
    offsets = [0]
    for chunk in chunk_ids:
        hashes.extend(sentences[chunk])
        offsets.append(len(hashes))
    rows = pc.index_in(pa.array(hashes, pa.string()), value_set=vectors["content_hash"])
    if rows.null_count:
        return False
    flat = pc.list_flatten(vectors["embedding"].take(rows)).to_numpy(zero_copy_only=False)
    np.save(out / SENTENCE_VECTORS, np.asarray(flat, dtype=np.float16).reshape(len(hashes), dim))
    np.save(out / SENTENCE_OFFSETS, np.asarray(offsets, dtype=np.int64))
    return True


@dataclass(frozen=True)
class SentenceIndex:
    """A version's sentence index, mapped (kpack.mapped_tables.load_array)."""

    vectors: np.ndarray  # (sentences, dim) float16
    offsets: np.ndarray  # (chunks + 1,) int64: chunk row r's sentences are offsets[r]:offsets[r+1]

    @classmethod
    def load(cls, folder: Path, chunks: int) -> SentenceIndex | None:
        """The index in a version's index folder, None when it has none; a PackError when its
        two files do not agree with each other or with the version's ``chunks``."""
        if not (folder / SENTENCE_OFFSETS).is_file():
            return None
        index = cls(load_array(folder, SENTENCE_VECTORS), load_array(folder, SENTENCE_OFFSETS))
        if len(index.offsets) != chunks + 1 or int(index.offsets[-1]) != len(index.vectors):
            raise PackError(
                f"{folder}: the sentence index is damaged ({len(index.vectors)} vectors and "
                f"{len(index.offsets)} offsets for {chunks} passages); rebuild the pack"
            )
        return index

    def similarities(self, row: int, question: np.ndarray) -> np.ndarray:
        """The cosine similarity of each sentence of chunk row ``row`` (in the order of
        :func:`passage_sentences`) with the unit ``question`` vector."""
        sentences = self.vectors[self.offsets[row] : self.offsets[row + 1]]
        return sentences.astype(np.float32) @ question.astype(np.float32)

    def best_similarity(self, rows: np.ndarray, question: np.ndarray) -> np.ndarray:
        """For each chunk row of ``rows``, the cosine similarity of its best sentence with the
        unit ``question`` vector; NaN for a passage without sentences. Reads those rows'
        sentences only, so it costs the same in a pack of any size."""
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        best = np.full(len(rows), np.nan, dtype=np.float32)
        counts = ends - starts
        has = counts > 0
        if not has.any():
            return best
        # Every wanted sentence at once, then each passage's best (reduceat over its run).
        wanted = np.concatenate(
            [np.arange(start, end) for start, end in zip(starts[has], ends[has], strict=True)]
        )
        similarity = self.vectors[wanted].astype(np.float32) @ question.astype(np.float32)
        firsts = np.concatenate([[0], np.cumsum(counts[has])[:-1]])
        best[has] = np.maximum.reduceat(similarity, firsts)
        return best
