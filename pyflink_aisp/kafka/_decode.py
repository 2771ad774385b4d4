"""JSON decoding of Kafka record values, with dead-letter records for bad input.

A record value must be UTF-8 JSON holding an object with a string ``text``;
``id`` (string or integer) and ``label`` are optional. Anything else becomes a
:class:`DeadLetter` carrying the reason, the Kafka coordinates and the raw bytes
(base64), so nothing is lost and the job never restarts for one bad record.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pyflink_aisp.errors import DecodeError

__all__ = [
    "MAX_DEAD_LETTER_VALUE_BYTES",
    "DeadLetter",
    "DecodeReason",
    "DecodedRecord",
    "KafkaCoordinates",
    "decode_review",
]


class DecodeReason(StrEnum):
    """Why a record went to the DLQ (the ``reason`` field of a dead letter)."""

    NULL_VALUE = "null_value"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_TEXT = "missing_text"
    TEXT_NOT_STRING = "text_not_string"
    INVALID_UNICODE = "invalid_unicode"
    BAD_ID = "bad_id"
    DECODE_ERROR = "decode_error"


#: Most raw value bytes a dead letter carries (base64 grows them by 4/3): keeps a
#: DLQ record under the producer's default ``max.request.size`` of 1 MiB.
MAX_DEAD_LETTER_VALUE_BYTES = 256 * 1024


@dataclass(frozen=True, kw_only=True)
class KafkaCoordinates:
    """Where a record came from: topic, partition and offset."""

    topic: str
    partition: int
    offset: int

    def default_id(self) -> str:
        """The id given to a record without one: ``topic/partition/offset``."""
        return f"{self.topic}/{self.partition}/{self.offset}"


@dataclass(frozen=True, kw_only=True)
class DecodedRecord:
    """A decoded input record.

    Attributes:
        id: The record's ``id`` as a string (from the JSON, else its coordinates).
        text: The text to score (may be empty).
        label: The ``label`` field if present (any JSON scalar), else None.
    """

    id: str
    text: str
    label: Any = None


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    """A record that could not be decoded, as written to the DLQ topic."""

    reason: DecodeReason
    detail: str
    source: KafkaCoordinates
    value: bytes | None

    def to_json(self) -> str:
        """The DLQ record value: ASCII JSON with ``reason``, ``detail``, ``topic``,
        ``partition``, ``offset``, ``value_base64`` (the raw bytes, base64, at most
        :data:`MAX_DEAD_LETTER_VALUE_BYTES` of them; null for a null value),
        ``value_size_bytes`` and ``value_truncated``."""
        value = self.value
        kept = None if value is None else value[:MAX_DEAD_LETTER_VALUE_BYTES]
        return json.dumps({
            "reason": self.reason.value,
            "detail": self.detail[:1000],
            "topic": self.source.topic,
            "partition": self.source.partition,
            "offset": self.source.offset,
            "value_base64": None if kept is None else base64.b64encode(kept).decode("ascii"),
            "value_size_bytes": None if value is None else len(value),
            "value_truncated": value is not None and len(value) > MAX_DEAD_LETTER_VALUE_BYTES,
        })


def _parse(value: bytes | None) -> dict[str, Any]:
    """Bytes → JSON object, or :class:`DecodeError` with the reason."""
    if value is None:
        raise DecodeError(DecodeReason.NULL_VALUE.value, "record value is null (tombstone)")
    try:
        decoded = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(
            DecodeReason.INVALID_UTF8.value, f"byte {exc.start}: {exc.reason}"
        ) from exc
    try:
        obj = json.loads(decoded)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digit limit, deep nesting
        raise DecodeError(DecodeReason.INVALID_JSON.value, f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, dict):
        raise DecodeError(
            DecodeReason.NOT_AN_OBJECT.value, f"JSON value is {type(obj).__name__}, not an object"
        )
    return obj


def _check_encodable(field: str, text: str) -> None:
    """JSON ``\\ud800`` escapes decode to lone surrogates, which no UTF-8 coder downstream accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DecodeError(
            DecodeReason.INVALID_UNICODE.value, f"'{field}' char {exc.start}: {exc.reason}"
        ) from exc


def decode_review(value: bytes | None, source: KafkaCoordinates) -> DecodedRecord | DeadLetter:
    """Decode one Kafka record value.

    Args:
        value: The raw record value (None for a tombstone).
        source: The record's topic, partition and offset.

    Returns:
        A :class:`DecodedRecord`, or a :class:`DeadLetter` saying why not. Never raises
        for bad input.
    """
    try:
        obj = _parse(value)
        if "text" not in obj or obj["text"] is None:
            raise DecodeError(DecodeReason.MISSING_TEXT.value, "no 'text' field")
        text = obj["text"]
        if not isinstance(text, str):
            raise DecodeError(
                DecodeReason.TEXT_NOT_STRING.value, f"'text' is {type(text).__name__}"
            )
        rid = obj.get("id")
        if rid is None:
            rid = source.default_id()
        elif isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise DecodeError(DecodeReason.BAD_ID.value, f"'id' is {type(rid).__name__}")
        _check_encodable("text", text)
        _check_encodable("id", str(rid))
        return DecodedRecord(id=str(rid), text=text, label=obj.get("label"))
    except DecodeError as exc:
        return DeadLetter(
            reason=DecodeReason(exc.reason), detail=exc.detail, source=source,
            value=None if value is None else bytes(value),
        )
