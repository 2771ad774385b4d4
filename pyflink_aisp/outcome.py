"""What happens to a record: it is scored, or it becomes a dead letter with one :class:`Reason`.

Every operator (the Arrow map, the async operator, the SQL functions) ends
each record in one of the two outcomes, and every dead letter has the same
JSON schema (:func:`dead_letter_json`)::

    {"reason", "detail", "id", "topic", "partition", "offset",
     "value_base64", "value_size_bytes", "value_truncated"}

``id`` is null when the record did not decode far enough to have one, and
holds at most :data:`MAX_DEAD_LETTER_ID_CHARS` characters of a longer one (the
dead letter's Kafka key is then ``topic/partition/offset``); the raw value is
kept (base64) up to :data:`MAX_DEAD_LETTER_VALUE_BYTES`, and less when the
sink's record limit needs it, so a dead letter can be replayed after a fix and
is always writable. The reason of an exception is read from its type
(:func:`reason_of`), never from its message.

Record limit: a Kafka producer refuses a record larger than its
``max.request.size`` (default 1 MiB) and the broker one larger than the topic's
``max.message.bytes`` (``RecordTooLargeException``), and an exactly-once sink
that cannot write a record fails the job, which then replays it forever.
:func:`render_scored` and :func:`render_dead_letter` take the most key + value
bytes the sink can write (``max_record_bytes``, see
:func:`~pyflink_aisp.kafka.sink_record_limit`): an output over it becomes an
``oversized_output`` dead letter, and a dead letter always fits.
"""

from __future__ import annotations

import base64
import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from pyflink_aisp.errors import (
    DecodeError,
    InferenceError,
    InferenceTimeoutError,
    InvalidModelOutputError,
    OversizedOutputError,
    PromptTooLongError,
    RemoteError,
    RemoteTimeoutError,
)

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "MAX_DEAD_LETTER_ID_CHARS",
    "MAX_DEAD_LETTER_VALUE_BYTES",
    "MIN_RECORD_BYTES",
    "DeadLettered",
    "Reason",
    "dead_letter_json",
    "is_record_fault",
    "reason_of",
    "render_dead_letter",
    "render_scored",
    "scored_json",
    "sentiment_label",
]

#: Most raw value bytes a dead letter carries (base64 grows them by 4/3): keeps a
#: DLQ record under the producer's default ``max.request.size`` of 1 MiB.
MAX_DEAD_LETTER_VALUE_BYTES = 256 * 1024
#: Longest ``detail`` kept, in characters.
MAX_DETAIL_CHARS = 1000
#: Longest ``id`` a dead letter carries, in characters (ASCII-escaped JSON: at most
#: 12 bytes per character, so at most 12 KiB).
MAX_DEAD_LETTER_ID_CHARS = 1024
#: Smallest record limit accepted: a dead letter without its raw value is at most
#: about 19 KiB (id 12 KiB + detail 6 KiB, escaped), so 32 KiB always leaves room.
MIN_RECORD_BYTES = 32 * 1024
#: The record limit when the sink's is not known: the producer's default
#: ``max.request.size`` (1 MiB) less 1 KiB of record overhead
#: (:data:`pyflink_aisp.kafka.RECORD_OVERHEAD_BYTES`).
DEFAULT_MAX_RECORD_BYTES = 1_048_576 - 1024


class Reason(enum.StrEnum):
    """Why a record went to the dead-letter topic (its ``reason`` field)."""

    NULL_VALUE = "null_value"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    DUPLICATE_KEY = "duplicate_key"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_TEXT = "missing_text"
    TEXT_NOT_STRING = "text_not_string"
    MISSING_FEATURE = "missing_feature"
    BAD_FEATURE = "bad_feature"
    INVALID_AVRO = "invalid_avro"
    UNKNOWN_SCHEMA = "unknown_schema"
    INVALID_UNICODE = "invalid_unicode"
    BAD_ID = "bad_id"
    DECODE_ERROR = "decode_error"
    NO_ROUTE = "no_route"
    INFERENCE_ERROR = "inference_error"
    INFERENCE_TIMEOUT = "inference_timeout"
    REMOTE_ERROR = "remote_error"
    REMOTE_TIMEOUT = "remote_timeout"
    PROMPT_TOO_LONG = "prompt_too_long"
    INVALID_MODEL_OUTPUT = "invalid_model_output"
    OVERSIZED_OUTPUT = "oversized_output"


