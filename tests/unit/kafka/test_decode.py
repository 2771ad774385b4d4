import base64
import json

import pytest

from pyflink_aisp.kafka import DecodedRecord, KafkaCoordinates, decode_review
from pyflink_aisp.kafka._decode import MAX_DEAD_LETTER_VALUE_BYTES
from pyflink_aisp.outcome import DeadLettered, Reason

SRC = KafkaCoordinates(topic="reviews", partition=2, offset=41)


def test_valid_record_keeps_id_text_label():
    out = decode_review(b'{"id": "rt-1", "text": "a fine film", "label": "fresh"}', SRC)
    assert out == DecodedRecord(id="rt-1", text="a fine film", label="fresh")


def test_integer_id_becomes_string_and_missing_id_uses_coordinates():
    assert decode_review(b'{"id": 7, "text": "x"}', SRC).id == "7"
    assert decode_review(b'{"text": "x"}', SRC).id == "reviews/2/41"


@pytest.mark.parametrize(("value", "expected"), [
    (b'{"text": "x"}', "reviews/2/41"),                 # absent: the coordinates
    (b'{"id": null, "text": "x"}', "reviews/2/41"),     # null: the same
    (b'{"id": " ", "text": "x"}', " "),                 # a non-empty string is an id as it is
    (b'{"id": 0, "text": "x"}', "0"),
    (b'{"id": -12, "text": "x"}', "-12"),
])
def test_the_id_rules(value, expected):
    assert decode_review(value, SRC).id == expected


@pytest.mark.parametrize(("value", "detail"), [
    (b'{"id": "", "text": "x"}', "'id' is an empty string"),
    (b'{"id": 1.5, "text": "x"}', "'id' is float"),
    (b'{"id": {"a": 1}, "text": "x"}', "'id' is dict"),
])
def test_an_empty_or_non_integer_id_is_a_bad_id_keyed_by_coordinates(value, detail):
    out = decode_review(value, SRC)
    assert isinstance(out, DeadLettered) and out.reason is Reason.BAD_ID and out.detail == detail
    assert out.id is None and out.key == "reviews/2/41"  # never "" as a Kafka key


@pytest.mark.parametrize(("value", "detail"), [
    (b'{"review_id": "r1", "body": "fine", "lang": "en"}',
     "no 'text' field; the object's fields: 'body', 'lang', 'review_id'"),
    (b'{"id": "a", "text": null}', "'text' is null"),
    (b"{}", "no 'text' field; the object is empty"),
    (json.dumps({f"f{i:02d}": i for i in range(10)}).encode(),
     "no 'text' field; the object's fields: 'f00', 'f01', 'f02', 'f03', 'f04', 'f05', 'f06', 'f07' "
     "and 2 more"),
])
def test_a_missing_text_names_the_fields_the_record_has(value, detail):
    out = decode_review(value, SRC)
    assert isinstance(out, DeadLettered) and out.reason is Reason.MISSING_TEXT and out.detail == detail


def test_empty_text_is_valid():
    assert decode_review(b'{"id": "e", "text": ""}', SRC) == DecodedRecord(id="e", text="")


def test_non_ascii_text_survives():
    raw = json.dumps({"id": "u", "text": "très bien — 映画"}, ensure_ascii=False).encode()
    assert decode_review(raw, SRC).text == "très bien — 映画"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, Reason.NULL_VALUE),
        (b"\xff\xfe{}", Reason.INVALID_UTF8),
        (b'{"id": 1, "text": ', Reason.INVALID_JSON),
        (b"", Reason.INVALID_JSON),
        (b"[1, 2]", Reason.NOT_AN_OBJECT),
        (b'"just a string"', Reason.NOT_AN_OBJECT),
        (b"{}", Reason.MISSING_TEXT),
        (b'{"id": "a", "text": null}', Reason.MISSING_TEXT),
        (b'{"id": "a", "text": 5}', Reason.TEXT_NOT_STRING),
        (b'{"id": ["a"], "text": "t"}', Reason.BAD_ID),
        (b'{"id": true, "text": "t"}', Reason.BAD_ID),
        (b'{"text": "x", "a": ' + b"[" * 5000 + b"]" * 5000 + b"}", Reason.INVALID_JSON),
        (b'{"id": ' + b"1" * 5000 + b', "text": "x"}', Reason.INVALID_JSON),
        (b'{"id": "s", "text": "a\\ud800b"}', Reason.INVALID_UNICODE),
        (b'{"id": "\\udfff", "text": "ok"}', Reason.INVALID_UNICODE),
    ],
)
def test_bad_records_become_dead_letters_with_reason(value, reason):
    out = decode_review(value, SRC)
    assert isinstance(out, DeadLettered)
    assert out.reason is reason
    assert (out.id, out.topic, out.partition, out.offset) == (None, SRC.topic, SRC.partition, SRC.offset)
    assert out.value == value


def test_dead_letter_json_keeps_raw_bytes_and_coordinates():
    out = decode_review(b"\xff\x00oops", SRC)
    doc = json.loads(out.to_json())
    assert doc["reason"] == "invalid_utf8"
    assert (doc["topic"], doc["partition"], doc["offset"]) == ("reviews", 2, 41)
    assert base64.b64decode(doc["value_base64"]) == b"\xff\x00oops"
    assert "byte 0" in doc["detail"]
    assert json.loads(decode_review(None, SRC).to_json())["value_base64"] is None


def test_dead_letter_of_a_huge_value_stays_under_one_mebibyte():
    value = b"\xff" + b"x" * 900_000
    letter = decode_review(value, SRC)
    doc = json.loads(letter.to_json())
    assert len(letter.to_json().encode()) < 1024 * 1024
    assert doc["value_truncated"] is True and doc["value_size_bytes"] == len(value)
    assert base64.b64decode(doc["value_base64"]) == value[:MAX_DEAD_LETTER_VALUE_BYTES]


