"""Which embedder a build uses: a model in a precision (kpack.embedding, kpack.quantized),
loaded once per process."""

from __future__ import annotations

import threading

from kpack.embedding import (
    PRECISIONS,
    Embedder,
    SentenceTransformerEmbedder,
    batch_size_for,
    embedding_device,
    load_model,
    model_label,
    requested_device,
)
from kpack.errors import PackError
from kpack.quantized import QuantizedEmbedder

_embedders: dict[tuple[str, str, str | None], Embedder] = {}
_embedders_lock = threading.Lock()


def embedder_for(name: str, precision: str = "fp32") -> Embedder:
    """The embedder of a model in a precision, loaded once per process."""
    if precision not in PRECISIONS:
        raise PackError(
            f"embedding precision must be one of {', '.join(PRECISIONS)}: {precision!r}"
        )
    # KPACK_EMBED_DEVICE is part of the key, so a process sees a change of it (and a
    # malformed value is reported on every call, not only the first).
    key = (model_label(name), precision, requested_device())
    with _embedders_lock:
        known = _embedders.get(key)
    if known is not None:
        return known
    if precision == "int8":
        made: Embedder = QuantizedEmbedder.load(name)
    else:
        device = embedding_device()
        made = SentenceTransformerEmbedder(
            key[0], load_model(name, device), device, batch_size_for(device)
        )
    with _embedders_lock:
        return _embedders.setdefault(key, made)
