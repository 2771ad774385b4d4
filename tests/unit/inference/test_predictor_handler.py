"""The numeric ONNX model handler (--predictor): rag-intent-classifier's logistic regression
converted by skl2onnx, on real embeddings, gives scikit-learn's own predict_proba and labels;
graphs that no field takes are refused at load in one line."""

from __future__ import annotations

import warnings

import joblib
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.errors import ModelError
from pyflink_aisp.inference import BatchingConfig, ModelRuntime
from pyflink_aisp.inference.handlers import OnnxEncoderHandler, OnnxPredictorHandler, Pooling
from pyflink_aisp.inference.tasks import SqlType, render_fields
from pyflink_aisp.inference.testing import check_model_handler
from pyflink_aisp.models import build_intent_head, build_minilm_encoder, locate_intent_models


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    return build_intent_head(tmp_path_factory.mktemp("head") / "intent-head.onnx")


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return build_minilm_encoder(tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="module")
def embeddings(encoder_dir):
    """all-MiniLM-L6-v2 embeddings (mean pooled, normalised) of 40 real review snippets."""
    encoder = OnnxEncoderHandler(model_path=encoder_dir / "model.onnx",
                                 tokenizer_path=encoder_dir / "tokenizer.json", pooling=Pooling.NONE)
    texts = [r.text for r in load_rotten_tomatoes()[:40]]
    return np.stack(encoder.run_inference(texts, encoder.load_model()))


def _sklearn():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = locate_intent_models()
        return joblib.load(models / "LogisticRegression.joblib"), joblib.load(models / "label_map.joblib")


def test_the_task_declares_one_field_per_graph_output(head):
    fields = OnnxPredictorHandler(model_path=head).task().fields
    assert [(f.name, f.sql_type) for f in fields] == [("label", SqlType.STRING),
                                                      ("probabilities", SqlType.ARRAY_FLOAT)]


def test_probabilities_and_labels_equal_scikit_learns(head, embeddings):
    handler = OnnxPredictorHandler(model_path=head)
    predictions = handler.run_inference(list(embeddings), handler.load_model())
    rendered = [render_fields(handler.task(), p) for p in predictions]
    clf, names = _sklearn()
    want = clf.predict_proba(embeddings)
    got = np.array([r["probabilities"] for r in rendered])
    assert got.shape == (40, 157)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # the label is the class of the largest probability, named by the package's label map
    want_labels = [str(names.get(c, c)) for c in clf.predict(embeddings)]
    want_labels = [c if n.lstrip("-").isdigit() else n
                   for c, n in zip(map(str, clf.predict(embeddings)), want_labels, strict=True)]
    assert [r["label"] for r in rendered] == want_labels
    assert len(set(want_labels)) > 3  # the texts do not all land on one intent


def test_the_handler_keeps_the_contract(head, embeddings):
    report = check_model_handler(OnnxPredictorHandler(model_path=head), list(embeddings[:6]))
    assert report.examples == 6 and report.device == "cpu"
    assert report.max_abs_diff < 1e-5


def test_a_vector_of_another_width_fails_alone_and_the_rest_score(head, embeddings):
    runtime = ModelRuntime.acquire(OnnxPredictorHandler(model_path=head), BatchingConfig(max_batch_size=8))
    try:
        rows = [list(embeddings[0]), [0.5] * 3, list(embeddings[1])]
        outcomes = runtime.infer_batch(rows)
    finally:
        runtime.release()
    assert isinstance(outcomes[1], ValueError) and "(384,) feature vector" in str(outcomes[1])
    assert not isinstance(outcomes[0], BaseException) and not isinstance(outcomes[2], BaseException)
    np.testing.assert_allclose(outcomes[0].prediction["probabilities"],
                               _sklearn()[0].predict_proba(embeddings[:1])[0], atol=1e-5)


def _graph(tmp_path, inputs, outputs, name="m.onnx"):
    nodes = [helper.make_node("Identity", [inputs[0].name], [o.name]) for o in outputs]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / name
    onnx.save_model(model, str(path))
    return path


def test_a_regressor_output_of_shape_batch_by_one_is_a_double(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])
    y = helper.make_tensor_value_info("variable", TensorProto.FLOAT, ["batch", 1])
    handler = OnnxPredictorHandler(model_path=_graph(tmp_path, [x], [y]))
    assert [(f.name, f.sql_type) for f in handler.task().fields] == [("variable", SqlType.DOUBLE)]
    out = handler.run_inference([[2.5], [-1.0]], handler.load_model())
    assert [render_fields(handler.task(), p) for p in out] == [{"variable": 2.5}, {"variable": -1.0}]


