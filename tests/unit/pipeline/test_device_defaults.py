"""Defaults that depend on the device (issue 23.3), the torch runtime's device-path options and what the
handler gets from them: CPU defaults unchanged, CUDA defaults applied, given values always win, and the
"not given" survives job parameters and rebuilding the options."""

from __future__ import annotations

import argparse
import inspect
import json
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchingConfig
from pyflink_aisp.pipeline import (
    OPTIONS,
    InferenceOptions,
    PipelineOptions,
    _handlers,
    flink_settings,
    format_job_parameters,
)
from pyflink_aisp.pipeline._config import add_flags, option
from pyflink_aisp.pipeline._options import Derived, InferenceRuntime, options_markdown

#: The device-aware options: (CPU default, CUDA default).
DEVICE_DEFAULTS = {"max_batch_size": (32, 1024), "max_batch_tokens": (None, 65536),
                   "arrow_batch_size": (1024, 8192)}
TORCH = InferenceRuntime.TORCH


def get_from(params: dict[str, str]) -> Any:
    return lambda key, default: params.get(key, default)


def values(options: InferenceOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in DEVICE_DEFAULTS}


def test_the_device_aware_options_are_the_three_knobs_of_batch_size() -> None:
    assert {o.name for o in OPTIONS if o.device_aware} == set(DEVICE_DEFAULTS)
    for name, (cpu, cuda) in DEVICE_DEFAULTS.items():
        assert (option(name).default, option(name).cuda_default) == (cpu, cuda)


def test_cpu_defaults_are_unchanged() -> None:
    options = InferenceOptions()
    assert values(options) == {name: cpu for name, (cpu, _) in DEVICE_DEFAULTS.items()}
    assert options.batching() == BatchingConfig(max_batch_size=32, max_wait_ms=5.0, max_idle_ms=2.0)
    settings = flink_settings(options)
    assert (settings["python.fn-execution.arrow.batch.size"], settings["python.fn-execution.bundle.size"],
            settings["table.exec.async-scalar.max-concurrent-operations"]) == ("1024", "4096", "64")


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_defaults_are_applied(device: str) -> None:
    options = InferenceOptions(device=device)
    assert values(options) == {name: cuda for name, (_, cuda) in DEVICE_DEFAULTS.items()}
    assert all(isinstance(v, Derived) for v in values(options).values())
    batching = options.batching()
    assert (batching.max_batch_size, batching.max_batch_tokens) == (1024, 65536)
    assert type(batching.max_batch_size) is int  # the batcher gets plain ints
    settings = flink_settings(options)
    assert settings["python.fn-execution.arrow.batch.size"] == "8192"  # eight model batches per Arrow batch
    assert settings["python.fn-execution.bundle.size"] == str(4 * 8192)


def test_given_values_win_on_either_device() -> None:
    given = {"max_batch_size": 32, "max_batch_tokens": 4096, "arrow_batch_size": 1024}
    for device in ("cpu", "cuda"):
        options = InferenceOptions(device=device, **given)
        assert values(options) == given and not any(isinstance(v, Derived) for v in values(options).values())
    assert InferenceOptions(device="cuda", max_batch_size=64).max_batch_tokens == 65536  # the others derive


def test_the_flags_leave_unset_options_to_the_device() -> None:
    cuda = PipelineOptions.from_args(["--input-topic", "i", "--output-topic", "o", "--device", "cuda"])
    assert values(cuda) == {name: c for name, (_, c) in DEVICE_DEFAULTS.items()}
    given = PipelineOptions.from_args(["--input-topic", "i", "--output-topic", "o", "--device", "cuda",
                                       "--max-batch-size", "32", "--arrow-batch-size", "2048"])
    assert (given.max_batch_size, given.arrow_batch_size, given.max_batch_tokens) == (32, 2048, 65536)
    assert type(given.max_batch_size) is int


def test_rebuilding_for_another_device_derives_again_and_keeps_given_values() -> None:
    moved = replace(InferenceOptions(), device="cuda")
    assert values(moved) == {name: c for name, (_, c) in DEVICE_DEFAULTS.items()}
    back = replace(moved, device="cpu")
    assert values(back) == {name: c for name, (c, _) in DEVICE_DEFAULTS.items()}
    kept = replace(InferenceOptions(device="cuda", max_batch_size=256), device="cpu")
    assert (kept.max_batch_size, kept.max_batch_tokens, kept.arrow_batch_size) == (256, None, 1024)