def test_dead_letter_json_is_ascii_even_for_odd_details():
    letter = DeadLettered(reason=Reason.DECODE_ERROR, detail="bad \ud800 thing", topic=SRC.topic,
                          partition=SRC.partition, offset=SRC.offset, value=b"v")
    assert letter.to_json().isascii()
    assert json.loads(letter.to_json())["value_truncated"] is False


def test_a_str_value_becomes_a_decode_error_letter_not_an_exception():
    from pyflink_aisp.kafka import decode_record

    letter = decode_record("not bytes", "t", 0, 7)
    assert isinstance(letter, DeadLettered) and letter.reason is Reason.DECODE_ERROR
    assert letter.value == b"not bytes" and letter.offset == 7


# -- RFC 8259 edge cases (issue 9.5): BOM accepted, non-JSON numbers and repeated names refused ----


@pytest.mark.parametrize("value", [b'\xef\xbb\xbf{"id": "b1", "text": "a fine film"}',
                                   '\ufeff{"id": "b1", "text": "a fine film"}'.encode("utf-8")])
def test_a_utf8_byte_order_mark_before_the_object_is_ignored(value):
    assert decode_review(value, SRC) == DecodedRecord(id="b1", text="a fine film")


def test_only_one_byte_order_mark_is_ignored_and_a_bom_inside_the_text_is_kept():
    twice = decode_review(b'\xef\xbb\xbf\xef\xbb\xbf{"text": "x"}', SRC)
    assert isinstance(twice, DeadLettered) and twice.reason is Reason.INVALID_JSON
    inside = decode_review('{"text": "\ufeffx"}'.encode(), SRC)
    assert inside == DecodedRecord(id="reviews/2/41", text="\ufeffx")


@pytest.mark.parametrize(("value", "detail"), [
    (b'{"text": NaN}', "NaN is not a JSON number (RFC 8259 section 6)"),
    (b'{"text": "x", "score": Infinity}', "Infinity is not a JSON number (RFC 8259 section 6)"),
    (b'{"text": "x", "score": [-Infinity]}', "-Infinity is not a JSON number (RFC 8259 section 6)"),
    (b'{"text": "x", "label": 1e999}', "number 1e999 overflows a double (IEEE 754 binary64)"),
    (b'{"text": "x", "label": -2.5E+400}', "number -2.5E+400 overflows a double (IEEE 754 binary64)"),
])
def test_numbers_that_are_not_json_or_not_finite_are_invalid_json(value, detail):
    out = decode_review(value, SRC)
    assert isinstance(out, DeadLettered)
    assert (out.reason, out.detail, out.value) == (Reason.INVALID_JSON, detail, value)


@pytest.mark.parametrize(("value", "number"), [
    (b'{"text": "x", "vector": [0.5, -1, 2.5e400, 3]}', "2.5e400"),  # a list of numbers: one C pass
    (b'{"text": "x", "rows": [{"a": "s", "b": [1, {"c": -7E+308}]}]}', "-7E+308"),  # nested, mixed
    (b'{"text": "x", "big": 1' + b"0" * 309 + b'.5}', "1" + "0" * 39),  # 310 integer digits
])
def test_an_overflow_anywhere_in_the_document_is_invalid_json(value, number):
    out = decode_review(value, SRC)
    assert isinstance(out, DeadLettered) and out.reason is Reason.INVALID_JSON
    assert out.detail == f"number {number} overflows a double (IEEE 754 binary64)"


def test_a_huge_integer_in_a_field_the_job_does_not_read_is_no_fault():
    out = decode_review(b'{"text": "x", "ids": [1' + b"0" * 400 + b', 2.5], "n": 1' + b"0" * 400 + b'}', SRC)
    assert out == DecodedRecord(id="reviews/2/41", text="x")


def test_the_first_fault_in_document_order_names_the_dead_letter():
    overflow_first = decode_review(b'{"text": "x", "n": 1e999, "m": {"k": 1, "k": 2}}', SRC)
    duplicate_first = decode_review(b'{"text": "x", "m": {"k": 1, "k": 2}, "n": 1e999}', SRC)
    assert isinstance(overflow_first, DeadLettered) and isinstance(duplicate_first, DeadLettered)
    assert (overflow_first.reason, duplicate_first.reason) == (Reason.INVALID_JSON, Reason.DUPLICATE_KEY)


def test_finite_floats_and_big_exponents_that_fit_still_decode():
    out = decode_review(b'{"text": "x", "label": 1.5e308}', SRC)
    assert out == DecodedRecord(id="reviews/2/41", text="x", label=1.5e308)


@pytest.mark.parametrize(("value", "name"), [
    (b'{"id": "d", "text": "first", "text": "second"}', "text"),
    (b'{"id": "a", "id": "b", "text": "x"}', "id"),
    (b'{"text": "x", "meta": {"k": 1, "k": 2}}', "k"),
    (b'{"text": "x", "list": [{"a": 1}, {"a": 2, "a": 3}]}', "a"),
])
def test_a_name_repeated_in_any_object_is_a_duplicate_key(value, name):
    out = decode_review(value, SRC)
    assert isinstance(out, DeadLettered)
    assert out.reason is Reason.DUPLICATE_KEY
    assert out.detail == f"name {name!r} appears more than once in an object (RFC 8259 section 4)"
    assert json.loads(out.to_json())["reason"] == "duplicate_key"


def test_equal_names_in_different_objects_are_not_duplicates():
    out = decode_review(b'{"text": "x", "a": {"text": 1}, "b": {"text": 2}}', SRC)
    assert out == DecodedRecord(id="reviews/2/41", text="x")