def reason_of(error: BaseException) -> Reason:
    """The reason for an exception: a :class:`~pyflink_aisp.errors.DecodeError`'s
    own, ``INFERENCE_TIMEOUT`` for :class:`~pyflink_aisp.errors.InferenceTimeoutError`,
    ``PROMPT_TOO_LONG`` for :class:`~pyflink_aisp.errors.PromptTooLongError`,
    ``REMOTE_TIMEOUT`` / ``REMOTE_ERROR`` for :class:`~pyflink_aisp.errors.RemoteTimeoutError` /
    :class:`~pyflink_aisp.errors.RemoteError`, ``INVALID_MODEL_OUTPUT`` for
    :class:`~pyflink_aisp.errors.InvalidModelOutputError`, else ``INFERENCE_ERROR``."""
    if isinstance(error, DecodeError):
        try:
            return Reason(error.reason)
        except ValueError:  # a decoder's own reason that the enum does not know
            return Reason.DECODE_ERROR
    if isinstance(error, InferenceTimeoutError):
        return Reason.INFERENCE_TIMEOUT
    if isinstance(error, RemoteTimeoutError):
        return Reason.REMOTE_TIMEOUT
    if isinstance(error, PromptTooLongError):
        return Reason.PROMPT_TOO_LONG
    if isinstance(error, RemoteError):
        return Reason.REMOTE_ERROR
    if isinstance(error, OversizedOutputError):
        return Reason.OVERSIZED_OUTPUT
    if isinstance(error, InvalidModelOutputError):
        return Reason.INVALID_MODEL_OUTPUT
    return Reason.INFERENCE_ERROR


def is_record_fault(error: BaseException) -> bool:
    """Whether an inference failure is the record's own, not the model's or the server's (its
    prompt does not fit the model: ``prompt_too_long``): the circuit breaker does not count it."""
    return isinstance(error, PromptTooLongError)


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
        """The dead letter of an exception (``where``: id, topic, partition, offset, value); a
        :class:`~pyflink_aisp.errors.DecodeError`'s detail is its own, any other's ``"Type: message"``."""
        detail = error.detail if isinstance(error, DecodeError) else f"{type(error).__name__}: {error}"
        return cls(reason=reason_of(error), detail=detail, **where)

    @property
    def key(self) -> str:
        """Kafka key of the dead letter: the id when it has at most
        :data:`MAX_DEAD_LETTER_ID_CHARS` characters, else ``topic/partition/offset``."""
        if self.id is not None and len(self.id) <= MAX_DEAD_LETTER_ID_CHARS:
            return self.id
        return f"{self.topic}/{self.partition}/{self.offset}"

    def to_json(self, max_bytes: int | None = None) -> str:
        """The dead-letter value (see :func:`dead_letter_json`)."""
        return dead_letter_json(self, max_bytes)


