"""The SQL functions' Python side without a job: config from job parameters, worker
settings, eval with a stand-in runtime and with the real runtime over the quick model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import cloudpickle
import pandas as pd
import pytest

from pyflink_aisp.errors import ConfigError, TokenizeError
from pyflink_aisp.inference import (
    BatchingConfig,
    Inferred,
    ModelRuntime,
    ModelSwapConfig,
    OnnxSentimentModel,
    _table,
    sql,
)
from pyflink_aisp.inference.sql import (
    BATCH_LENGTH_BUCKETS_PARAM,
    BATCH_MAX_IDLE_PARAM,
    BATCH_MAX_SIZE_PARAM,
    BATCH_MAX_TOKENS_PARAM,
    BATCH_MAX_WAIT_PARAM,
    INTRA_OP_THREADS_PARAM,
    LATENCY_SLO_PARAM,
    MODEL_DIR_PARAM,
    MODEL_POINTER_PARAM,
    MODEL_POLL_INTERVAL_PARAM,
    STATS_DIR_PARAM,
    TABLE_BATCHING,
    AsyncSentimentFunction,
    PandasSentimentFunction,
    TableInferenceConfig,
    configure_table_env,
    format_job_parameters,
    python_worker_settings,
    sentiment,
    sentiment_pandas,
    sentiment_udf,
)

SHA = "a" * 64


class _Group:
    """The part of PyFlink's MetricGroup the functions use."""

    def __init__(self) -> None:
        self.gauges: dict[str, Any] = {}

    def add_group(self, name: str) -> _Group:
        return self

    def gauge(self, name: str, read: Any) -> None:
        self.gauges[name] = read


class _Context:
    """The part of Flink's FunctionContext that open() uses."""

    def __init__(self, metrics: bool = True, **params: str) -> None:
        self.params = params
        self.group = _Group() if metrics else None

    def get_job_parameter(self, key: str, default: str) -> str:
        return self.params.get(key, default)

    def get_metric_group(self) -> _Group:
        if self.group is None:
            raise RuntimeError("Metric has not been enabled.")
        return self.group


def _config(**params: str) -> TableInferenceConfig:
    return TableInferenceConfig.from_job_parameters(_Context(**params).get_job_parameter)


# -- config from job parameters -------------------------------------------------------


def test_no_job_parameters_give_the_defaults() -> None:
    config = _config()
    assert config == TableInferenceConfig()
    assert (
        config.batching
        == TABLE_BATCHING
        == BatchingConfig(max_batch_size=64, max_wait_ms=5.0, max_idle_ms=2.0)
    )
    assert config.swap is None and config.stats_dir is None and config.model_dir is None


def test_every_job_parameter_is_read(tmp_path: Path) -> None:
    config = _config(
        **{
            MODEL_DIR_PARAM: str(tmp_path / "model"),
            BATCH_MAX_SIZE_PARAM: " 128 ",
            BATCH_MAX_WAIT_PARAM: "2.5",
            BATCH_MAX_IDLE_PARAM: "0.5",
            BATCH_MAX_TOKENS_PARAM: "4096",
            BATCH_LENGTH_BUCKETS_PARAM: "16,32;64",
            LATENCY_SLO_PARAM: "150",
            INTRA_OP_THREADS_PARAM: "2",
            MODEL_POINTER_PARAM: str(tmp_path / "ptr.json"),
            MODEL_POLL_INTERVAL_PARAM: "0.5",
            STATS_DIR_PARAM: str(tmp_path / "stats"),
        }
    )
    assert config == TableInferenceConfig(
        model_dir=tmp_path / "model",
        batching=BatchingConfig(
            max_batch_size=128,
            max_wait_ms=2.5,
            max_idle_ms=0.5,
            max_batch_tokens=4096,
            length_buckets=(16, 32, 64),
            latency_slo_ms=150.0,
        ),
        intra_op_threads=2,
        swap=ModelSwapConfig(pointer_path=tmp_path / "ptr.json", poll_interval_s=0.5),
        stats_dir=tmp_path / "stats",
    )


