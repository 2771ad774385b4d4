"""A record's outcome: the Reason enum, reason_of, the dead-letter schema and scored JSON."""

from __future__ import annotations

import base64
import enum
import json
import uuid

import numpy as np
import pytest

from pyflink_aisp.errors import (
    DecodeError,
    InferenceError,
    InferenceTimeoutError,
    InvalidModelOutputError,
    PromptTooLongError,
    RemoteError,
    RemoteTimeoutError,
    TokenizeError,
)
from pyflink_aisp.inference.tasks import EmbeddingTask, SentimentTask, Task, render_prediction
from pyflink_aisp.outcome import (
    MAX_DEAD_LETTER_VALUE_BYTES,
    MAX_DETAIL_CHARS,
    DeadLettered,
    Reason,
    dead_letter_json,
    reason_of,
    scored_json,
    sentiment_label,
)

SHA = "c" * 64


def _json(task: Task, record_id: str, prediction: object) -> str:
    """The scored value as the operators write it: the task's fields, then ``scored_json``."""
    rendered = task.render(prediction)
    extra = {f.name: rendered[f.name] for f in task.fields if f.extra}
    return scored_json(record_id, {k: v for k, v in rendered.items() if k not in extra}, SHA, extra=extra)
KEYS = ["reason", "detail", "id", "topic", "partition", "offset", "value_base64", "value_size_bytes",
        "value_truncated"]


def test_reason_values_are_the_dead_letter_reasons() -> None:
    assert {r.name: r.value for r in Reason} == {
        "NULL_VALUE": "null_value",
        "INVALID_UTF8": "invalid_utf8",
        "INVALID_JSON": "invalid_json",
        "DUPLICATE_KEY": "duplicate_key",
        "NOT_AN_OBJECT": "not_an_object",
        "MISSING_TEXT": "missing_text",
        "TEXT_NOT_STRING": "text_not_string",
        "MISSING_FEATURE": "missing_feature",
        "BAD_FEATURE": "bad_feature",
        "INVALID_AVRO": "invalid_avro",
        "UNKNOWN_SCHEMA": "unknown_schema",
        "INVALID_UNICODE": "invalid_unicode",
        "BAD_ID": "bad_id",
        "DECODE_ERROR": "decode_error",
        "NO_ROUTE": "no_route",
        "INFERENCE_ERROR": "inference_error",
        "INFERENCE_TIMEOUT": "inference_timeout",
        "REMOTE_ERROR": "remote_error",
        "REMOTE_TIMEOUT": "remote_timeout",
        "PROMPT_TOO_LONG": "prompt_too_long",
        "INVALID_MODEL_OUTPUT": "invalid_model_output",
        "OVERSIZED_OUTPUT": "oversized_output",
    }
    assert Reason.INVALID_JSON == "invalid_json" and str(Reason.INFERENCE_TIMEOUT) == "inference_timeout"


@pytest.mark.parametrize("reason", [r for r in Reason if r.name not in
                                    ("INFERENCE_ERROR", "INFERENCE_TIMEOUT", "OVERSIZED_OUTPUT")])
def test_reason_of_a_decode_error_is_its_own(reason: Reason) -> None:
    assert reason_of(DecodeError(reason.value, "detail")) is reason


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (InferenceTimeoutError("waited too long"), Reason.INFERENCE_TIMEOUT),
        (RemoteError("/v2/models/m/infer: HTTP 400: bad shape", 400), Reason.REMOTE_ERROR),
        (RemoteTimeoutError("no answer within the 30 s deadline", 503), Reason.REMOTE_TIMEOUT),
        (PromptTooLongError("/v1/completions: HTTP 400: exceeds the available context size", 400),
         Reason.PROMPT_TOO_LONG),
        (InvalidModelOutputError("the completion is not JSON"), Reason.INVALID_MODEL_OUTPUT),
        (InferenceError("batcher closed"), Reason.INFERENCE_ERROR),
        (TokenizeError("not a str"), Reason.INFERENCE_ERROR),
        (RuntimeError("inference_timeout: a message is not a type"), Reason.INFERENCE_ERROR),
        (TimeoutError("a builtin timeout"), Reason.INFERENCE_ERROR),
        (MemoryError(), Reason.INFERENCE_ERROR),
    ],
)
def test_reason_of_other_errors_is_read_from_the_type(error: BaseException, reason: Reason) -> None:
    assert reason_of(error) is reason