def dead_letter_json(letter: DeadLettered, max_bytes: int | None = None) -> str:
    """ASCII JSON of a dead letter, the schema of the module docstring.

    Args:
        letter: The dead letter.
        max_bytes: Most bytes of the JSON (None: no limit beyond the caps below).

    Returns:
        The JSON, with at most :data:`MAX_DETAIL_CHARS` of detail,
        :data:`MAX_DEAD_LETTER_ID_CHARS` of id, and the longest prefix of the raw
        value (base64) up to :data:`MAX_DEAD_LETTER_VALUE_BYTES` that keeps it
        within ``max_bytes`` (``value_truncated`` says whether it was cut).
    """
    value = letter.value
    doc: dict[str, Any] = {
        "reason": letter.reason.value,
        "detail": letter.detail[:MAX_DETAIL_CHARS],
        "id": None if letter.id is None else letter.id[:MAX_DEAD_LETTER_ID_CHARS],
        "topic": letter.topic,
        "partition": letter.partition,
        "offset": letter.offset,
        "value_base64": None,
        "value_size_bytes": None if value is None else len(value),
        "value_truncated": False,
    }
    if value is None:
        return json.dumps(doc)
    keep = min(len(value), MAX_DEAD_LETTER_VALUE_BYTES)
    if max_bytes is not None:
        doc["value_base64"], doc["value_truncated"] = "", True  # the longest form of the rest
        room = max_bytes - len(json.dumps(doc))
        keep = max(0, min(keep, room // 4 * 3))  # base64: 4 characters per 3 bytes
    doc["value_base64"] = base64.b64encode(value[:keep]).decode("ascii")
    doc["value_truncated"] = keep < len(value)
    return json.dumps(doc)


def render_dead_letter(letter: DeadLettered, max_record_bytes: int) -> tuple[str, str]:
    """``(key, value)`` of a dead letter whose UTF-8 key + value fit in ``max_record_bytes``
    (>= :data:`MIN_RECORD_BYTES`; the raw value prefix shrinks to fit)."""
    key = letter.key
    return key, letter.to_json(max_record_bytes - len(key.encode("utf-8", "surrogatepass")))


def render_scored(
    record_id: str, fields: Mapping[str, Any], model_version: str, *,
    extra: Mapping[str, Any] | None = None, kept: Mapping[str, Any] | None = None, max_record_bytes: int,
) -> str:
    """The output value of a scored record (:func:`scored_json`), checked against the sink.

    Args:
        record_id: The record's id (also the Kafka key).
        fields: The prediction's fields, as its task rendered them
            (:meth:`pyflink_aisp.inference.Task.render`), without the extra ones.
        model_version: sha256 of the model that scored it.
        extra: The extra fields the job asked for (written after ``model_sha256``).
        kept: The input record's fields the job keeps (written after ``id``).
        max_record_bytes: Most UTF-8 bytes of key + value the sink can write.

    Raises:
        OversizedOutputError: Key + value exceed ``max_record_bytes`` (reason
            ``oversized_output``).
        InferenceError: A value is NaN or an infinity, which JSON cannot carry
            (RFC 8259 section 6), or not JSON-able at all (a numpy scalar or array): a
            model failure, reason ``inference_error``.
    """
    try:
        value = scored_json(record_id, fields, model_version, extra=extra, kept=kept)
    except ValueError as exc:
        raise InferenceError(f"the model's output is not finite (NaN or infinity; not JSON, RFC 8259 "
                             f"section 6): {exc}") from exc
    except TypeError as exc:
        raise InferenceError(f"the model's output is not JSON-able (the task must render plain Python "
                             f"values): {exc}") from exc
    size = len(record_id.encode("utf-8", "surrogatepass")) + len(value.encode("utf-8", "surrogatepass"))
    if size > max_record_bytes:
        raise OversizedOutputError(size, max_record_bytes)
    return value


def sentiment_label(score: float) -> str:
    """``'fresh'`` for P(fresh) >= 0.5, else ``'rotten'``."""
    return "fresh" if score >= 0.5 else "rotten"


def scored_json(
    record_id: str, fields: Mapping[str, Any], model_version: str, *, extra: Mapping[str, Any] | None = None,
    kept: Mapping[str, Any] | None = None,
) -> str:
    """The output value of a scored record.

    Args:
        record_id: The record's id.
        fields: The prediction's fields (JSON-able values), in their order.
        model_version: sha256 of the model that scored it.
        extra: Extra fields the job asked for, after ``model_sha256``.
        kept: Fields of the input record the job keeps, after ``id`` (unchanged JSON values).

    Returns:
        Compact JSON (no spaces between tokens, as Flink's ``json`` format writes it)
        ``{"id", <kept>..., <fields>..., "model_sha256", <extra>...}``: for the sentiment
        model ``{"id", "label", "score", "model_sha256"}`` (then ``"embedding"`` with
        ``--with-embedding``); for an encoder ``{"id", "embedding", "model_sha256"}``.
        Written by orjson (UTF-8 text as it is); a document orjson cannot write (an
        integer past 64 bits, a name that is not a string, a lone surrogate) by Python's
        ``json`` (non-ASCII escaped as ``\\uXXXX``).

    Raises:
        ValueError: A value is NaN or infinite (not JSON).
        TypeError: A value is not JSON-able (e.g. a numpy scalar).
    """
    doc = {"id": record_id, **(kept or {}), **fields, "model_sha256": model_version}
    if extra:
        doc.update(extra)
    try:
        plain = all(map(_plain, doc.values()))
    except RecursionError:  # nested past Python's stack: json.dumps decides
        plain = False
    if plain:
        try:
            return orjson.dumps(doc, option=_ORJSON_STRICT).decode("utf-8")
        except TypeError:  # orjson.JSONEncodeError is one: json.dumps decides (and raises the same)
            pass
    return json.dumps(doc, allow_nan=False, separators=(",", ":"))


#: orjson writes only what Python's ``json`` writes: dataclasses, dates and times, and subclasses of
#: str, int, dict and list are refused (then :func:`json.dumps` decides, as before).
_ORJSON_STRICT = (orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
                  | orjson.OPT_PASSTHROUGH_SUBCLASS)


def _plain(value: Any) -> bool:
    """Whether orjson may write a value: no NaN or infinity (orjson writes them as null), and no type
    that orjson writes but Python's ``json`` refuses (an Enum, a UUID). False also where a sum of
    numbers overflows: then :func:`json.dumps` decides. Subclasses of str, int, float, dict and list
    count as plain here; orjson refuses them (:data:`_ORJSON_STRICT`)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list | tuple):
        try:  # a list of numbers: one C pass; NaN and infinities make the sum non-finite
            return math.isfinite(sum(value))
        except Exception:  # not all numbers, an int past a double's range, or a numpy scalar's own error
            return all(map(_plain, value))
    if isinstance(value, dict):
        return all(map(_plain, value.values()))
    return value is None or isinstance(value, str | int)
