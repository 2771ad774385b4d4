"""Avro values against a real Schema Registry (Apicurio Registry's Confluent API, started by the
suite) and a real broker: records written by Confluent's own AvroSerializer, under two versions
of a schema, decode to their fields by each record's schema id; an unknown id or an unreachable
registry is a dead letter, not an error."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pyflink_aisp.kafka import DecodedRecord, FieldMapping, create_topics, decode_record, read_topic
from pyflink_aisp.local import find_free_port
from pyflink_aisp.outcome import DeadLettered, Reason

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "Review", "namespace": "aisp.test", "fields": [
    {"name": "review_id", "type": "string"}, {"name": "body", "type": "string"},
    {"name": "lang", "type": "string"}]}
#: v2 adds a field with a default: backward compatible, a new schema id
V2 = {**V1, "fields": [*V1["fields"], {"name": "stars", "type": ["null", "int"], "default": None}]}


def test_records_of_two_schema_versions_decode_by_their_ids(kafka_bootstrap, schema_registry, topic):
    t = topic("avro")
    create_topics(kafka_bootstrap, [t])
    client = SchemaRegistryClient({"url": schema_registry})
    context = SerializationContext(t, MessageField.VALUE)
    v1, v2 = (AvroSerializer(client, json.dumps(s)) for s in (V1, V2))
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    sent = [({"review_id": f"r{i}", "body": f"text {i}", "lang": "en"}, v1) for i in range(3)]
    sent += [({"review_id": f"s{i}", "body": f"more {i}", "lang": "fr", "stars": i}, v2) for i in range(3)]
    for record, serializer in sent:
        producer.produce(t, value=serializer(record, context))
    producer.produce(t, value=b"\x00\x00\x00\x7f\xff" + b"\x02a")  # an id the registry never gave
    assert producer.flush(30) == 0
    mapping = FieldMapping(text="/body", id="/review_id", keep=("/lang", "/stars"), value_format="avro",
                           schema_registry_url=schema_registry)
    messages = read_topic(kafka_bootstrap, t, min_count=len(sent) + 1, timeout_s=30)
    decoded = [decode_record(m.value(), m.topic(), m.partition(), m.offset(), mapping) for m in messages]
    good = [d for d in decoded if isinstance(d, DecodedRecord)]
    assert [(d.id, d.text, d.kept) for d in good] == [
        (r["review_id"], r["body"], (("lang", r["lang"]), ("stars", r.get("stars")))) for r, _ in sent]
    ids = {int.from_bytes(m.value()[1:5], "big") for m in messages[: len(sent)]}
    assert len(ids) == 2, "two schema versions, two ids"
    (bad,) = [d for d in decoded if isinstance(d, DeadLettered)]
    assert bad.reason is Reason.UNKNOWN_SCHEMA and f"schema id {0x7fff} not found" in bad.detail


def test_an_unreachable_registry_is_a_dead_letter_per_record():
    url = f"http://127.0.0.1:{find_free_port()}/apis/ccompat/v7"  # nothing listens there
    mapping = FieldMapping(value_format="avro", schema_registry_url=url)
    out = decode_record(b"\x00\x00\x00\x00\x01\x02a", "t", 0, 0, mapping)
    assert isinstance(out, DeadLettered) and out.reason is Reason.UNKNOWN_SCHEMA
    assert "did not answer: ConnectError" in out.detail
