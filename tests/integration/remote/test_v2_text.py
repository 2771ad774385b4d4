"""Issue 22: text models over V2: the handler with ``texts=True`` sends each record's text as a
BYTES tensor to the real KServe server's ``review_tfidf`` (a TF-IDF and logistic regression
trained on the reviews, one string input; the ``v2_server`` fixture), over REST and over gRPC; the
answers equal the same graph run in process, and a numeric handler on a text model (or the other
way round) stops at the start-up check with a hint."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews
from pyflink_aisp.errors import ModelError
from pyflink_aisp.inference.handlers.remote import V2PredictorHandler

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reviews():
    """200 held-out reviews, and two texts beyond ASCII."""
    _, heldout = split_reviews(load_rotten_tomatoes())
    return [r.text for r in heldout[:200]] + ["très drôle, un vrai plaisir", "映画は退屈だった — dull"], \
        [r.label for r in heldout[:200]]


def _in_process(path, texts):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    label, probabilities = session.run(["label", "probabilities"],
                                       {"text": np.array(texts, dtype=object).reshape(-1, 1)})
    return list(label), probabilities


@pytest.mark.parametrize("binding", ["rest", "grpc"])
def test_texts_go_as_bytes_tensors_and_answer_as_the_graph_in_process(v2_server, reviews, binding) -> None:
    texts, truth = reviews
    url = v2_server.grpc_url if binding == "grpc" else v2_server.url
    handler = V2PredictorHandler(url=url, model="review_tfidf", texts=True, rows_per_request=32)
    assert [(f.name, f.sql_type.value) for f in handler.task().fields] == [
        ("label", "STRING"), ("probabilities", "ARRAY<FLOAT>")]
    model = handler.load_model()
    try:
        got = handler.run_inference(texts, model)
        stats = model.session.stats
    finally:
        handler.release_model(model)
    labels, probabilities = _in_process(v2_server.text_onnx_path, texts)
    assert [g["label"] for g in got] == labels
    np.testing.assert_allclose(np.stack([g["probabilities"] for g in got]), probabilities, atol=1e-6)
    assert stats.requests == -(-len(texts) // 32) and not stats.failures
    accuracy = np.mean([(g["label"] == "fresh") == bool(t) for g, t in zip(got, truth, strict=False)])
    assert accuracy > 0.7  # a real model of the reviews, not noise


def test_a_numeric_handler_on_a_text_model_and_the_other_way_round_stop_at_the_check(v2_server) -> None:
    with pytest.raises(ModelError, match="a text model: leave out --feature-fields"):
        V2PredictorHandler(url=v2_server.url, model="review_tfidf").check()
    with pytest.raises(ModelError, match="a text model takes one BYTES tensor"):
        V2PredictorHandler(url=v2_server.grpc_url, model="intent_head", texts=True).check()
