"""Field mapping: JSON Pointers (RFC 6901) to the text, the id and the kept fields of a record."""

from __future__ import annotations

import json

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.kafka import DecodedRecord, FieldMapping, KafkaCoordinates, decode_review, parse_pointer
from pyflink_aisp.kafka._mapping import is_missing, resolve_pointer
from pyflink_aisp.outcome import DeadLettered, Reason

SRC = KafkaCoordinates(topic="reviews", partition=1, offset=9)
# RFC 6901 section 5's example document
RFC_DOC = {"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\j": 5, 'k"l': 6,
           " ": 7, "m~n": 8}


@pytest.mark.parametrize(("pointer", "value"), [
    ("/foo", ["bar", "baz"]), ("/foo/0", "bar"), ("/", 0), ("/a~1b", 1), ("/c%d", 2), ("/e^f", 3),
    ("/g|h", 4), ("/i\\j", 5), ('/k"l', 6), ("/ ", 7), ("/m~0n", 8),
])
def test_the_rfc_6901_examples_resolve(pointer, value):
    assert resolve_pointer(RFC_DOC, parse_pointer(pointer)) == value


@pytest.mark.parametrize("pointer", ["/foo/2", "/foo/01", "/foo/-", "/foo/bar", "/nope", "/foo/0/x"])
def test_what_a_document_does_not_hold_is_missing(pointer):
    assert is_missing(resolve_pointer(RFC_DOC, parse_pointer(pointer)))


@pytest.mark.parametrize(("pointer", "message"), [
    ("", "must start with '/'"), ("body", "must start with '/'"), ("/a~2b", "'~' must be followed by 0 or 1"),
    ("/a~", "'~' must be followed by 0 or 1"),
])
def test_a_pointer_that_cannot_match_is_one_line_at_start_up(pointer, message):
    with pytest.raises(ConfigError, match=message):
        FieldMapping(text=pointer)


@pytest.mark.parametrize("keep", [("/lang", "/meta/lang"), ("/id",), ("/x/model_sha256",)])
def test_kept_names_must_be_unique_and_not_the_outputs_own(keep):
    with pytest.raises(ConfigError, match="keep each name once"):
        FieldMapping(keep=keep)


def test_a_record_of_another_shape_decodes_by_its_mapping_with_nested_fields_and_kept_values():
    mapping = FieldMapping(text="/review/body", id="/review_id", keep=("/lang", "/meta/stars", "/absent"))
    value = json.dumps({"review_id": 17, "review": {"body": "a fine film"}, "lang": "en",
                        "meta": {"stars": [4, 5]}}).encode()
    assert decode_review(value, SRC, mapping) == DecodedRecord(id="17", text="a fine film",
                                                               kept=(("lang", "en"), ("stars", [4, 5]),
                                                                     ("absent", None)))
    assert mapping.kept_names == ["lang", "stars", "absent"]


def test_star_keeps_every_top_level_field_but_the_text_and_id_in_the_records_order():
    mapping = FieldMapping(text="/body", id="/review_id", keep=("*",))
    value = json.dumps({"lang": "en", "review_id": "r1", "body": "a fine film", "meta": {"stars": 4},
                        "model_sha256": "x", "id": "spoof"}).encode()
    out = decode_review(value, SRC, mapping)
    assert out == DecodedRecord(id="r1", text="a fine film", kept=(("lang", "en"), ("meta", {"stars": 4})))
    # a nested text: its top-level parent is kept whole
    nested = FieldMapping(text="/review/body", keep=("*",))
    value = json.dumps({"review": {"body": "t"}, "id": 5, "lang": "de"}).encode()
    assert decode_review(value, SRC, nested).kept == (("review", {"body": "t"}), ("lang", "de"))
    with pytest.raises(ConfigError, match="'\\*' keeps every field: give it alone"):
        FieldMapping(keep=("*", "/lang"))


@pytest.mark.parametrize(("value", "reason", "detail"), [
    (b'{"review_id": "r", "text": "t"}', Reason.MISSING_TEXT,
     "no value at /review/body; the object's fields: 'review_id', 'text'"),
    (b'{"review": {"body": null}}', Reason.MISSING_TEXT, "'/review/body' is null"),
    (b'{"review": {"body": 3}}', Reason.TEXT_NOT_STRING, "'/review/body' is int"),
    (b'{"review": {"body": "t"}, "review_id": ""}', Reason.BAD_ID, "'/review_id' is an empty string"),
    (b'{"review": {"body": "t"}, "review_id": 1.5}', Reason.BAD_ID, "'/review_id' is float"),
])
def test_a_record_without_its_mapped_field_is_a_dead_letter_naming_the_path(value, reason, detail):
    out = decode_review(value, SRC, FieldMapping(text="/review/body", id="/review_id"))
    assert isinstance(out, DeadLettered) and (out.reason, out.detail) == (reason, detail)