def test_none_and_zero_switch_optional_knobs_off() -> None:
    base = TableInferenceConfig(
        batching=BatchingConfig(
            max_batch_tokens=100, length_buckets=(8,), latency_slo_ms=50.0, max_idle_ms=1.0
        ),
        intra_op_threads=3,
    )
    get = _Context(
        **{
            BATCH_MAX_TOKENS_PARAM: "none",
            BATCH_MAX_IDLE_PARAM: "NONE",
            BATCH_LENGTH_BUCKETS_PARAM: "None",
            LATENCY_SLO_PARAM: "null",
            INTRA_OP_THREADS_PARAM: "0",
        }
    ).get_job_parameter
    config = TableInferenceConfig.from_job_parameters(get, base=base)
    assert config.batching == BatchingConfig()
    assert config.intra_op_threads is None


def test_unset_parameters_keep_the_base_values(tmp_path: Path) -> None:
    base = TableInferenceConfig(
        model_dir=tmp_path, batching=BatchingConfig(max_batch_size=7, max_wait_ms=1.0), intra_op_threads=1
    )
    get = _Context(**{BATCH_MAX_WAIT_PARAM: "9"}).get_job_parameter
    config = TableInferenceConfig.from_job_parameters(get, base=base)
    assert config == TableInferenceConfig(
        model_dir=tmp_path, intra_op_threads=1, batching=BatchingConfig(max_batch_size=7, max_wait_ms=9.0)
    )


def test_job_parameters_round_trip(tmp_path: Path) -> None:
    for config in (
        TableInferenceConfig(),
        TableInferenceConfig(
            model_dir=tmp_path / "m",
            intra_op_threads=4,
            stats_dir=tmp_path / "s",
            batching=BatchingConfig(
                max_batch_size=3,
                max_wait_ms=0.25,
                max_idle_ms=None,
                max_batch_tokens=99,
                length_buckets=(4, 8),
                latency_slo_ms=12.5,
            ),
            swap=ModelSwapConfig(pointer_path=tmp_path / "p.json", poll_interval_s=3.0),
        ),
    ):
        params = config.job_parameters()
        assert all(isinstance(v, str) for v in params.values())
        assert TableInferenceConfig.from_job_parameters(_Context(**params).get_job_parameter) == config


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({BATCH_MAX_SIZE_PARAM: "many"}, "aisp.batch.max-size must be an integer, got 'many'"),
        ({BATCH_MAX_SIZE_PARAM: "0"}, "job parameter aisp.batch.max-size: max_batch_size must be >= 1"),
        ({BATCH_MAX_WAIT_PARAM: "-1"}, "job parameter aisp.batch.max-wait-ms: max_wait_ms must be >= 0"),
        ({BATCH_MAX_WAIT_PARAM: "soon"}, "aisp.batch.max-wait-ms must be a number"),
        ({BATCH_MAX_IDLE_PARAM: "-1"}, "job parameter aisp.batch.max-idle-ms: max_idle_ms must be >= 0"),
        ({BATCH_MAX_TOKENS_PARAM: "0"}, "job parameter aisp.batch.max-tokens"),
        ({BATCH_LENGTH_BUCKETS_PARAM: "32,16"}, "job parameter aisp.batch.length-buckets"),
        ({BATCH_LENGTH_BUCKETS_PARAM: "16,x"}, "aisp.batch.length-buckets must list integers"),
        ({LATENCY_SLO_PARAM: "0"}, "job parameter aisp.latency-slo-ms: latency_slo_ms must be > 0"),
        ({INTRA_OP_THREADS_PARAM: "-2"}, "job parameter aisp.onnx.intra-op-threads"),
        ({MODEL_POLL_INTERVAL_PARAM: "1"}, "aisp.model.poll-interval-s is set but aisp.model.pointer is not"),
        ({MODEL_POINTER_PARAM: "/p.json", MODEL_POLL_INTERVAL_PARAM: "0"}, "aisp.model.poll-interval-s"),
    ],
)
def test_invalid_parameters_raise_config_errors_naming_the_parameter(params, message) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        _config(**params)


