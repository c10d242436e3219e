"""The embedding model's ONNX graphs on this machine: the one module that writes them into the
model cache, tokenizes for them and opens them with onnxruntime, for the build and for queries.

Two graphs of one model exist, for two jobs, and both live here:

- **fp32, for questions** (:class:`OnnxBert`, :func:`bert_graph`): a BERT sentence-transformer
  in the usual layout (the packaged all-MiniLM-L6-v2: a BERT encoder, mean pooling,
  normalisation) written as an ONNX graph straight from its safetensors weights, without
  torch. Its vectors agree with sentence-transformers' (the fp32 build's) to 2.3e-7 per
  component (tests/test_retrieval.py holds them within 5e-7).
- **int8, for builds** (kpack.quantized): the sentence-transformers model exported by
  ``torch.onnx``, fused by onnxruntime's optimizer and quantized; any sentence-transformers
  model with a fast tokenizer.

Why not one export for both (issue 33, measured 2026-11-28 on 2 shared cores): the torch
export's fused fp32 graph reproduces sentence-transformers as closely (2.4e-7), so queries
could load it, but making it costs 22 s and imports torch (about 0.5 GB resident) in the
process that makes it, where :func:`bert_graph` takes about 1 s without torch: every fresh
machine or container's first question would wait 20 s more, and a server would keep torch in
memory. The other way round, int8 quantized from :func:`bert_graph`'s graph is another model:
onnxruntime's optimizer does not fuse its attention (no QAttention after quantization), and
its int8 vectors stray from today's by up to 0.024 (least cosine 0.989), so every int8
pack's vectors would change. What the two share is here once: the cache folder written whole
or not at all (:func:`publish_folder`), the tokenizer (:func:`model_tokenizer`), the model's
inputs (:func:`bert_inputs`) and the onnxruntime session (:func:`cpu_session`).

"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kpack.settings import model_cache_dir

if TYPE_CHECKING:
    import onnx
    import onnxruntime
    from tokenizers import Tokenizer

SUPPORTED_MODULES = [
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
]
# A BERT model's inputs, each (batch, tokens) int64, as a tokenizer's encodings give them.
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def bert_inputs(encodings: list[Any]) -> dict[str, np.ndarray]:
    """Tokenizer encodings of one length (padded, or a single text) as BERT_INPUTS arrays."""
    return {
        "input_ids": np.asarray([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.asarray([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.asarray([e.type_ids for e in encodings], dtype=np.int64),
    }


def model_tokenizer(path: Path, max_length: int, pad_id: int | None) -> Tokenizer:
    """The model's fast tokenizer from its tokenizer.json, truncating at ``max_length``; it pads
    a batch with ``pad_id``, or pads nothing (None: one text per run)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length)
    if pad_id is None:
        tokenizer.no_padding()
    else:
        tokenizer.enable_padding(pad_id=pad_id)
    return tokenizer


def cpu_session(
    model: Path | bytes, threads: int, memory_arena: bool = False
) -> onnxruntime.InferenceSession:
    """An onnxruntime session on the CPU running each graph on ``threads`` threads; with
    ``memory_arena``, memory of a run is kept for the next (the build's many short runs)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Threads that spin while waiting hold cores other processes on a shared machine need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Without the arena, memory for a batch is returned after it: with it, one batch of 64
    # passages kept 0.5 GB for the process's life, and a question ran no slower without.
    options.enable_cpu_mem_arena = memory_arena
    options.log_severity_level = 3  # errors only: no optimizer notes, no shape-merge warnings
    return onnxruntime.InferenceSession(
        str(model) if isinstance(model, Path) else model,
        options,
        providers=["CPUExecutionProvider"],
    )


def publish_folder(folder: Path, write: Callable[[Path], None]) -> None:
    """Make ``folder`` whole or not at all: ``write`` fills a staging folder beside it, which
    then takes its place (a reader never sees half a model); OSError when it cannot be
    written."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        write(staging)
        shutil.rmtree(folder, ignore_errors=True)  # a folder left incomplete (edited by hand)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# Bump when bert_graph changes, so graphs written by an older version are not reused.
GRAPH_RECIPE = 2
OPSET = 17  # LayerNormalization
IR_VERSION = (
    8  # the oldest that holds OPSET: onnx writes its newest, which onnxruntime may not read
)
OUTPUT = "sentence_embedding"
GRAPH_FILE = "model.onnx"
GRAPH_WEIGHTS = "weights.data"
WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"


