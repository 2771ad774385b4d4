"""What happens to a record: it is scored, or it becomes a dead letter with one :class:`Reason`.

Every operator (the Arrow map, the async operator, the SQL functions) ends
each record in one of the two outcomes, and every dead letter has the same
JSON schema (:func:`dead_letter_json`)::

    {"reason", "detail", "id", "topic", "partition", "offset",
     "value_base64", "value_size_bytes", "value_truncated"}

``id`` is null when the record did not decode far enough to have one; the raw
value is kept (base64) up to :data:`MAX_DEAD_LETTER_VALUE_BYTES`, so a dead
letter can be replayed after a fix and stays under the producer's default
``max.request.size`` (1 MiB). The reason of an exception is read from its
type (:func:`reason_of`), never from its message.
"""

from __future__ import annotations

import base64
import enum
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyflink_aisp.errors import DecodeError, InferenceTimeoutError

__all__ = [
    "MAX_DEAD_LETTER_VALUE_BYTES",
    "DeadLettered",
    "Reason",
    "dead_letter_json",
    "reason_of",
    "scored_json",
    "sentiment_label",
]

#: Most raw value bytes a dead letter carries (base64 grows them by 4/3): keeps a
#: DLQ record under the producer's default ``max.request.size`` of 1 MiB.
MAX_DEAD_LETTER_VALUE_BYTES = 256 * 1024
#: Longest ``detail`` kept, in characters.
MAX_DETAIL_CHARS = 1000


class Reason(enum.StrEnum):
    """Why a record went to the dead-letter topic (its ``reason`` field)."""

    NULL_VALUE = "null_value"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_TEXT = "missing_text"
    TEXT_NOT_STRING = "text_not_string"
    INVALID_UNICODE = "invalid_unicode"
    BAD_ID = "bad_id"
    DECODE_ERROR = "decode_error"
    INFERENCE_ERROR = "inference_error"
    INFERENCE_TIMEOUT = "inference_timeout"
    OVERSIZED_OUTPUT = "oversized_output"


def reason_of(error: BaseException) -> Reason:
    """The reason for an exception: a :class:`~pyflink_aisp.errors.DecodeError`'s
    own, ``INFERENCE_TIMEOUT`` for :class:`~pyflink_aisp.errors.InferenceTimeoutError`,
    else ``INFERENCE_ERROR``."""
    if isinstance(error, DecodeError):
        try:
            return Reason(error.reason)
        except ValueError:  # a decoder's own reason that the enum does not know
            return Reason.DECODE_ERROR
    if isinstance(error, InferenceTimeoutError):
        return Reason.INFERENCE_TIMEOUT
    return Reason.INFERENCE_ERROR


@dataclass(frozen=True, kw_only=True)
class DeadLettered:
    """A record's dead letter.

    Attributes:
        reason: Why.
        detail: What exactly (the exception type and message, cut to 1,000 chars).
        id: The record's id, or None when it did not decode.
        topic: Kafka coordinates of the input record (None outside Kafka).
        partition: Its partition.
        offset: Its offset.
        value: Its raw bytes (None for a null value or when not known).
    """

    reason: Reason
    detail: str
    id: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    value: bytes | None = None

    @classmethod
    def of_error(cls, error: BaseException, **where: Any) -> DeadLettered:
        """The dead letter of an exception (``where``: id, topic, partition, offset, value)."""
        return cls(reason=reason_of(error), detail=f"{type(error).__name__}: {error}", **where)

    @property
    def key(self) -> str:
        """Kafka key of the dead letter: the id, else ``topic/partition/offset``."""
        return self.id if self.id is not None else f"{self.topic}/{self.partition}/{self.offset}"

    def to_json(self) -> str:
        """The dead-letter value (see :func:`dead_letter_json`)."""
        return dead_letter_json(self)


def dead_letter_json(letter: DeadLettered) -> str:
    """ASCII JSON of a dead letter, the schema of the module docstring; at most
    :data:`MAX_DEAD_LETTER_VALUE_BYTES` of the raw value (base64) and
    :data:`MAX_DETAIL_CHARS` of detail."""
    value = letter.value
    kept = None if value is None else value[:MAX_DEAD_LETTER_VALUE_BYTES]
    return json.dumps({
        "reason": letter.reason.value,
        "detail": letter.detail[:MAX_DETAIL_CHARS],
        "id": letter.id,
        "topic": letter.topic,
        "partition": letter.partition,
        "offset": letter.offset,
        "value_base64": None if kept is None else base64.b64encode(kept).decode("ascii"),
        "value_size_bytes": None if value is None else len(value),
        "value_truncated": value is not None and len(value) > MAX_DEAD_LETTER_VALUE_BYTES,
    })


def sentiment_label(score: float) -> str:
    """``'fresh'`` for P(fresh) >= 0.5, else ``'rotten'``."""
    return "fresh" if score >= 0.5 else "rotten"


def scored_json(record_id: str, prediction: Any, model_version: str, *, with_embedding: bool) -> str:
    """The output value of a scored record.

    Args:
        record_id: The record's id.
        prediction: ``(score, (384,) float32 embedding)`` of the sentiment model, or a
            ``(dim,)`` float32 vector of a generic encoder.
        model_version: sha256 of the model that scored it.
        with_embedding: Add the sentiment model's embedding.

    Returns:
        ``{"id", "label", "score", "model_sha256"}`` (``"embedding"`` with
        ``with_embedding``) for the sentiment model; ``{"id", "embedding",
        "model_sha256"}`` for an encoder.
    """
    if isinstance(prediction, np.ndarray):
        return json.dumps({"id": record_id, "embedding": prediction.tolist(), "model_sha256": model_version})
    score, embedding = prediction
    out: dict[str, Any] = {"id": record_id, "label": sentiment_label(score), "score": float(score),
                           "model_sha256": model_version}
    if with_embedding:
        out["embedding"] = np.asarray(embedding, dtype=np.float64).tolist()
    return json.dumps(out)
