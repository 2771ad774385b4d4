"""TensorRT execution provider options: shape profiles, engine and timing cache, fp16.

Pure functions: they build the provider options a TensorRT session gets, and
open nothing. Names and formats are ONNX Runtime's, "TensorRT Execution
Provider", section "Configurations"
(https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html):

- ``trt_profile_min_shapes`` / ``trt_profile_opt_shapes`` / ``trt_profile_max_shapes``:
  ``"input1:dim1xdim2,input2:dim1xdim2"``, one explicit optimization profile for
  EVERY dynamic-shape input (ORT requires all of them or none). The engine is built
  once for the whole range (batch 1..max batch, sequence 1..max length) and tuned
  at the opt shape, instead of being rebuilt whenever a batch falls outside the
  shapes seen so far.
- ``trt_engine_cache_enable`` / ``trt_engine_cache_path``: the built engine (and its
  ``.profile``) are saved and loaded by the next session of the same model;
  ``trt_timing_cache_enable`` / ``trt_timing_cache_path``: kernel timings shared by
  later builds. ORT checks the saved profile against the requested one and rebuilds
  when they differ.
- ``trt_fp16_enable``: let TensorRT choose fp16 kernels (precision fp16 only).

The cache lives under the project's home (:func:`pyflink_aisp.home.aisp_home`):
``trt-cache/<model sha256>/<precision>-ort<onnxruntime version>``; the ORT docs ask
to clear the cache when the model, ORT or TensorRT version, or the hardware
changes, and a new ORT version or model gets a new directory here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import onnxruntime as ort

from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.home import aisp_home

__all__ = [
    "DEFAULT_TRT_MAX_BATCH",
    "DEFAULT_TRT_OPT_LENGTH",
    "PROFILE_KEYS",
    "TENSORRT_PRECISIONS",
    "TensorrtSettings",
    "graph_input_shapes",
    "tensorrt_cache_dir",
    "tensorrt_profiles",
    "tensorrt_provider_options",
    "with_tensorrt_defaults",
]

_TENSORRT = "TensorrtExecutionProvider"
#: The three profile options: given together or not at all (a user's set replaces the defaults whole).
PROFILE_KEYS = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")
#: Profile max batch when the caller names none: the largest batch of the H200 runs in issue 23.
DEFAULT_TRT_MAX_BATCH = 1024
#: Typical padded length, the profile's opt sequence length: Rotten Tomatoes snippets have a median of
#: 26 MiniLM tokens, p90 42, p99 55 (12,808 reviews), and a batch is padded to its longest row.
DEFAULT_TRT_OPT_LENGTH = 48
TENSORRT_PRECISIONS = ("fp32", "fp16")

#: A graph input: name and dims (None: a dynamic dim).
InputShape = tuple[str, tuple[int | None, ...]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorrtSettings:
    """What the TensorRT options are built from.

    Attributes:
        max_batch_size: Largest batch the session runs (profile max, rows).
        opt_batch_size: Batch TensorRT tunes for (the handler's batch size, rows).
        max_length: Longest sequence (profile max, tokens).
        opt_length: Sequence length TensorRT tunes for (tokens).
        cache_dir: Engine and timing cache directory.
        precision: ``"fp32"`` or ``"fp16"`` (sets ``trt_fp16_enable``).

    Raises:
        ConfigError: A size < 1, an opt above its max, or another precision.
    """

    max_batch_size: int
    opt_batch_size: int
    max_length: int
    opt_length: int
    cache_dir: Path
    precision: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "opt_batch_size", "max_length", "opt_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TensorRT {name} must be >= 1, got {getattr(self, name)}")
        if self.opt_batch_size > self.max_batch_size or self.opt_length > self.max_length:
            raise ConfigError(f"TensorRT opt shape {self.opt_batch_size}x{self.opt_length} exceeds the max "
                              f"{self.max_batch_size}x{self.max_length}")
        if self.precision not in TENSORRT_PRECISIONS:
            raise ConfigError(f"TensorRT precision must be one of {TENSORRT_PRECISIONS}, "
                              f"got {self.precision!r}")


def tensorrt_cache_dir(model_sha256: str, precision: str = "fp32", home: Path | None = None) -> Path:
    """``<home>/trt-cache/<model_sha256>/<precision>-ort<onnxruntime version>`` (not created).

    Args:
        model_sha256: sha256 of the ``.onnx`` file.
        precision: ``"fp32"`` or ``"fp16"`` (an fp16 engine is another engine).
        home: The state directory; None: :func:`~pyflink_aisp.home.aisp_home`.
    """
    return (home or aisp_home()) / "trt-cache" / model_sha256 / f"{precision}-ort{ort.__version__}"


def graph_input_shapes(path: Path) -> tuple[InputShape, ...]:
    """Name and dims of each graph input of an ``.onnx`` file (initializers excluded).

    Reads the graph without its external data. A dim with a symbolic name or no
    value is dynamic (None).

    Raises:
        ModelError: The file cannot be read as an ONNX model.
    """
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # onnx raises DecodeError / OSError
        raise ModelError(f"cannot read the graph inputs of {path}: {exc}") from exc
    weights = {init.name for init in graph.initializer}
    return tuple(
        (value.name, tuple(d.dim_value if d.HasField("dim_value") else None
                           for d in value.type.tensor_type.shape.dim))
        for value in graph.input if value.name not in weights
    )


def tensorrt_profiles(inputs: Sequence[InputShape], settings: TensorrtSettings) -> dict[str, str]:
    """The three profile options for every input with a dynamic dim.

    Each such input must be ``(batch, sequence)``: dim 0 ranges over
    1..``max_batch_size`` (opt ``opt_batch_size``), dim 1 over 1..``max_length``
    (opt ``opt_length``); a static dim keeps its value in all three.

    Args:
        inputs: From :func:`graph_input_shapes`.
        settings: The ranges.

    Returns:
        ``{"trt_profile_min_shapes": "input_ids:1x1,...", ...}``; ``{}`` when no input is dynamic.

    Raises:
        ModelError: A dynamic input that is not of rank 2 (give your own ``trt_profile_*`` options).
    """
    ranges = ((1, settings.opt_batch_size, settings.max_batch_size),
              (1, settings.opt_length, settings.max_length))
    shapes: tuple[list[str], list[str], list[str]] = ([], [], [])
    for name, dims in inputs:
        if all(dim is not None for dim in dims):
            continue
        if len(dims) != 2:
            raise ModelError(f"cannot derive a TensorRT profile for input {name!r} of dims {dims} (expected "
                             f"(batch, sequence)); pass trt_profile_* provider options")
        for which, shape in enumerate(shapes):
            shape.append(name + ":" + "x".join(str(ranges[axis][which] if dim is None else dim)
                                               for axis, dim in enumerate(dims)))
    if not shapes[0]:
        return {}
    return {key: ",".join(shape) for key, shape in zip(PROFILE_KEYS, shapes, strict=True)}


def tensorrt_provider_options(inputs: Sequence[InputShape], settings: TensorrtSettings) -> dict[str, str]:
    """Default TensorRT provider options: profiles, engine + timing cache, fp16 switch.

    Args:
        inputs: From :func:`graph_input_shapes`.
        settings: Ranges, cache directory and precision.

    Raises:
        ModelError: As :func:`tensorrt_profiles`.
    """
    cache = str(settings.cache_dir)
    return {
        **tensorrt_profiles(inputs, settings),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": cache,
        "trt_fp16_enable": "True" if settings.precision == "fp16" else "False",
    }


def with_tensorrt_defaults(
    providers: Sequence[tuple[str, Mapping[str, object]]], defaults: Mapping[str, str]
) -> tuple[tuple[str, dict[str, object]], ...]:
    """The provider list with ``defaults`` under each TensorRT entry's own options.

    A user's option wins over a default of the same name; a user who sets any of
    :data:`PROFILE_KEYS` replaces the default profiles whole (ORT takes the three
    together). Other providers are returned unchanged.

    Args:
        providers: ``(name, options)`` pairs (:func:`~pyflink_aisp.inference.normalize_providers`).
        defaults: From :func:`tensorrt_provider_options`.
    """
    result = []
    for name, options in providers:
        merged = dict(options)
        if name == _TENSORRT:
            own_profile = any(key in options for key in PROFILE_KEYS)
            merged = {key: value for key, value in defaults.items()
                      if not (own_profile and key in PROFILE_KEYS)} | merged
        result.append((name, merged))
    return tuple(result)