def bert_graph(weights: dict[str, np.ndarray], config: dict[str, Any]) -> onnx.ModelProto:
    """A BERT sentence-transformer as an ONNX graph: token, position and type embeddings,
    ``num_hidden_layers`` post-norm encoder layers (GELU by erf), then the mean over the
    attention mask's tokens at unit length. ``weights`` are the model's tensors named as in
    its safetensors file without the ``bert.`` prefix; the inputs are BERT_INPUTS,
    (batch, tokens) int64, the output (batch, hidden_size) float32."""
    from onnx import TensorProto, helper, numpy_helper

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    eps = config["layer_norm_eps"]
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def constant(name: str, value: Any, dtype: Any = np.float32) -> str:
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype), name))
        return name

    def op(kind: str, *inputs: str, **attributes: Any) -> str:
        output = f"{kind}_{len(nodes)}"
        nodes.append(helper.make_node(kind, list(inputs), [output], **attributes))
        return output

    def weight(name: str, transposed: bool = False) -> str:
        return constant(name, weights[name].T if transposed else weights[name])

    def linear(x: str, prefix: str) -> str:  # x @ W.T + b, W stored (out, in)
        return op(
            "Add", op("MatMul", x, weight(prefix + ".weight", True)), weight(prefix + ".bias")
        )

    def layer_norm(x: str, prefix: str) -> str:
        return op(
            "LayerNormalization",
            x,
            weight(prefix + ".weight"),
            weight(prefix + ".bias"),
            axis=-1,
            epsilon=eps,
        )

    to_heads = constant("to_heads", [0, 0, heads, hidden // heads], np.int64)
    to_hidden = constant("to_hidden", [0, 0, hidden], np.int64)
    first, axis_0 = constant("first", [0], np.int64), constant("axis_0", [0], np.int64)
    tokens = op("Shape", "input_ids", start=1, end=2)
    x = op(
        "Add",
        op(
            "Add",
            op("Gather", weight(WORD_EMBEDDINGS), "input_ids"),
            op("Slice", weight("embeddings.position_embeddings.weight"), first, tokens, axis_0),
        ),
        op("Gather", weight("embeddings.token_type_embeddings.weight"), "token_type_ids"),
    )
    x = layer_norm(x, "embeddings.LayerNorm")
    one = constant("one", 1.0)
    mask = op("Cast", "attention_mask", to=TensorProto.FLOAT)
    padding = op(  # -inf-like on padding tokens, broadcast over heads and query tokens
        "Unsqueeze",
        op(
            "Mul",
            op("Sub", one, mask),
            constant("lowest", np.finfo(np.float32).min),
        ),
        constant("heads_and_queries", [1, 2], np.int64),
    )
    scale = constant("scale", 1.0 / math.sqrt(hidden // heads))
    half, root_two = constant("half", 0.5), constant("root_two", math.sqrt(2.0))
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."

        def split(v: str, order: list[int]) -> str:  # (batch, tokens, hidden) -> per head
            return op("Transpose", op("Reshape", v, to_heads), perm=order)

        query = split(linear(x, p + "attention.self.query"), [0, 2, 1, 3])
        key = split(linear(x, p + "attention.self.key"), [0, 2, 3, 1])  # transposed
        value = split(linear(x, p + "attention.self.value"), [0, 2, 1, 3])
        scores = op("Add", op("Mul", op("MatMul", query, key), scale), padding)
        context = op(
            "Reshape",
            op("Transpose", op("MatMul", op("Softmax", scores, axis=-1), value), perm=[0, 2, 1, 3]),
            to_hidden,
        )
        x = layer_norm(
            op("Add", linear(context, p + "attention.output.dense"), x),
            p + "attention.output.LayerNorm",
        )
        inner = linear(x, p + "intermediate.dense")
        gelu = op(
            "Mul",
            op("Mul", inner, half),
            op("Add", op("Erf", op("Div", inner, root_two)), one),
        )
        x = layer_norm(op("Add", linear(gelu, p + "output.dense"), x), p + "output.LayerNorm")
    summed = op(
        "ReduceSum",
        op("Mul", x, op("Unsqueeze", mask, constant("last", [2], np.int64))),
        constant("over_tokens", [1], np.int64),
        keepdims=0,
    )
    counted = op(
        "Max",
        op("ReduceSum", mask, constant("per_text", [1], np.int64), keepdims=1),
        constant("at_least", 1e-9),
    )
    nodes.append(
        helper.make_node("LpNormalization", [op("Div", summed, counted)], [OUTPUT], p=2, axis=1)
    )
    graph = helper.make_graph(
        nodes,
        "sentence_embedding",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
            for n in BERT_INPUTS
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", hidden])],
        initializers,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )


class OnnxBert:
    """A BERT sentence-transformer (mean pooling, unit vectors) run by onnxruntime from the
    graph :func:`bert_graph` writes of its weights."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.config = json.loads((folder / "config.json").read_text())
        max_length = json.loads((folder / "sentence_bert_config.json").read_text())[
            "max_seq_length"
        ]
        self.tokenizer = model_tokenizer(
            folder / "tokenizer.json", max_length, self.config.get("pad_token_id", 0)
        )
        self._model = self._graph_file()
        self._sessions: dict[int, onnxruntime.InferenceSession] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, folder: Path) -> OnnxBert | None:
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

    def _weights(self) -> dict[str, np.ndarray]:
        from safetensors.numpy import load_file

        return {
            name.removeprefix("bert."): value
            for name, value in load_file(str(self.folder / "model.safetensors")).items()
        }

    def _graph_file(self) -> Path | bytes:
        """The model's graph in the model cache (GRAPH_FILE, its weights beside it in
        GRAPH_WEIGHTS), written there first if it is not; the graph itself, weights inside,
        when the cache cannot be written.

        Weights in a file of their own because onnxruntime maps such a file instead of
        copying the weights into the process: a session opens in 0.07 s instead of 0.27 s,
        the word-piece table's rows no question uses are never read, and processes embedding
        with one model share its pages."""
        weights = (self.folder / "model.safetensors").stat()
        key = json.dumps(
            [str(self.folder), weights.st_size, weights.st_mtime_ns, GRAPH_RECIPE]
        ).encode()
        folder = model_cache_dir() / f"bert-{hashlib.sha256(key).hexdigest()[:16]}"
        if (folder / GRAPH_FILE).is_file():
            return folder / GRAPH_FILE
        import onnx  # only to write the graph: a process that finds it cached never needs it

        graph = bert_graph(self._weights(), self.config)

        def write(staging: Path) -> None:
            onnx.save_model(
                graph,
                str(staging / GRAPH_FILE),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=GRAPH_WEIGHTS,
                size_threshold=1024,
            )

        try:
            publish_folder(folder, write)
        except OSError:
            if (folder / GRAPH_FILE).is_file():  # another process's, written at once
                return folder / GRAPH_FILE
            return graph.SerializeToString()  # the cache cannot be written: keep it in memory
        return folder / GRAPH_FILE

    def _session(self, threads: int) -> onnxruntime.InferenceSession:
        """The session on ``threads`` threads, made at first use; a cached graph that does not
        load (a damaged file) is written again."""
        with self._lock:
            if threads not in self._sessions:
                try:
                    session = cpu_session(self._model, threads)
                except Exception:  # onnxruntime's Fail, InvalidProtobuf, ... derive from it
                    if not isinstance(self._model, Path):
                        raise
                    shutil.rmtree(self._model.parent, ignore_errors=True)
                    self._model = self._graph_file()
                    session = cpu_session(self._model, threads)
                self._sessions[threads] = session
            return self._sessions[threads]

    def word_embeddings(self) -> np.ndarray:
        """The input word-piece embedding table (vocabulary, hidden) of the model's weights
        (retrieval.meaning's word vectors)."""
        from safetensors import safe_open

        with safe_open(str(self.folder / "model.safetensors"), framework="np") as weights:
            name = next(n for n in weights.keys() if n.endswith(WORD_EMBEDDINGS))  # noqa: SIM118
            return weights.get_tensor(name)

    def encode(self, texts: list[str], threads: int) -> np.ndarray:
        """Unit-length float32 vectors, as sentence-transformers' encode would give."""
        if not texts:
            return np.zeros((0, self.config["hidden_size"]), dtype=np.float32)
        feed = bert_inputs(self.tokenizer.encode_batch(texts))
        return self._session(threads).run([OUTPUT], feed)[0]