def test_the_job_parameters_carry_given_values_only_and_round_trip() -> None:
    derived = InferenceOptions(device="cuda")
    params = derived.job_parameters()
    assert params["aisp.device"] == "cuda:0"
    assert "aisp.batch.max-size" not in params and "aisp.batch.max-tokens" not in params
    for through in (params, json.loads(format_job_parameters(params))):
        back = InferenceOptions.from_job_parameters(get_from(through))
        assert back == derived and isinstance(back.max_batch_size, Derived)
    given = InferenceOptions(device="cuda", max_batch_size=32, max_batch_tokens=2048)
    params = given.job_parameters()
    assert (params["aisp.batch.max-size"], params["aisp.batch.max-tokens"]) == ("32", "2048")
    back = InferenceOptions.from_job_parameters(get_from(params))
    assert values(back) == {"max_batch_size": 32, "max_batch_tokens": 2048, "arrow_batch_size": 8192}
    assert type(back.max_batch_size) is int


def test_a_worker_derives_the_defaults_of_the_device_the_job_parameters_name() -> None:
    """A SQL function's base options were built on the CPU; aisp.device=cuda in the job makes it a GPU run."""
    base = InferenceOptions(max_wait_ms=1.0)
    worker = InferenceOptions.from_job_parameters(get_from({"aisp.device": "cuda"}), base=base)
    assert (worker.max_batch_size, worker.max_batch_tokens, worker.max_wait_ms) == (1024, 65536, 1.0)
    explicit = InferenceOptions.from_job_parameters(
        get_from({"aisp.device": "cuda", "aisp.batch.max-size": "32"}), base=base)
    assert explicit.max_batch_size == 32 and type(explicit.max_batch_size) is int


def test_derived_values_survive_pickling_as_derived() -> None:
    copy = pickle.loads(pickle.dumps(InferenceOptions(device="cuda")))
    assert isinstance(copy.max_batch_size, Derived) and copy.max_batch_size == 1024
    assert replace(copy, device="cpu").max_batch_size == 32


def test_the_async_operator_caps_a_derived_batch_at_its_capacity() -> None:
    async_job = PipelineOptions(input_topic="i", output_topic="o", device="cuda", operator="async")
    assert async_job.max_batch_size == 256 == async_job.capacity
    with pytest.raises(ConfigError, match=r"--capacity \(256\) must be >= --max-batch-size \(512\)"):
        PipelineOptions(input_topic="i", output_topic="o", device="cuda", operator="async",
                        max_batch_size=512)
    assert replace(async_job, operator="arrow").max_batch_size == 1024


def test_the_options_page_and_help_show_both_defaults_with_the_reason() -> None:
    table = options_markdown(OPTIONS)
    row = next(line for line in table.splitlines() if line.startswith("| `--max-batch-size`"))
    assert "| 32; cuda: 1024 |" in row and "On cuda: a GPU call costs about 5 ms" in row
    assert "| none; cuda: 65536 |" in table
    parser = argparse.ArgumentParser()
    add_flags(parser)
    assert "default 1024; cuda: 8192]" in " ".join(parser.format_help().split())


# -- the torch runtime's device-path options --------------------------------------------------


