"""Embedding questions at query time, without loading torch when the model allows it.

A question is embedded by the model its pack version was built with. Loading that model
through sentence-transformers costs seconds (torch, transformers, scikit-learn are imported
for it) on every cold start, while running it for one question takes milliseconds. So when
the model is a BERT sentence-transformer stored locally in the usual layout (the packaged
all-MiniLM-L6-v2 is: a BERT encoder, mean pooling, normalisation), the question is embedded
by :class:`NumpyBert`, the same arithmetic in numpy over the same weights and tokenizer. Its
vectors agree with sentence-transformers' (the build's) to 2.1e-7 per component at most:
measured over 343 texts (the demo pack's 38 eval questions, 300 of its passages and
tests/test_retrieval.py's five edge cases, one text at a time as queries embed them, and in
batches of 32), median 1e-7, every cosine with the build's vector 0.9999999 or more.
tests/test_retrieval.py holds them within 5e-7, leaving room for another CPU's BLAS. Any
other model goes through kpack.embedding, as the build does.

BLAS runs with the reader's thread budget: on a shared machine, one OpenBLAS thread embedded a
question in 0.07 s where two took 0.4 to 2.6 s (threads spinning for cores other processes
held).
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np

SUPPORTED_MODULES = [
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
]


class TextEncoder(Protocol):
    def encode(self, texts: list[str], threads: int) -> np.ndarray: ...


# Abramowitz & Stegun 7.1.26: erf(x) = 1 - t * polynomial(t) * exp(-x*x), t = 1 / (1 + p*x).
_ERF_P = 0.3275911
_ERF_COEFFICIENTS = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to an absolute error below 1.5e-7 (5.5e-7 in float32; numpy has no erf), in the
    input's float32: GELU's erf is most of the elementwise work of a forward pass.

    Not scipy.special.erf, although scipy is a dependency: on float32 it is 3.0 times slower
    on one question's GELU input (1536 x 12: 0.50 ms against 0.17), which made a question's
    whole embedding about 6% slower (200 encodes of the demo pack's
    questions, 12 alternating rounds on a loaded 2-core machine: best round 17.3 ms against
    16.4 ms, median ratio 1.07), for vectors no closer to the build's (both 2.1e-7 at most);
    importing scipy.special also costs 0.4 s in a fresh process."""
    z = np.abs(x)
    t = 1.0 / (1.0 + np.float32(_ERF_P) * z)
    polynomial = np.float32(_ERF_COEFFICIENTS[-1])
    for coefficient in reversed(_ERF_COEFFICIENTS[:-1]):  # Horner's scheme
        polynomial = polynomial * t + np.float32(coefficient)
    return np.copysign(1.0 - polynomial * t * np.exp(-z * z), x)


