"""Embedding questions at query time, without loading torch when the model allows it.

A question is embedded by the model its pack version was built with. Loading that model
through sentence-transformers costs seconds (torch, transformers, scikit-learn are imported
for it) on every cold start, while running it for one question takes milliseconds. So when
the model is a BERT sentence-transformer stored locally in the usual layout (the packaged
all-MiniLM-L6-v2 is: a BERT encoder, mean pooling, normalisation), the question is embedded
by :class:`OnnxBert`: this module writes the same arithmetic as an ONNX graph over the same
weights (:func:`bert_graph`, no torch needed) and onnxruntime runs it with the model's own
tokenizer. Its vectors agree with sentence-transformers' (the build's) to 2e-7 per component
at most: measured over the python_docs_qa questions one at a time and in a batch of 32, and
tests/test_retrieval.py holds them within 5e-7, leaving room for another CPU's arithmetic.
Any other model goes through kpack.embedding, as the build does.

Why onnxruntime: a question's embedding is six layers of matrix products with a dozen to a
few dozen token columns, where OpenBLAS (numpy) reaches a third of the memory bandwidth;
onnxruntime's kernels ran the same graph in 8.2 ms against 16.6 ms for the numpy forward pass
this module held before (the python_docs_qa questions, one thread). The graph is written once
per model and machine into kpack.settings.model_cache_dir() and loaded from there (0.1 s).

BLAS (the reader's own vector products) runs with the reader's thread budget
(:func:`use_blas_threads`, set once per process): on a shared machine, one OpenBLAS thread
embedded a question in 0.07 s where two took 0.4 to 2.6 s (threads spinning for cores other
processes held). onnxruntime gets the same budget, without spinning threads.

A model that is not on this machine (and cannot be fetched: no network, or HF_HUB_OFFLINE=1)
is a :class:`kpack.errors.PackNotReady` with one line saying so, not the loader's traceback.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kpack.errors import PackNotReady

if TYPE_CHECKING:
    import onnx
    import onnxruntime

SUPPORTED_MODULES = [
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
]


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
    its safetensors file without the ``bert.`` prefix; the inputs are kpack.embedding.BERT_INPUTS,
    (batch, tokens) int64, the output (batch, hidden_size) float32."""
    from onnx import TensorProto, helper, numpy_helper

    from kpack.embedding import BERT_INPUTS

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
        from tokenizers import Tokenizer

        self.folder = folder
        self.config = json.loads((folder / "config.json").read_text())
        max_length = json.loads((folder / "sentence_bert_config.json").read_text())[
            "max_seq_length"
        ]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding(pad_id=self.config.get("pad_token_id", 0))
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
        from kpack.settings import model_cache_dir

        weights = (self.folder / "model.safetensors").stat()
        key = json.dumps(
            [str(self.folder), weights.st_size, weights.st_mtime_ns, GRAPH_RECIPE]
        ).encode()
        folder = model_cache_dir() / f"bert-{hashlib.sha256(key).hexdigest()[:16]}"
        if (folder / GRAPH_FILE).is_file():
            return folder / GRAPH_FILE
        import onnx  # only to write the graph: a process that finds it cached never needs it

        graph = bert_graph(self._weights(), self.config)
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        except OSError:
            return graph.SerializeToString()
        try:
            onnx.save_model(
                graph,
                str(staging / GRAPH_FILE),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=GRAPH_WEIGHTS,
                size_threshold=1024,
            )
            shutil.rmtree(folder, ignore_errors=True)  # a graph left without its weights
            os.replace(staging, folder)  # whole or absent
        except OSError:
            if not (folder / GRAPH_FILE).is_file():  # not another process's, written at once
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return folder / GRAPH_FILE

    def _session(self, threads: int) -> onnxruntime.InferenceSession:
        """The session on ``threads`` threads, made at first use; a cached graph that does not
        load (a damaged file) is written again."""
        with self._lock:
            if threads not in self._sessions:
                try:
                    session = _open_session(self._model, threads)
                except Exception:  # onnxruntime's Fail, InvalidProtobuf, ... derive from it
                    if not isinstance(self._model, Path):
                        raise
                    shutil.rmtree(self._model.parent, ignore_errors=True)
                    self._model = self._graph_file()
                    session = _open_session(self._model, threads)
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
        from kpack.embedding import bert_inputs

        feed = bert_inputs(self.tokenizer.encode_batch(texts))
        return self._session(threads).run([OUTPUT], feed)[0]


def _open_session(model: Path | bytes, threads: int) -> onnxruntime.InferenceSession:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Without the arena, memory for a batch is returned after it: with it, one batch of 64
    # passages kept 0.5 GB for the process's life, and a question ran no slower without.
    options.enable_cpu_mem_arena = False
    options.log_severity_level = 3  # not the shape-merge warnings of a dynamic batch
    return onnxruntime.InferenceSession(str(model) if isinstance(model, Path) else model, options)


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
