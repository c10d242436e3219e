"""Closeness of words by meaning, from the embedding model's own word vectors.

The offline answer counts a question's term that a sentence lacks by its closest word in the
sentence ("folder" and "directory": 0.63; "folder" and "volcano": 0.07), using the input word
piece vectors of the pack's embedding model (a word is the mean of its pieces' unit vectors).
This costs a table lookup per word, where running the model over each candidate sentence
costs about 18 ms of CPU (retrieval.extractive). Only a BERT model run by the ONNX encoder
(kpack.onnx_models.OnnxBert) has its table at hand; for any other model there is none and
words count only when they are shared.
"""

from __future__ import annotations

from functools import cache, lru_cache

import numpy as np

from kpack.text import search_words, stem

# Below this cosine two words are not taken for the same meaning (measured on pairs such as
# folder/directory 0.63, column/field 0.38, fetch/download 0.27, folder/volcano 0.07).
MIN_CLOSENESS = 0.35


class WordVectors:
    """Unit vectors of words: the mean of their word pieces' input embeddings."""

    def __init__(self, table: np.ndarray, tokenizer: object) -> None:
        self.table = table / np.linalg.norm(table, axis=1, keepdims=True)
        self.tokenizer = tokenizer
        self.vector = lru_cache(maxsize=65536)(self._vector)
        # A text's words and their vectors, once per text (pack sentences repeat).
        self.words_of = lru_cache(maxsize=16384)(self._words_of)

    def terms_matrix(self, terms: tuple[str, ...]) -> np.ndarray:
        return np.stack([self.vector(t) for t in terms])

    def _vector(self, word: str) -> np.ndarray:
        ids = self.tokenizer.encode(word, add_special_tokens=False).ids  # type: ignore[attr-defined]
        mean = self.table[ids].mean(axis=0) if ids else np.zeros(self.table.shape[1])
        norm = float(np.linalg.norm(mean))
        return mean / norm if norm else mean

    def _words_of(self, text: str) -> np.ndarray | None:
        found = {stem(w): w for w in search_words(text)}
        return np.stack([self.vector(w) for w in found.values()]) if found else None

    def closeness(self, words: tuple[str, ...], text: str) -> dict[str, float]:
        """For each of the question's ``words``, how close the text's closest word comes
        (0..1), counted from MIN_CLOSENESS up; words with no close word are left out."""
        mine = self.words_of(text)
        if mine is None or not words:
            return {}
        theirs = self.terms_matrix(words)
        best = (theirs @ mine.T).max(axis=1)
        return {
            word: float((score - MIN_CLOSENESS) / (1.0 - MIN_CLOSENESS))
            for word, score in zip(words, best, strict=True)
            if score >= MIN_CLOSENESS
        }


@cache
def word_vectors_of(model_name: str) -> WordVectors | None:
    """The word vectors of a model (a reader holds them as ``reader.word_vectors``); None when
    the model is not run by the ONNX encoder. Made once per model and process: the table is
    read from the model's weights and normalised (47 MB for the packaged model), which every
    version of every pack built with the model would otherwise hold again."""
    from kpack.onnx_models import OnnxBert
    from retrieval.encoder import encoder_for

    encoder = encoder_for(model_name)
    if not isinstance(encoder, OnnxBert):
        return None
    return WordVectors(encoder.word_embeddings(), encoder.tokenizer)
