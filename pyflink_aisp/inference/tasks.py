"""What a handler's predictions mean: its output fields, their SQL types, how one is rendered.

A :class:`Task` is declared by the handler (:meth:`ModelHandler.task
<pyflink_aisp.inference.ModelHandler.task>`) and read by everything that
writes predictions: the Kafka operators render each prediction with
:meth:`Task.render` into the fields of its JSON output (between ``id`` and
``model_sha256``), SQL functions take their row type from :attr:`Task.fields`.
No operator switches on the type of a prediction.

The tasks of the project's own handlers live here: :class:`SentimentTask`
(``score``, ``label``, with ``--with-embedding`` also ``embedding``),
:class:`EmbeddingTask` (``embedding``) and :class:`ClassificationTask` (``label``,
``score``, optionally ``top_labels`` and ``top_scores``), :class:`PredictionTask` (one field
per output of a numeric model, declared by the model's graph) and :class:`GenerationTask` (a
language model's ``completion``, ``finish_reason`` and token usage, plus the fields of a
structured output). A user's handler declares its own by
subclassing :class:`Task` (see ``jobs/examples/lexicon_handler.py``).
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyflink_aisp.errors import ConfigError, InferenceError
from pyflink_aisp.outcome import render_scored, sentiment_label

__all__ = [
    "RESERVED_FIELDS",
    "ClassificationTask",
    "EmbeddingTask",
    "GenerationTask",
    "OutputField",
    "PredictionTask",
    "SentimentTask",
    "SqlType",
    "Task",
    "check_kept_names",
    "check_task",
    "render_fields",
    "render_prediction",
]

#: Names the operators write themselves (``id``, ``model_sha256``) or that a SQL
#: function's row adds (``reason``, ``detail``): no task may declare them.
RESERVED_FIELDS = frozenset({"id", "model_sha256", "reason", "detail"})

_NAME = re.compile(r"[a-z_][a-z0-9_]*")


class SqlType(enum.StrEnum):
    """The Flink SQL type of an output field (its value in a rendered dict: the Python type after it)."""

    STRING = "STRING"  #: str
    DOUBLE = "DOUBLE"  #: float
    BIGINT = "BIGINT"  #: int
    BOOLEAN = "BOOLEAN"  #: bool
    ARRAY_FLOAT = "ARRAY<FLOAT>"  #: list of float (float32 values)
    ARRAY_DOUBLE = "ARRAY<DOUBLE>"  #: list of float
    ARRAY_STRING = "ARRAY<STRING>"  #: list of str


@dataclass(frozen=True, kw_only=True)
class OutputField:
    """One field of a task's output.

    Attributes:
        name: Lower-case identifier (``[a-z_][a-z0-9_]*``), not one of :data:`RESERVED_FIELDS`.
        sql_type: Its Flink SQL type.
        extra: A field the job asked for beside the task's own (e.g. the sentiment
            model's embedding with ``--with-embedding``); the JSON output writes the
            extra fields after ``model_sha256``, the others before it.

    Raises:
        ConfigError: A bad or reserved name, or a ``sql_type`` that is not a :class:`SqlType`.
    """

    name: str
    sql_type: SqlType
    extra: bool = False

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or self.name in RESERVED_FIELDS:
            raise ConfigError(f"output field name must match [a-z_][a-z0-9_]* and not be one of "
                              f"{sorted(RESERVED_FIELDS)}, got {self.name!r}")
        if not isinstance(self.sql_type, SqlType):
            raise ConfigError(f"sql_type of {self.name} must be a SqlType, got {self.sql_type!r}")


class Task(abc.ABC):
    """What one prediction of a handler becomes: named, typed, JSON-able fields.

    A task is pickled into the job graph with the operator: keep it small (it is
    config, e.g. a frozen dataclass) and importable on the workers.
    Thread-safety: :meth:`render` may run on several threads at once.
    """

    @property
    @abc.abstractmethod
    def fields(self) -> tuple[OutputField, ...]:
        """The output fields, in the order of a SQL row (at least one, names unique)."""

    @abc.abstractmethod
    def render(self, prediction: Any) -> Mapping[str, Any]:
        """One prediction → a dict with exactly the names of :attr:`fields`.

        Values are plain JSON-able Python values of each field's type (no numpy
        scalars: a record rendered with one is dead-lettered, ``inference_error``);
        the JSON output writes them in the dict's order. NaN or an
        infinity is allowed here: the operator then dead-letters the record
        (``inference_error``: JSON cannot carry it).

        Raises:
            Exception: The prediction is not of this task's shape (the operator
                dead-letters the record as ``inference_error``).
        """

    @property
    def has_probabilities(self) -> bool:
        """Whether :meth:`probabilities` gives class probabilities (a cascade stage needs them)."""
        return False

    def probabilities(self, prediction: Any) -> Any:
        """One prediction's class probabilities, a ``(k,)`` float vector (a cascade's confidence).

        Raises:
            InferenceError: This task has none (:attr:`has_probabilities` is False).
        """
        raise InferenceError(f"{type(self).__name__} gives no class probabilities")


def check_task(task: Task) -> Task:
    """``task`` when it is a :class:`Task` with at least one field and unique field names.

    Raises:
        ConfigError: Not a Task, no field, or a name twice.
    """
    if not isinstance(task, Task):
        raise ConfigError(f"ModelHandler.task() must return a Task, got {type(task).__name__}")
    names = [f.name for f in task.fields]
    if not names or len(set(names)) != len(names):
        raise ConfigError(f"{type(task).__name__} needs at least one output field and unique names, "
                          f"got {names}")
    return task


def render_fields(task: Task, prediction: Any) -> Mapping[str, Any]:
    """``task.render(prediction)``, checked to hold exactly the task's field names.

    Raises:
        InferenceError: The task cannot render the prediction (not of its shape), gave
            no mapping or rendered other names: a model failure, reason ``inference_error``.
    """
    try:
        rendered = task.render(prediction)
        names = {f.name for f in task.fields}
    except Exception as exc:
        raise InferenceError(f"{type(task).__name__} cannot render the prediction: "
                             f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(rendered, Mapping):
        raise InferenceError(f"{type(task).__name__}.render must return a mapping of its field names, "
                             f"got {type(rendered).__name__}")
    if set(rendered) != names:
        raise InferenceError(f"{type(task).__name__}.render gave the fields {sorted(rendered)}, "
                             f"not its declared {sorted(names)}")
    return rendered


def check_kept_names(names: Sequence[str], task: Task) -> None:
    """Refuse kept input fields that would overwrite the task's output fields.

    Raises:
        ConfigError: A kept name is one of the task's fields (named in the message).
    """
    clash = sorted(set(names) & {f.name for f in task.fields})
    if clash:
        raise ConfigError(f"kept fields {clash} would overwrite the task's output fields "
                          f"{[f.name for f in task.fields]}: keep other fields, or rename them upstream")


def render_prediction(
    task: Task, record_id: str, prediction: Any, model_version: str, *, max_record_bytes: int,
    kept: Mapping[str, Any] | None = None,
) -> str:
    """The Kafka output value of one scored record: ``{"id", <kept fields>..., <task fields>...,
    "model_sha256", <extra fields>...}`` (:func:`~pyflink_aisp.outcome.render_scored`).

    Args:
        task: The handler's task.
        record_id: The record's id (also its Kafka key).
        prediction: What the handler returned for the record.
        model_version: sha256 of the model that scored it.
        max_record_bytes: Most UTF-8 bytes of key + value the sink can write.
        kept: The input record's fields the job keeps (a :class:`~pyflink_aisp.kafka.FieldMapping`);
            one named like a task field is not written (the task's own value is).

    Raises:
        InferenceError: The task cannot render the prediction, or a value is NaN,
            infinite or not JSON-able, e.g. a numpy scalar (reason ``inference_error``).
        OversizedOutputError: Key + value exceed ``max_record_bytes`` (``oversized_output``).
    """
    rendered = render_fields(task, prediction)
    if kept:  # with every field kept (--keep-fields '*'), a field named like an output field yields to it
        kept = {k: v for k, v in kept.items() if k not in rendered}
    extra_names = [f.name for f in task.fields if f.extra]
    if not extra_names:
        return render_scored(record_id, rendered, model_version, kept=kept, max_record_bytes=max_record_bytes)
    own = {k: v for k, v in rendered.items() if k not in extra_names}
    extra = {k: rendered[k] for k in extra_names}
    return render_scored(record_id, own, model_version, extra=extra, kept=kept,
                         max_record_bytes=max_record_bytes)


_SCORE = OutputField(name="score", sql_type=SqlType.DOUBLE)
_LABEL = OutputField(name="label", sql_type=SqlType.STRING)
_SENTIMENT_EMBEDDING = OutputField(name="embedding", sql_type=SqlType.ARRAY_DOUBLE, extra=True)
_EMBEDDING = OutputField(name="embedding", sql_type=SqlType.ARRAY_FLOAT)


@dataclass(frozen=True, kw_only=True)
class SentimentTask(Task):
    """Review sentiment: a ``(score, (dim,) float32 embedding)`` prediction, P(fresh) first.

    Fields: ``score`` DOUBLE (P(fresh)), ``label`` STRING (``fresh`` when score >= 0.5,
    else ``rotten``), and with ``with_embedding`` the extra ``embedding``
    ARRAY<DOUBLE> (the L2-normalised sentence embedding). Rendered in the order
    ``label, score(, embedding)``: the JSON of the packaged job.
    """

    with_embedding: bool = False

    @property
    def fields(self) -> tuple[OutputField, ...]:
        return (_SCORE, _LABEL, _SENTIMENT_EMBEDDING) if self.with_embedding else (_SCORE, _LABEL)

    @property
    def has_probabilities(self) -> bool:
        return True

    def probabilities(self, prediction: Any) -> Any:
        """``(2,)`` float64: P(rotten), P(fresh)."""
        score = float(prediction[0])
        return np.array([1.0 - score, score])

    def render(self, prediction: Any) -> dict[str, Any]:
        score, embedding = prediction
        out: dict[str, Any] = {"label": sentiment_label(score), "score": float(score)}
        if self.with_embedding:
            out["embedding"] = np.asarray(embedding, dtype=np.float64).tolist()
        return out


@dataclass(frozen=True, kw_only=True)
class EmbeddingTask(Task):
    """A text encoder: a ``(dim,)`` float32 vector per text, field ``embedding`` ARRAY<FLOAT>."""

    @property
    def fields(self) -> tuple[OutputField, ...]:
        return (_EMBEDDING,)

    def render(self, prediction: Any) -> dict[str, Any]:
        return {"embedding": np.asarray(prediction).tolist()}


_TOP_LABELS = OutputField(name="top_labels", sql_type=SqlType.ARRAY_STRING)
_TOP_SCORES = OutputField(name="top_scores", sql_type=SqlType.ARRAY_DOUBLE)


@dataclass(frozen=True, kw_only=True)
class ClassificationTask(Task):
    """A sequence classifier: a ``(num_labels,)`` float32 vector of probabilities per text
    (softmax for single-label, sigmoid per label for multi-label models).

    Fields: ``label`` STRING (the most probable label), ``score`` DOUBLE (its
    probability), and with ``top_k`` > 0 also ``top_labels`` ARRAY<STRING> and
    ``top_scores`` ARRAY<DOUBLE>: the ``min(top_k, num_labels)`` most probable labels,
    most probable first (ties: the lower label index first, as ``numpy.argsort`` with
    ``kind="stable"`` on the negated scores).

    Attributes:
        labels: Label names by output index (a HF ``config.json``'s ``id2label``).
        top_k: How many labels ``top_labels``/``top_scores`` hold (0: neither field).

    Raises:
        ConfigError: No label, a label twice, or ``top_k`` < 0.
    """

    labels: tuple[str, ...]
    top_k: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(self.labels))
        if not self.labels or len(set(self.labels)) != len(self.labels):
            raise ConfigError(f"a classifier needs at least one label and unique names, "
                              f"got {list(self.labels)}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0, got {self.top_k!r}")

    @property
    def fields(self) -> tuple[OutputField, ...]:
        return (_LABEL, _SCORE, _TOP_LABELS, _TOP_SCORES) if self.top_k else (_LABEL, _SCORE)

    @property
    def has_probabilities(self) -> bool:
        return True

    def probabilities(self, prediction: Any) -> Any:
        """``(num_labels,)`` float64: the prediction itself."""
        return np.asarray(prediction, dtype=np.float64)

    def render(self, prediction: Any) -> dict[str, Any]:
        scores = np.asarray(prediction, dtype=np.float64)
        if scores.shape != (len(self.labels),):
            raise InferenceError(f"expected {len(self.labels)} label scores, got shape {scores.shape}")
        order = np.argsort(-scores, kind="stable")
        best = int(order[0])
        out: dict[str, Any] = {"label": self.labels[best], "score": float(scores[best])}
        if self.top_k:
            top = order[: self.top_k]
            out["top_labels"] = [self.labels[i] for i in top]
            out["top_scores"] = scores[top].tolist()
        return out


_PLAIN = {
    SqlType.STRING: str, SqlType.DOUBLE: float, SqlType.BIGINT: int, SqlType.BOOLEAN: bool,
}


def _plain(field: OutputField, value: Any) -> Any:
    """One output value of a row as the plain Python value of its SQL type."""
    if field.sql_type in _PLAIN:
        item = value.item() if isinstance(value, np.generic | np.ndarray) else value
        if isinstance(item, bytes):
            item = item.decode("utf-8")
        return _PLAIN[field.sql_type](item)
    array = np.asarray(value)
    if array.ndim != 1:
        raise InferenceError(f"{field.name}: expected a (k,) vector per row, got shape {array.shape}")
    if field.sql_type is SqlType.ARRAY_STRING:
        return [str(v) for v in array.tolist()]
    return array.astype(np.float64).tolist()


@dataclass(frozen=True, kw_only=True)
class PredictionTask(Task):
    """A numeric model's outputs, one field per output: a prediction is a mapping of the
    field names to one row's value of each output (a numpy scalar or ``(k,)`` vector).

    Which fields a model has comes from its graph (:class:`~pyflink_aisp.inference.handlers.
    OnnxPredictorHandler` declares them): e.g. a scikit-learn classifier exported by
    ``skl2onnx`` with ``zipmap=False`` has ``label`` STRING or BIGINT and ``probabilities``
    ARRAY<FLOAT>; a regressor one DOUBLE.

    Attributes:
        outputs: The fields, in the graph's output order.

    Raises:
        ConfigError: No field, or a name twice.
    """

    outputs: tuple[OutputField, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", tuple(self.outputs))
        names = [f.name for f in self.outputs]
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"a prediction task needs at least one output field and unique names, "
                              f"got {names}")

    @property
    def fields(self) -> tuple[OutputField, ...]:
        return self.outputs

    @property
    def has_probabilities(self) -> bool:
        """Whether the model has an output named ``probabilities`` (skl2onnx's classifiers)."""
        return any(f.name == "probabilities" and f.sql_type in (SqlType.ARRAY_FLOAT, SqlType.ARRAY_DOUBLE)
                   for f in self.outputs)

    def probabilities(self, prediction: Any) -> Any:
        """``(k,)`` float64: the ``probabilities`` output.

        Raises:
            InferenceError: The model has no such output.
        """
        if not self.has_probabilities:
            raise InferenceError("a prediction task gives class probabilities only from an output named "
                                 "probabilities (ARRAY<FLOAT> or ARRAY<DOUBLE>)")
        return np.asarray(prediction["probabilities"], dtype=np.float64).reshape(-1)

    def render(self, prediction: Any) -> dict[str, Any]:
        return {f.name: _plain(f, prediction[f.name]) for f in self.outputs}


_GENERATION_FIELDS = (
    OutputField(name="completion", sql_type=SqlType.STRING),
    OutputField(name="finish_reason", sql_type=SqlType.STRING),
    OutputField(name="prompt_tokens", sql_type=SqlType.BIGINT),
    OutputField(name="completion_tokens", sql_type=SqlType.BIGINT),
)
_TRUNCATED_FIELD = (OutputField(name="prompt_truncated", sql_type=SqlType.BOOLEAN),)


@dataclass(frozen=True, kw_only=True)
class GenerationTask(Task):
    """Text generation: a prediction is a mapping with ``completion`` (the generated text),
    ``finish_reason`` (the OpenAI API's: ``stop``, ``length``, ...), ``prompt_tokens`` and
    ``completion_tokens`` (the server's usage for this record; None where a request carried
    several records and the server reported one total), and one value per ``structured`` field.

    Fields: ``completion`` STRING, ``finish_reason`` STRING, ``prompt_tokens`` BIGINT,
    ``completion_tokens`` BIGINT, with ``prompt_truncated`` its BOOLEAN field, then the
    ``structured`` fields (a JSON schema's properties, parsed from the completion).

    Attributes:
        structured: Fields parsed from a structured (JSON) completion, in the schema's order.
        prompt_truncated: Prompts may be cut to fit the model (``--prompt-overflow truncate``):
            a field ``prompt_truncated`` says whether the record's was.

    Raises:
        ConfigError: A structured field named like one of the four, or a name twice.
    """

    structured: tuple[OutputField, ...] = ()
    prompt_truncated: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "structured", tuple(self.structured))
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            own, given = [f.name for f in _GENERATION_FIELDS], [f.name for f in self.structured]
            raise ConfigError(f"structured output fields must not repeat or be named like {own}, got {given}")

    @property
    def fields(self) -> tuple[OutputField, ...]:
        return _GENERATION_FIELDS + (_TRUNCATED_FIELD if self.prompt_truncated else ()) + self.structured

    def render(self, prediction: Any) -> dict[str, Any]:
        return {f.name: None if prediction[f.name] is None else _plain(f, prediction[f.name])
                for f in self.fields}
