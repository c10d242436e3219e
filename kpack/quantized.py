"""The int8 embedding path: a sentence-transformers model exported to ONNX by this project's
code, its weights quantized to int8, and run by onnxruntime on the CPU.

Export (once per model and machine): ``torch.onnx.export`` of the sentence-transformers model
itself, its Transformer, Pooling and (where it has one) Normalize modules followed by the unit
length ``encode(normalize_embeddings=True)`` gives, so pooling and normalisation are
sentence-transformers' own arithmetic. The fp32 export must reproduce sentence-transformers
(cosine >= FP32_AGREEMENT on PROBE_TEXTS) before it is quantized with onnxruntime's dynamic
quantization: int8 weights per output channel, and the activations quantized at run time from
their own range. Three choices keep the int8 vectors close to fp32 (bench/RESULTS.md, issue 24):

- Full 8-bit weights where the CPU's u8 x s8 products cannot saturate (VNNI on x86, and
  non-x86 CPUs); a 7-bit range (reduce_range) only on x86 without VNNI (AVX2), which adds the
  products in 16 bits. The choice is part of the export's cache key.
- The feed-forward down-projections of the first half of the layers stay fp32
  (kept_in_fp32): their input is GELU's output, whose heavy tail costs one activation scale
  per tensor the most precision; measured one MatMul at a time, these gained the most cosine.
- One text per run: activations are quantized per input tensor, so a batch would make a
  text's vector depend on the texts padded in with it; alone, a text always gets the same
  vector. The runs go in parallel, one per core (onnxruntime sessions are thread-safe), which
  was faster than batches on the session's thread pool.

The tokenizer is the model's own (its fast tokenizer's tokenizer.json), truncating at the
model's max_seq_length.

The export is kept under kpack.settings.model_cache_dir(), in a folder named by the model, its
weights file (size and modification time) and the versions of torch, transformers,
sentence-transformers, onnx and onnxruntime and whether the CPU takes full 8-bit weights, so
an upgrade or another CPU exports again. An exclusive lock on
that folder's lock file is held while exporting: parallel shards of one build wait for one
export instead of racing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kpack.embedding import (
    DEVICE_VARIABLE,
    encode,
    load_model,
    model_label,
    requested_device,
    resolve_model_path,
)
from kpack.errors import PackError
from kpack.file_locks import locked
from kpack.onnx_models import BERT_INPUTS, bert_inputs, cpu_session, model_tokenizer, publish_folder
from kpack.settings import model_cache_dir

if TYPE_CHECKING:
    from collections.abc import Iterator

    import onnxruntime

# Bump when the export changes (graph, quantization settings), so old exports are not reused.
EXPORT_RECIPE = 2
EXPORT_PACKAGES = ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime")
MODEL_FILE = "model.int8.onnx"
TOKENIZER_FILE = "tokenizer.json"
RECORD_FILE = "export.json"
# onnxruntime's advice to run its pre-processing (shape inference for static quantization's
# calibration), logged on every dynamic quantization; nothing here to act on.
QUANTIZE_ADVICE = "Please consider to run pre-processing before quantization"
# Activation producers whose output feeds the MatMuls kept in fp32 (kept_in_fp32).
GELU_OPS = ("Gelu", "BiasGelu", "FastGelu")
FP32_AGREEMENT = 0.9999  # least cosine of the fp32 export with sentence-transformers
INT8_AGREEMENT = 0.98  # least mean cosine of int8 with fp32: below it, not the same model
PROBE_TEXTS = (
    "How do I configure the cache directory?",
    "The quick brown fox jumps over the lazy dog.",
    "Knowledge packs turn a list of URLs into a graph of articles, sections and chunks, "
    "with vectors for search and PageRank for authority.",
    # Longer than any max_seq_length: the truncation is checked too.
    " ".join(["A paragraph of documentation that goes on about parsers and exceptions."] * 60),
)


def export_key(name: str) -> str:
    """The cache folder name of a model's export: what it depends on, hashed."""
    path = Path(resolve_model_path(name))
    weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    parts = {
        "model": model_label(name),
        "path": str(path),
        "weights": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in weights],
        "versions": {package: version(package) for package in EXPORT_PACKAGES},
        "recipe": EXPORT_RECIPE,
        "full_range_weights": full_range_weights(),
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_label(name))
    return f"{readable[-60:]}-{digest}"


