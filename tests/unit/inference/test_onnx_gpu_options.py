"""TensorRT provider options (profiles, engine/timing cache, fp16) as exact values, and the sentiment
session that receives them (ORT's session constructor replaced: no TensorRT on this host)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.inference.handlers._onnx_trt import (
    PROFILE_KEYS,
    TensorrtSettings,
    graph_input_shapes,
    tensorrt_cache_dir,
    tensorrt_profiles,
    tensorrt_provider_options,
    with_tensorrt_defaults,
)
from pyflink_aisp.models import ModelAssets

CUDA, TRT, CPU = "CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"
TOKENS = (("input_ids", (None, None)), ("attention_mask", (None, None)))


def _settings(tmp_path: Path, **changes: Any) -> TensorrtSettings:
    values: dict[str, Any] = {"max_batch_size": 256, "opt_batch_size": 32, "max_length": 128,
                              "opt_length": 48, "cache_dir": tmp_path / "cache"}
    return TensorrtSettings(**(values | changes))


def test_profiles_cover_batch_and_sequence_of_every_dynamic_input(tmp_path: Path) -> None:
    inputs = (*TOKENS, ("token_type_ids", (None, 128)), ("scale", (1,)))  # static dims kept / skipped
    assert tensorrt_profiles(inputs, _settings(tmp_path)) == {
        "trt_profile_min_shapes": "input_ids:1x1,attention_mask:1x1,token_type_ids:1x128",
        "trt_profile_opt_shapes": "input_ids:32x48,attention_mask:32x48,token_type_ids:32x128",
        "trt_profile_max_shapes": "input_ids:256x128,attention_mask:256x128,token_type_ids:256x128",
    }
    assert tensorrt_profiles((("x", (4, 8)),), _settings(tmp_path)) == {}  # nothing dynamic
    with pytest.raises(ModelError, match="pixels"):
        tensorrt_profiles((("pixels", (None, 3, 224, 224)),), _settings(tmp_path))


@pytest.mark.parametrize(("precision", "fp16"), [("fp32", "False"), ("fp16", "True")])
def test_provider_options_are_profiles_cache_and_precision(tmp_path: Path, precision: str, fp16: str) -> None:
    options = tensorrt_provider_options(TOKENS, _settings(tmp_path, precision=precision))
    cache = str(tmp_path / "cache")
    assert options == {
        "trt_profile_min_shapes": "input_ids:1x1,attention_mask:1x1",
        "trt_profile_opt_shapes": "input_ids:32x48,attention_mask:32x48",
        "trt_profile_max_shapes": "input_ids:256x128,attention_mask:256x128",
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": cache,
        "trt_fp16_enable": fp16,
    }


@pytest.mark.parametrize(
    "changes",
    [{"max_batch_size": 0}, {"opt_length": 0}, {"opt_batch_size": 512}, {"opt_length": 129},
     {"precision": "bf16"}],
)
def test_settings_reject(tmp_path: Path, changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        _settings(tmp_path, **changes)


def test_cache_dir_is_under_home_per_model_precision_and_ort_version(tmp_path: Path) -> None:
    assert tensorrt_cache_dir("ab" * 32, "fp16", home=tmp_path) == (
        tmp_path / "trt-cache" / ("ab" * 32) / f"fp16-ort{ort.__version__}")
    assert not (tmp_path / "trt-cache").exists()  # a path, not a directory made


def test_user_options_win_and_a_user_profile_replaces_the_default_whole() -> None:
    defaults = {"trt_profile_min_shapes": "a:1x1", "trt_profile_opt_shapes": "a:8x8",
                "trt_profile_max_shapes": "a:9x9", "trt_fp16_enable": "False",
                "trt_engine_cache_enable": "True"}
    providers: tuple[tuple[str, dict[str, object]], ...] = (
        (TRT, {"device_id": 1, "trt_fp16_enable": "True"}), (CUDA, {"device_id": 1}), (CPU, {}))
    assert with_tensorrt_defaults(providers, defaults) == (
        (TRT, {"trt_profile_min_shapes": "a:1x1", "trt_profile_opt_shapes": "a:8x8",
               "trt_profile_max_shapes": "a:9x9", "trt_fp16_enable": "True",
               "trt_engine_cache_enable": "True", "device_id": 1}),
        (CUDA, {"device_id": 1}),
        (CPU, {}),
    )
    own = {"trt_profile_min_shapes": "a:2x2", "trt_profile_opt_shapes": "a:4x4",
           "trt_profile_max_shapes": "a:6x6"}
    ((_, merged),) = with_tensorrt_defaults(((TRT, own),), defaults)
    assert merged == {**own, "trt_fp16_enable": "False", "trt_engine_cache_enable": "True"}
    assert {key: merged[key] for key in PROFILE_KEYS} == own
    assert with_tensorrt_defaults(((CUDA, {}),), defaults) == ((CUDA, {}),)


def test_graph_input_shapes_reads_dynamic_dims_without_initializers(tmp_path: Path) -> None:
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq_len"])
    fixed = helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4])
    unnamed = helper.make_tensor_value_info("mask", TensorProto.INT64, [None, 16])
    out = helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", "seq_len"])
    weight = helper.make_tensor("bias", TensorProto.FLOAT, [4], [0.0] * 4)
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["y"])], "g",
                              [ids, fixed, unnamed], [out], initializer=[weight])
    path = tmp_path / "g.onnx"
    onnx.save_model(helper.make_model(graph), str(path))
    assert graph_input_shapes(path) == (("input_ids", (None, None)), ("mask", (None, 16)))
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelError, match=r"bad\.onnx"):
        graph_input_shapes(tmp_path / "bad.onnx")


def _capture_session_args(monkeypatch: pytest.MonkeyPatch, home: Path) -> dict[str, Any]:
    """Every provider available, and ORT's session constructor recording its arguments then failing."""
    seen: dict[str, Any] = {}

    def fake_session(path: str, *, sess_options: Any, providers: list[str],
                     provider_options: list[dict[str, object]]) -> None:
        seen.update(path=path, providers=providers, provider_options=provider_options)
        raise RuntimeError("no TensorRT on this host")

    monkeypatch.setenv("AISP_HOME", str(home))
    monkeypatch.setattr(ort, "get_available_providers", ort.get_all_providers)
    monkeypatch.setattr(ort, "InferenceSession", fake_session)
    return seen


