"""JSON decoding of Kafka record values, with dead-letter records for bad input.

A record value must be UTF-8 JSON holding an object with a string ``text``;
``id`` and ``label`` are optional. The id rules:

* an absent or null ``id``: the record's coordinates ``topic/partition/offset``
  (unique and stable across replays: the same record gets the same id);
* a string (not empty) or an integer (written as its decimal string): itself;
* an empty string, a boolean, a float, an array or an object: ``bad_id``.

The id is the output's Kafka key and its ``id`` field. Anything else becomes a
:class:`~pyflink_aisp.outcome.DeadLettered` carrying the reason, the Kafka
coordinates and the raw bytes (base64), so nothing is lost and the job never
restarts for one bad record.

Edge cases of RFC 8259, decided:

* a UTF-8 byte order mark before the JSON text is ignored (section 8.1 lets a
  parser ignore it; Windows producers write it);
* ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON numbers (section 6):
  ``invalid_json`` (Python's ``json`` would accept them), and so is a number
  that overflows a double (``1e999``, which Python would read as infinity);
* a name repeated within one object (section 4: names SHOULD be unique, and
  parsers differ on which value wins): ``duplicate_key``, at any depth, rather
  than silently scoring whichever ``text`` the parser kept.

A document with no backslash, one object (a single ``{``) and names that each occur once
in its bytes is parsed by orjson (numbers included, in C); every other document, and
any that orjson refuses, is parsed by Python's ``json`` as above, so both paths give
the same object or the same dead letter (``tests/unit/kafka/test_decode_plain.py``).
A field only the features read (:attr:`~pyflink_aisp.kafka.FieldMapping.feature_only_names`)
is read as doubles on both paths, so an integer past 64 bits there, which orjson parses to
the nearest double, does not send the document to ``json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson

from pyflink_aisp.errors import DecodeError
from pyflink_aisp.kafka._avro import decode_avro, jsonable, registry_client
from pyflink_aisp.kafka._mapping import (
    DEFAULT_MAPPING,
    FieldMapping,
    ValueFormat,
    is_missing,
    resolve_pointer,
)
from pyflink_aisp.outcome import MAX_DEAD_LETTER_VALUE_BYTES, DeadLettered, Reason

__all__ = [
    "MAX_DEAD_LETTER_VALUE_BYTES",
    "DecodedRecord",
    "KafkaCoordinates",
    "decode_record",
    "decode_review",
]


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
        text: The text to score (may be empty; ``""`` for a record read for its features).
        label: The ``label`` field if present (any JSON scalar), else None.
        kept: ``(name, value)`` of the mapping's kept fields, in its order (value None where
            absent; with ``keep=("*",)`` every top-level field but the text and id fields).
        features: The feature vector of a mapping with features, else None.
        text_pair: The second text of a mapping with one (a pair model's), else None.
        prompt: ``(name, value)`` of the mapping's prompt fields, in its order: a string as it
            is, any other JSON value as compact JSON text.
    """

    id: str
    text: str
    label: Any = None
    kept: tuple[tuple[str, Any], ...] = ()
    features: tuple[float, ...] | None = None
    text_pair: str | None = None
    prompt: tuple[tuple[str, str], ...] = ()

    @property
    def model_input(self) -> Any:
        """What the model gets: the feature vector of a mapping with features; with prompt
        fields a ``dict`` of placeholder name → ``str`` value holding ``text`` (and
        ``text_pair``) and each prompt field; the ``(text, text_pair)`` tuple of a mapping with a
        second text; else the text."""
        if self.features is not None:
            return self.features
        if self.prompt:
            pair = {} if self.text_pair is None else {"text_pair": self.text_pair}
            return {"text": self.text, **pair, **dict(self.prompt)}
        return self.text if self.text_pair is None else (self.text, self.text_pair)


_BOM = "\ufeff"


def _reject_constant(name: str) -> Any:
    raise DecodeError(Reason.INVALID_JSON.value, f"{name} is not a JSON number (RFC 8259 section 6)")


