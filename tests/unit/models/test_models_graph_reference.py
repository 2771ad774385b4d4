"""The ONNX encoder graph against an independent float64 numpy BERT (no torch).

The reference follows HF ``BertModel`` + sentence-transformers mean pooling +
Normalize, runs each text alone (no padding, so no mask), and reads the weights,
config and tokenizer itself; the ONNX graph runs padded batches.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file
from scipy.special import erf
from tokenizers import Tokenizer

from pyflink_aisp.errors import ModelError
from pyflink_aisp.models import BertConfig, append_sentiment_head, build_encoder_model, locate_source_model

F64 = npt.NDArray[np.float64]
TEXTS = [
    "A three-hour cinema master class.",
    "The character of ZigZag is not sufficiently developed to support a film constructed around him.",
    "",
    "Gorgeous, witty, and seductive, but it drags on far too long " * 12,  # truncated at 128 tokens
    "ok",
]


class NumpyBert:
    """float64 sentence encoder: BERT → mean pooling → L2 normalisation."""

    def __init__(self) -> None:
        source = locate_source_model()
        self.w = {k: v.astype(np.float64) for k, v in load_file(str(source.weights_path)).items()}
        self.cfg: dict[str, Any] = json.loads(source.config_path.read_text())
        self.tokenizer = Tokenizer.from_file(str(source.tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=128)

    def _ln(self, x: F64, name: str) -> F64:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        normed = (x - mean) / np.sqrt(var + self.cfg["layer_norm_eps"])
        return normed * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def _dense(self, x: F64, name: str) -> F64:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def _attention(self, x: F64, p: str) -> F64:
        heads = self.cfg["num_attention_heads"]
        size = self.cfg["hidden_size"] // heads
        q, k, v = (
            self._dense(x, f"{p}.{n}").reshape(len(x), heads, size).transpose(1, 0, 2)
            for n in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(size)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return (probs @ v).transpose(1, 0, 2).reshape(len(x), heads * size)

    def embed_one(self, text: str) -> F64:
        enc = self.tokenizer.encode(text)
        ids, types = np.array(enc.ids), np.array(enc.type_ids)
        x = (
            self.w["embeddings.word_embeddings.weight"][ids]
            + self.w["embeddings.position_embeddings.weight"][: len(ids)]
            + self.w["embeddings.token_type_embeddings.weight"][types]
        )
        x = self._ln(x, "embeddings.LayerNorm")
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}"
            attended = self._dense(self._attention(x, f"{p}.attention.self"), f"{p}.attention.output.dense")
            x = self._ln(attended + x, f"{p}.attention.output.LayerNorm")
            hidden = self._dense(x, f"{p}.intermediate.dense")
            hidden = 0.5 * hidden * (1.0 + erf(hidden / np.sqrt(2.0)))
            x = self._ln(self._dense(hidden, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
        pooled = x.mean(axis=0)
        return pooled / max(float(np.linalg.norm(pooled)), 1e-12)


@pytest.fixture(scope="module")
def encoder_model() -> onnx.ModelProto:
    source = locate_source_model()
    return build_encoder_model(source.weights_path, source.bert_config())


@pytest.fixture(scope="module")
def session(encoder_model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(encoder_model.SerializeToString(), providers=["CPUExecutionProvider"])


def _onnx_embed(session: ort.InferenceSession, texts: list[str]) -> npt.NDArray[np.float32]:
    from pyflink_aisp.tokenize import BatchEncoder

    enc = BatchEncoder(locate_source_model().tokenizer_path, 128).encode(texts)
    (out,) = session.run(["embedding"], enc.model_inputs())
    return out


def test_graph_interface(encoder_model: onnx.ModelProto) -> None:
    assert encoder_model.opset_import[0].version == 18
    assert [i.name for i in encoder_model.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    for value in encoder_model.graph.input:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "seq_len"]
    assert [o.name for o in encoder_model.graph.output] == ["embedding"]


def test_onnx_matches_numpy_reference(session: ort.InferenceSession) -> None:
    reference = NumpyBert()
    expected = np.stack([reference.embed_one(t) for t in TEXTS])
    actual = _onnx_embed(session, TEXTS)
    assert actual.dtype == np.float32 and actual.shape == (len(TEXTS), 384)
    max_abs_diff = float(np.abs(actual - expected).max())
    assert max_abs_diff <= 1e-5, max_abs_diff
    np.testing.assert_allclose(np.linalg.norm(actual, axis=1), 1.0, atol=1e-6)


def test_semantic_similarity(session: ort.InferenceSession) -> None:
    a, b, c = _onnx_embed(
        session,
        [
            "The movie was wonderful and deeply moving.",
            "A truly great film that touched my heart.",
            "The central bank raised interest rates on Tuesday.",
        ],
    )
    assert float(a @ b) > float(a @ c) + 0.2
    assert float(a @ b) > float(b @ c) + 0.2


def test_head_appended_in_graph(encoder_model: onnx.ModelProto, session: ort.InferenceSession) -> None:
    coef = np.linspace(-1.0, 1.0, 384, dtype=np.float32)
    full = append_sentiment_head(encoder_model, coef, 0.25)
    assert [o.name for o in full.graph.output] == ["embedding", "score"]
    scored = ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    from pyflink_aisp.tokenize import BatchEncoder

    enc = BatchEncoder(locate_source_model().tokenizer_path, 128).encode(TEXTS[:3])
    embedding, score = scored.run(["embedding", "score"], enc.model_inputs())
    assert score.shape == (3,) and score.dtype == np.float32
    np.testing.assert_allclose(score, 1 / (1 + np.exp(-(embedding @ coef + 0.25))), atol=1e-6)
    with pytest.raises(ModelError):
        append_sentiment_head(encoder_model, coef[:10], 0.0)


def test_config_read_from_json_and_rejects_unsupported(tmp_path: Any) -> None:
    cfg = locate_source_model().bert_config()
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size) == (
        384,
        6,
        12,
        1536,
    )
    raw = json.loads(locate_source_model().config_path.read_text())
    raw["hidden_act"] = "relu"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelError, match="hidden_act"):
        BertConfig.from_json(tmp_path / "config.json")
