"""The embedding device (KPACK_EMBED_DEVICE, the CPU fall back) and the int8 path: its export,
cached once per machine under a lock, and its vectors against sentence-transformers fp32.

No GPU is on the machines these tests were written on: what a GPU does is covered by
choose_device's rules with the facts torch would report, and measured by bench/embed_bench.py
where one is present.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kpack.embedders import embedder_for
from kpack.embedding import (
    CPU_BATCH,
    DEVICE_VARIABLE,
    batch_size_for,
    choose_device,
    effective_precision,
    embedding_device,
    requested_device,
    torch_is_cpu_only,
    vector_namespace,
)
from kpack.errors import PackError
from kpack.quantized import RECORD_FILE, QuantizedEmbedder, ensure_export, full_range_weights

NO_GPU = not torch.cuda.is_available() and not torch.backends.mps.is_available()
TEXTS = [
    "Which environment variable sets where the sprocket cache lives?",
    "WIDGET_HOME sets the cache directory; the default is ~/.widget.",
    "Gaskets and flanges are checked by the SprocketValidator before a build. " * 3,
    "  Leading spaces, CAPITALS and Ünïcödé ✓ 日本語 text  ",
    "The registry is rebuilt every night. " * 120,  # past the 256-token limit: truncated
]


@pytest.fixture
def model_cache(tmp_path_factory, monkeypatch) -> Path:
    """One int8 export for this module's tests, in a folder of its own."""
    folder = tmp_path_factory.getbasetemp() / "model-cache"
    monkeypatch.setenv("KPACK_MODEL_CACHE", str(folder))
    return folder


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", None), ("auto", None), (" CPU ", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda:1")],
)
def test_the_device_variable_is_read(monkeypatch, value, expected):
    monkeypatch.setenv(DEVICE_VARIABLE, value)
    assert requested_device() == expected


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "tpu", "cpu,cuda"])
def test_a_malformed_device_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(DEVICE_VARIABLE, value)
    with pytest.raises(PackError, match=r"KPACK_EMBED_DEVICE must be auto, cpu, cuda, cuda:N"):
        requested_device()


def test_the_device_follows_the_machine():
    # What torch reports decides: the first GPU, else MPS, else the CPU.
    assert choose_device(None, cuda_devices=2, mps=False) == "cuda:0"
    assert choose_device(None, cuda_devices=0, mps=True) == "mps"
    assert choose_device(None, cuda_devices=0, mps=False) == "cpu"
    # A request is honoured where the machine has it ...
    assert choose_device("cuda", cuda_devices=1, mps=False) == "cuda:0"
    assert choose_device("cuda:1", cuda_devices=2, mps=False) == "cuda:1"
    assert choose_device("cpu", cuda_devices=2, mps=True) == "cpu"
    # ... and refused where it does not, never quietly replaced by the CPU.
    with pytest.raises(PackError, match=r"KPACK_EMBED_DEVICE=cuda:2, but torch sees 2 CUDA"):
        choose_device("cuda:2", cuda_devices=2, mps=False)
    with pytest.raises(PackError, match=r"=cuda, but torch sees no CUDA device"):
        choose_device("cuda", cuda_devices=0, mps=True)
    with pytest.raises(PackError, match=r"=mps, but torch sees no MPS device"):
        choose_device("mps", cuda_devices=1, mps=False)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_without_a_gpu_the_cpu_embeds_and_a_requested_gpu_is_refused(monkeypatch):
    monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    assert embedding_device() == "cpu"
    assert batch_size_for("cpu") == CPU_BATCH
    monkeypatch.setenv(DEVICE_VARIABLE, "cuda")
    with pytest.raises(PackError, match=r"KPACK_EMBED_DEVICE=cuda, but torch sees no CUDA"):
        embedding_device()