_NESTED = (float, list, dict)


def _any_infinite(value: Any) -> bool:
    """Whether a parsed JSON value holds an infinite float: a number that overflowed a double (the
    constants ``Infinity`` and ``NaN`` are refused while parsing). A list of numbers is one C pass."""
    if isinstance(value, float):
        return math.isinf(value)
    if isinstance(value, list):
        try:  # an infinite float is above every int, so a largest that is an int rules one out
            top = max(map(abs, value)) if value else 0
            return isinstance(top, float) and math.isinf(top)
        except TypeError:  # not all numbers
            pass
    elif isinstance(value, dict):
        value = value.values()
    else:
        return False
    for item in value:
        if isinstance(item, _NESTED) and _any_infinite(item):
            return True
    return False


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise DecodeError(Reason.INVALID_JSON.value,
                          f"number {text[:40]} overflows a double (IEEE 754 binary64)")
    return number


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            raise DecodeError(Reason.DUPLICATE_KEY.value, f"name {name[:100]!r} appears more than once in "
                              "an object (RFC 8259 section 4)")
        seen.add(name)
    raise AssertionError("unreachable: a shorter dict has a repeated name")


_BOM_UTF8 = _BOM.encode("utf-8")

#: orjson keeps integers to 64 bits and reads a wider integer literal as a double; a document with a
#: number this large (in magnitude) goes to Python's ``json``, which keeps the integer exact.
_WIDE = 2.0**63


def _has_wide_number(value: Any) -> bool:
    """Whether a parsed value (no objects inside) holds a number of magnitude at least :data:`_WIDE`."""
    if isinstance(value, float):
        return abs(value) >= _WIDE
    if isinstance(value, list):
        try:  # a list of numbers: one C pass
            return bool(value) and max(map(abs, value)) >= _WIDE
        except TypeError:  # strings, nulls or lists inside
            return any(_has_wide_number(item) for item in value)
    return False