def test_without_an_id_field_every_record_is_scored_under_its_coordinates():
    out = decode_review(b'{"id": "ignored", "text": "t"}', SRC, FieldMapping(id=None))
    assert out == DecodedRecord(id="reviews/1/9", text="t")
    absent = decode_review(b'{"body": "t"}', SRC, FieldMapping(text="/body", id="/review_id"))
    assert isinstance(absent, DecodedRecord) and absent.id == "reviews/1/9"


def test_a_raw_value_is_the_text_under_the_records_coordinates():
    raw = FieldMapping(value_format="raw")
    assert decode_review("très bien — 映画".encode(), SRC, raw) == DecodedRecord(id="reviews/1/9",
                                                                                 text="très bien — 映画")
    assert decode_review(b'\xef\xbb\xbf{"id": 1}', SRC, raw).text == '{"id": 1}'  # BOM dropped, not parsed
    for value, reason in ((None, Reason.NULL_VALUE), (b"\xff\xfe", Reason.INVALID_UTF8)):
        out = decode_review(value, SRC, raw)
        assert isinstance(out, DeadLettered) and out.reason is reason


@pytest.mark.parametrize("fields", [{"text": "/body"}, {"keep": ("/lang",)}, {"features": ("/x",)},
                                    {"text_pair": "/passage"}])
def test_raw_values_have_no_fields_to_map(fields):
    with pytest.raises(ConfigError, match="raw values are the text itself"):
        FieldMapping(value_format="raw", **fields)


def test_features_from_one_array_field_or_named_number_fields_in_the_pointers_order():
    vector = FieldMapping(features=("/features",), id="/tx", keep=("/merchant",))
    out = decode_review(b'{"tx": "t1", "features": [0.5, -2, 3e2], "merchant": "m"}', SRC, vector)
    assert out == DecodedRecord(id="t1", text="", kept=(("merchant", "m"),), features=(0.5, -2.0, 300.0))
    assert out.model_input == (0.5, -2.0, 300.0)
    named = FieldMapping(features=("/amount", "/card/age_days"), id="/tx", keep=("*",))
    out = decode_review(b'{"tx": 7, "card": {"age_days": 30}, "amount": 12.5, "country": "NL"}', SRC, named)
    assert isinstance(out, DecodedRecord)
    assert (out.id, out.features) == ("7", (12.5, 30.0))
    assert out.kept == (("card", {"age_days": 30}), ("country", "NL"))  # the one-level feature is not kept


@pytest.mark.parametrize(("value", "reason", "detail"), [
    (b'{"tx": 1}', Reason.MISSING_FEATURE, "no value at /features; the object's fields: 'tx'"),
    (b'{"features": null}', Reason.MISSING_FEATURE, "'/features' is null"),
    (b'{"features": []}', Reason.BAD_FEATURE, "'/features' is an empty array"),
    (b'{"features": [1, "2"]}', Reason.BAD_FEATURE, "'/features/1' is str, not a number"),
    (b'{"features": [1, true]}', Reason.BAD_FEATURE, "'/features/1' is bool, not a number"),
    (b'{"features": [1.5, 1' + b"0" * 400 + b']}', Reason.BAD_FEATURE,
     "'/features/1' is an integer past a double's range (IEEE 754 binary64)"),
    (b'{"features": 1' + b"0" * 400 + b'}', Reason.BAD_FEATURE,
     "'/features' is an integer past a double's range (IEEE 754 binary64)"),
    (b'{"features": {"a": 1}}', Reason.BAD_FEATURE, "'/features' is dict, not a number"),
])
def test_a_record_without_usable_features_is_a_dead_letter_naming_the_path(value, reason, detail):
    out = decode_review(value, SRC, FieldMapping(features=("/features",)))
    assert isinstance(out, DeadLettered) and (out.reason, out.detail) == (reason, detail)


def test_a_single_number_feature_is_a_vector_of_one():
    out = decode_review(b'{"x": 4}', SRC, FieldMapping(features=("/x",)))
    assert isinstance(out, DecodedRecord) and out.features == (4.0,)


def test_the_kafka_key_as_the_id_for_json_and_raw_values():
    json_key = FieldMapping(text="/body", id="key", keep=("*",))
    out = decode_review(b'{"body": "t", "id": "ignored", "lang": "en"}', SRC, json_key, key="k-1 é".encode())
    assert out == DecodedRecord(id="k-1 é", text="t", kept=(("lang", "en"),))  # the record's own id is not
    assert decode_review(b'{"body": "t"}', SRC, json_key, key=None).id == "reviews/1/9"  # no key
    assert decode_review(b'{"body": "t"}', SRC, json_key, key=b"").id == "reviews/1/9"
    raw_key = FieldMapping(value_format="raw", id="key")
    assert decode_review(b"a text", SRC, raw_key, key=b"r7") == DecodedRecord(id="r7", text="a text")
    bad = decode_review(b"a text", SRC, raw_key, key=b"\xff")
    assert isinstance(bad, DeadLettered) and bad.reason is Reason.BAD_ID
    assert bad.detail == "the Kafka key is not UTF-8 (byte 0: invalid start byte)"


def test_the_key_is_read_only_when_the_id_is_the_key():
    out = decode_review(b'{"id": "a", "text": "t"}', SRC, FieldMapping(), key=b"other")
    assert isinstance(out, DecodedRecord) and out.id == "a"


