"""rag-intent-classifier's logistic regression as a HF classifier directory: the job's
probabilities are scikit-learn's own ``predict_proba`` on the same embeddings, and the
package's documented examples get the labels its documentation gives."""

from __future__ import annotations

import json
import warnings

import joblib
import numpy as np
import onnxruntime as ort
import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxClassifierHandler
from pyflink_aisp.models import (
    build_encoder_model,
    build_intent_classifier,
    locate_intent_models,
    locate_source_model,
)
from pyflink_aisp.tokenize import ArrowTokenizer, TokenizerConfig

#: docs/LABELS.md of rag-intent-classifier 1.0.7: text -> the label it documents.
DOCUMENTED = {
    "I'm not satisfied with your last answer": "follow_up",
    "please assist immediately, my card is showing unauthorized activity": "urgent_attention_required",
    "i want a real person to help me from here": "connect_to_human",
}


@pytest.fixture(scope="module")
def intent_dir(tmp_path_factory):
    return build_intent_classifier(tmp_path_factory.mktemp("intent"))


def test_the_directory_is_a_157_label_classifier(intent_dir):
    labels = list(json.loads((intent_dir / "config.json").read_text())["id2label"].values())
    assert len(labels) == len(set(labels)) == 157
    assert {"weather", "transfer", "connect_to_human", "follow_up"} <= set(labels)
    assert not [name for name in labels if name.isdigit()], "every class has its name"


def test_probabilities_equal_scikit_learns_predict_proba(intent_dir):
    texts = [*DOCUMENTED, *(r.text for r in load_rotten_tomatoes()[:60])]
    handler = OnnxClassifierHandler(model_dir=intent_dir)
    got = np.stack(handler.run_inference(texts, handler.load_model()))
    # the reference: the encoder graph's embedding (all-MiniLM-L6-v2, mean pooling, normalised), then
    # the package's LogisticRegression itself
    source = locate_source_model()
    encoder = build_encoder_model(source.weights_path, source.bert_config())
    session = ort.InferenceSession(encoder.SerializeToString(), providers=["CPUExecutionProvider"])
    tokenizer = ArrowTokenizer.from_file(source.tokenizer_path, TokenizerConfig(max_length=128))
    rows = np.arange(len(texts), dtype=np.intp)
    with tokenizer.pad(tokenizer.encode(texts), rows) as padded:
        (embedding,) = session.run(["embedding"], padded.model_inputs())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = joblib.load(locate_intent_models() / "LogisticRegression.joblib")
    np.testing.assert_allclose(got, clf.predict_proba(embedding), atol=1e-5)
    task = handler.task()
    assert [task.render(p)["label"] for p in got[:3]] == list(DOCUMENTED.values())
