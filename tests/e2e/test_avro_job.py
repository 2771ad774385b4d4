"""Issue 21: Avro values (Confluent wire format) with a real Schema Registry (Apicurio Registry,
started by the suite), written by Confluent's own AvroSerializer, scored by options alone through
`flink run` on the standalone cluster in both modes: each record once, its own id, `lang` kept, the
score the model gives its body; values that are not the wire format or name an unknown schema are
dead letters with their reasons, not restarts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
N = 150
SCHEMA = {"type": "record", "name": "Review", "namespace": "aisp.e2e", "fields": [
    {"name": "review_id", "type": "string"}, {"name": "body", "type": "string"},
    {"name": "lang", "type": "string"}]}


@pytest.fixture(scope="module")
def avro_topic(stack, schema_registry):
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, ["avro-reviews"])
    serializer = AvroSerializer(SchemaRegistryClient({"url": schema_registry}), json.dumps(SCHEMA))
    context = SerializationContext("avro-reviews", MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    reviews = load_rotten_tomatoes()[:N]
    for r in reviews:
        producer.produce("avro-reviews", value=serializer({"review_id": r.id, "body": r.text, "lang": "en"},
                                                          context))
    producer.produce("avro-reviews", value=b'{"review_id": "j", "body": "json, not avro"}')
    producer.produce("avro-reviews", value=b"\x00\x00\x01\x00\x00\x02ab")  # schema id 65536: unknown
    producer.produce("avro-reviews", value=serializer({"review_id": "cut", "body": "x" * 40, "lang": "en"},
                                                      context)[:12])  # truncated
    assert producer.flush(30) == 0
    return reviews


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_avro_records_are_scored_exactly_once_by_options_alone(stack, model_assets, schema_registry,
                                                               avro_topic, job_outputs, mode):
    bootstrap = str(stack.status().bootstrap_servers)
    out_topic = f"avro-scores-{mode}"
    create_topics(bootstrap, [out_topic, f"{out_topic}.dlq"])
    stdout, read = job_outputs(stack, mode, (
        "--bootstrap-servers", bootstrap, "--input-topic", "avro-reviews", "--output-topic", out_topic,
        "--model-dir", str(model_assets.directory), "--value-format", "avro", "--schema-registry-url",
        schema_registry, "--text-field", "/body", "--id-field", "/review_id", "--keep-fields", "/lang",
        "--checkpoint-interval-ms", "1000"), {out_topic: N, f"{out_topic}.dlq": 3})
    if mode == "batch":
        assert f": {N + 3} in, {N} out, 3 dead letters" in stdout
    out, dlq = read[out_topic], read[f"{out_topic}.dlq"]
    docs = [json.loads(m.value()) for m in out]
    reviews = avro_topic
    assert sorted(d["id"] for d in docs) == sorted(r.id for r in reviews)  # each once
    assert all(list(d) == ["id", "lang", "label", "score", "model_sha256"] for d in docs)
    assert {d["lang"] for d in docs} == {"en"}
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    expected = {r.id: float(s) for r, s in zip(reviews, scores, strict=True)}
    assert all(d["score"] == pytest.approx(expected[d["id"]], abs=1e-5) for d in docs)
    letters = sorted((json.loads(m.value())["reason"], json.loads(m.value())["detail"][:40]) for m in dlq)
    assert [reason for reason, _ in letters] == ["invalid_avro", "invalid_avro", "unknown_schema"]
    assert len(dlq) == 3