def test_of_error_takes_reason_and_detail_from_the_exception() -> None:
    letter = DeadLettered.of_error(DecodeError("invalid_json", "Expecting value"), topic="t", partition=1,
                                   offset=7, value=b"{")
    assert letter == DeadLettered(reason=Reason.INVALID_JSON,
                                  detail="Expecting value",  # a decode error's own, as the decoder's letters
                                  topic="t", partition=1, offset=7, value=b"{")
    timeout = DeadLettered.of_error(InferenceTimeoutError("late"), id="r1")
    assert timeout.reason is Reason.INFERENCE_TIMEOUT and timeout.detail == "InferenceTimeoutError: late"
    assert timeout.key == "r1" and letter.key == "t/1/7"


def test_dead_letter_json_has_all_nine_keys_always() -> None:
    bare = json.loads(DeadLettered(reason=Reason.NULL_VALUE, detail="tombstone").to_json())
    assert list(bare) == KEYS
    assert bare == {"reason": "null_value", "detail": "tombstone", "id": None, "topic": None,
                    "partition": None, "offset": None, "value_base64": None, "value_size_bytes": None,
                    "value_truncated": False}
    value = "é ☃ {\"id\": 1}".encode()
    full = DeadLettered(reason=Reason.INFERENCE_ERROR, detail="RuntimeError: ☃ failed", id="r-1", topic="in",
                        partition=2, offset=41, value=value)
    text = full.to_json()
    assert text == dead_letter_json(full) and text.isascii()
    out = json.loads(text)
    assert list(out) == KEYS
    assert out == {"reason": "inference_error", "detail": "RuntimeError: ☃ failed", "id": "r-1",
                   "topic": "in", "partition": 2, "offset": 41,
                   "value_base64": base64.b64encode(value).decode("ascii"), "value_size_bytes": len(value),
                   "value_truncated": False}
    assert base64.b64decode(out["value_base64"]) == value
    empty = json.loads(DeadLettered(reason=Reason.INVALID_JSON, detail="", value=b"").to_json())
    assert (empty["value_base64"], empty["value_size_bytes"], empty["value_truncated"]) == ("", 0, False)


@pytest.mark.parametrize(("size", "truncated"), [(MAX_DEAD_LETTER_VALUE_BYTES, False),
                                                 (MAX_DEAD_LETTER_VALUE_BYTES + 1, True),
                                                 (3 * MAX_DEAD_LETTER_VALUE_BYTES, True)])