def test_a_second_text_makes_the_model_input_a_pair_and_star_skips_its_field():
    mapping = FieldMapping(text="/query", text_pair="/doc/passage", id="/qid", keep=("*",))
    value = json.dumps({"qid": "q1", "query": "is it good", "doc": {"passage": "a fine film"},
                        "lang": "en"}).encode()
    out = decode_review(value, SRC, mapping)
    assert isinstance(out, DecodedRecord)
    assert (out.id, out.model_input) == ("q1", ("is it good", "a fine film"))
    assert out.kept == (("doc", {"passage": "a fine film"}), ("lang", "en"))  # nested: only top-level skipped
    flat = FieldMapping(text="/query", text_pair="/passage", keep=("*",))
    out = decode_review(b'{"id": 3, "query": "q", "passage": "p", "lang": "en"}', SRC, flat)
    assert isinstance(out, DecodedRecord) and out.kept == (("lang", "en"),)
    assert decode_review(b'{"id": 3, "text": "t"}', SRC, FieldMapping()).model_input == "t"


@pytest.mark.parametrize(("value", "reason", "detail"), [
    (b'{"query": "q"}', Reason.MISSING_TEXT, "no value at /passage; the object's fields: 'query'"),
    (b'{"query": "q", "passage": null}', Reason.MISSING_TEXT, "'/passage' is null"),
    (b'{"query": "q", "passage": 7}', Reason.TEXT_NOT_STRING, "'/passage' is int"),
    (b'{"query": "q", "passage": "\\ud800"}', Reason.INVALID_UNICODE, "'/passage' char 0"),
])
def test_a_record_without_a_usable_second_text_is_a_dead_letter_naming_its_path(value, reason, detail):
    out = decode_review(value, SRC, FieldMapping(text="/query", text_pair="/passage"))
    assert isinstance(out, DeadLettered) and out.reason is reason and out.detail.startswith(detail)


def test_a_second_text_is_refused_with_features_and_must_be_a_pointer():
    with pytest.raises(ConfigError, match="a model of --feature-fields reads no text"):
        FieldMapping(features=("/x",), text_pair="/passage")
    with pytest.raises(ConfigError, match="must start with '/'"):
        FieldMapping(text_pair="passage")


def test_prompt_fields_make_the_model_input_a_dict_of_placeholders_with_other_values_as_json():
    mapping = FieldMapping(text="/body", id="/rid", prompt_fields=("/meta/product", "/stars", "/tags"))
    assert mapping.prompt_names == ["product", "stars", "tags"]
    value = json.dumps({"rid": "r1", "body": "It broke.", "stars": 1.5, "tags": ["a", "é"],
                        "meta": {"product": "kettle {text}"}}, ensure_ascii=False).encode()
    out = decode_review(value, SRC, mapping)
    assert isinstance(out, DecodedRecord) and out.id == "r1"
    assert out.model_input == {"text": "It broke.", "product": "kettle {text}", "stars": "1.5",
                               "tags": '["a","é"]'}
    pair = FieldMapping(text="/q", text_pair="/p", prompt_fields=("/lang",))
    out = decode_review(b'{"q": "q", "p": "p", "lang": "en"}', SRC, pair)
    assert isinstance(out, DecodedRecord) and out.model_input == {"text": "q", "text_pair": "p", "lang": "en"}
    assert decode_review(b'{"id": 1, "text": "t"}', SRC, FieldMapping(prompt_fields=())).model_input == "t"


@pytest.mark.parametrize(("value", "reason", "detail"), [
    (b'{"body": "b"}', Reason.MISSING_TEXT, "no value at /meta/product; the object's fields: 'body' (a "
                                            "--prompt-fields field)"),
    (b'{"body": "b", "meta": {"product": null}}', Reason.MISSING_TEXT, "'/meta/product' is null"),
    (b'{"body": "b", "meta": {"product": "\\udfff"}}', Reason.INVALID_UNICODE, "'/meta/product' char 0"),
])
def test_a_record_without_a_prompt_field_is_a_dead_letter_naming_it(value, reason, detail):
    out = decode_review(value, SRC, FieldMapping(text="/body", prompt_fields=("/meta/product",)))
    assert isinstance(out, DeadLettered) and out.reason is reason and out.detail.startswith(detail)


@pytest.mark.parametrize(("fields", "message"), [
    ({"prompt_fields": ("/a/name", "/b/name")}, r"placeholders \['name'\] twice"),
    ({"prompt_fields": ("/meta/text",)}, r"placeholders \['text'\] twice"),
    ({"prompt_fields": ("/x",), "features": ("/f",)}, "not for raw values or --feature-fields"),
    ({"prompt_fields": ("/x",), "value_format": "raw"}, "not for raw values or --feature-fields"),
    ({"prompt_fields": ("name",)}, "must start with '/'"),
])
def test_prompt_fields_are_refused_where_they_cannot_name_a_placeholder(fields, message):
    with pytest.raises(ConfigError, match=message):
        FieldMapping(**fields)
