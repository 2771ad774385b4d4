"""An ONNX graph of a sentence-transformers BERT encoder, built from safetensors.

No torch: the graph is written node by node with :mod:`onnx.helper` (opset 18)
and the weights come from :func:`safetensors.numpy.load_file`. The layout
follows HF ``transformers`` ``BertModel`` (``modeling_bert.py``): embeddings
(word + absolute position + token type, LayerNorm), then per layer
self-attention (``softmax(QK^T / sqrt(d) + mask) V``, additive mask of
``finfo(float32).min`` on padding), output dense + residual + LayerNorm,
GELU(erf) feed-forward + residual + LayerNorm. After it come
sentence-transformers ``Pooling`` (mean over ``attention_mask``, token count
clamped at 1e-9) and ``Normalize`` (``x / max(||x||_2, 1e-12)``, as
``torch.nn.functional.normalize``).

Graph inputs: ``input_ids``, ``attention_mask``, ``token_type_ids``, int64
``(batch, seq_len)``, both axes dynamic. Output ``embedding`` float32
``(batch, hidden_size)``; :func:`append_sentiment_head` adds ``score`` float32
``(batch,)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

from pyflink_aisp.errors import ModelError
from pyflink_aisp.models._source import BertConfig

__all__ = [
    "EMBEDDING_OUTPUT",
    "INPUT_NAMES",
    "OPSET",
    "SCORE_OUTPUT",
    "append_sentiment_head",
    "build_encoder_model",
]

#: ONNX opset of the graphs built here.
OPSET = 18
#: IR version 9 loads in onnxruntime >= 1.15.
_IR_VERSION = 9
#: Graph inputs, each int64 ``(batch, seq_len)``.
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
#: float32 ``(batch, hidden_size)`` L2-normalised sentence embedding.
EMBEDDING_OUTPUT = "embedding"
#: float32 ``(batch,)`` P(positive) of the appended logistic head.
SCORE_OUTPUT = "score"
_MASK_VALUE = float(np.finfo(np.float32).min)  # HF: torch.finfo(dtype).min
_POOL_MIN_COUNT = 1e-9  # sentence-transformers Pooling: clamp(sum_mask, min=1e-9)
_NORM_EPS = 1e-12  # torch.nn.functional.normalize default eps
Weights = Mapping[str, npt.NDArray[np.generic]]


class _GraphBuilder:
    """Collects nodes and initializers, handing out unique value names."""

    def __init__(self, weights: Weights) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._weights = weights
        self._count = 0

    def const(self, name: str, value: npt.ArrayLike, dtype: type = np.float32) -> str:
        """Add an initializer and return its name."""
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, key: str, *, transpose: bool = False) -> str:
        """Add safetensors tensor ``key``; Linear weights ``(out, in)`` are transposed."""
        try:
            array = np.asarray(self._weights[key], dtype=np.float32)
        except KeyError as exc:
            raise ModelError(f"weight {key!r} missing from the safetensors file") from exc
        return self.const(key, np.ascontiguousarray(array.T if transpose else array))

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        """Add one node and return its (single) output name."""
        self._count += 1
        output = out or f"{op_type.lower()}_{self._count}"
        node = helper.make_node(op_type, list(inputs), [output], name=f"{op_type}_{self._count}", **attrs)
        self.nodes.append(node)
        return output


def _linear(g: _GraphBuilder, prefix: str, x: str) -> str:
    """``x @ W^T + b`` for the HF ``nn.Linear`` named ``prefix``."""
    product = g.op("MatMul", x, g.weight(f"{prefix}.weight", transpose=True))
    return g.op("Add", product, g.weight(f"{prefix}.bias"))


def _layer_norm(g: _GraphBuilder, prefix: str, x: str, eps: float) -> str:
    scale, bias = g.weight(f"{prefix}.weight"), g.weight(f"{prefix}.bias")
    return g.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=eps)


def _gelu(g: _GraphBuilder, x: str) -> str:
    """Exact GELU ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (opset 18 has no Gelu op)."""
    erf = g.op("Erf", g.op("Div", x, "c_sqrt2"))
    return g.op("Mul", g.op("Mul", x, "c_half"), g.op("Add", erf, "c_one"))


def _embeddings(g: _GraphBuilder, cfg: BertConfig) -> str:
    """Word + position + token-type embeddings, then LayerNorm: ``(batch, seq, hidden)``."""
    words = g.op("Gather", g.weight("embeddings.word_embeddings.weight"), "input_ids")
    types = g.op("Gather", g.weight("embeddings.token_type_embeddings.weight"), "token_type_ids")
    seq_len = g.op("Squeeze", g.op("Shape", "input_ids", start=1, end=2), "c_axis0")
    positions = g.op("Range", "c_zero_i64", seq_len, "c_one_i64")
    position_vectors = g.op("Gather", g.weight("embeddings.position_embeddings.weight"), positions)
    summed = g.op("Add", g.op("Add", words, types), position_vectors)
    return _layer_norm(g, "embeddings.LayerNorm", summed, cfg.layer_norm_eps)


def _additive_mask(g: _GraphBuilder, mask_f: str) -> str:
    """``(1 - mask) * finfo.min`` as ``(batch, 1, 1, seq)``, added to attention scores."""
    additive = g.op("Mul", g.op("Sub", "c_one", mask_f), g.const("c_mask_value", _MASK_VALUE))
    return g.op("Unsqueeze", additive, g.const("c_axes12", [1, 2], np.int64))


def _heads(g: _GraphBuilder, x: str, perm: list[int]) -> str:
    """``(batch, seq, hidden)`` → ``(batch, heads, ...)`` per ``perm``."""
    return g.op("Transpose", g.op("Reshape", x, "c_head_shape"), perm=perm)


def _self_attention(g: _GraphBuilder, prefix: str, x: str, mask: str, cfg: BertConfig) -> str:
    """Multi-head self-attention of one layer, before its output dense."""
    query = _heads(g, _linear(g, f"{prefix}.query", x), [0, 2, 1, 3])  # (b, h, s, d)
    key = _heads(g, _linear(g, f"{prefix}.key", x), [0, 2, 3, 1])  # (b, h, d, s)
    value = _heads(g, _linear(g, f"{prefix}.value", x), [0, 2, 1, 3])  # (b, h, s, d)
    scores = g.op("Div", g.op("MatMul", query, key), "c_sqrt_head")
    probs = g.op("Softmax", g.op("Add", scores, mask), axis=-1)
    context = g.op("Transpose", g.op("MatMul", probs, value), perm=[0, 2, 1, 3])
    return g.op("Reshape", context, "c_hidden_shape")


def _encoder_layer(g: _GraphBuilder, index: int, x: str, mask: str, cfg: BertConfig) -> str:
    prefix = f"encoder.layer.{index}"
    attended = _self_attention(g, f"{prefix}.attention.self", x, mask, cfg)
    projected = _linear(g, f"{prefix}.attention.output.dense", attended)
    x = _layer_norm(g, f"{prefix}.attention.output.LayerNorm", g.op("Add", projected, x), cfg.layer_norm_eps)
    hidden = _gelu(g, _linear(g, f"{prefix}.intermediate.dense", x))
    out = _linear(g, f"{prefix}.output.dense", hidden)
    return _layer_norm(g, f"{prefix}.output.LayerNorm", g.op("Add", out, x), cfg.layer_norm_eps)


def _mean_pool_normalize(g: _GraphBuilder, x: str, mask_f: str) -> str:
    """Masked mean over tokens, then L2 normalisation: ``(batch, hidden)``."""
    mask3 = g.op("Unsqueeze", mask_f, g.const("c_axis2", [2], np.int64))
    summed = g.op("ReduceSum", g.op("Mul", x, mask3), "c_axis1", keepdims=0)
    count = g.op(
        "Clip", g.op("ReduceSum", mask3, "c_axis1", keepdims=0), g.const("c_min_count", _POOL_MIN_COUNT)
    )
    mean = g.op("Div", summed, count)
    norm = g.op("ReduceL2", mean, "c_axis1", keepdims=1)
    return g.op("Div", mean, g.op("Clip", norm, g.const("c_norm_eps", _NORM_EPS)), out=EMBEDDING_OUTPUT)


def _add_shared_constants(g: _GraphBuilder, cfg: BertConfig) -> None:
    g.const("c_one", 1.0)
    g.const("c_half", 0.5)
    g.const("c_sqrt2", math.sqrt(2.0))
    g.const("c_sqrt_head", math.sqrt(cfg.head_size))
    g.const("c_zero_i64", 0, np.int64)
    g.const("c_one_i64", 1, np.int64)
    g.const("c_axis0", [0], np.int64)
    g.const("c_axis1", [1], np.int64)
    g.const("c_head_shape", [0, 0, cfg.num_attention_heads, cfg.head_size], np.int64)
    g.const("c_hidden_shape", [0, 0, cfg.hidden_size], np.int64)


def build_encoder_model(weights_path: Path, cfg: BertConfig) -> onnx.ModelProto:
    """Build the encoder + mean pooling + L2 normalisation graph.

    Args:
        weights_path: HF ``model.safetensors`` of a ``BertModel`` (keys without
            the ``bert.`` prefix).
        cfg: Its ``config.json`` hyper-parameters.

    Returns:
        A checked opset-18 model: inputs ``input_ids``, ``attention_mask``,
        ``token_type_ids`` int64 ``(batch, seq_len)``; output ``embedding``
        float32 ``(batch, hidden_size)``. Weights are inside (about 90 MB for
        MiniLM-L6).

    Raises:
        ModelError: The weights file is unreadable or lacks a tensor.
    """
    try:
        weights = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise ModelError(f"cannot read weights {weights_path}: {exc}") from exc
    g = _GraphBuilder(weights)
    _add_shared_constants(g, cfg)
    mask_f = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    x, mask = _embeddings(g, cfg), _additive_mask(g, mask_f)
    for index in range(cfg.num_hidden_layers):
        x = _encoder_layer(g, index, x, mask, cfg)
    _mean_pool_normalize(g, x, mask_f)
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq_len"]) for n in INPUT_NAMES]
    output = helper.make_tensor_value_info(EMBEDDING_OUTPUT, TensorProto.FLOAT, ["batch", cfg.hidden_size])
    graph = helper.make_graph(g.nodes, "sentence_encoder", inputs, [output], initializer=g.initializers)
    return _finish(graph)


def append_sentiment_head(encoder: onnx.ModelProto, coef: npt.ArrayLike, intercept: float) -> onnx.ModelProto:
    """Add a logistic-regression head: ``score = sigmoid(embedding @ coef + intercept)``.

    Args:
        encoder: A model from :func:`build_encoder_model` (not modified).
        coef: ``(hidden_size,)`` weights (cast to float32).
        intercept: Bias.

    Returns:
        A new model with outputs ``embedding`` float32 ``(batch, hidden)`` and
        ``score`` float32 ``(batch,)``.

    Raises:
        ModelError: ``coef`` does not match the embedding size.
    """
    hidden = encoder.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    weight = np.asarray(coef, dtype=np.float32).reshape(-1)
    if weight.shape != (hidden,):
        raise ModelError(f"head coef must have shape ({hidden},), got {weight.shape}")
    g = _GraphBuilder({})
    logit = g.op(
        "Add",
        g.op("MatMul", EMBEDDING_OUTPUT, g.const("head_coef", weight[:, None])),
        g.const("head_intercept", [intercept]),
    )
    g.op("Squeeze", g.op("Sigmoid", logit), g.const("c_head_axis1", [1], np.int64), out=SCORE_OUTPUT)
    graph = onnx.GraphProto()
    graph.CopyFrom(encoder.graph)
    graph.node.extend(g.nodes)
    graph.initializer.extend(g.initializers)
    graph.output.append(helper.make_tensor_value_info(SCORE_OUTPUT, TensorProto.FLOAT, ["batch"]))
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=_IR_VERSION,
        producer_name="pyflink-aisp",
    )
    onnx.checker.check_model(model)
    return model
