"""Tests for OnnxSentimentModel (CPU; provider errors without a GPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest

import pyflink_aisp.inference as inference_area
from pyflink_aisp.errors import ChecksumError, ConfigError, ModelError, TokenizeError
from pyflink_aisp.inference.handlers import ExecutionProvider, OnnxSentimentModel
from pyflink_aisp.models import ModelAssets

# deliberately unsorted lengths
TEXTS = [
    "An utterly charming, beautifully acted film " * 8,
    "Dull.",
    "The plot makes no sense and the jokes fall flat, but the cast tries hard.",
    "",
    "Wonderful!",
    "A long, winding, self-indulgent mess of a movie " * 20,
    "Funny and warm.",
]


@pytest.fixture(scope="module")
def model(quick_assets: ModelAssets) -> OnnxSentimentModel:
    return OnnxSentimentModel(quick_assets, intra_op_num_threads=2, batch_size=3)


def test_all_names_exist() -> None:
    for name in inference_area.__all__:
        assert hasattr(inference_area, name), name


def test_predict_shapes_and_dtypes(model: OnnxSentimentModel) -> None:
    scores, embeddings = model.predict(TEXTS)
    assert scores.shape == (len(TEXTS),) and scores.dtype == np.float32
    assert embeddings.shape == (len(TEXTS), 384) and embeddings.dtype == np.float32
    assert ((scores > 0) & (scores < 1)).all()
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    assert model.providers == ["CPUExecutionProvider"]
    assert model.model_version == model.assets.sha256


def test_predict_keeps_input_order(model: OnnxSentimentModel) -> None:
    scores, embeddings = model.predict(TEXTS)
    for i, text in enumerate(TEXTS):  # each alone: no padding, no bucketing
        alone_scores, alone_embeddings = model.predict([text])
        np.testing.assert_allclose(embeddings[i], alone_embeddings[0], atol=1e-5)
        np.testing.assert_allclose(scores[i], alone_scores[0], atol=1e-5)
    reversed_scores, _ = model.predict(TEXTS[::-1])
    np.testing.assert_allclose(reversed_scores[::-1], scores, atol=1e-5)


def test_predict_empty(model: OnnxSentimentModel) -> None:
    scores, embeddings = model.predict([])
    assert scores.shape == (0,) and embeddings.shape == (0, 384)


def test_predict_rejects_non_str(model: OnnxSentimentModel) -> None:
    with pytest.raises(TokenizeError):
        model.predict(["fine", None])  # type: ignore[list-item]


def test_unknown_provider_raises(quick_assets: ModelAssets) -> None:
    with pytest.raises(ConfigError, match="unknown execution provider"):
        OnnxSentimentModel(quick_assets, providers=["NoSuchExecutionProvider"])
    with pytest.raises(ConfigError):
        OnnxSentimentModel(quick_assets, providers=[])


def test_unavailable_provider_raises_without_fallback(quick_assets: ModelAssets) -> None:
    missing = [p for p in ort.get_all_providers() if p not in ort.get_available_providers()]
    if ExecutionProvider.CUDA in missing:
        missing = [ExecutionProvider.CUDA]
    # no onnxruntime build ships every provider (get_all_providers lists them all)
    assert missing, "this onnxruntime build claims every execution provider"
    with pytest.raises(ModelError, match="not available"):
        OnnxSentimentModel(quick_assets, providers=[missing[0], ExecutionProvider.CPU])


def test_bad_config_raises(quick_assets: ModelAssets) -> None:
    with pytest.raises(ConfigError):
        OnnxSentimentModel(quick_assets, intra_op_num_threads=0)
    with pytest.raises(ConfigError):
        OnnxSentimentModel(quick_assets, batch_size=0)


def test_checksum_checked_on_load(quick_assets: ModelAssets) -> None:
    wrong = dataclasses.replace(quick_assets, sha256="0" * 64)
    with pytest.raises(ChecksumError):
        OnnxSentimentModel(wrong)


@pytest.mark.parametrize(("allow", "entry"), [(True, "1"), (False, "0")])
def test_allow_spinning_is_set_on_the_session(quick_assets, allow, entry):
    from pyflink_aisp.inference.handlers import OnnxSentimentModel

    model = OnnxSentimentModel(quick_assets, intra_op_num_threads=1, allow_spinning=allow)
    options = model._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == entry
    scores, _ = model.predict(["fine"])
    assert scores.shape == (1,)
