"""The SQL functions' Python side without a job: options from job parameters in open(),
the table env settings, eval with a stand-in runtime and with the real runtime over the quick model.

The options table itself (parsing, round trips, errors, derived settings) is tested in test_options.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import cloudpickle
import pandas as pd
import pytest

from pyflink_aisp.errors import ConfigError, InferenceTimeoutError, TokenizeError
from pyflink_aisp.inference import BatchingConfig, Inferred, ModelHandler, ModelRuntime, ModelSwapConfig
from pyflink_aisp.inference.handlers import OnnxEncoderHandler, OnnxSentimentModel, Pooling, SentimentHandler
from pyflink_aisp.inference.tasks import SentimentTask
from pyflink_aisp.pipeline import InferenceOptions, _handlers, _sql_functions, flink_settings, sql
from pyflink_aisp.pipeline.sql import (
    SENTIMENT_RESULT_TYPE,
    AsyncSentimentFunction,
    PandasSentimentFunction,
    configure_table_env,
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


class _LengthHandler(ModelHandler[str, tuple[float, None], str]):
    """A model-free handler: score = len(text) / 100."""

    def load_model(self) -> str:
        return "length"

    def model_version(self) -> str:
        return SHA

    def run_inference(self, batch, model):
        return [(len(x) / 100.0, None) for x in batch]

    def task(self, *, with_embedding: bool = False) -> SentimentTask:
        return SentimentTask(with_embedding=with_embedding)


@pytest.fixture
def seen_options(monkeypatch) -> list[InferenceOptions]:
    """open() builds the handler of the options it read: record them, use a model-free handler."""
    seen: list[InferenceOptions] = []

    def handler_for(options: InferenceOptions) -> _LengthHandler:
        seen.append(options)
        return _LengthHandler()

    monkeypatch.setattr(_sql_functions, "handler_for", handler_for)
    return seen


# -- options from job parameters in open() ------------------------------------------------


def test_open_without_job_parameters_uses_the_defaults(seen_options) -> None:
    function = PandasSentimentFunction()
    function.open(_Context())
    try:
        assert seen_options == [InferenceOptions()]
        runtime = function._shared.runtime
        assert runtime.batching == BatchingConfig(max_batch_size=32, max_wait_ms=5.0, max_idle_ms=2.0)
        assert runtime._swap_config is None
    finally:
        function.close()
    assert function._shared.runtime is None and not ModelRuntime._registry


def test_open_reads_the_job_parameters_over_the_function_defaults(seen_options, tmp_path: Path) -> None:
    defaults = InferenceOptions(max_batch_size=7, max_wait_ms=1.0, intra_op_threads=1, model_dir=tmp_path)
    function = AsyncSentimentFunction(defaults)
    function.open(_Context(**{
        "aisp.batch.max-wait-ms": "9",
        "aisp.batch.length-buckets": "16,32;64",
        "aisp.latency-slo-ms": "150",
        "aisp.model.pointer": str(tmp_path / "ptr.json"),
        "aisp.model.poll-interval-s": "0.5",
    }))
    try:
        expected = InferenceOptions(
            max_batch_size=7, max_wait_ms=9.0, intra_op_threads=1, model_dir=tmp_path,
            length_buckets=(16, 32, 64), latency_slo_ms=150.0, model_pointer=tmp_path / "ptr.json",
            model_poll_interval_s=0.5)
        assert seen_options == [expected]
        runtime = function._shared.runtime
        assert runtime.batching == expected.batching() == BatchingConfig(
            max_batch_size=7, max_wait_ms=9.0, max_idle_ms=2.0, length_buckets=(16, 32, 64),
            latency_slo_ms=150.0)
        swap = ModelSwapConfig(pointer_path=tmp_path / "ptr.json", poll_interval_s=0.5)
        assert runtime._swap_config == swap
    finally:
        function.close()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"aisp.batch.max-size": "0"}, "job parameter aisp.batch.max-size must be >= 1"),
        ({"aisp.batch.length-buckets": "32,16"}, "job parameter aisp.batch.length-buckets"),
        ({"aisp.onnx.intra-op-threads": "-2"}, "job parameter aisp.onnx.intra-op-threads must be >= 0"),
    ],
)
def test_open_refuses_a_bad_job_parameter_naming_it(seen_options, params, message) -> None:
    function = AsyncSentimentFunction()
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        function.open(_Context(**params))
    assert seen_options == [] and function._shared.runtime is None


def test_the_handler_and_model_dir_follow_the_options(monkeypatch, tmp_path: Path) -> None:
    seen: list[Path] = []
    monkeypatch.setattr(_handlers, "load_model_assets", lambda d: seen.append(d) or "assets")
    monkeypatch.setenv("AISP_MODEL_DIR", str(tmp_path))
    assert _handlers.model_assets(InferenceOptions()) == "assets" and seen == [tmp_path]
    assert _handlers.model_assets(InferenceOptions(model_dir=tmp_path / "x")) == "assets"
    assert seen[-1] == tmp_path / "x"

    assets = object()  # SentimentHandler keeps its assets until load_model
    monkeypatch.setattr(_handlers, "model_assets", lambda options: assets)
    handler = _handlers.handler_for(InferenceOptions(intra_op_threads=3))
    assert isinstance(handler, SentimentHandler) and handler._assets is assets and handler._threads == 3
    assert _handlers.handler_for(InferenceOptions())._threads is None  # 0: ORT's default
    encoder = _handlers.handler_for(InferenceOptions(
        encoder_onnx=tmp_path / "e.onnx", encoder_tokenizer=tmp_path / "t.json", encoder_output="pooled",
        encoder_pooling=Pooling.CLS, encoder_normalize=True, intra_op_threads=2))
    assert isinstance(encoder, OnnxEncoderHandler)
    assert (encoder._model_path, encoder._tokenizer_path, encoder._output, encoder._pooling,
            encoder._normalize, encoder._threads) == (
        tmp_path / "e.onnx", tmp_path / "t.json", "pooled", Pooling.CLS, True, 2)


# -- table env settings -----------------------------------------------------------------


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
    options = InferenceOptions(model_dir=tmp_path, max_batch_size=16)
    settings = configure_table_env(t_env, options, extra_job_parameters={"aisp.tokenizer.max-length": "64"})
    assert t_env.config.values == settings
    params = json.loads(settings.pop("pipeline.global-job-parameters"))
    assert params == {"aisp.tokenizer.max-length": "64", **options.job_parameters()}
    assert params["aisp.batch.max-size"] == "16" and params["aisp.model.dir"] == str(tmp_path)
    assert settings == flink_settings(options)
    assert settings["table.exec.async-scalar.max-concurrent-operations"] == "32"
    # what a job sets is what the functions read back in open()
    assert InferenceOptions.from_job_parameters(lambda k, d: params.get(k, d)) == options


def test_configure_table_env_options_win_over_extra_parameters() -> None:
    extra = {"aisp.batch.max-size": "9"}
    given = InferenceOptions(max_batch_size=32)
    settings = configure_table_env(_TableEnv(), given, extra_job_parameters=extra)
    assert json.loads(settings["pipeline.global-job-parameters"])["aisp.batch.max-size"] == "32"
    # a batch size the device chose was not given: the extra parameter stands
    settings = configure_table_env(_TableEnv(), InferenceOptions(), extra_job_parameters=extra)
    assert json.loads(settings["pipeline.global-job-parameters"])["aisp.batch.max-size"] == "9"


# -- the functions with a stand-in runtime ----------------------------------------------


class _FakeRuntime:
    """ModelRuntime's infer/infer_batch: score = len(text) / 100; "boom" fails alone,
    "late" times out alone."""

    model_version = SHA

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def _one(self, text: str) -> Inferred:
        if text == "boom":
            raise TokenizeError("cannot tokenize boom")
        if text == "late":
            raise InferenceTimeoutError("waited too long")
        return Inferred((len(text) / 100.0, None), SHA)

    async def infer(self, text: str) -> Inferred:
        return self._one(text)

    def infer_batch(self, texts: list[str]) -> list[Inferred | BaseException]:
        self.batches.append(list(texts))
        out: list[Inferred | BaseException] = []
        for text in texts:
            try:
                out.append(self._one(text))
            except Exception as exc:
                out.append(exc)
        return out


def _with_fake(function: Any) -> Any:
    function._shared.runtime = _FakeRuntime()
    return function


def test_async_eval_rows_for_text_null_and_failure() -> None:
    function = _with_fake(AsyncSentimentFunction())
    rows = [tuple(asyncio.run(function.eval(t))) for t in ("x" * 70, "x" * 10, None, "boom", "late")]
    assert rows == [
        (0.7, "fresh", SHA, None, None),
        (0.1, "rotten", SHA, None, None),
        (None, None, None, None, None),
        (None, None, SHA, "inference_error", "TokenizeError: cannot tokenize boom"),
        (None, None, SHA, "inference_timeout", "InferenceTimeoutError: waited too long"),
    ]
    assert function._shared.counts == {"recordsIn": 5, "recordsOut": 2, "nullInputs": 1, "deadLetters": 2}


def test_pandas_eval_returns_one_row_per_input_in_order() -> None:
    function = _with_fake(PandasSentimentFunction())
    frame = function.eval(pd.Series(["x" * 70, None, "boom", "x" * 50, "late"], dtype=object))
    assert function._shared.runtime.batches == [["x" * 70, "boom", "x" * 50, "late"]]  # nulls never sent
    assert list(frame.columns) == ["score", "label", "model_sha256", "reason", "detail"]
    assert frame["score"].dtype == "float64"
    assert frame["score"].tolist()[0::3] == [0.7, 0.5]
    assert frame["score"].isna().tolist() == [False, True, True, False, True]
    assert frame["label"].tolist() == ["fresh", None, None, "fresh", None]
    assert frame["model_sha256"].tolist() == [SHA, None, SHA, SHA, SHA]
    assert frame["reason"].tolist() == [None, None, "inference_error", None, "inference_timeout"]
    assert frame["detail"].tolist() == [None, None, "TokenizeError: cannot tokenize boom", None,
                                        "InferenceTimeoutError: waited too long"]
    assert function.eval(pd.Series([], dtype=object)).shape == (0, 5)
    assert function.eval(pd.Series([None], dtype=object))["reason"].tolist() == [None]
    assert function._shared.runtime.batches == [["x" * 70, "boom", "x" * 50, "late"]]  # nothing to score
    assert function._shared.counts == {"recordsIn": 6, "recordsOut": 2, "nullInputs": 2, "deadLetters": 2}


def test_async_and_pandas_rows_are_the_same() -> None:
    texts = ["x" * 70, None, "boom", "late", "x" * 20]
    async_rows = [tuple(asyncio.run(_with_fake(AsyncSentimentFunction()).eval(t))) for t in texts]
    frame = _with_fake(PandasSentimentFunction()).eval(pd.Series(texts, dtype=object))
    pandas_rows = [tuple(None if pd.isna(v) else v for v in row) for row in frame.itertuples(index=False)]
    assert pandas_rows == async_rows


def test_pandas_eval_turns_a_failed_call_into_error_rows() -> None:
    function = _with_fake(PandasSentimentFunction())

    def broken(texts):
        raise RuntimeError("batcher closed")

    function._shared.runtime.infer_batch = broken
    frame = function.eval(pd.Series(["a", None, "b"], dtype=object))
    assert frame["reason"].tolist() == ["inference_error", None, "inference_error"]
    assert frame["detail"].tolist() == ["RuntimeError: batcher closed", None, "RuntimeError: batcher closed"]
    assert frame["model_sha256"].tolist() == [SHA, None, SHA]
    assert function._shared.counts == {"recordsIn": 3, "recordsOut": 0, "nullInputs": 1, "deadLetters": 2}


def test_a_long_detail_is_cut() -> None:
    function = _with_fake(AsyncSentimentFunction())

    async def fails(text):
        raise RuntimeError("x" * 5000)

    function._shared.runtime.infer = fails
    row = asyncio.run(function.eval("a"))
    assert row[3] == "inference_error" and row[4] == ("RuntimeError: " + "x" * 5000)[:1000]


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
    fields = ["score", "label", "model_sha256", "reason", "detail"]
    assert [f.name for f in sentiment._result_type.fields] == fields
    assert [f.name for f in sentiment_pandas._result_type.fields] == fields
    assert sentiment._result_type == SENTIMENT_RESULT_TYPE
    assert sentiment._func._shared.defaults is None  # the table's defaults, under the job parameters
    custom = sentiment_udf(InferenceOptions(intra_op_threads=1), vectorized=True)
    assert isinstance(custom._func, PandasSentimentFunction)
    assert custom._func._shared.defaults == InferenceOptions(intra_op_threads=1)


def test_functions_pickle_without_their_runtime() -> None:
    function = _with_fake(AsyncSentimentFunction(InferenceOptions(intra_op_threads=2)))
    copy = cloudpickle.loads(cloudpickle.dumps(function))
    assert copy._shared.runtime is None and copy._shared.defaults == InferenceOptions(intra_op_threads=2)


def test_async_operator_gets_a_copy_of_each_reused_input_row() -> None:
    """FLINK-39532: PyFlink's coder reuses one list per decoded row; eval runs later."""
    from pyflink.fn_execution.table.async_function.operations import AsyncScalarFunctionOperation

    assert getattr(AsyncScalarFunctionOperation.process_element, "_aisp_snapshots_inputs", False)
    patched = AsyncScalarFunctionOperation.process_element
    _sql_functions._snapshot_async_scalar_inputs()  # idempotent: no second wrapper
    assert AsyncScalarFunctionOperation.process_element is patched

    seen: list[Any] = []
    wrapped = _sql_functions._snapshotting(lambda self, value: seen.append(value))
    reused = ["first"]
    wrapped(None, reused)
    reused[0] = "second"  # the coder decodes the next row into the same list
    wrapped(None, reused)
    assert seen == [["first"], ["second"]]