def _plain_object(raw: bytes, as_doubles: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The object of a plain document, parsed by orjson; None where Python's ``json`` decides.

    Plain: no backslash (so each name is spelled in the bytes exactly as it reads, and a repeated
    name occurs twice), no byte order mark, one ``{`` (no nested object), orjson parses it (it
    refuses invalid UTF-8, ``NaN``, overflowing numbers and what is not JSON), its value is an
    object whose every name occurs once in the bytes (orjson keeps the last of repeated names), and
    no number outside the fields named in ``as_doubles`` is wide enough to be an integer orjson
    read as a double. A field in ``as_doubles`` is only ever converted to doubles (``float``), and
    orjson's double for a wide integer literal is the correctly rounded one, ``float(int)``.
    """
    first = raw.find(b"{")
    if first < 0 or raw.find(b"{", first + 1) >= 0 or b"\\" in raw or raw.startswith(_BOM_UTF8):
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    try:
        for name, item in obj.items():
            if raw.count(b'"' + name.encode("utf-8") + b'"') != 1 or (
                    name not in as_doubles and _has_wide_number(item)):
                return None
    except RecursionError:  # arrays nested past Python's stack (orjson reads 1,023 levels)
        return None
    return obj


def _parse(value: bytes | None, as_doubles: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Bytes → JSON object, or :class:`DecodeError` with the reason (``as_doubles``: as
    :func:`_plain_object`)."""
    if value is None:
        raise DecodeError(Reason.NULL_VALUE.value, "record value is null (tombstone)")
    raw = value if isinstance(value, bytes) else bytes(value)
    plain = _plain_object(raw, as_doubles)
    if plain is not None:
        return plain
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(
            Reason.INVALID_UTF8.value, f"byte {exc.start}: {exc.reason}"
        ) from exc
    if decoded.startswith(_BOM):
        decoded = decoded[1:]
    try:
        try:  # floats parsed natively (in C); only a document that holds an overflow pays the hook
            obj = json.loads(decoded, parse_constant=_reject_constant, object_pairs_hook=_unique_object)
            checked = not _any_infinite(obj)
        except (DecodeError, RecursionError):  # the first fault in document order, as the hook finds it
            checked = False
        if not checked:
            obj = json.loads(decoded, parse_constant=_reject_constant, parse_float=_finite_float,
                             object_pairs_hook=_unique_object)
    except DecodeError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digit limit, deep nesting
        raise DecodeError(Reason.INVALID_JSON.value, f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, dict):
        raise DecodeError(
            Reason.NOT_AN_OBJECT.value, f"JSON value is {type(obj).__name__}, not an object"
        )
    return obj


#: Field names a ``missing_text`` detail lists, at most, each cut to 40 characters.
_NAMES_SHOWN = 8


def _missing_text(obj: dict[str, Any]) -> str:
    """The detail of a record without a text: what it has instead (so the dead letter, and the
    dead-letter watch's line, say which field the user's records use)."""
    if "text" in obj:
        return "'text' is null"
    names = sorted(obj)
    shown = ", ".join(repr(n[:40]) for n in names[:_NAMES_SHOWN])
    more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
    if not names:
        return "no 'text' field; the object is empty"
    return f"no 'text' field; the object's fields: {shown}{more}"


def _check_encodable(field: str, text: str) -> None:
    """JSON ``\\ud800`` escapes decode to lone surrogates, which no UTF-8 coder downstream accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DecodeError(
            Reason.INVALID_UNICODE.value, f"'{field}' char {exc.start}: {exc.reason}"
        ) from exc


def _dead_letter(reason: Reason, detail: str, source: KafkaCoordinates, value: bytes | None) -> DeadLettered:
    """The dead letter of a record that did not decode (its ``id`` unknown)."""
    return DeadLettered(reason=reason, detail=detail, topic=source.topic, partition=source.partition,
                        offset=source.offset, value=value)


def _kept(obj: dict[str, Any], mapping: FieldMapping) -> tuple[tuple[str, Any], ...]:
    """The kept ``(name, value)`` pairs of one record (:attr:`DecodedRecord.kept`)."""
    if mapping.keep_all:
        skip = mapping.keep_all_skips
        return tuple((name, value) for name, value in obj.items() if name not in skip)
    return tuple((name, None if is_missing(v := resolve_pointer(obj, path)) else v)
                 for name, path in zip(mapping.kept_names, mapping.keep_paths, strict=True))


def _key_id(key: bytes | None) -> str | None:
    """The id of a record whose id is its Kafka key: the key as UTF-8 (None: no key, or empty)."""
    if not key:
        return None
    try:
        return bytes(key).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(Reason.BAD_ID.value, f"the Kafka key is not UTF-8 (byte {exc.start}: "
                          f"{exc.reason})") from exc


def decode_review(value: bytes | None, source: KafkaCoordinates,
                  mapping: FieldMapping = DEFAULT_MAPPING,
                  key: bytes | None = None) -> DecodedRecord | DeadLettered:
    """Decode one Kafka record value.

    Args:
        value: The raw record value (None for a tombstone).
        source: The record's topic, partition and offset.
        mapping: Where the text and the id are, and the fields to keep (default
            ``{"id", "text"}``, nothing kept).
        key: The record's Kafka key (read only when the mapping's id is the key).

    Returns:
        A :class:`DecodedRecord`, or a :class:`~pyflink_aisp.outcome.DeadLettered`
        (``id`` None) saying why not. Never raises
        for bad input.
    """
    try:
        if mapping.value_format is ValueFormat.RAW:
            record = _decode_raw(value, source)
            keyed = _key_id(key) if mapping.id_from_key else None
            return record if keyed is None else DecodedRecord(id=keyed, text=record.text)
        if mapping.value_format is ValueFormat.AVRO:
            if value is None:
                raise DecodeError(Reason.NULL_VALUE.value, "record value is null (tombstone)")
            assert mapping.schema_registry_url is not None  # FieldMapping checks it
            obj = decode_avro(value, registry_client(mapping.schema_registry_url))
        else:
            obj = _parse(value, mapping.feature_only_names)
        features: tuple[float, ...] | None = None
        text_pair: str | None = None
        prompt: tuple[tuple[str, str], ...] = ()
        kept: tuple[tuple[str, Any], ...]
        if mapping.features:
            text, features = "", _features(obj, mapping)
            rid = None if mapping.id_path is None else resolve_pointer(obj, mapping.id_path)
            rid = None if is_missing(rid) else rid
            kept = _kept(obj, mapping)
        elif mapping.is_default:
            if "text" not in obj or obj["text"] is None:
                raise DecodeError(Reason.MISSING_TEXT.value, _missing_text(obj))
            text, rid = obj["text"], obj.get("id")
            kept = ()
        else:
            text = resolve_pointer(obj, mapping.text_path)
            if is_missing(text) or text is None:
                raise DecodeError(Reason.MISSING_TEXT.value, _missing_at(obj, mapping.text, text))
            rid = None if mapping.id_path is None else resolve_pointer(obj, mapping.id_path)
            rid = None if is_missing(rid) else rid
            kept = _kept(obj, mapping)
            if mapping.text_pair_path is not None:
                text_pair = _text_pair(obj, mapping)
            prompt = _prompt_values(obj, mapping) if mapping.prompt_paths else ()
        if not isinstance(text, str):
            raise DecodeError(
                Reason.TEXT_NOT_STRING.value, f"'{_name(mapping.text)}' is {type(text).__name__}"
            )
        if mapping.id_from_key:
            rid = _key_id(key)
        if rid is None:
            rid = source.default_id()
        elif isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise DecodeError(Reason.BAD_ID.value, f"'{_name(mapping.id)}' is {type(rid).__name__}")
        elif rid == "":
            raise DecodeError(Reason.BAD_ID.value, f"'{_name(mapping.id)}' is an empty string")
        if mapping.value_format is ValueFormat.AVRO and kept:
            kept = tuple((name, jsonable(v)) for name, v in kept)
        _check_encodable("text", text)
        _check_encodable("id", str(rid))
        if text_pair is not None:
            _check_encodable(str(mapping.text_pair), text_pair)
        return DecodedRecord(id=str(rid), text=text, label=obj.get("label"), kept=kept, features=features,
                             text_pair=text_pair, prompt=prompt)
    except DecodeError as exc:
        return _dead_letter(Reason(exc.reason), exc.detail, source, None if value is None else bytes(value))


def _text_pair(obj: dict[str, Any], mapping: FieldMapping) -> str:
    """The second text of a record (a pair model's): ``missing_text`` / ``text_not_string``
    naming its pointer."""
    assert mapping.text_pair is not None and mapping.text_pair_path is not None
    value = resolve_pointer(obj, mapping.text_pair_path)
    if is_missing(value) or value is None:
        raise DecodeError(Reason.MISSING_TEXT.value, _missing_at(obj, mapping.text_pair, value))
    if not isinstance(value, str):
        raise DecodeError(Reason.TEXT_NOT_STRING.value, f"'{mapping.text_pair}' is {type(value).__name__}")
    return value


def _prompt_values(obj: dict[str, Any], mapping: FieldMapping) -> tuple[tuple[str, str], ...]:
    """The prompt fields of a record (:attr:`DecodedRecord.prompt`): a missing or null one is
    ``missing_text`` naming its pointer."""
    out = []
    for pointer, name, path in zip(mapping.prompt_fields, mapping.prompt_names, mapping.prompt_paths,
                                   strict=True):
        value = resolve_pointer(obj, path)
        if is_missing(value) or value is None:
            raise DecodeError(Reason.MISSING_TEXT.value,
                              f"{_missing_at(obj, pointer, value)} (a --prompt-fields field)")
        if not isinstance(value, str):
            value = json.dumps(jsonable(value) if mapping.value_format is ValueFormat.AVRO else value,
                               ensure_ascii=False, separators=(",", ":"))
        _check_encodable(pointer, value)
        out.append((name, value))
    return tuple(out)


_NUMBER_TYPES = {int, float}
_FLOAT_TYPE = {float}


def _number(pointer: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecodeError(Reason.BAD_FEATURE.value, f"'{pointer}' is {type(value).__name__}, not a number")
    try:
        return float(value)
    except OverflowError:  # an integer of more than 308 digits
        raise DecodeError(Reason.BAD_FEATURE.value,
                          f"'{pointer}' is an integer past a double's range (IEEE 754 binary64)") from None


def _features(obj: dict[str, Any], mapping: FieldMapping) -> tuple[float, ...]:
    """The feature vector of a record: the numbers of one array field, or of several number fields."""
    found = [resolve_pointer(obj, path) for path in mapping.feature_paths]
    for pointer, value in zip(mapping.features, found, strict=True):
        if is_missing(value) or value is None:
            raise DecodeError(Reason.MISSING_FEATURE.value, _missing_at(obj, pointer, value))
    if len(found) > 1:
        return tuple(_number(p, v) for p, v in zip(mapping.features, found, strict=True))
    pointer, value = mapping.features[0], found[0]
    if not isinstance(value, list):
        return (_number(pointer, value),)
    if not value:
        raise DecodeError(Reason.BAD_FEATURE.value, f"'{pointer}' is an empty array")
    types = set(map(type, value))
    if types == _FLOAT_TYPE:  # every element a float already: no conversion
        return tuple(value)
    if types <= _NUMBER_TYPES:  # every element an int or a float (a bool is neither)
        try:
            return tuple(map(float, value))
        except OverflowError:  # an int past a double's range: named below
            pass
    return tuple(_number(f"{pointer}/{i}", v) for i, v in enumerate(value))  # names the first that is not


def _decode_raw(value: bytes | None, source: KafkaCoordinates) -> DecodedRecord:
    """A raw UTF-8 value: the text (a byte order mark dropped), under the record's coordinates."""
    if value is None:
        raise DecodeError(Reason.NULL_VALUE.value, "record value is null (tombstone)")
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(Reason.INVALID_UTF8.value, f"byte {exc.start}: {exc.reason}") from exc
    return DecodedRecord(id=source.default_id(), text=text.removeprefix(_BOM))


def _name(pointer: str | None) -> str:
    """How a detail names a field: ``text`` for the default ``/text``, else the pointer."""
    return {"/text": "text", "/id": "id"}.get(pointer or "", pointer or "id")


def _missing_at(obj: dict[str, Any], pointer: str, found: Any) -> str:
    if not is_missing(found):
        return f"'{pointer}' is null"
    names = ", ".join(repr(n[:40]) for n in sorted(obj)[:_NAMES_SHOWN])
    if not obj:
        return f"no value at {pointer}; the object is empty"
    return f"no value at {pointer}; the object's fields: {names}"


def decode_record(
    value: bytes | None, topic: str, partition: int, offset: int, mapping: FieldMapping = DEFAULT_MAPPING,
    key: bytes | None = None,
) -> DecodedRecord | DeadLettered:
    """:func:`decode_review` with a catch-all: an exception nobody foresaw (a bug, an
    input of a new kind) becomes a ``decode_error`` dead letter, never a job restart.

    Args:
        value: The raw record value (None for a tombstone).
        topic: Its topic.
        partition: Its partition.
        offset: Its offset.
        mapping: As :func:`decode_review`.
        key: As :func:`decode_review`.
    """
    source = KafkaCoordinates(topic=topic, partition=partition, offset=offset)
    try:
        return decode_review(value, source, mapping, key)
    except Exception as exc:
        raw = None if value is None else (value.encode("utf-8", "surrogatepass") if isinstance(value, str)
                                          else bytes(value))
        return _dead_letter(Reason.DECODE_ERROR, f"{type(exc).__name__}: {exc}", source, raw)