def _layer_norm(h: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the hidden axis, which is axis 0 here (see NumpyBert._forward)."""
    share = 1.0 / h.shape[0]  # sums times this, not .mean(): its Python overhead showed
    centred = h - h.sum(0) * share
    variance = (centred * centred).sum(0) * share
    return centred * (1.0 / np.sqrt(variance + eps)) * weight[:, None] + bias[:, None]


def blas_limit(threads: int) -> Any:
    """A context that runs BLAS with at most ``threads`` threads."""
    global _controller
    from threadpoolctl import ThreadpoolController

    with _controller_lock:
        if _controller is None:
            _controller = ThreadpoolController()
    return _controller.limit(limits=threads, user_api="blas")


_controller: Any = None
_controller_lock = threading.Lock()


class NumpyBert:
    """A BERT sentence-transformer (mean pooling, unit vectors) evaluated with numpy."""

    def __init__(self, folder: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.config = json.loads((folder / "config.json").read_text())
        max_length = json.loads((folder / "sentence_bert_config.json").read_text())[
            "max_seq_length"
        ]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding(pad_id=self.config.get("pad_token_id", 0))
        self.weights = {
            name.removeprefix("bert."): value
            for name, value in load_file(str(folder / "model.safetensors")).items()
        }

    @classmethod
    def load(cls, folder: Path) -> NumpyBert | None:
        """The encoder for a model folder, or None when the model is not of this form."""
        try:
            config = json.loads((folder / "config.json").read_text())
            modules = json.loads((folder / "modules.json").read_text())
            pooling_dir = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
            pooling = json.loads((folder / pooling_dir / "config.json").read_text())
        except (OSError, ValueError, KeyError, StopIteration):
            return None
        supported = (
            config.get("model_type") == "bert"
            and config.get("hidden_act") == "gelu"
            and config.get("position_embedding_type", "absolute") == "absolute"
            and [m["type"] for m in modules] in (SUPPORTED_MODULES, SUPPORTED_MODULES[:2])
            and pooling.get("pooling_mode_mean_tokens") is True
            and not any(
                v
                for k, v in pooling.items()
                if k.startswith("pooling_mode_") and "mean_tokens" not in k
            )
            and all(
                (folder / name).is_file()
                for name in ("model.safetensors", "tokenizer.json", "sentence_bert_config.json")
            )
        )
        return cls(folder) if supported else None

    def encode(self, texts: list[str], threads: int) -> np.ndarray:
        """Unit-length float32 vectors, as sentence-transformers' encode would give."""
        if not texts:
            return np.zeros((0, self.config["hidden_size"]), dtype=np.float32)
        with blas_limit(threads):
            return self._forward(self.tokenizer.encode_batch(texts))

    def _forward(self, encodings: list) -> np.ndarray:
        """BERT over a batch, with activations hidden-major: ``h`` is (hidden, tokens of the
        batch). A question is a dozen tokens; single-threaded OpenBLAS multiplies a weight
        matrix (out, in) by that narrow (in, tokens) matrix twice as fast as the token-major
        product (tokens, in) @ (in, out), and the weights are used as stored."""
        w, config = self.weights, self.config
        ids = np.array([e.ids for e in encodings])
        types = np.array([e.type_ids for e in encodings])
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        eps, heads, hidden = (
            config["layer_norm_eps"],
            config["num_attention_heads"],
            config["hidden_size"],
        )
        size = hidden // heads
        batch, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][types]
        )
        h = np.ascontiguousarray(x.reshape(batch * length, hidden).T)
        h = _layer_norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        padding = (1.0 - mask)[:, None, None, :] * np.finfo(np.float32).min
        scale = np.float32(1.0 / math.sqrt(size))

        def linear(v: np.ndarray, prefix: str) -> np.ndarray:
            return w[prefix + ".weight"] @ v + w[prefix + ".bias"][:, None]

        def split(v: np.ndarray) -> np.ndarray:  # (hidden, tokens) -> (batch, heads, length, size)
            return v.reshape(heads, size, batch, length).transpose(2, 0, 3, 1)

        for layer in range(config["num_hidden_layers"]):
            p = f"encoder.layer.{layer}."
            query = split(linear(h, p + "attention.self.query"))
            key = split(linear(h, p + "attention.self.key"))
            value = split(linear(h, p + "attention.self.value"))
            scores = query @ key.transpose(0, 1, 3, 2) * scale + padding
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ value).transpose(1, 3, 0, 2).reshape(hidden, batch * length)
            h = _layer_norm(
                linear(context, p + "attention.output.dense") + h,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
                eps,
            )
            inner = linear(h, p + "intermediate.dense")
            inner = 0.5 * inner * (1.0 + _erf(inner * np.float32(1.0 / math.sqrt(2.0))))
            h = _layer_norm(
                linear(inner, p + "output.dense") + h,
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
                eps,
            )
        tokens = h.reshape(hidden, batch, length)
        pooled = ((tokens * mask).sum(2) / np.clip(mask.sum(1), 1e-9, None)).T
        return (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)).astype(np.float32)


class SentenceTransformerEncoder:
    """Any other model, through kpack.embedding (sentence-transformers, as the build)."""

    def __init__(self, name: str) -> None:
        from kpack.embedding import load_model

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        with warnings.catch_warnings():
            # tqdm's "IProgress not found" (a red box in Jupyter without ipywidgets) is about a
            # progress bar that loading a model does not need.
            warnings.filterwarnings("ignore", message="IProgress not found")
            self.model = load_model(name)

    def encode(self, texts: list[str], threads: int) -> np.ndarray:
        import torch

        from kpack.embedding import encode

        torch.set_num_threads(threads)
        return encode(self.model, texts)


_encoders: dict[str, TextEncoder] = {}
_encoders_lock = threading.Lock()


def encoder_for(model_name: str) -> TextEncoder:
    """The encoder of a model, made once per process."""
    with _encoders_lock:
        if model_name not in _encoders:
            from kpack.embedding import resolve_model_path

            folder = Path(resolve_model_path(model_name))
            fast = NumpyBert.load(folder) if folder.is_dir() else None
            _encoders[model_name] = fast or SentenceTransformerEncoder(model_name)
        return _encoders[model_name]
