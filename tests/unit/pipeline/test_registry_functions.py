"""The SQL functions of the model registry (pyflink_aisp.pipeline.registry.NAME): resolved from
$AISP_MODELS, typed by the model's task, configured by the entry alone (not by job parameters),
scoring ARRAY<FLOAT> rows with the numeric model exactly as scikit-learn does."""

from __future__ import annotations

import asyncio
import warnings

import cloudpickle
import joblib
import numpy as np
import pandas as pd
import pytest

from pyflink_aisp.models import build_intent_head, locate_intent_models
from pyflink_aisp.pipeline import load_registry, registry


class _Group:
    def add_group(self, name):
        return self

    def gauge(self, name, read):
        pass


class _Context:
    """FunctionContext with a job parameter that would pick another model: the entry wins."""

    def get_job_parameter(self, key, default):
        return {"aisp.batch.max-size": "2", "aisp.classifier.dir": "/nonexistent"}.get(key, default)

    def get_metric_group(self):
        return _Group()


@pytest.fixture(scope="module")
def models_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("registry")
    build_intent_head(folder / "head.onnx")
    path = folder / "models.yaml"
    path.write_text("models:\n  intent_head: {task: predict, path: head.onnx, max-batch-size: 64}\n")
    return path


@pytest.fixture()
def env(models_file, monkeypatch):
    monkeypatch.setenv("AISP_MODELS", str(models_file))
    return models_file


def _vectors(n):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n, 384)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _clf():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return joblib.load(locate_intent_models() / "LogisticRegression.joblib")


def test_a_registered_model_is_a_function_typed_by_its_task(env):
    for name in ("intent_head", "intent_head_pandas"):
        function = getattr(registry, name)
        assert [repr(t) for t in function._input_types] == ["ArrayType(FloatType(true), true)"]
        result = function._result_type
        assert result.names == ["label", "probabilities", "model_sha256", "reason", "detail"]
        assert [repr(f.data_type) for f in result.fields][:2] == ["VarCharType(2147483647, true)",
                                                                  "ArrayType(FloatType(true), true)"]
    assert registry.intent_head_pandas._func_type == "pandas"


def test_an_unknown_model_or_no_registry_is_an_attribute_error_naming_why(env, monkeypatch):
    with pytest.raises(AttributeError, match=r"names no model 'fraud'; it has \['intent_head'\]"):
        registry.fraud  # noqa: B018
    monkeypatch.delenv("AISP_MODELS")
    with pytest.raises(AttributeError, match=r"\$AISP_MODELS names no model registry"):
        registry.intent_head  # noqa: B018


def test_the_pandas_function_scores_arrays_as_scikit_learn_with_the_entrys_options(env):
    function = cloudpickle.loads(cloudpickle.dumps(registry.intent_head_pandas._func))
    function.open(_Context())
    try:
        x = _vectors(5)
        frame = function.eval(pd.Series([x[0], x[1], None, x[2].tolist(), [1.0, 2.0]]))
        runtime = function._shared.runtime
        assert runtime.batching.max_batch_size == 64  # the entry's, not the job parameter's 2
    finally:
        function.close()
    assert list(frame.columns) == ["label", "probabilities", "model_sha256", "reason", "detail"]
    want = _clf().predict_proba(x[:3])
    for row, i in ((0, 0), (1, 1), (3, 2)):
        np.testing.assert_allclose(frame["probabilities"][row], want[i], atol=1e-5)
        assert frame["reason"][row] is None
    assert frame.iloc[2].isna().all()  # null in, null out
    assert frame["reason"][4] == "inference_error" and "(384,) feature vector" in frame["detail"][4]


def test_the_async_function_scores_one_array(env):
    function = cloudpickle.loads(cloudpickle.dumps(registry.intent_head._func))
    function.open(_Context())
    try:
        x = _vectors(1)
        row = asyncio.run(function.eval(x[0].tolist()))
    finally:
        function.close()
    version = load_registry(env).get("intent_head").handler().model_version()
    assert row[2] == version and row[3] is None
    np.testing.assert_allclose(row[1], _clf().predict_proba(x)[0], atol=1e-5)