def test_config_is_frozen_and_validated() -> None:
    with pytest.raises(ConfigError, match="intra_op_threads must be >= 1"):
        TableInferenceConfig(intra_op_threads=0)
    with pytest.raises(TypeError):
        TableInferenceConfig(None)  # type: ignore[misc]  # keyword-only
    with pytest.raises(AttributeError):
        TableInferenceConfig().intra_op_threads = 2  # type: ignore[misc]


def test_model_dir_falls_back_to_the_environment(monkeypatch, tmp_path: Path) -> None:
    seen: list[Path] = []
    monkeypatch.setattr("pyflink_aisp.models.load_model_assets", lambda d: seen.append(d) or "assets")
    monkeypatch.setenv("AISP_MODEL_DIR", str(tmp_path))
    assert TableInferenceConfig().model_assets() == "assets" and seen == [tmp_path]
    assert TableInferenceConfig(model_dir=tmp_path / "x").model_assets() == "assets"
    assert seen[-1] == tmp_path / "x"


# -- worker settings ------------------------------------------------------------------


def test_worker_settings_for_the_default_batching() -> None:
    assert python_worker_settings(BatchingConfig()) == {
        "python.fn-execution.bundle.time": "50",
        "python.fn-execution.bundle.size": "1000",
        "python.fn-execution.arrow.batch.size": "64",
        "table.exec.async-scalar.max-concurrent-operations": "128",
        "table.exec.async-scalar.timeout": "600000 ms",
        "table.exec.async-scalar.retry-strategy": "NO_RETRY",
    }


@pytest.mark.parametrize(
    ("batching", "bundle_time"),
    [
        (BatchingConfig(max_batch_size=256, latency_slo_ms=150.0), "10"),
        (BatchingConfig(max_batch_size=1, latency_slo_ms=2.0), "5"),
        (BatchingConfig(max_batch_size=64, latency_slo_ms=3000.0), "50"),
        (BatchingConfig(max_batch_size=512, max_wait_ms=50.0), "50"),
    ],
)
def test_worker_settings_follow_the_batching(batching: BatchingConfig, bundle_time: str) -> None:
    settings = python_worker_settings(batching)
    assert settings["python.fn-execution.bundle.time"] == bundle_time
    size = batching.max_batch_size
    assert int(settings["table.exec.async-scalar.max-concurrent-operations"]) == 2 * size
    assert int(settings["python.fn-execution.arrow.batch.size"]) == size
    bundle_size = int(settings["python.fn-execution.bundle.size"])
    assert bundle_size == max(1000, 8 * size) and bundle_size >= 4 * 2 * size


def test_job_parameters_format_survives_commas_colons_quotes_and_empty_values() -> None:
    params = {"aisp.model.dir": "/m:1,2", "q": 'it\'s "x"', "e": ""}
    assert json.loads(format_job_parameters(params)) == params


class _TableConfig:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _TableEnv:
    def __init__(self) -> None:
        self.config = _TableConfig()

    def get_config(self) -> _TableConfig:
        return self.config


def test_configure_table_env_sets_settings_and_job_parameters(tmp_path: Path) -> None:
    t_env = _TableEnv()
    config = TableInferenceConfig(model_dir=tmp_path, batching=BatchingConfig(max_batch_size=16))
    settings = configure_table_env(t_env, config, extra_job_parameters={"aisp.tokenizer.max-length": "64"})
    assert t_env.config.values == settings
    params = json.loads(settings.pop("pipeline.global-job-parameters"))
    assert params == {"aisp.tokenizer.max-length": "64", **config.job_parameters()}
    assert settings == python_worker_settings(config.batching)


