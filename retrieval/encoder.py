"""Embedding questions at query time, without loading torch when the model allows it.

A question is embedded by the model its pack version was built with. Loading that model
through sentence-transformers costs seconds (torch, transformers, scikit-learn are imported
for it) on every cold start, while running it for one question takes milliseconds. So when
the model is a BERT sentence-transformer stored locally in the usual layout (the packaged
all-MiniLM-L6-v2 is: a BERT encoder, mean pooling, normalisation), the question is embedded
by :class:`kpack.onnx_models.OnnxBert`: the same arithmetic as an ONNX graph over the same
weights (kpack.onnx_models.bert_graph, no torch needed), which onnxruntime runs with the
model's own tokenizer. Its vectors agree with sentence-transformers' (the build's) to 2e-7 per component
at most: measured over the python_docs_qa questions one at a time and in a batch of 32, and
tests/test_retrieval.py holds them within 5e-7, leaving room for another CPU's arithmetic.
Any other model goes through kpack.embedding, as the build does.

Why onnxruntime: a question's embedding is six layers of matrix products with a dozen to a
few dozen token columns, where OpenBLAS (numpy) reaches a third of the memory bandwidth;
onnxruntime's kernels ran the same graph in 8.2 ms against 16.6 ms for the numpy forward pass
this module held before (the python_docs_qa questions, one thread). The graph is written once
per model and machine into kpack.settings.model_cache_dir() and loaded from there (0.1 s);
kpack.onnx_models says why it is not the int8 build's torch export.

BLAS (the reader's own vector products) runs with the reader's thread budget
(:func:`use_blas_threads`, set once per process): on a shared machine, one OpenBLAS thread
embedded a question in 0.07 s where two took 0.4 to 2.6 s (threads spinning for cores other
processes held). onnxruntime gets the same budget, without spinning threads.

A model that is not on this machine (and cannot be fetched: no network, or HF_HUB_OFFLINE=1)
is a :class:`kpack.errors.PackNotReady` with one line saying so, not the loader's traceback.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Protocol

import numpy as np

from kpack.errors import PackNotReady
from kpack.onnx_models import OnnxBert


class TextEncoder(Protocol):
    def encode(self, texts: list[str], threads: int) -> np.ndarray: ...


def use_blas_threads(threads: int) -> None:
    """Run BLAS with ``threads`` threads from now on, in this whole process.

    OpenBLAS keeps one thread count for the process, not one per thread, and changing it while
    other threads multiply is not safe: so it is set here, once (again only if a reader asks
    for another count, e.g. after KPACK_READER_THREADS changed), under a lock, when a reader
    opens and before an encoder first runs, never around each call. A server's worker threads
    then all run with the count set when its first reader opened.
    """
    global _blas_threads
    if _blas_threads == threads:
        return
    from threadpoolctl import threadpool_limits

    with _blas_lock:
        if _blas_threads != threads:
            threadpool_limits(limits=threads, user_api="blas")
            _blas_threads = threads


_blas_threads: int | None = None
_blas_lock = threading.Lock()


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

        if torch.get_num_threads() != threads:  # process-wide too: set once, not per call
            torch.set_num_threads(threads)
        return encode(self.model, texts)


_encoders: dict[str, TextEncoder] = {}
_encoders_lock = threading.Lock()


def encoder_for(model_name: str) -> TextEncoder:
    """The encoder of a model, made once per process; PackNotReady when it cannot be loaded."""
    with _encoders_lock:
        if model_name not in _encoders:
            from kpack.embedding import resolve_model_path

            folder = Path(resolve_model_path(model_name))
            fast = OnnxBert.load(folder) if folder.is_dir() else None
            try:
                _encoders[model_name] = fast or SentenceTransformerEncoder(model_name)
            except OSError as exc:  # what transformers raises for a model it cannot find
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
                raise PackNotReady(
                    f"the pack's embedding model {model_name!r} is not on this machine and "
                    f"cannot be downloaded ({reason}); install it, or rebuild the pack with a "
                    "model that is here"
                ) from exc
        return _encoders[model_name]
