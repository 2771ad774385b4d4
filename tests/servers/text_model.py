"""A text model for the V2 server's text input: TF-IDF and a logistic regression trained on the
train split of the rotten-tomatoes reviews (scikit-learn), converted by ``skl2onnx`` with one
string input ``text`` of shape ``[-1, 1]`` and the outputs ``label`` (``fresh`` / ``rotten``,
BYTES) and ``probabilities`` (FP32 ``[-1, 2]``): what a user serves as a model that owns its
tokenizer. The same ``model.onnx`` runs in process for the tests' expected values."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews


def build_review_tfidf(out: Path) -> Path:
    """Train and write the model to ``out`` (a file); returns ``out``."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType

    train, _ = split_reviews(load_rotten_tomatoes())
    texts = [r.text for r in train]
    labels = np.array(["fresh" if r.label else "rotten" for r in train])
    # word tokens of 2+ characters, as written: lowercase=True would convert to ONNX's StringNormalizer,
    # which needs the en_US.UTF-8 locale installed where the server runs
    pipeline = make_pipeline(TfidfVectorizer(lowercase=False, token_pattern=r"\b\w\w+\b", max_features=20000),
                             LogisticRegression(max_iter=1000))
    pipeline.fit(texts, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = to_onnx(pipeline, initial_types=[("text", StringTensorType([None, 1]))],
                        options={id(pipeline.steps[-1][1]): {"zipmap": False}},
                        target_opset={"": 18, "ai.onnx.ml": 3})
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out))
    return out
