"""ONNX Runtime devices: provider lists with device_id, the device IO binding path, handler device()."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference.handlers import (
    ExecutionProvider,
    OnnxEncoderHandler,
    OnnxEncoderModel,
    OnnxSentimentModel,
    SentimentHandler,
)
from pyflink_aisp.inference.handlers._onnx import normalize_providers, provider_device
from pyflink_aisp.inference.handlers._onnx_binding import DeviceIO, parse_ort_device
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


# -- device IO binding (DeviceIO) on the CPU provider: the CUDA code path with device ("cpu", 0) ---------


@pytest.fixture(scope="module")
def small_session(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    """A two-input, two-output token graph: masked = float(ids * mask), total = sum(masked, axis 1)."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq_len"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq_len"])
    masked = helper.make_tensor_value_info("masked", TensorProto.FLOAT, ["batch", "seq_len"])
    total = helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch"])
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["product"]),
        helper.make_node("Cast", ["product"], ["masked"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["masked", "axes"], ["total"], keepdims=0),
    ]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(nodes, "small", [ids, mask], [masked, total], initializer=[axes])
    path = tmp_path_factory.mktemp("small-graph") / "small.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return ort.InferenceSession(str(path), providers=[CPU])


def _feed(rng: np.random.Generator, batch: int, seq_len: int) -> dict[str, np.ndarray]:
    return {"input_ids": rng.integers(0, 30_000, (batch, seq_len), dtype=np.int64),
            "attention_mask": (rng.random((batch, seq_len)) < 0.8).astype(np.int64)}


def test_device_io_gives_session_run_outputs_for_new_and_repeated_shapes(
    small_session: ort.InferenceSession,
) -> None:
    io = DeviceIO(small_session, ["masked", "total"], "cpu")
    assert (io.device_type, io.device_id) == ("cpu", 0)
    rng = np.random.default_rng(0)
    for batch, seq_len in [(4, 7), (4, 7), (1, 3), (4, 7), (16, 32)]:  # (4, 7) refills a kept value
        feed = _feed(rng, batch, seq_len)
        masked, total = io.run(feed)
        expected_masked, expected_total = small_session.run(["masked", "total"], feed)
        np.testing.assert_array_equal(masked, expected_masked)
        np.testing.assert_array_equal(total, expected_total)
    assert io.cached_keys() == [  # least recently used first, one value per input x shape
        ("input_ids", (1, 3), "<i8"), ("attention_mask", (1, 3), "<i8"),
        ("input_ids", (4, 7), "<i8"), ("attention_mask", (4, 7), "<i8"),
        ("input_ids", (16, 32), "<i8"), ("attention_mask", (16, 32), "<i8"),
    ]


def test_device_io_never_writes_into_the_callers_arrays(small_session: ort.InferenceSession) -> None:
    # On the CPU ortvalue_from_numpy wraps the array; a kept wrapper refilled by update_inplace would
    # overwrite the first caller's (pooled) buffer with the second caller's rows.
    io = DeviceIO(small_session, ["total"], "cpu")
    rng = np.random.default_rng(1)
    first, second = _feed(rng, 3, 5), _feed(rng, 3, 5)
    kept = {name: array.copy() for name, array in first.items()}
    (first_total,) = io.run(first)
    (second_total,) = io.run(second)
    for name, array in first.items():
        np.testing.assert_array_equal(array, kept[name])
    np.testing.assert_array_equal(first_total, small_session.run(["total"], kept)[0])
    np.testing.assert_array_equal(second_total, small_session.run(["total"], second)[0])


def test_device_io_keeps_at_most_max_cached_values(small_session: ort.InferenceSession) -> None:
    rng = np.random.default_rng(2)
    io = DeviceIO(small_session, ["total"], "cpu", max_cached_values=2)
    for seq_len in (2, 3, 4):
        io.run(_feed(rng, 2, seq_len))
    assert io.cached_keys() == [("input_ids", (2, 4), "<i8"), ("attention_mask", (2, 4), "<i8")]
    none_kept = DeviceIO(small_session, ["total"], "cpu", max_cached_values=0)
    none_kept.run(_feed(rng, 2, 2))
    assert none_kept.cached_keys() == []


def test_device_io_threads_keep_their_own_values(small_session: ort.InferenceSession) -> None:
    io = DeviceIO(small_session, ["total"], "cpu")
    feeds = [_feed(np.random.default_rng(seed), 8, 16) for seed in range(16)]  # one shape: shared if global
    expected = [small_session.run(["total"], feed)[0] for feed in feeds]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda feed: [io.run(feed)[0] for _ in range(20)], feeds))
    for got, want in zip(results, expected, strict=True):
        for total in got:
            np.testing.assert_array_equal(total, want)
    assert io.cached_keys() == []  # this thread ran nothing


@pytest.mark.parametrize(
    ("device", "parsed"), [("cpu", ("cpu", 0)), ("cuda", ("cuda", 0)), ("cuda:3", ("cuda", 3))]
)
def test_parse_ort_device(device: str, parsed: tuple[str, int]) -> None:
    assert parse_ort_device(device) == parsed


@pytest.mark.parametrize("device", ["gpu", "cpu:0", "cuda:-1", "cuda:x", "mps"])
def test_parse_ort_device_rejects(device: str) -> None:
    with pytest.raises(ConfigError):
        parse_ort_device(device)


def test_device_io_rejects_bad_arguments(small_session: ort.InferenceSession) -> None:
    with pytest.raises(ConfigError):
        DeviceIO(small_session, [], "cpu")
    with pytest.raises(ConfigError):
        DeviceIO(small_session, "total", "cpu")  # a bare string is not a list of names
    with pytest.raises(ConfigError):
        DeviceIO(small_session, ["total"], "cpu", max_cached_values=-1)


def test_encoder_model_with_device_io_embeds_as_session_run(quick_assets: ModelAssets) -> None:
    handler = OnnxEncoderHandler(model_path=quick_assets.onnx_path,
                                 tokenizer_path=quick_assets.tokenizer_path, output="embedding",
                                 pooling="none", intra_op_num_threads=2)
    plain = handler.load_model()
    assert plain.io is None  # CPU provider: session.run
    bound = OnnxEncoderModel(plain.session, plain.tokenizer, feeds=plain.feeds, output=plain.output,
                             pooling=plain.pooling, normalize=plain.normalize,
                             io=DeviceIO(plain.session, [plain.output], "cpu"))
    tokens = plain.tokenizer.encode(TEXTS)
    for rows in (np.arange(5), np.array([4, 0, 2])):
        with plain.tokenizer.pad(tokens, rows) as padded:
            np.testing.assert_array_equal(bound.embed(padded), plain.embed(padded))


def test_predict_rows_beyond_the_tensorrt_profile_runs_in_chunks(quick_assets: ModelAssets) -> None:
    model = OnnxSentimentModel(quick_assets, intra_op_num_threads=2, io_binding=True)
    tokens = model.encode(TEXTS)
    rows = np.array([4, 2, 0, 1, 3])
    scores, embeddings = model.predict_rows(tokens, rows)
    model._max_rows = 2  # as a TensorRT session with max_batch_size=2 (no TensorRT here)
    chunked_scores, chunked_embeddings = model.predict_rows(tokens, rows)
    assert chunked_scores.shape == (5,) and chunked_embeddings.shape == (5, 384)
    np.testing.assert_allclose(chunked_scores, scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(chunked_embeddings, embeddings, rtol=1e-5, atol=1e-6)