# -- the functions with a stand-in runtime ----------------------------------------------


class _FakeRuntime:
    """ModelRuntime's infer/infer_many: score = len(text) / 100; "boom" fails alone."""

    model_version = SHA

    def _one(self, text: str) -> Inferred:
        if text == "boom":
            raise TokenizeError("cannot tokenize boom")
        return Inferred((len(text) / 100.0, None), SHA)

    async def infer(self, text: str) -> Inferred:
        return self._one(text)

    def infer_many(self, texts: list[str]) -> list[Inferred | BaseException]:
        out: list[Inferred | BaseException] = []
        for text in texts:
            try:
                out.append(self._one(text))
            except TokenizeError as exc:
                out.append(exc)
        return out


def _with_fake(function: Any) -> Any:
    function._shared.runtime = _FakeRuntime()
    return function


def test_async_eval_rows_for_text_null_and_failure() -> None:
    function = _with_fake(AsyncSentimentFunction())
    rows = [tuple(asyncio.run(function.eval(t))) for t in ("x" * 70, "x" * 10, None, "boom")]
    assert rows == [
        (0.7, "fresh", SHA, None),
        (0.1, "rotten", SHA, None),
        (None, None, None, None),
        (None, None, SHA, "inference_error: TokenizeError: cannot tokenize boom"),
    ]
    assert function._shared.counts == {"recordsIn": 4, "recordsOut": 2, "nullInputs": 1, "deadLetters": 1}


def test_pandas_eval_returns_one_row_per_input_in_order() -> None:
    function = _with_fake(PandasSentimentFunction())
    frame = function.eval(pd.Series(["x" * 70, None, "boom", "x" * 50], dtype=object))
    assert list(frame.columns) == ["score", "label", "model_sha256", "error"]
    assert frame["score"].dtype == "float64"
    assert frame["score"].tolist()[0::3] == [0.7, 0.5] and frame["score"].isna().tolist() == [
        False,
        True,
        True,
        False,
    ]
    assert frame["label"].tolist() == ["fresh", None, None, "fresh"]
    assert frame["model_sha256"].tolist() == [SHA, None, SHA, SHA]
    assert frame["error"].tolist()[:2] == [None, None] and frame["error"][2].startswith("inference_error")
    assert function.eval(pd.Series([], dtype=object)).shape == (0, 4)
    assert function._shared.counts == {"recordsIn": 4, "recordsOut": 2, "nullInputs": 1, "deadLetters": 1}


def test_pandas_eval_turns_a_failed_call_into_error_rows() -> None:
    function = _with_fake(PandasSentimentFunction())

    def broken(texts):
        raise RuntimeError("batcher closed")

    function._shared.runtime.infer_many = broken
    frame = function.eval(pd.Series(["a", "b"], dtype=object))
    assert frame["error"].tolist() == ["inference_error: RuntimeError: batcher closed"] * 2


def test_eval_before_open_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before open"):
        asyncio.run(AsyncSentimentFunction().eval("x"))
    with pytest.raises(RuntimeError, match="before open"):
        PandasSentimentFunction().eval(pd.Series(["x"]))


# -- PyFlink plumbing -------------------------------------------------------------------


def test_sql_module_public_api_is_complete() -> None:
    assert len(sql.__all__) == len(set(sql.__all__))
    for name in sql.__all__:
        assert getattr(sql, name) is not None, name
    assert sql.sentiment_label(0.5) == "fresh" and sql.sentiment_label(0.49) == "rotten"


def test_udf_objects_are_async_and_pandas_scalar_functions() -> None:
    from pyflink.table.udf import UserDefinedAsyncScalarFunctionWrapper, UserDefinedScalarFunctionWrapper

    assert isinstance(sentiment, UserDefinedAsyncScalarFunctionWrapper)
    assert isinstance(sentiment_pandas, UserDefinedScalarFunctionWrapper)
    assert sentiment_pandas._func_type == "pandas"
    assert [f.name for f in sentiment._result_type.fields] == ["score", "label", "model_sha256", "error"]
    custom = sentiment_udf(TableInferenceConfig(intra_op_threads=1), vectorized=True)
    assert custom._func._shared.defaults == TableInferenceConfig(intra_op_threads=1)