def full_range_weights(cpu_flags: str | None = None, machine: str | None = None) -> bool:
    """Whether this CPU's int8 products take full 8-bit weights: x86 without VNNI adds u8 x s8
    products in 16 bits, which saturate unless the weights keep to 7 bits."""
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    if cpu_flags is None:
        try:
            cpu_flags = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: assume the 16-bit adds, the safe range everywhere
            return False
    return any(flag in cpu_flags.split() for flag in ("avx512_vnni", "avx_vnni"))


def kept_in_fp32(graph: Any) -> list[str]:
    """The MatMuls left in fp32: those fed by a GELU (the feed-forward down-projections), of
    the first half of the layers (graph order is layer order)."""
    made_by_gelu = {
        output for node in graph.node if node.op_type in GELU_OPS for output in node.output
    }
    down = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[0] in made_by_gelu]
    return down[: len(down) // 2]


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An exclusive lock on ``lock_path``, waited for: one exporter per model per machine."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with locked(lock_path):
        yield


def ensure_export(name: str) -> tuple[Path, bool]:
    """The folder of the model's int8 export, exported first if this machine has none; and
    whether this call exported it."""
    root = model_cache_dir()
    folder = root / export_key(name)
    if (folder / RECORD_FILE).is_file():
        return folder, False
    with _exclusive(root / f"{folder.name}.lock"):
        if (folder / RECORD_FILE).is_file():  # another process exported it while we waited
            return folder, False
        publish_folder(folder, lambda staging: _export(name, staging))
    return folder, True


def _sentence_embedding(model: Any) -> Any:
    """The module exported: sentence-transformers' forward, then unit length."""
    import torch

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor,
        ) -> torch.Tensor:
            features = {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "token_type_ids": token_type_ids,
            }
            embedding = self.model(features)["sentence_embedding"]
            return torch.nn.functional.normalize(embedding, p=2, dim=1)

    return SentenceEmbedding().eval()


def _export(name: str, folder: Path) -> None:
    """Export, fuse, check, quantize and record the model into ``folder``."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    from sentence_transformers import SentenceTransformer

    model = load_model(name, "cpu")  # the build's fp32 model: the reference
    tokenizer = model.tokenizer
    if not getattr(tokenizer, "is_fast", False):
        raise PackError(
            f"embedding_precision int8 needs a model with a fast tokenizer; "
            f"{model_label(name)} has none: use embedding_precision fp32"
        )
    tokenizer.backend_tokenizer.save(str(folder / TOKENIZER_FILE))
    record = {
        "model": model_label(name),
        "max_seq_length": int(model.max_seq_length),
        "dimension": int(model.get_embedding_dimension()),
        "versions": {package: version(package) for package in EXPORT_PACKAGES},
        "recipe": EXPORT_RECIPE,
        "full_range_weights": full_range_weights(),
    }
    tokenizer_file = _load_tokenizer(folder, record)
    example = bert_inputs([tokenizer_file.encode(PROBE_TEXTS[0])])
    # The same weights with the attention written out as matrix products (not torch's fused
    # scaled_dot_product_attention), which onnxruntime's optimizer recognises and fuses.
    eager = SentenceTransformer(
        resolve_model_path(name), device="cpu", model_kwargs={"attn_implementation": "eager"}
    )
    exported, fused = folder / "exported.onnx", folder / "fused.onnx"
    with torch.inference_mode(), warnings.catch_warnings():
        # The tracer's warnings are about Python control flow on shapes, which the dynamic
        # axes below cover; the export is checked against sentence-transformers instead.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _sentence_embedding(eager),
            tuple(torch.from_numpy(example[n]) for n in BERT_INPUTS),
            str(exported),
            dynamo=False,
            input_names=list(BERT_INPUTS),
            output_names=["sentence_embedding"],
            dynamic_axes={
                **{n: {0: "batch", 1: "tokens"} for n in BERT_INPUTS},
                "sentence_embedding": {0: "batch"},
            },
            opset_version=17,
        )
    # Fused attention, embedding and layer norms, GELU: the quantizer then turns each
    # attention into one QAttention.
    config = eager[0].auto_model.config
    optimize_model(
        str(exported),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
    ).save_model_to_file(str(fused))
    exported.unlink()
    reference = encode(model, list(PROBE_TEXTS))
    fp32 = _Session(fused, tokenizer_file).encode(list(PROBE_TEXTS))
    agreement = float((fp32 * reference).sum(1).min())
    if agreement < FP32_AGREEMENT:
        raise PackError(
            f"the ONNX export of {model_label(name)} does not reproduce sentence-transformers "
            f"(cosine {agreement:.4f}); use embedding_precision fp32 for this model"
        )
    record["kept_in_fp32"] = kept_in_fp32(onnx.load(str(fused), load_external_data=False).graph)
    with _quiet_root_warning(QUANTIZE_ADVICE):
        quantize_dynamic(
            fused,
            folder / MODEL_FILE,
            per_channel=True,
            reduce_range=not record["full_range_weights"],
            weight_type=QuantType.QInt8,
            nodes_to_exclude=record["kept_in_fp32"],
            # The exporter leaves some intermediate types to shape inference, which cannot
            # always tell them: they are float.
            extra_options={"DefaultTensorType": 1},
        )
    fused.unlink()
    int8 = _Session(folder / MODEL_FILE, tokenizer_file).encode(list(PROBE_TEXTS))
    record["int8_cosine_to_fp32"] = round(float((int8 * reference).sum(1).mean()), 5)
    if record["int8_cosine_to_fp32"] < INT8_AGREEMENT:
        raise PackError(
            f"the int8 export of {model_label(name)} strays from fp32 (mean cosine "
            f"{record['int8_cosine_to_fp32']}); use embedding_precision fp32 for this model"
        )
    (folder / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")


@contextmanager
def _quiet_root_warning(prefix: str) -> Iterator[None]:
    """Drop the root logger's records that start with ``prefix`` while the block runs."""

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(prefix)

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def _load_tokenizer(folder: Path, record: dict) -> Any:
    # One text per run: nothing to pad.
    return model_tokenizer(folder / TOKENIZER_FILE, record["max_seq_length"], pad_id=None)