def test_the_device_path_options_round_trip_as_job_parameters() -> None:
    options = InferenceOptions(runtime=TORCH, device="cuda", tf32=True, pad_to_multiple_of=8,
                               batch_size_buckets=(64, 256, 1024), pipeline_depth=3)
    params = options.job_parameters()
    assert {k: params[k] for k in ("aisp.torch.tf32", "aisp.torch.pad-to-multiple-of",
                                   "aisp.torch.batch-size-buckets", "aisp.batch.pipeline-depth")} == {
        "aisp.torch.tf32": "true", "aisp.torch.pad-to-multiple-of": "8",
        "aisp.torch.batch-size-buckets": "64,256,1024", "aisp.batch.pipeline-depth": "3"}
    assert InferenceOptions.from_job_parameters(get_from(params)) == options
    defaults = InferenceOptions(runtime=TORCH).job_parameters()
    assert defaults["aisp.torch.pad-to-multiple-of"] == defaults["aisp.batch.pipeline-depth"] == "none"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tf32": True}, "--tf32 needs --runtime torch and --device cuda"),
    ({"tf32": True, "runtime": TORCH}, "--tf32 needs --runtime torch and --device cuda .* --device cpu"),
    ({"tf32": True, "device": "cuda"}, "--tf32 needs --runtime torch .* got --runtime onnx"),
    ({"pad_to_multiple_of": 16}, "--pad-to-multiple-of apply to --runtime torch"),
    ({"batch_size_buckets": (8, 16)}, "--batch-size-buckets apply to --runtime torch"),
    ({"pipeline_depth": 2, "device": "cuda"}, "--pipeline-depth apply to --runtime torch"),
    ({"pipeline_depth": 2, "classifier": "/models/intent"}, "--pipeline-depth apply to --runtime torch"),
    ({"runtime": TORCH, "batch_size_buckets": (64, 32)}, "--batch-size-buckets must be strictly ascending"),
    ({"runtime": TORCH, "pipeline_depth": 0}, "--pipeline-depth must be >= 1"),
    ({"runtime": TORCH, "pad_to_multiple_of": 0}, "--pad-to-multiple-of must be >= 1"),
])
def test_device_path_options_that_cannot_apply_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        InferenceOptions(**kwargs)


def test_the_onnx_sentiment_model_on_the_cpu_takes_a_pipeline_depth_as_concurrent_runs() -> None:
    from pyflink_aisp.pipeline._handlers import handler_for

    options = InferenceOptions(pipeline_depth=2, intra_op_threads=1)
    handler = handler_for(options)
    assert handler._runs == 2 and handler._threads == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(("fields", "runs"), [
    ({"operator": "record", "parallelism": 2}, 2),
    ({"operator": "record", "parallelism": 20}, 8),  # MAX_CONCURRENT_RUNS
    ({"operator": "record", "parallelism": 2, "pipeline_depth": 1}, 1),  # given: it stands
    ({"operator": "record"}, 1),
    ({"operator": "arrow", "parallelism": 2}, 1),
])
def test_the_record_operators_subtasks_run_the_model_side_by_side(fields: dict[str, Any], runs: int) -> None:
    from pyflink_aisp.pipeline import PipelineOptions
    from pyflink_aisp.pipeline._handlers import handler_for

    options = PipelineOptions(input_topic="i", output_topic="o", **fields)
    handler = handler_for(options)
    assert options.concurrent_runs == runs
    assert handler._runs == runs and handler._threads is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("config", "fields", "runs"), [
    # flink run against a cluster whose TaskManagers have 1 slot: each subtask has an interpreter alone
    ({"execution.target": "remote", "taskmanager.numberOfTaskSlots": "1"}, {"parallelism": 4}, 1),
    ({"execution.target": "kubernetes-application", "taskmanager.numberOfTaskSlots": "2"},
     {"parallelism": 4}, 2),
    ({"execution.target": "remote", "taskmanager.numberOfTaskSlots": "4"}, {"parallelism": 2}, 2),
    ({"execution.target": "remote", "taskmanager.numberOfTaskSlots": "16"}, {"parallelism": 12}, 8),
    # a MiniCluster runs every subtask in the client's JVM: one interpreter, whatever its slots
    ({"execution.target": "local", "taskmanager.numberOfTaskSlots": "1"}, {"parallelism": 2}, 2),
    ({"taskmanager.numberOfTaskSlots": "1"}, {"parallelism": 2}, 2),
    ({"execution.target": "remote"}, {"parallelism": 2}, 2),  # slots unknown
    ({"execution.target": "remote", "taskmanager.numberOfTaskSlots": "x"}, {"parallelism": 2}, 2),
    ({"execution.target": "remote", "taskmanager.numberOfTaskSlots": "1"},
     {"parallelism": 4, "pipeline_depth": 3}, 3),  # given: it stands
    ({"execution.target": "remote", "taskmanager.numberOfTaskSlots": "1"},
     {"parallelism": 4, "operator": "arrow"}, 1),
])
def test_a_clusters_slots_cap_the_record_operators_derived_depth(
        config: dict[str, str], fields: dict[str, Any], runs: int) -> None:
    from pyflink_aisp.pipeline import PipelineOptions
    from pyflink_aisp.pipeline._handlers import handler_for
    from pyflink_aisp.pipeline._settings import cluster_pipeline_depth

    options = PipelineOptions(input_topic="i", output_topic="o", **{"operator": "record", **fields})
    capped = cluster_pipeline_depth(options, config.get)
    assert capped.concurrent_runs == runs
    assert handler_for(capped)._runs == runs  # type: ignore[attr-defined]
    assert cluster_pipeline_depth(capped, config.get) == capped  # idempotent: the job and its line agree