def test_functions_pickle_without_their_runtime() -> None:
    function = _with_fake(AsyncSentimentFunction(TableInferenceConfig(intra_op_threads=2)))
    copy = cloudpickle.loads(cloudpickle.dumps(function))
    assert copy._shared.runtime is None and copy._shared.defaults == TableInferenceConfig(intra_op_threads=2)


def test_async_operator_gets_a_copy_of_each_reused_input_row() -> None:
    """FLINK-39532: PyFlink's coder reuses one list per decoded row; eval runs later."""
    from pyflink.fn_execution.table.async_function.operations import AsyncScalarFunctionOperation

    assert getattr(AsyncScalarFunctionOperation.process_element, "_aisp_snapshots_inputs", False)
    patched = AsyncScalarFunctionOperation.process_element
    _table._snapshot_async_scalar_inputs()  # idempotent: no second wrapper
    assert AsyncScalarFunctionOperation.process_element is patched

    seen: list[Any] = []
    wrapped = _table._snapshotting(lambda self, value: seen.append(value))
    reused = ["first"]
    wrapped(None, reused)
    reused[0] = "second"  # the coder decodes the next row into the same list
    wrapped(None, reused)
    assert seen == [["first"], ["second"]]


# -- open/eval/close on the real runtime and the quick model --------------------------------


@pytest.fixture
def quick_model(monkeypatch, quick_assets):
    """``model_assets()`` returns the quick test model (it has no manifest directory)."""
    monkeypatch.setattr(TableInferenceConfig, "model_assets", lambda self: quick_assets)
    return quick_assets


def test_functions_share_one_runtime_score_like_the_model_and_write_stats(quick_model, tmp_path) -> None:
    texts = ["A gripping, beautiful film.", "Dull and far too long.", "", "meh"]
    expected, _ = OnnxSentimentModel(quick_model).predict(texts)
    params = {
        BATCH_MAX_SIZE_PARAM: "8",
        BATCH_MAX_WAIT_PARAM: "20",
        INTRA_OP_THREADS_PARAM: "1",
        STATS_DIR_PARAM: str(tmp_path),
    }
    async_fn, pandas_fn = AsyncSentimentFunction(), PandasSentimentFunction()
    async_ctx = _Context(**params)
    async_fn.open(async_ctx)
    pandas_fn.open(_Context(metrics=False, **params))
    try:
        assert async_fn._shared.runtime is pandas_fn._shared.runtime  # one model per worker

        async def score_all() -> list[Any]:
            return await asyncio.gather(*(async_fn.eval(t) for t in texts))

        rows = asyncio.run(score_all())
        frame = pandas_fn.eval(pd.Series(texts, dtype=object))
        for i, score in enumerate(expected):
            assert rows[i][0] == pytest.approx(float(score), abs=1e-5)
            assert frame["score"][i] == pytest.approx(float(score), abs=1e-5)
            assert rows[i][2] == frame["model_sha256"][i] == quick_model.sha256
        assert async_ctx.group.gauges["recordsOut"]() == 4
        assert async_ctx.group.gauges["recordsInferred"]() == 8  # the runtime's gauges bound too
    finally:
        async_fn.close()
        pandas_fn.close()
    assert not ModelRuntime._registry  # the last close released the model
    (stats_file,) = tmp_path.glob("aisp-stats-*.json")
    stats = json.loads(stats_file.read_text())
    assert stats["records"] == 8 and stats["model_sha256"] == quick_model.sha256
    assert stats["max_batch_size"] > 1  # the four concurrent async rows shared a batch