def test_tensorrt_sentiment_session_gets_the_defaults_under_the_users_options(
    quick_assets: ModelAssets, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen = _capture_session_args(monkeypatch, tmp_path)
    user = {"trt_fp16_enable": "False", "trt_max_workspace_size": "1073741824"}
    with pytest.raises(ModelError, match="no TensorRT on this host"):
        OnnxSentimentModel(quick_assets, providers=[(TRT, user), CUDA], device_id=0, batch_size=32,
                           precision="fp16", verify=False)
    cache = tmp_path.resolve() / "trt-cache" / quick_assets.sha256 / f"fp16-ort{ort.__version__}"
    assert cache.is_dir()
    names = ("input_ids", "attention_mask", "token_type_ids")
    assert seen["providers"] == [TRT, CUDA]
    assert seen["provider_options"] == [
        {"trt_profile_min_shapes": ",".join(f"{n}:1x1" for n in names),
         "trt_profile_opt_shapes": ",".join(f"{n}:32x48" for n in names),
         "trt_profile_max_shapes": ",".join(f"{n}:1024x128" for n in names),
         "trt_engine_cache_enable": "True", "trt_engine_cache_path": str(cache),
         "trt_timing_cache_enable": "True", "trt_timing_cache_path": str(cache),
         "trt_fp16_enable": "False",  # the user's option wins over precision fp16
         "trt_max_workspace_size": "1073741824", "device_id": 0},
        {"device_id": 0},
    ]


def test_cuda_sentiment_session_gets_no_tensorrt_options(
    quick_assets: ModelAssets, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen = _capture_session_args(monkeypatch, tmp_path)
    with pytest.raises(ModelError):
        OnnxSentimentModel(quick_assets, providers=[CUDA], device_id=2, max_batch_size=4096, verify=False)
    assert seen["provider_options"] == [{"device_id": 2}]
    assert not (tmp_path / "trt-cache").exists()


@pytest.mark.parametrize(
    ("providers", "kwargs"),
    [([CPU], {"precision": "fp16"}),  # fp16 is a TensorRT switch
     ([CUDA], {"precision": "fp16"}),
     ([TRT, CUDA], {"precision": "bf16"}),
     ([TRT, CUDA], {"batch_size": 64, "max_batch_size": 32})],
)
def test_sentiment_model_rejects_tensorrt_settings(
    quick_assets: ModelAssets, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    providers: list[str], kwargs: dict[str, Any],
) -> None:
    seen = _capture_session_args(monkeypatch, tmp_path)
    with pytest.raises(ConfigError):
        OnnxSentimentModel(quick_assets, providers=providers, verify=False, **kwargs)
    assert seen == {}  # refused before any session