# -- open/eval/close on the real runtime and the quick model --------------------------------


@pytest.fixture
def quick_model(monkeypatch, quick_assets):
    """The handler's assets are the quick test model (it has no manifest directory)."""
    monkeypatch.setattr(_handlers, "model_assets", lambda options: quick_assets)
    return quick_assets


def test_functions_share_one_runtime_score_like_the_model_and_write_stats(quick_model, tmp_path) -> None:
    texts = ["A gripping, beautiful film.", "Dull and far too long.", "", "meh"]
    expected, _ = OnnxSentimentModel(quick_model).predict(texts)
    params = {
        "aisp.batch.max-size": "8",
        "aisp.batch.max-wait-ms": "20",
        "aisp.onnx.intra-op-threads": "1",
        "aisp.stats.dir": str(tmp_path),
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
            assert rows[i][3] is None and frame["reason"][i] is None
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


def test_the_sql_functions_trip_the_circuit_breaker_when_most_rows_fail() -> None:
    """Issue 9.8 in SQL: failing rows become reason rows until the failure rate reaches the
    threshold; then eval raises CircuitOpenError (the job fails over) instead of emptying the stream."""
    from pyflink_aisp.errors import CircuitOpenError
    from pyflink_aisp.inference import BreakerConfig, FailureRateBreaker

    pandas_fn = _with_fake(PandasSentimentFunction())
    pandas_fn._shared.breaker = FailureRateBreaker(BreakerConfig(max_failure_rate=0.5, window_records=8,
                                                                 min_records=4))
    frame = pandas_fn.eval(pd.Series(["x" * 10, "boom", "x" * 20, None], dtype=object))  # 1 of 3 failed
    assert frame["reason"].tolist() == [None, "inference_error", None, None]
    expected = r"inference failure rate 0\.571 \(4 of the last 7 records\).*TokenizeError"
    with pytest.raises(CircuitOpenError, match=expected):
        pandas_fn.eval(pd.Series(["boom", "boom", "boom", "x"], dtype=object))  # 4 of 7 failed

    async_fn = _with_fake(AsyncSentimentFunction())
    async_fn._shared.breaker = FailureRateBreaker(BreakerConfig(max_failure_rate=0.5, window_records=4,
                                                                min_records=4))
    assert tuple(asyncio.run(async_fn.eval("x" * 10)))[3] is None
    assert tuple(asyncio.run(async_fn.eval("late")))[3] == "inference_timeout"
    assert tuple(asyncio.run(async_fn.eval("x" * 10)))[3] is None  # 1 of 3: not judged before 4
    with pytest.raises(CircuitOpenError):
        asyncio.run(async_fn.eval("boom"))  # 2 of 4 = 0.5 >= 0.5


def test_the_sql_functions_get_the_breaker_from_the_job_parameters() -> None:
    from pyflink_aisp.pipeline import InferenceOptions

    assert InferenceOptions().breaker() is not None
    assert InferenceOptions(max_failure_rate=None).breaker() is None
    config = InferenceOptions.from_job_parameters(
        {"aisp.breaker.max-failure-rate": "0.25", "aisp.breaker.window": "50"}.get).breaker()
    assert (config.max_failure_rate, config.window_records, config.min_records) == (0.25, 50, 5)


def test_an_open_whose_stats_dir_cannot_be_made_gives_the_model_back(seen_options, tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    function = PandasSentimentFunction()
    with pytest.raises(OSError):
        function.open(_Context(**{"aisp.stats.dir": str(taken)}))
    assert function._shared.runtime is None and not ModelRuntime._registry
