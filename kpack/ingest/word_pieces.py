"""What the embedding model reads: its own word pieces, counted with its own tokenizer.

A passage is embedded as its heading path and its body (kpack.contracts.passage_text), and the
model reads at most ``max_seq_length`` word pieces of it, two of them its special tokens
([CLS] and [SEP] for BERT models); the rest is cut off before the model sees it. Chunks are
sized in these pieces (kpack.ingest.chunking) so that nothing a chunk holds is invisible to
dense search: code and identifiers cost several pieces a word, so a count of words misjudges
them (a 192-word chunk of the Python docs ran to 1,122 pieces).

The tokenizer is the model's ``tokenizer.json`` (the fast tokenizers library, already a
dependency of the query encoder); a model without one, such as a name that was never
downloaded, is counted by words at the ratio English prose shows (:data:`WORDS_PER_PIECE`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kpack.embedding import resolve_model_path

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
MODEL_CONFIG_FILE = "sentence_bert_config.json"
# Word pieces a model reads when its folder does not say (BERT's sentence-transformers default).
DEFAULT_MAX_PIECES = 256
# The pieces a BERT encoding adds around a text: [CLS] and [SEP].
SPECIAL_PIECES = 2
# English prose runs at about 0.75 words per word piece; used only without a tokenizer.
WORDS_PER_PIECE = 0.75


def estimate_tokens(text: str) -> int:
    """A text's tokens as a budget counts them (retrieval.results.within_budget: the context
    an agent asks for), estimated from its words at :data:`WORDS_PER_PIECE`, with no tokenizer
    to load."""
    return round(len(text.split()) / WORDS_PER_PIECE)


@dataclass(frozen=True)
class PieceCounter:
    """Counts the word pieces of texts as one embedding model reads them."""

    model: str
    reads: int  # pieces of text the model reads, its special tokens left out
    tokenizer: Any | None  # tokenizers.Tokenizer, or None: counted by words

    def count(self, texts: Sequence[str]) -> list[int]:
        """Pieces of each text, without the special tokens (so counts of parts add up)."""
        if not texts:
            return []
        if self.tokenizer is None:
            return [round(len(t.split()) / WORDS_PER_PIECE) for t in texts]
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]

    def count_one(self, text: str) -> int:
        return self.count([text])[0]


def _model_folder(model: str) -> Path | None:
    path = Path(resolve_model_path(model))
    if path.is_dir():
        return path
    try:  # a hub name: its files are in the local cache if it was ever downloaded
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:
        return None


def _max_pieces(folder: Path) -> int:
    try:
        return int(json.loads((folder / MODEL_CONFIG_FILE).read_text())["max_seq_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_MAX_PIECES


@lru_cache(maxsize=4)
def piece_counter(model: str) -> PieceCounter:
    """The counter of ``model`` (a kg_config ``embedding_model``), loaded once per process."""
    folder = _model_folder(model)
    if folder is None or not (folder / TOKENIZER_FILE).is_file():
        log.warning(
            "no tokenizer.json for embedding model %r: chunk sizes are estimated from words",
            model,
        )
        return PieceCounter(model, DEFAULT_MAX_PIECES - SPECIAL_PIECES, None)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    tokenizer.no_truncation()  # counting: every piece, not the ones the model keeps
    tokenizer.no_padding()
    return PieceCounter(model, _max_pieces(folder) - SPECIAL_PIECES, tokenizer)