@pytest.mark.parametrize(("inputs", "outputs", "message"), [
    ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])], "static batch size 4"),
    ([helper.make_tensor_value_info("x", TensorProto.INT64, ["b", 3])],
     [helper.make_tensor_value_info("y", TensorProto.INT64, ["b", 3])], "takes one float tensor"),
    ([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3])],
     [helper.make_tensor_value_info("id", TensorProto.FLOAT, ["b", 3])], "operators write themselves"),
    ([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2, 3])],
     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2, 3])], "takes one float tensor"),
])
def test_graphs_no_field_takes_are_refused_in_one_line(tmp_path, inputs, outputs, message):
    handler = OnnxPredictorHandler(model_path=_graph(tmp_path, inputs, outputs))
    with pytest.raises(ModelError, match=message) as info:
        handler.load_model()
    assert "\n" not in str(info.value)


def test_a_zipmap_output_is_refused_with_the_export_option_to_use(tmp_path):
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    model = to_onnx(LogisticRegression(max_iter=200).fit(x, y), x[:1].astype(np.float32), target_opset=18)
    path = tmp_path / "zipmap.onnx"
    onnx.save_model(model, str(path))
    with pytest.raises(ModelError, match="zipmap=False"):
        OnnxPredictorHandler(model_path=path).task()


def test_a_missing_file_is_refused():
    with pytest.raises(ModelError, match="not found"):
        OnnxPredictorHandler(model_path="/nonexistent/model.onnx")


def test_hot_swap_takes_a_retrained_model_with_the_same_fields_and_refuses_others(head, embeddings,
                                                                                 tmp_path):
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    from pyflink_aisp.checksums import sha256_file
    from pyflink_aisp.errors import ChecksumError

    clf, _ = _sklearn()
    handler = OnnxPredictorHandler(model_path=head)
    serving = handler.load_model()
    assert handler.model_version() == sha256_file(head)
    assert handler.run_inference([embeddings[0]], serving)[0]["label"]
    retrained = clf
    retrained.coef_ = retrained.coef_ * 0.5  # another version: flatter probabilities, the same fields
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = to_onnx(retrained, initial_types=[("embedding", FloatTensorType([None, 384]))],
                        options={id(retrained): {"zipmap": False}}, target_opset={"": 18, "ai.onnx.ml": 3})
    v2 = tmp_path / "v2.onnx"
    onnx.save_model(model, str(v2))
    swapped = handler.load_version(v2, sha256_file(v2))
    (got,) = handler.run_inference([embeddings[0]], swapped)
    np.testing.assert_allclose(got["probabilities"], retrained.predict_proba(embeddings[:1])[0], atol=1e-5)
    with pytest.raises(ChecksumError):
        handler.load_version(v2, "0" * 64)
    x = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", 384])
    y = helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 384])
    other = _graph(tmp_path, [x], [y], name="other.onnx")
    with pytest.raises(ModelError, match=r"gives the fields \['score'\].*not the serving model's"):
        handler.load_version(other, sha256_file(other))


@pytest.mark.parametrize(("rows", "width", "shape"), [
    ([(0.5, 1, 2.5), [3.0, -1.0, 0.0]], 3, (2, 3)),     # tuples and lists, ints among floats
    ([(0.5, 1.0)], None, (1, 2)),                       # any width where the model declares none
    ([(0.5, 1.0), (2.0,)], None, None),                 # ragged: the rows are read one by one
    ([(0.5, 1.0)], 3, None),                            # not the model's width
    ([(0.5, "x")], 2, None),                            # not a number
    ([[[0.5, 1.0]]], 2, None),                          # a row of two dimensions
    ([], 2, None),
])
def test_feature_vectors_become_one_matrix_in_one_conversion(rows, width, shape):
    from pyflink_aisp.inference.handlers._onnx_predictor import feature_matrix

    got = feature_matrix(rows, np.float32, width)
    if shape is None:
        assert got is None
    else:
        assert got.dtype == np.float32 and got.shape == shape
        np.testing.assert_array_equal(got, np.stack([np.asarray(r, dtype=np.float32) for r in rows]))


@pytest.mark.parametrize(("allow", "entry"), [(True, "1"), (False, "0")])
def test_an_encoders_session_spins_as_asked(encoder_dir, allow, entry):
    encoder = OnnxEncoderHandler(model_path=encoder_dir / "model.onnx",
                                 tokenizer_path=encoder_dir / "tokenizer.json", pooling=Pooling.NONE,
                                 allow_spinning=allow)
    session = encoder.load_model().session
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == entry
