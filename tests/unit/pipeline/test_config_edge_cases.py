"""Edge cases found by breaking: job flags and SQL job parameters (no services, no JVM)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchingConfig
from pyflink_aisp.pipeline import InferenceOptions, PipelineOptions, flink_settings

ROOT = Path(__file__).resolve().parents[3]


def _job():
    path = ROOT / "jobs" / "review_sentiment.py"
    spec = importlib.util.spec_from_file_location("review_sentiment_edge_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


BASE = ["--input-topic", "in", "--output-topic", "out", "--bootstrap-servers", "127.0.0.1:1"]


def _usage_error(capsys, argv: list[str]) -> str:  # type: ignore[no-untyped-def]
    """Run the job with ``argv``: it must exit 2 (argparse usage error); its stderr."""
    with pytest.raises(SystemExit) as exit_info:
        _job().main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("value", ["nan", "inf", "1e309"])
def test_latency_slo_non_finite_is_a_one_line_usage_error(value: str, capsys) -> None:  # type: ignore[no-untyped-def]
    """`--latency-slo-ms nan|inf|1e309` is refused by the argument parser (exit 2, one line),
    not a traceback from deriving the bundle time."""
    err = _usage_error(capsys, [*BASE, "--latency-slo-ms", value])
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors == [f"{errors[0].split(':')[0]}: error: argument --latency-slo-ms: "
                      f"--latency-slo-ms must be a finite number, got '{value}'"]


def test_bundle_time_zero_is_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    """`--bundle-time-ms 0` is not silently replaced by the default (0 is falsy in
    `bundle_time_ms or ...`): like -1, it is refused as 'must be >= 1'."""
    for value in ("0", "-1"):
        err = _usage_error(capsys, [*BASE, "--bundle-time-ms", value])
        assert f"--bundle-time-ms must be >= 1, got {value}" in err
    with pytest.raises(ConfigError, match="--bundle-time-ms must be >= 1, got 0"):
        InferenceOptions(bundle_time_ms=0)
    assert InferenceOptions(bundle_time_ms=1).effective_bundle_time_ms == 1


@pytest.mark.parametrize("flag,value", [("--max-wait-ms", "nan"), ("--max-wait-ms", "inf"),
                                        ("--max-idle-ms", "nan"), ("--max-idle-ms", "inf")])
def test_wait_flags_must_be_finite(flag: str, value: str, capsys) -> None:  # type: ignore[no-untyped-def]
    """nan/inf --max-wait-ms must not reach BatchingConfig (inf kills the batching
    thread, nan makes records wait until a batch fills: see test_batcher_breaks);
    nan --max-idle-ms must not be read as 'off'."""
    err = _usage_error(capsys, [*BASE, flag, value])
    assert f"argument {flag}: {flag} must be a finite number, got '{value}'" in err


@pytest.mark.parametrize("name", ["max_wait_ms", "max_idle_ms"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_waits_are_refused_in_code_too(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be a finite number"):
        InferenceOptions(**{name: value})


@pytest.mark.parametrize("key,value", [
    ("aisp.batch.max-wait-ms", "nan"),
    ("aisp.batch.max-wait-ms", "inf"),
    ("aisp.batch.max-idle-ms", "nan"),
    ("aisp.latency-slo-ms", "inf"),
    ("aisp.latency-slo-ms", "-inf"),
    ("aisp.model.poll-interval-s", "inf"),
])
def test_sql_job_parameters_must_be_finite(key: str, value: str) -> None:
    params = {key: value, "aisp.model.pointer": "/tmp/pointer.json"}
    pattern = f"job parameter {key.replace('.', r'[.]')} must be a finite number"
    with pytest.raises(ConfigError, match=pattern):
        InferenceOptions.from_job_parameters(lambda k, d: params.get(k, d))


@pytest.mark.parametrize(
    ("slo_ms", "shown"), [(math.inf, "inf"), (math.nan, "nan"), (3_600_000.5, "3600000.5")]
)
def test_python_worker_settings_with_infinite_slo(slo_ms: float, shown: str) -> None:
    """latency_slo_ms=inf once passed BatchingConfig, then the worker settings crashed
    with ValueError (int(inf // 4) = int(nan)). Now BatchingConfig and PipelineOptions
    (naming the flag) refuse it, and nan or anything above one hour, up front; the
    largest target accepted still gives finite worker settings."""
    expected = f"latency_slo_ms must be a finite number of ms up to 3,600,000, got {shown}"
    with pytest.raises(ConfigError) as batching_err:
        BatchingConfig(latency_slo_ms=slo_ms)
    assert str(batching_err.value) == expected
    with pytest.raises(ConfigError) as options_err:
        InferenceOptions(latency_slo_ms=slo_ms)
    assert str(options_err.value) == f"--latency-slo-ms: {expected}"
    largest = InferenceOptions(latency_slo_ms=3_600_000.0)  # the largest target accepted
    assert largest.batching().latency_slo_ms == 3_600_000.0
    assert flink_settings(largest)["python.fn-execution.bundle.time"] == "50"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-batch-size", "0"], "--max-batch-size must be >= 1, got 0"),
        (["--length-buckets", "32,16"], "--length-buckets: length_buckets must be strictly ascending"),
        (["--length-buckets", "16,16"], "--length-buckets: length_buckets must be strictly ascending"),
        (["--max-batch-tokens", "0"], "--max-batch-tokens must be >= 1, got 0"),
        (["--operator", "async", "--capacity", "4"], "--capacity (4) must be >= --max-batch-size (32)"),
        (["--operator", "async", "--max-batch-size", "512"],
         "--capacity (256) must be >= --max-batch-size (512)"),
    ],
)
def test_batching_flags_are_checked_before_any_service_is_touched(flags, message, capsys):  # type: ignore[no-untyped-def]
    # the broker address is unreachable: a Kafka error here would mean the check came too late
    assert message in _usage_error(capsys, [*BASE, *flags])


def test_capacity_below_the_batch_size_is_fine_for_the_arrow_operator() -> None:
    # only the async operator takes records in flight
    assert PipelineOptions(input_topic="i", output_topic="o", capacity=4).capacity == 4


@pytest.mark.parametrize("name", ["max_failure_rate", "model_poll_interval_s", "max_wait_ms"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_every_float_option_is_refused_non_finite_in_code(name: str, value: float) -> None:
    """A flag or job parameter never parses to nan; a value given in code is checked the same."""
    with pytest.raises(ConfigError, match="must be a finite number"):
        InferenceOptions(**{name: value})


@pytest.mark.parametrize(("fields", "message"), [
    ({"device": 0}, "--device must be cpu, cuda or cuda:N, got 0"),
    ({"runtime": 1}, "--runtime must be one of onnx, torch, got 1"),
    ({"mode": True}, "--mode must be one of streaming, batch, got True"),
    ({"startup_mode": 0}, "--startup-mode must be one of"),
])
def test_an_enum_or_device_option_given_another_type_in_code_is_refused(fields, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=message):
        PipelineOptions(input_topic="in", output_topic="out", **fields)


def test_path_options_given_strings_in_code_become_paths(tmp_path: Path) -> None:
    options = InferenceOptions(model_pointer=str(tmp_path / "pointer.json"), model_dir="assets",  # type: ignore[arg-type]
                               stats_dir=tmp_path)
    assert options.model_dir == Path("assets") and options.stats_dir == tmp_path
    swap = options.swap()
    assert swap is not None and swap.pointer_path == tmp_path / "pointer.json"


@pytest.mark.parametrize(("values", "message"), [
    ({"max_batch_size": True}, "--max-batch-size must be an integer, got True"),
    ({"max_batch_size": 2.5}, "--max-batch-size must be an integer, got 2.5"),
    ({"max_batch_size": "8"}, "--max-batch-size must be an integer, got '8'"),
    ({"max_wait_ms": True}, "--max-wait-ms must be a finite number, got True"),
    ({"encoder_normalize": 1}, "--encoder-normalize must be true or false, got 1"),
])
def test_numbers_and_bools_given_in_code_are_checked_like_flags(values, message) -> None:
    with pytest.raises(ConfigError) as info:
        InferenceOptions(**values)
    assert str(info.value) == message
    assert InferenceOptions(max_wait_ms=5).max_wait_ms == 5  # an int is a number of ms


def test_the_startup_mode_error_lists_only_the_modes_a_job_may_ask_for(capsys) -> None:  # type: ignore[no-untyped-def]
    expected = "--startup-mode must be one of earliest-offset, latest-offset, group-offsets, got "
    with pytest.raises(ConfigError, match=expected + "'specific-offsets'"):
        PipelineOptions(input_topic="i", output_topic="o", startup_mode="specific-offsets")
    assert expected + "'now'" in _usage_error(capsys, [*BASE, "--startup-mode", "now"])


def test_job_parameters_over_a_base_of_another_class_are_refused() -> None:
    with pytest.raises(TypeError, match="needs a PipelineOptions base, got a InferenceOptions"):
        PipelineOptions.from_job_parameters(lambda k, d: d, base=InferenceOptions())
    job = PipelineOptions(input_topic="i", output_topic="o", max_batch_size=7)
    assert InferenceOptions.from_job_parameters(lambda k, d: d, base=job) == job  # a subclass is kept
