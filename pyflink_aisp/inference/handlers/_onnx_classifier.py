"""A ModelHandler for a Hugging Face sequence-classification model directory on ONNX Runtime.

The directory is the layout ``transformers`` and ``optimum`` write: ``config.json``
(``id2label``, optionally ``problem_type``), ``tokenizer.json`` and ``model.onnx``
(an export whose output ``logits`` is float ``(batch, num_labels)``, as
``optimum-cli export onnx --task text-classification`` writes it). Probabilities
follow ``transformers``' own rule for the config (``pipelines/text_classification.py``,
``function_to_apply``): sigmoid per label when ``problem_type`` is
``multi_label_classification`` or the model has one label, else softmax over the
labels. The graph's inputs are fed as :class:`OnnxEncoderHandler` feeds them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ModelError
from pyflink_aisp.inference.handlers._common import Pooling
from pyflink_aisp.inference.handlers._onnx import ExecutionProvider, ProviderSpec
from pyflink_aisp.inference.handlers._onnx_encoder import OnnxEncoderHandler, OnnxEncoderModel
from pyflink_aisp.inference.tasks import ClassificationTask
from pyflink_aisp.tokenize import PaddedBatch

__all__ = ["ClassifierConfig", "OnnxClassifierHandler", "read_classifier_config"]

_VERSION_TAG = "pyflink-aisp/onnx-classifier/1"
_MULTI_LABEL = "multi_label_classification"
_LOGITS = "logits"


class ClassifierConfig:
    """What the handler reads from ``config.json``.

    Attributes:
        labels: Label names by output index (``id2label``; keys ``"0"``..``"n-1"``).
        multi_label: Sigmoid per label (else softmax).
    """

    def __init__(self, labels: tuple[str, ...], multi_label: bool) -> None:
        self.labels = labels
        self.multi_label = multi_label


def read_classifier_config(path: Path) -> ClassifierConfig:
    """Labels and activation of a HF sequence classifier's ``config.json``.

    Raises:
        ModelError: The file is missing or not JSON, ``id2label`` is missing, its keys are
            not exactly ``0..n-1``, a label is empty or twice, or ``problem_type`` is
            ``regression`` (not a classifier).
    """
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read classifier config {path}: {exc}") from exc
    id2label = config.get("id2label") if isinstance(config, dict) else None
    if not isinstance(id2label, dict) or not id2label:
        raise ModelError(f"{path} has no id2label: the labels of a sequence classifier are needed "
                         "(transformers writes them with the model)")
    try:
        indices = sorted(int(k) for k in id2label)
    except ValueError:
        raise ModelError(f"{path}: id2label keys must be label indices, got {sorted(id2label)[:5]}") from None
    if indices != list(range(len(id2label))):
        raise ModelError(f"{path}: id2label must name indices 0..{len(id2label) - 1}, got {indices[:10]}")
    labels = tuple(str(id2label[str(i)] if str(i) in id2label else id2label[i]) for i in indices)
    if any(not label for label in labels) or len(set(labels)) != len(labels):
        raise ModelError(f"{path}: id2label holds an empty or repeated label: {list(labels)[:10]}")
    problem = config.get("problem_type")
    if problem == "regression":
        raise ModelError(f"{path}: problem_type is regression, not a classifier")
    return ClassifierConfig(labels, problem == _MULTI_LABEL or len(labels) == 1)


def _probabilities(logits: npt.NDArray[np.floating[Any]], multi_label: bool) -> npt.NDArray[np.float32]:
    """``(k, n)`` logits → ``(k, n)`` float32 probabilities (max-shifted softmax, or sigmoid)."""
    x = logits.astype(np.float64, copy=False)
    if multi_label:
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)
    shifted = np.exp(x - x.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)


class _ClassifierModel(OnnxEncoderModel):
    """An encoder session whose ``(k, num_labels)`` output becomes probabilities."""

    multi_label: bool = False

    def embed(self, padded: PaddedBatch) -> npt.NDArray[np.float32]:
        return _probabilities(super().embed(padded), self.multi_label)


class OnnxClassifierHandler(OnnxEncoderHandler):
    """Classifies texts with a HF sequence-classification model directory.

    Predictions are ``(num_labels,)`` float32 probabilities in ``id2label`` order,
    rendered by :class:`~pyflink_aisp.inference.tasks.ClassificationTask` (``label``,
    ``score`` and, with ``top_k``, ``top_labels`` / ``top_scores``). The model version
    is the sha256 over ``model.onnx``, ``tokenizer.json``, ``config.json`` and the
    options (``max_length``, output). Hot swap (:meth:`load_version`) takes another ``.onnx``
    file for the same ``config.json`` labels and tokenizer (e.g. a retrained or recalibrated
    graph); it must give one probability per label, and later outputs carry its sha256.

    Args:
        model_dir: The directory (``config.json``, ``tokenizer.json``, ``model.onnx``).
        top_k: Labels in ``top_labels`` / ``top_scores`` (0: neither field).
        output: Graph output of the logits (default ``logits``, the name HF exports give it).
        max_length: Truncation, special tokens included (None: the tokenizer's, else 128).
        providers: ONNX Runtime execution providers (default CPU).
        device_id: CUDA device of a GPU provider.
        intra_op_num_threads: ORT intra-op threads (None: ORT's default).
        allow_spinning: ORT intra-op threads spin-wait between runs (session config
            ``session.intra_op.allow_spinning``); None: ORT's default (spinning).

    Raises:
        ConfigError: ``top_k`` < 0, or as :class:`OnnxEncoderHandler`.
        ModelError: A file of the directory is missing, or its ``config.json`` as
            :func:`read_classifier_config` refuses it.
    """

    def __init__(
        self,
        *,
        model_dir: Path | str,
        top_k: int = 0,
        output: str = _LOGITS,
        max_length: int | None = None,
        providers: Sequence[ProviderSpec] = (ExecutionProvider.CPU,),
        device_id: int | None = None,
        intra_op_num_threads: int | None = None,
        allow_spinning: bool | None = None,
    ) -> None:
        directory = Path(model_dir)
        missing = [n for n in ("config.json", "tokenizer.json", "model.onnx")
                   if not (directory / n).is_file()]
        if missing:
            raise ModelError(f"{directory} is not a sequence-classification model directory: no {missing} "
                             "(config.json with id2label, tokenizer.json, model.onnx)")
        self._config_path = directory / "config.json"
        self._classifier = read_classifier_config(self._config_path)
        self._task = ClassificationTask(labels=self._classifier.labels, top_k=top_k)
        super().__init__(model_path=directory / "model.onnx", tokenizer_path=directory / "tokenizer.json",
                         output=output, pooling=Pooling.NONE, max_length=max_length, providers=providers,
                         device_id=device_id, intra_op_num_threads=intra_op_num_threads,
                         allow_spinning=allow_spinning)

    @property
    def labels(self) -> tuple[str, ...]:
        """Label names by output index."""
        return self._classifier.labels

    def task(self, *, with_embedding: bool = False) -> ClassificationTask:  # type: ignore[override]
        """``label``, ``score`` (and ``top_labels``/``top_scores`` with ``top_k``)."""
        return self._task

    def _version_inputs(self) -> tuple[str, list[Path], dict[str, str]]:
        _, files, options = super()._version_inputs()
        return _VERSION_TAG, [*files, self._config_path], options

    def _plan_output(self, session: Any, model_path: Path) -> str:
        """The logits output, checked as the encoder checks it; its declared last axis must
        hold one value per label.

        Raises:
            ModelError: No such output, or a declared label axis of another size.
        """
        declared = {arg.name: arg for arg in session.get_outputs()}
        name = super()._plan_output(session, model_path)
        shape = declared[name].shape
        width = shape[-1] if isinstance(shape, list) and shape else None
        if isinstance(width, int) and width != len(self.labels):
            raise ModelError(f"output {name!r} of {model_path} has {width} values per text but "
                             f"config.json names {len(self.labels)} labels")
        return name

    def _wrap_model(self, model: OnnxEncoderModel) -> OnnxEncoderModel:
        """The encoder session, returning probabilities (softmax, or sigmoid per label)."""
        classifier = _ClassifierModel(model.session, model.tokenizer, feeds=model.feeds, output=model.output,
                                      pooling=Pooling.NONE, normalize=False, io=model.io)
        classifier.multi_label = self._classifier.multi_label
        return classifier

    def _probe_checks(self) -> dict[str, Any]:
        """Rows of probabilities: each in [0, 1], summing to 1 under softmax."""
        return {"probabilities": "sigmoid" if self._classifier.multi_label else "softmax"}