def test_the_raw_value_is_capped_at_256_kib(size: int, truncated: bool) -> None:
    assert MAX_DEAD_LETTER_VALUE_BYTES == 256 * 1024
    value = bytes(range(256)) * (size // 256) + b"\xff" * (size % 256)
    out = json.loads(DeadLettered(reason=Reason.INVALID_UTF8, detail="x", value=value).to_json())
    kept = base64.b64decode(out["value_base64"])
    assert kept == value[:MAX_DEAD_LETTER_VALUE_BYTES]
    assert out["value_size_bytes"] == size and out["value_truncated"] is truncated


def test_the_detail_is_capped() -> None:
    out = json.loads(DeadLettered(reason=Reason.INFERENCE_ERROR, detail="x" * 5000).to_json())
    assert out["detail"] == "x" * MAX_DETAIL_CHARS


def test_sentiment_label_threshold() -> None:
    assert sentiment_label(0.5) == "fresh" and sentiment_label(0.9) == "fresh"
    assert sentiment_label(0.49) == "rotten" and sentiment_label(0.0) == "rotten"


def test_scored_json_of_a_sentiment_prediction() -> None:
    embedding = np.array([0.25, -0.5, 1.0], dtype=np.float32)
    plain = json.loads(_json(SentimentTask(), "r1", (np.float32(0.75), embedding)))
    assert plain == {"id": "r1", "label": "fresh", "score": 0.75, "model_sha256": SHA}
    assert list(plain) == ["id", "label", "score", "model_sha256"]
    rotten = json.loads(_json(SentimentTask(), "r2", (0.125, embedding)))
    assert rotten["label"] == "rotten" and rotten["score"] == 0.125
    full = json.loads(_json(SentimentTask(with_embedding=True), "r1", (0.75, embedding)))
    assert full == {"id": "r1", "label": "fresh", "score": 0.75, "model_sha256": SHA,
                    "embedding": [0.25, -0.5, 1.0]}
    assert list(full) == ["id", "label", "score", "model_sha256", "embedding"]
    for task in (SentimentTask(), SentimentTask(with_embedding=True)):  # the bytes the job writes
        assert render_prediction(task, "r1", (0.75, embedding), SHA, max_record_bytes=1 << 20) == _json(
            task, "r1", (0.75, embedding))


def test_scored_json_of_an_encoder_vector() -> None:
    vector = np.array([0.5, -0.25, 0.0, 2.0], dtype=np.float32)
    task = EmbeddingTask()  # an encoder's output is its embedding: --with-embedding adds nothing
    out = json.loads(value := _json(task, "e1", vector))
    assert render_prediction(task, "e1", vector, SHA, max_record_bytes=1 << 20) == value
    assert out == {"id": "e1", "embedding": [0.5, -0.25, 0.0, 2.0], "model_sha256": SHA}
    assert list(out) == ["id", "embedding", "model_sha256"]


def test_a_decode_error_with_a_reason_outside_the_enum_is_a_decode_error():
    from pyflink_aisp.errors import DecodeError
    from pyflink_aisp.outcome import Reason, reason_of

    assert reason_of(DecodeError("schema_mismatch", "a decoder of its own")) is Reason.DECODE_ERROR


# -- the sink's record limit (issue 9.1) ---------------------------------------------------


def _size(key: str, value: str) -> int:
    return len(key.encode("utf-8")) + len(value.encode("utf-8"))


def test_render_scored_refuses_an_output_over_the_limit_by_its_utf8_size() -> None:
    from pyflink_aisp.errors import OversizedOutputError
    from pyflink_aisp.outcome import render_scored

    record_id = "中" * 200_000  # 600 KB as a key, 600 KB again in the value (UTF-8, not escaped)
    task, prediction = SentimentTask(), (0.75, np.zeros(3, np.float32))
    value = _json(task, record_id, prediction)
    size = _size(record_id, value)
    assert record_id in value and size == 2 * 3 * 200_000 + len(value) - 200_000 and size > 1_048_576
    with pytest.raises(OversizedOutputError) as exc:
        render_prediction(task, record_id, prediction, SHA, max_record_bytes=1_048_576 - 1024)
    assert (exc.value.size_bytes, exc.value.limit_bytes) == (size, 1_048_576 - 1024)
    assert reason_of(exc.value) is Reason.OVERSIZED_OUTPUT
    # exactly at the limit it is written; one byte less and it is not
    small = render_prediction(task, "r1", prediction, SHA,
                              max_record_bytes=_size("r1", value_of_r1 := _json(task, "r1", prediction)))
    assert small == value_of_r1
    with pytest.raises(OversizedOutputError):
        render_scored("r1", task.render(prediction), SHA, max_record_bytes=_size("r1", value_of_r1) - 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_render_scored_refuses_a_score_or_vector_that_is_not_finite(bad: float) -> None:
    from pyflink_aisp.errors import InferenceError
    from pyflink_aisp.outcome import render_scored

    for task, prediction in ((SentimentTask(), (bad, np.zeros(3, np.float32))),
                             (EmbeddingTask(), np.array([0.5, bad], dtype=np.float32))):
        with pytest.raises(InferenceError, match="not finite"):
            render_prediction(task, "r1", prediction, SHA, max_record_bytes=1 << 20)
    with pytest.raises(InferenceError, match="not finite"):
        render_prediction(SentimentTask(with_embedding=True), "r1", (0.5, np.array([bad], np.float32)), SHA,
                          max_record_bytes=1 << 20)
    with pytest.raises(InferenceError, match="not finite"):
        render_scored("r1", {"score": bad}, SHA, max_record_bytes=1 << 20)


@pytest.mark.parametrize("limit", [32 * 1024, 100_000, 1_048_576 - 1024])
@pytest.mark.parametrize("id_chars", [0, 10, 1024, 1025, 117_000])
def test_a_dead_letter_always_fits_the_limit_and_keeps_the_longest_value_prefix(
    limit: int, id_chars: int
) -> None:
    from pyflink_aisp.outcome import MAX_DEAD_LETTER_ID_CHARS, render_dead_letter

    record_id = "😀" * id_chars if id_chars else None
    value = ("x" * 900_000).encode()
    letter = DeadLettered(reason=Reason.OVERSIZED_OUTPUT, detail="é" * 5000, id=record_id, topic="in",
                          partition=3, offset=99, value=value)
    key, text = render_dead_letter(letter, limit)
    assert _size(key, text) <= limit
    out = json.loads(text)
    kept = base64.b64decode(out["value_base64"])
    assert kept == value[:len(kept)] and out["value_truncated"] is True and out["value_size_bytes"] == 900_000
    # the longest prefix: 3 more bytes (4 base64 characters) would not fit, or the 256 KiB cap is reached
    assert len(kept) == MAX_DEAD_LETTER_VALUE_BYTES or _size(key, text) + 4 > limit
    if record_id is None or id_chars > MAX_DEAD_LETTER_ID_CHARS:
        assert key == "in/3/99"
    else:
        assert key == record_id
    assert out["id"] == (None if record_id is None else record_id[:MAX_DEAD_LETTER_ID_CHARS])


def test_a_small_dead_letter_is_unchanged_by_the_limit() -> None:
    from pyflink_aisp.outcome import render_dead_letter

    letter = DeadLettered(reason=Reason.INVALID_JSON, detail="x", topic="t", partition=0, offset=1,
                          value=b"{")
    assert render_dead_letter(letter, 32 * 1024) == ("t/0/1", letter.to_json())


class _Colour(enum.Enum):
    RED = 1
    NAN = float("nan")


class _Level(enum.IntEnum):
    HIGH = 3


class _Name(enum.StrEnum):
    A = "a"


def _nested(depth: int) -> object:
    value: object = 1.0
    for i in range(depth):
        value = [value] if i % 2 else {"n": value}
    return value


@pytest.mark.parametrize("fields", [
    {"p": [0.1, 1e-05, 3], "label": "caf\u00e9 \U0001f3ac", "n": None, "ok": True},
    {"big": 2**70, "neg": [-(2**63) - 1, 1.5]},                      # past orjson's 64 bits
    {"s": "\ud800"},                                                 # a lone surrogate
    {"nested": {"a": [1.0, {"b": float("nan")}]}},                   # NaN deep inside
    {"v": [1.0, float("inf")]}, {"v": -float("inf")},
    {"v": [np.float32(1.0), [float("nan")]]},                        # a numpy scalar beside a NaN (fuzzing)
    {"v": [np.float32(1.0), [-(2**63) - 1, [], 2**70]]},
    {"k": {1: "int name"}},
    {"t": (1, "x", [2.5])},
    # types orjson writes and json refuses (found by a helper trying to break scored_json)
    {"e": _Colour.RED}, {"e": [_Colour.RED]}, {"e": _Colour.NAN}, {"u": uuid.UUID(int=5)},
    {"i": _Level.HIGH, "s": _Name.A},                                # int and str enums: both write them
    {"deep": _nested(700)}, {"deep": _nested(300)},                  # past Python's stack for a walk
])
def test_scored_json_reads_back_as_pythons_json_writes_it_or_fails_the_same_way(fields) -> None:
    doc = {"id": "r1", **fields, "model_sha256": SHA}
    try:
        expected: object = json.loads(json.dumps(doc, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        expected = type(exc)
    try:
        got: object = json.loads(scored_json("r1", fields, SHA))
    except (TypeError, ValueError, RecursionError) as exc:
        got = type(exc)
    assert got == expected
