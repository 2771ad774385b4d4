"""Avro values in the Confluent wire format (written here with fastavro), decoded with schemas
fetched by id from a stand-in registry: fields map by pointer; every bad value is an error with its
reason; credentials in the registry URL never reach a message. Against a real registry and
Confluent's own serializer: tests/integration/kafka/test_avro_registry.py."""

from __future__ import annotations

import io
import json
import struct

import fastavro
import httpx
import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.kafka import DecodedRecord, FieldMapping, KafkaCoordinates, decode_review
from pyflink_aisp.kafka._avro import SchemaRegistryClient, decode_avro, redact_url
from pyflink_aisp.outcome import DeadLettered, Reason

SCHEMA = {"type": "record", "name": "Review", "namespace": "test", "fields": [
    {"name": "review_id", "type": "string"}, {"name": "body", "type": ["null", "string"], "default": None},
    {"name": "lang", "type": "string"}, {"name": "stars", "type": "int"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "raw", "type": "bytes"}]}
SRC = KafkaCoordinates(topic="reviews", partition=0, offset=4)


class _Registry:
    """A registry answering GET /schemas/ids/{id} from a dict (counts calls; fails on demand)."""

    def __init__(self, schemas, fail_first=0):
        self.schemas, self.calls, self.fail_first = schemas, 0, fail_first

    def get(self, url, timeout, headers):
        self.calls += 1
        if self.calls <= self.fail_first:
            raise httpx.ConnectError("connection refused")
        schema_id = int(url.rsplit("/", 1)[1])
        request = httpx.Request("GET", url)
        if schema_id not in self.schemas:
            return httpx.Response(404, json={"error_code": 40403, "message": "Schema not found"},
                                  request=request)
        return httpx.Response(200, json=self.schemas[schema_id], request=request)


def _wire(schema_id, record, schema=SCHEMA):
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">I", schema_id) + body.getvalue()


RECORD = {"review_id": "r1", "body": "a joy", "lang": "en", "stars": 5, "at": 1_700_000_000_000,
          "raw": b"\x01\x02"}


def _client(registry):
    return SchemaRegistryClient("http://user:s3cret@registry:8081", get=registry.get)


def test_fields_map_by_pointer_and_kept_values_are_json_able():
    registry = _Registry({3: {"schema": json.dumps(SCHEMA)}})
    mapping = FieldMapping(text="/body", id="/review_id", keep=("/lang", "/at", "/raw"), value_format="avro",
                           schema_registry_url="http://registry:8081")
    from pyflink_aisp.kafka import _avro

    _avro._CLIENTS["http://registry:8081"] = SchemaRegistryClient("http://registry:8081", get=registry.get)
    out = decode_review(_wire(3, RECORD), SRC, mapping)
    again = decode_review(_wire(3, {**RECORD, "review_id": "r2"}), SRC, mapping)
    assert isinstance(out, DecodedRecord) and out.id == "r1" and out.text == "a joy"
    assert out.kept == (("lang", "en"), ("at", "2023-11-14T22:13:20+00:00"), ("raw", "AQI="))
    assert isinstance(again, DecodedRecord) and again.id == "r2"
    assert registry.calls == 1  # one fetch per schema id
    null_body = decode_review(_wire(3, {**RECORD, "body": None}), SRC, mapping)
    assert isinstance(null_body, DeadLettered) and null_body.reason is Reason.MISSING_TEXT
    _avro._CLIENTS.pop("http://registry:8081")


@pytest.mark.parametrize(("value", "reason", "detail"), [
    (b"", Reason.INVALID_AVRO, "not the Confluent Avro wire format (0 bytes"),
    (b'{"id": 1}', Reason.INVALID_AVRO, "(magic byte 123;"),
    (_wire(3, RECORD)[:9], Reason.INVALID_AVRO, "body does not decode under schema id 3"),
    (_wire(3, RECORD) + b"\x00\x00", Reason.INVALID_AVRO, "2 bytes left after the datum of schema id 3"),
    (_wire(9, RECORD), Reason.UNKNOWN_SCHEMA, "schema id 9 not found at http://registry:8081/schemas/ids/9"),
    (_wire(4, RECORD), Reason.UNKNOWN_SCHEMA, "schema id 4 is a PROTOBUF schema, not Avro"),
    (_wire(5, RECORD), Reason.UNKNOWN_SCHEMA,
     "schema id 5 at http://registry:8081/schemas/ids/5 is not an Avro"),
    (_wire(6, "just a string", schema="string"), Reason.NOT_AN_OBJECT, "the Avro datum is str, not a record"),
])
def test_every_bad_value_is_an_error_with_its_reason_and_no_credentials(value, reason, detail):
    registry = _Registry({3: {"schema": json.dumps(SCHEMA)}, 4: {"schemaType": "PROTOBUF", "schema": "x"},
                          5: {"schema": "{not json"}, 6: {"schema": '"string"'}})
    from pyflink_aisp.errors import DecodeError

    with pytest.raises(DecodeError) as info:
        decode_avro(value, _client(registry))
    assert info.value.reason == reason.value and detail in info.value.detail
    assert "s3cret" not in info.value.detail and "user" not in info.value.detail


def test_a_registry_that_does_not_answer_is_retried_then_a_dead_letter_not_cached():
    registry = _Registry({3: {"schema": json.dumps(SCHEMA)}}, fail_first=3)
    client = SchemaRegistryClient("http://user:s3cret@registry:8081", get=registry.get, attempts=3)
    from pyflink_aisp.errors import DecodeError

    with pytest.raises(DecodeError) as info:
        decode_avro(_wire(3, RECORD), client)
    assert info.value.reason == "unknown_schema" and "did not answer: ConnectError" in info.value.detail
    assert "s3cret" not in info.value.detail and registry.calls == 3
    assert decode_avro(_wire(3, RECORD), client)["review_id"] == "r1"  # the next record fetches again


def test_avro_needs_a_registry_url_and_only_avro_takes_one():
    with pytest.raises(ConfigError, match="avro values need --schema-registry-url"):
        FieldMapping(value_format="avro")
    with pytest.raises(ConfigError, match="give both or neither"):
        FieldMapping(schema_registry_url="http://registry:8081")
    with pytest.raises(ConfigError, match="must be an http"):
        FieldMapping(value_format="avro", schema_registry_url="registry:8081")


def test_redact_url_drops_the_user_info_only():
    assert redact_url("https://u:p@host:8081/apis/ccompat/v7") == "https://host:8081/apis/ccompat/v7"
    assert redact_url("http://host/x") == "http://host/x"
