"""ONNX Runtime devices: provider lists with device_id, IO binding path, handler device()."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference.handlers import ExecutionProvider, OnnxSentimentModel, SentimentHandler
from pyflink_aisp.inference.handlers._onnx import normalize_providers, provider_device
from pyflink_aisp.models import ModelAssets

CUDA, TRT, CPU = "CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"
TEXTS = [
    "A gorgeous, witty, seductive movie.",
    "Dull.",
    "The plot makes no sense and the jokes fall flat, but the cast tries hard. " * 3,
    "",
    "Wonderful!",
]


def test_io_binding_path_gives_the_same_numbers_on_cpu(quick_assets: ModelAssets) -> None:
    plain = OnnxSentimentModel(quick_assets, intra_op_num_threads=2, batch_size=2)
    bound = OnnxSentimentModel(quick_assets, intra_op_num_threads=2, batch_size=2, io_binding=True)
    assert not plain.uses_io_binding and bound.uses_io_binding
    assert plain.device == bound.device == "cpu"
    scores, embeddings = plain.predict(TEXTS)
    bound_scores, bound_embeddings = bound.predict(TEXTS)
    np.testing.assert_array_equal(bound_scores, scores)
    np.testing.assert_array_equal(bound_embeddings, embeddings)
    assert bound_scores.shape == (5,) and bound_embeddings.shape == (5, 384)
    empty_scores, empty_embeddings = bound.predict([])
    assert empty_scores.shape == (0,) and empty_embeddings.shape == (0, 384)


def test_normalize_providers_sets_device_id_on_gpu_providers() -> None:
    pairs = normalize_providers([TRT, (CUDA, {"arena_extend_strategy": "kSameAsRequested"}), CPU], 2)
    assert pairs == (
        (TRT, {"device_id": 2}),
        (CUDA, {"arena_extend_strategy": "kSameAsRequested", "device_id": 2}),
        (CPU, {}),
    )
    assert normalize_providers([(CUDA, {"device_id": 1})], 1) == ((CUDA, {"device_id": 1}),)
    assert normalize_providers([ExecutionProvider.CPU]) == ((CPU, {}),)


@pytest.mark.parametrize(
    ("providers", "device_id"),
    [
        ([CPU], 0),  # device_id without a GPU provider
        ([CUDA], -1),
        ([(CUDA, {"device_id": 1})], 0),  # contradicts the provider's own option
        (["NoSuchExecutionProvider"], None),
        ([], None),
        (CPU, None),  # a bare string is not a list of providers
    ],
)
def test_normalize_providers_rejects(providers: object, device_id: int | None) -> None:
    with pytest.raises(ConfigError):
        normalize_providers(providers, device_id)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("providers", "device"),
    [
        ([CPU], "cpu"),
        ([CUDA, CPU], "cuda:0"),
        ([(CUDA, {"device_id": 3}), CPU], "cuda:3"),
        ([(TRT, {"device_id": "1"}), (CUDA, {"device_id": "1"})], "cuda:1"),
        ([CPU, CUDA], "cpu"),  # the first provider decides
    ],
)
def test_provider_device(providers: list[object], device: str) -> None:
    assert provider_device(providers) == device  # type: ignore[arg-type]


def test_sentiment_handler_device_and_providers(quick_assets: ModelAssets) -> None:
    cpu = SentimentHandler(quick_assets)
    assert cpu.device() == "cpu" and cpu.providers == [CPU]
    gpu = SentimentHandler(quick_assets, providers=[ExecutionProvider.CUDA, CPU], device_id=1)
    assert gpu.device() == "cuda:1" and gpu.providers == [CUDA, CPU]
    copy = pickle.loads(pickle.dumps(gpu))
    assert copy.device() == "cuda:1" and copy.providers == [CUDA, CPU]
    with pytest.raises(ConfigError):
        SentimentHandler(quick_assets, device_id=0)  # CPU only


def test_cuda_handler_without_that_device_fails_to_load(quick_assets: ModelAssets) -> None:
    # CPU-only onnxruntime: provider unavailable; GPU build: no device 99, so ORT drops CUDA.
    handler = SentimentHandler(quick_assets, providers=[CUDA, CPU], device_id=99)
    with pytest.raises(ModelError, match=r"refusing to fall back|cannot load"):
        handler.load_model()


def test_cpu_handler_loads_and_scores(quick_assets: ModelAssets) -> None:
    handler = SentimentHandler(quick_assets, intra_op_num_threads=2)
    model = handler.load_model()
    assert model.device == "cpu" and not model.uses_io_binding
    (score, embedding), _ = handler.run_inference(["Wonderful!", "Dull."], model)
    assert 0.0 < score < 1.0 and embedding.shape == (384,)
