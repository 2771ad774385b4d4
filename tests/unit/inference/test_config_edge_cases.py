"""Edge cases found by breaking: job flags and SQL job parameters (no services, no JVM)."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchingConfig

ROOT = Path(__file__).resolve().parents[3]


def _job():
    path = ROOT / "jobs" / "review_sentiment.py"
    spec = importlib.util.spec_from_file_location("review_sentiment_edge_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


BASE = ["--input-topic", "in", "--output-topic", "out", "--bootstrap-servers", "127.0.0.1:1"]


@pytest.mark.parametrize("value", ["nan", "inf", "1e309"])
def test_latency_slo_non_finite_is_a_one_line_usage_error(value: str, capsys) -> None:  # type: ignore[no-untyped-def]
    """`--latency-slo-ms nan|inf|1e309` is refused by the argument parser (exit 2, one line),
    not a traceback from deriving the bundle time."""
    with pytest.raises(SystemExit) as exit_info:
        _job().main([*BASE, "--latency-slo-ms", value])
    assert exit_info.value.code == 2
    assert "--latency-slo-ms: expected a finite number" in capsys.readouterr().err


def test_bundle_time_zero_is_refused() -> None:
    """`--bundle-time-ms 0` is silently replaced by the default (0 is falsy in
    `a.bundle_time_ms or ...`), while -1 is refused as 'must be >= 1'."""
    with pytest.raises(ConfigError):
        _job().parse_args([*BASE, "--bundle-time-ms", "0"])


@pytest.mark.parametrize("flag,value", [("--max-wait-ms", "nan"), ("--max-wait-ms", "inf"),
                                        ("--max-idle-ms", "nan")])
def test_wait_flags_must_be_finite(flag: str, value: str) -> None:
    """nan/inf --max-wait-ms reach BatchingConfig unchecked (inf kills the batching
    thread, nan makes records wait until a batch fills: see test_batcher_breaks);
    nan --max-idle-ms is silently read as 'off' by the `>= 0` test in parse_args."""
    try:
        cfg = _job().parse_args([*BASE, flag, value])
        if flag == "--max-idle-ms":
            assert cfg.max_idle_ms is not None, "nan --max-idle-ms silently turned the idle release off"
        BatchingConfig(max_batch_size=cfg.max_batch_size, max_wait_ms=cfg.max_wait_ms,
                       max_idle_ms=cfg.max_idle_ms)
    except (ConfigError, SystemExit):
        return
    pytest.fail(f"{flag} {value} accepted")


@pytest.mark.parametrize("key,value", [
    ("aisp.batch.max-wait-ms", "nan"),
    ("aisp.batch.max-wait-ms", "inf"),
    ("aisp.batch.max-idle-ms", "nan"),
    ("aisp.latency-slo-ms", "inf"),
    ("aisp.model.poll-interval-s", "inf"),
])
def test_sql_job_parameters_must_be_finite(key: str, value: str) -> None:
    from pyflink_aisp.inference.sql import TableInferenceConfig

    params = {key: value, "aisp.model.pointer": "/tmp/pointer.json"}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        TableInferenceConfig.from_job_parameters(lambda k, d: params.get(k, d))


def test_python_worker_settings_with_infinite_slo() -> None:
    """latency_slo_ms=inf passes BatchingConfig, then python_worker_settings /
    configure_table_env crash with ValueError (int(inf // 4) = int(nan))."""
    from pyflink_aisp.inference.sql import python_worker_settings

    try:
        batching = BatchingConfig(latency_slo_ms=math.inf)
    except ConfigError:
        return
    python_worker_settings(batching)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-batch-size", "0"], "max_batch_size must be >= 1"),
        (["--length-buckets", "32,16"], "length_buckets"),
        (["--max-batch-tokens", "0"], "max_batch_tokens"),
        (["--capacity", "4"], "--capacity (4) must be >= --max-batch-size (512)"),
    ],
)
def test_batching_flags_are_checked_before_any_service_is_touched(flags, message):
    # the broker address is unreachable: a Kafka error here would mean the check came too late
    with pytest.raises(ConfigError, match=re.escape(message)):
        _job().parse_args([*BASE, *flags])