def test_auto_precision_is_int8_on_the_cpu(monkeypatch):
    # The torch build is told from its version, without importing it: a CPU-only one can
    # never see a GPU.
    assert torch_is_cpu_only() == (torch.version.cuda is None and not torch.backends.mps.is_built())
    assert (effective_precision("fp32"), effective_precision("int8")) == ("fp32", "int8")
    monkeypatch.setenv(DEVICE_VARIABLE, "cpu")
    assert effective_precision("auto") == "int8"
    if NO_GPU:
        monkeypatch.delenv(DEVICE_VARIABLE)
        assert effective_precision("auto") == "int8"
        monkeypatch.setenv(DEVICE_VARIABLE, "cuda")
        with pytest.raises(PackError, match=r"KPACK_EMBED_DEVICE=cuda, but torch sees no CUDA"):
            effective_precision("auto")


def test_int8_vectors_are_close_to_fp32_and_cached_apart(model_cache):
    fp32 = embedder_for("default", "fp32").encode(TEXTS)
    int8 = embedder_for("default", "int8")
    vectors = int8.encode(TEXTS)
    assert (int8.precision, int8.device, vectors.dtype, vectors.shape) == (
        "int8",
        "cpu",
        np.float32,
        fp32.shape,
    )
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = (vectors * fp32).sum(1)
    assert cosines.mean() >= 0.995 and cosines.min() >= 0.99, cosines
    # Texts run in parallel, and each vector still lands on its own text's row.
    assert ((vectors @ fp32.T).argmax(1) == np.arange(len(TEXTS))).all()
    # A text's vector does not depend on the texts embedded with it (a rebuild that embeds
    # it among other texts gives the same vector, so rankings do not move build to build).
    assert np.array_equal(int8.encode([TEXTS[2]])[0], vectors[2])
    assert np.array_equal(int8.encode(TEXTS[::-1])[::-1], vectors)
    assert vector_namespace("default", "int8") != vector_namespace("default", "fp32")
    assert int8.encode([]).shape == (0, 384)


@pytest.mark.parametrize(
    ("machine", "flags", "full"),
    [
        ("x86_64", "fpu sse2 avx2 avx512f avx512_vnni", True),
        ("x86_64", "fpu sse2 avx2 avx_vnni", True),
        ("x86_64", "fpu sse2 avx2 fma", False),  # 16-bit adds of u8 x s8 products: 7 bits
        ("aarch64", "fp asimd", True),
    ],
)
def test_full_8_bit_weights_only_where_the_products_cannot_saturate(machine, flags, full):
    assert full_range_weights(flags, machine) is full


def test_int8_refuses_a_gpu_request(monkeypatch):
    monkeypatch.setenv(DEVICE_VARIABLE, "cuda")
    with pytest.raises(PackError, match=r"int8 runs on the CPU .* KPACK_EMBED_DEVICE=cuda"):
        QuantizedEmbedder.load("default")


EXPORT_IN_CHILD = """
import json, sys
from kpack.quantized import QuantizedEmbedder
embedder = QuantizedEmbedder.load("default")
print(json.dumps({"exported": embedder.exported, "vector": embedder.encode([sys.argv[1]])[0].tolist()}))
"""


def test_parallel_processes_export_once_and_reuse_it(tmp_path, monkeypatch):
    """Two shards starting at once on a machine with no export: one exports, the other waits
    for it and loads the same files; a damaged export is made again."""
    monkeypatch.setenv("KPACK_MODEL_CACHE", str(tmp_path / "cache"))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", EXPORT_IN_CHILD, TEXTS[0]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["exported"] for r in results) == [False, True]
    assert np.allclose(results[0]["vector"], results[1]["vector"], atol=1e-6)
    exports = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(exports) == 1  # no staging folder left behind
    record = json.loads((exports[0] / RECORD_FILE).read_text())
    assert record["int8_cosine_to_fp32"] >= 0.995
    # The feed-forward down-projections of the model's first three (of six) layers stay fp32.
    assert record["kept_in_fp32"] == [
        f"/model/model.0/encoder/layer.{layer}/output/dense/MatMul" for layer in range(3)
    ]
    assert ensure_export("default") == (exports[0], False)

    (exports[0] / "model.int8.onnx").write_bytes(b"damaged on disk")
    repaired = QuantizedEmbedder.load("default")
    assert repaired.exported
    assert np.allclose(repaired.encode([TEXTS[0]])[0], results[0]["vector"], atol=1e-6)