class Recorder:
    """Stands in for TorchSentimentHandler: records its arguments."""

    def __init__(self, assets: Any, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.fixture
def recorded(monkeypatch) -> Any:
    monkeypatch.setattr(_handlers, "TorchSentimentHandler", Recorder)
    monkeypatch.setattr(_handlers, "model_assets", lambda options: "assets")
    return lambda **kw: _handlers.handler_for(InferenceOptions(runtime=TORCH, **kw)).kwargs


def test_the_torch_handler_gets_the_device_path_options(recorded) -> None:
    cpu = recorded()
    assert {k: cpu[k] for k in ("batch_size", "pad_to_multiple_of", "batch_size_buckets", "tf32",
                                "pipeline_depth", "memory_limit_bytes")} == {
        "batch_size": 32, "pad_to_multiple_of": None, "batch_size_buckets": (), "tf32": False,
        "pipeline_depth": None, "memory_limit_bytes": None}
    gpu = recorded(device="cuda", tf32=True, pad_to_multiple_of=8, batch_size_buckets=(256, 1024),
                   pipeline_depth=3)
    assert (gpu["device"], gpu["batch_size"], gpu["pad_to_multiple_of"], gpu["batch_size_buckets"],
            gpu["tf32"], gpu["pipeline_depth"]) == ("cuda:0", 1024, 8, (256, 1024), True, 3)
    assert type(gpu["batch_size"]) is int


def test_a_gpu_lease_caps_the_torch_handlers_memory_at_the_leased_mib(recorded) -> None:
    leased = recorded(device="cuda", gpu_affinity="http://127.0.0.1:7420", gpu_mem_mib=2048)
    assert leased["memory_limit_bytes"] == 2048 * 2**20
    assert recorded(device="cuda")["memory_limit_bytes"] is None  # no lease: the whole device
    assert recorded(gpu_affinity="http://127.0.0.1:7420")["memory_limit_bytes"] is None  # a CPU lease
    assert recorded(device="cuda", gpu_affinity="http://h:1", gpu_mem_mib=0)["memory_limit_bytes"] is None


def test_the_arguments_passed_are_the_torch_handlers_own() -> None:
    """Every name handler_for passes is a parameter of TorchSentimentHandler (helper "torch" adds them)."""
    from pyflink_aisp.inference.handlers import TorchSentimentHandler

    parameters = inspect.signature(TorchSentimentHandler).parameters
    passed = _handlers.torch_device_kwargs(InferenceOptions(runtime=TORCH))
    assert set(passed) <= set(parameters), set(passed) - set(parameters)


# -- the expected GPU numbers of docs/gpu.md ---------------------------------------------------


def _expectations() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "docs" / "gpu_expectations.py"
    spec = importlib.util.spec_from_file_location("aisp_gpu_expectations", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_pages_expectations_are_what_the_cost_model_gives() -> None:
    model = _expectations()
    computed = {p: {b: round(model.expected(p, b), -2) for b in model.BATCHES} for p in model.EXPECTED}
    assert model.EXPECTED == computed
    assert model.HOST_BOUND == round(1e6 / model.host_us_per_row(), -2)
    assert model.BF16_US_PER_TOKEN == round(model.us_per_token("bf16"), 3)
    # the fp32 model at the measured batch is within 2 % of the measured forward-only rate
    assert abs(model.expected("fp32", 1024) / model.FORWARD_ONLY["fp32"] - 1) < 0.02
    page = (Path(__file__).resolve().parents[3] / "docs" / "gpu.md").read_text(encoding="utf-8")
    for batch in model.BATCHES:
        fp32, bf16 = model.EXPECTED["fp32"][batch], model.EXPECTED["bf16"][batch]
        assert f"| {batch:,} | {fp32:,} | {bf16:,} |" in page, batch
    # the CUDA batch size is the table's fastest, and eight of them make an Arrow batch
    best = max(model.BATCHES, key=lambda b: model.EXPECTED["bf16"][b])
    assert option("max_batch_size").cuda_default == best
    assert option("arrow_batch_size").cuda_default == 8 * best
