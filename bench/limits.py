"""The physical limit of embedding on this machine, and the int8 export the benchmarks share.

``peaks``: the measured peak throughput of a large fp32 matrix product (numpy's BLAS on every
core: the FMA throughput) and of an int8 one (onnxruntime's dynamic quantized MatMul, what the
int8 path runs). ``flops_per_text``: MiniLM's matrix-product FLOPs per text at each text's own
token count. Their quotient is the most texts per second the machine could embed; a path's
measured texts per second over it is its share of the limit. ``int8_export`` makes the int8
export before any timing, as it is made once per machine.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PEAK_SIZE = 2048  # square matrices of the peak measurements
PEAK_REPEATS = 5


def int8_export() -> dict:
    """The int8 export of the packaged model, made here unless this machine has it."""
    started = time.perf_counter()
    from kpack.quantized import ensure_export

    folder, exported = ensure_export("default")
    record = json.loads((folder / "export.json").read_text())
    return {
        "folder": str(folder),
        "exported": exported,
        "seconds": round(time.perf_counter() - started, 3),
        "int8_cosine_to_fp32_on_probes": record["int8_cosine_to_fp32"],
    }


def peaks() -> dict:
    """Measured peak throughput of a large fp32 and int8 matrix product on every core."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on every call
    rng = np.random.default_rng(0)
    n = PEAK_SIZE
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)

    def best_seconds(run: Any) -> float:
        run()  # warm-up
        times = []
        for _ in range(PEAK_REPEATS):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return min(times)

    fp32_s = best_seconds(lambda: a @ b)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "peak",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        [numpy_helper.from_array(b, "w")],
    )
    with tempfile.TemporaryDirectory() as folder:
        fp32_model, int8_model = Path(folder, "fp32.onnx"), Path(folder, "int8.onnx")
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        onnx.save(model, fp32_model)
        quantize_dynamic(fp32_model, int8_model, weight_type=QuantType.QInt8, per_channel=True)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = len(os.sched_getaffinity(0))
        session = onnxruntime.InferenceSession(
            str(int8_model), options, providers=["CPUExecutionProvider"]
        )
        int8_s = best_seconds(lambda: session.run(None, {"x": a}))
    flops = 2.0 * n**3
    return {
        "cores": len(os.sched_getaffinity(0)),
        "matrix": n,
        "fp32_gflops": round(flops / fp32_s / 1e9, 1),
        "int8_gops": round(flops / int8_s / 1e9, 1),
    }


# --- The physical limit --------------------------------------------------------------------


def flops_per_text(texts: list[str]) -> float:
    """Mean FLOPs of MiniLM's matrix products per text, at each text's own token count: per
    layer and token the four attention projections and the two feed-forward ones, plus the
    attention's two products over the text's tokens."""
    from tokenizers import Tokenizer

    from kpack.embedding import resolve_model_path

    folder = Path(resolve_model_path("default"))
    config = json.loads((folder / "config.json").read_text())
    max_tokens = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_tokens)
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    per_token = 2 * (4 * hidden * hidden + 2 * hidden * inner)
    total = 0.0
    for encoding in tokenizer.encode_batch(texts):
        tokens = len(encoding.ids)
        total += config["num_hidden_layers"] * (tokens * per_token + 4 * tokens * tokens * hidden)
    return total / max(len(texts), 1)


def higher_peaks(first: dict, last: dict) -> dict:
    """Two peak measurements, each figure the higher: a shared machine lowers them at times."""
    return {**first, **{k: max(first[k], last[k]) for k in ("fp32_gflops", "int8_gops")}}