class _Session:
    """An onnxruntime session of an exported model on the CPU: one text per run, one run per
    core at a time."""

    def __init__(self, path: Path, tokenizer: Any) -> None:
        # One thread a run: the parallelism is across texts (encode).
        self.session: onnxruntime.InferenceSession = cpu_session(path, 1, memory_arena=True)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.tokenizer = tokenizer
        self.dimension = int(self.session.get_outputs()[0].shape[-1])
        # Every core this process may run on (a container's share, not the host's count).
        self.cores = len(os.sched_getaffinity(0))

    def _vector(self, encoding: Any) -> np.ndarray:
        arrays = bert_inputs([encoding])
        return self.session.run(None, {name: arrays[name] for name in self.inputs})[0][0]

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=True)
        with ThreadPoolExecutor(self.cores) as pool:
            return np.stack(list(pool.map(self._vector, encodings))).astype(np.float32)


_load_lock = threading.Lock()


def _open_export(folder: Path) -> _Session:
    record = json.loads((folder / RECORD_FILE).read_text())
    return _Session(folder / MODEL_FILE, _load_tokenizer(folder, record))


@dataclass
class QuantizedEmbedder:
    """int8: the model's int8 export, through onnxruntime on the CPU (see the module doc)."""

    label: str
    session: _Session
    exported: bool  # whether loading it exported it (False: this machine's export was reused)
    device: str = "cpu"
    batch_size: int = 1  # one text per run (see the module doc)
    precision: str = "int8"

    @classmethod
    def load(cls, name: str) -> QuantizedEmbedder:
        requested = requested_device()
        if requested not in (None, "cpu"):
            raise PackError(
                f"embedding_precision int8 runs on the CPU (onnxruntime), but "
                f"{DEVICE_VARIABLE}={requested} asks for another device: unset "
                f"{DEVICE_VARIABLE}, or set the pack's embedding_precision to fp32"
            )
        with _load_lock:
            folder, exported = ensure_export(name)
            try:
                session = _open_export(folder)
            except Exception:  # onnxruntime and tokenizers raise bare Exceptions
                if exported:
                    raise
                # A damaged export (a disk error, a file edited by hand) is made again, once.
                with _exclusive(folder.parent / f"{folder.name}.lock"):
                    shutil.rmtree(folder, ignore_errors=True)
                folder, exported = ensure_export(name)
                session = _open_export(folder)
        return cls(model_label(name), session, exported)

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """Unit vectors of ``texts``; ``batch_size`` is ignored: a text's int8 vector must
        not depend on the texts embedded with it."""
        return self.session.encode(texts)

    def dimension(self) -> int:
        return self.session.dimension
