"""TorchSentimentHandler: parity with the ONNX model on real reviews, devices, file checks."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.datasets import Review, load_rotten_tomatoes, split_reviews
from pyflink_aisp.errors import ChecksumError, ConfigError, ModelError, TokenizeError
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.inference.handlers._torch import (
    TorchSentimentHandler,
    TorchSentimentModel,
    parse_torch_device,
    read_head,
)
from pyflink_aisp.models import ModelAssets, locate_source_model

PARITY_ATOL = 1e-5


@pytest.fixture(scope="module")
def heldout() -> list[Review]:
    """200 held-out Rotten Tomatoes snippets, in file order (mixed lengths)."""
    return split_reviews(load_rotten_tomatoes())[1][:200]


@pytest.fixture(scope="module")
def reviews(heldout: list[Review]) -> list[str]:
    return [r.text for r in heldout]


@pytest.fixture(scope="module")
def handler(model_assets: ModelAssets) -> TorchSentimentHandler:
    return TorchSentimentHandler(model_assets, intra_op_num_threads=2)


@pytest.fixture(scope="module")
def torch_model(handler: TorchSentimentHandler) -> TorchSentimentModel:
    return handler.load_model()


@pytest.fixture(scope="module")
def onnx_model(model_assets: ModelAssets) -> OnnxSentimentModel:
    return OnnxSentimentModel(model_assets, intra_op_num_threads=2)


def test_parity_with_onnx_on_real_reviews(
    torch_model: TorchSentimentModel, onnx_model: OnnxSentimentModel, heldout: list[Review]
) -> None:
    reviews = [r.text for r in heldout]
    t_scores, t_embeddings = torch_model.predict(reviews)
    o_scores, o_embeddings = onnx_model.predict(reviews)
    assert t_scores.shape == (200,) and t_scores.dtype == np.float32
    assert t_embeddings.shape == (200, 384) and t_embeddings.dtype == np.float32
    assert float(np.abs(t_scores - o_scores).max()) <= PARITY_ATOL
    assert float(np.abs(t_embeddings - o_embeddings).max()) <= PARITY_ATOL
    np.testing.assert_allclose(np.linalg.norm(t_embeddings, axis=1), 1.0, atol=1e-5)
    labels = np.array([r.label for r in heldout])
    accuracy = float(((t_scores >= 0.5) == (labels == 1)).mean())
    assert accuracy >= 0.7  # the head's held-out accuracy is 0.769 (majority class 0.58)


def test_parity_holds_for_another_sub_batch_size(
    model_assets: ModelAssets, torch_model: TorchSentimentModel, reviews: list[str]
) -> None:
    small = TorchSentimentHandler(model_assets, batch_size=7, intra_op_num_threads=2).load_model()
    scores, embeddings = small.predict(reviews[:50])
    ref_scores, ref_embeddings = torch_model.predict(reviews[:50])
    np.testing.assert_allclose(scores, ref_scores, atol=PARITY_ATOL)
    np.testing.assert_allclose(embeddings, ref_embeddings, atol=PARITY_ATOL)


def test_handler_predictions_match_sentiment_handler_shape(
    handler: TorchSentimentHandler, torch_model: TorchSentimentModel, reviews: list[str]
) -> None:
    out = handler.run_inference(reviews[:3], torch_model)
    assert len(out) == 3
    for score, embedding in out:
        assert isinstance(score, float) and 0.0 < score < 1.0
        assert embedding.shape == (384,) and embedding.dtype == np.float32
    assert handler.run_inference([], torch_model) == []
    assert handler.example_tokens("Dull.", torch_model) == 4  # [CLS] dull . [SEP]
    with pytest.raises(TokenizeError):
        torch_model.predict(["fine", None])  # type: ignore[list-item]


def test_head_is_the_onnx_head(model_assets: ModelAssets, torch_model: TorchSentimentModel) -> None:
    coef, intercept = read_head(model_assets.onnx_path, 384)
    assert coef.shape == (384,) and coef.dtype == np.float32 and np.abs(coef).max() > 0.1
    assert isinstance(intercept, float)


def test_model_version_is_documented_digest(
    model_assets: ModelAssets, handler: TorchSentimentHandler
) -> None:
    weights_sha = sha256_file(locate_source_model().weights_path)
    config_sha = sha256_file(locate_source_model().directory / "config.json")
    tag = f"pyflink-aisp/torch-sentiment/1\n{weights_sha}\n{model_assets.sha256}\n{config_sha}\n"
    assert handler.model_version() == hashlib.sha256(tag.encode()).hexdigest()
    assert handler.model_version() != model_assets.sha256
    other = TorchSentimentHandler(model_assets, weights_sha256="0" * 64)
    assert other.model_version() != handler.model_version()


@pytest.mark.parametrize(
    ("given", "normal"), [("cpu", "cpu"), ("cuda", "cuda:0"), ("CUDA:1", "cuda:1"), (" cuda:12 ", "cuda:12")]
)
def test_parse_torch_device(given: str, normal: str) -> None:
    assert parse_torch_device(given) == normal


@pytest.mark.parametrize("bad", ["gpu", "mps", "cuda:-1", "cuda:x", "cpu:0", ""])
def test_parse_torch_device_rejects(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_torch_device(bad)


def test_device_is_reported_without_loading(model_assets: ModelAssets) -> None:
    assert TorchSentimentHandler(model_assets).device() == "cpu"
    assert TorchSentimentHandler(model_assets, device="cuda").device() == "cuda:0"
    assert TorchSentimentHandler(model_assets, device="cuda:1").device() == "cuda:1"


def test_unusable_cuda_device_raises_instead_of_cpu(model_assets: ModelAssets) -> None:
    # No CUDA here: "cuda" itself; on a GPU host: one index past the visible devices.
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = f"cuda:{count}" if count else "cuda"
    with pytest.raises(ModelError, match=r"refusing to run on the CPU|only \d+ CUDA device"):
        TorchSentimentHandler(model_assets, device=device).load_model()


def test_bad_arguments(model_assets: ModelAssets) -> None:
    with pytest.raises(ConfigError):
        TorchSentimentHandler(model_assets, batch_size=0)
    with pytest.raises(ConfigError):
        TorchSentimentHandler(model_assets, intra_op_num_threads=0)
    with pytest.raises(ConfigError):
        TorchSentimentHandler(model_assets, weights_sha256="ABC")


def test_assets_without_manifest_need_weights_sha256(quick_assets: ModelAssets) -> None:
    with pytest.raises(ModelError, match="weights_sha256"):
        TorchSentimentHandler(quick_assets)


def _copy_source(tmp_path: Path) -> Path:
    source = locate_source_model()
    for name in ("model.safetensors", "config.json"):
        shutil.copyfile(source.directory / name, tmp_path / name)
    return tmp_path


def _flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


def test_tampered_weights_raise_checksum_error(model_assets: ModelAssets, tmp_path: Path) -> None:
    weights_dir = _copy_source(tmp_path)
    _flip_byte(weights_dir / "model.safetensors", 40_000_000)  # inside a weight tensor
    handler = TorchSentimentHandler(model_assets, weights_dir=weights_dir)
    with pytest.raises(ChecksumError) as info:
        handler.load_model()
    assert info.value.path == str(weights_dir / "model.safetensors")
    assert info.value.expected == sha256_file(locate_source_model().weights_path)


def test_corrupt_weights_with_matching_digest_raise_model_error(
    model_assets: ModelAssets, tmp_path: Path
) -> None:
    weights_dir = _copy_source(tmp_path)
    garbage = weights_dir / "model.safetensors"
    garbage.write_bytes(b"\xff" * 64)  # not a safetensors header
    handler = TorchSentimentHandler(
        model_assets, weights_dir=weights_dir, weights_sha256=sha256_file(garbage)
    )
    with pytest.raises(ModelError, match="cannot read weights") as info:
        handler.load_model()
    assert not isinstance(info.value, ChecksumError)


def test_tampered_head_file_raises_checksum_error(model_assets: ModelAssets, tmp_path: Path) -> None:
    onnx_copy = tmp_path / "model.onnx"
    shutil.copyfile(model_assets.onnx_path, onnx_copy)
    _flip_byte(onnx_copy, onnx_copy.stat().st_size - 100)
    tampered = dataclasses.replace(model_assets, onnx_path=onnx_copy)
    with pytest.raises(ChecksumError):
        TorchSentimentHandler(tampered).load_model()


def test_release_model_drops_the_encoder(handler: TorchSentimentHandler) -> None:
    model = handler.load_model()
    assert model.predict(["ok"])[0].shape == (1,)
    handler.release_model(model)
    assert model.encoder is None
    with pytest.raises(ModelError, match="release_model"):
        model.predict(["ok"])


# -- reduced precision (issue 10.3): torch.autocast, checked at load, part of the version -----------


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_stays_within_the_tolerance_of_fp32_on_real_reviews(
    model_assets: ModelAssets, reviews: list[str], torch_model: TorchSentimentModel, precision: str
) -> None:
    from pyflink_aisp.inference.handlers._torch import PRECISION_TOLERANCE

    reduced = TorchSentimentHandler(model_assets, intra_op_num_threads=2, precision=precision)
    model = reduced.load_model()  # runs the probe check against fp32
    assert model.precision == precision
    scores, embeddings = model.predict(reviews)
    full, _ = torch_model.predict(reviews)
    gap = np.abs(scores - full)
    assert 0 < gap.max() <= PRECISION_TOLERANCE  # it does run in another precision, and stays close
    assert int(((scores >= 0.5) != (full >= 0.5)).sum()) <= 2  # of 200 held-out reviews
    assert embeddings.dtype == np.float32 and np.abs(np.linalg.norm(embeddings, axis=1) - 1).max() < 1e-3
    assert reduced.model_version() != TorchSentimentHandler(model_assets).model_version()


def test_the_precision_is_a_line_of_the_version_and_fp32_keeps_its_digest(model_assets: ModelAssets) -> None:
    fp32 = TorchSentimentHandler(model_assets)
    assert TorchSentimentHandler(model_assets, precision="fp32").model_version() == fp32.model_version()
    versions = {p: TorchSentimentHandler(model_assets, precision=p).model_version() for p in ("bf16", "fp16")}
    assert len({fp32.model_version(), *versions.values()}) == 3
    with pytest.raises(ConfigError, match=r"precision must be one of \['fp32', 'fp16', 'bf16'\], got 'fp8'"):
        TorchSentimentHandler(model_assets, precision="fp8")


def test_a_precision_that_moves_scores_too_far_is_refused_at_load(
    model_assets: ModelAssets, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyflink_aisp.inference.handlers import _torch

    monkeypatch.setattr(_torch, "PRECISION_TOLERANCE", 1e-9)
    with pytest.raises(ModelError, match=r"precision bf16 moves probe scores by .* from float32 \(> 1e-09\)"):
        TorchSentimentHandler(model_assets, intra_op_num_threads=2, precision="bf16").load_model()
