"""bench/_kafka_load.py: which Kafka errors the bench's offset reads retry (a topic just made)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


def test_a_topic_whose_leader_is_not_known_yet_is_retried_and_a_refusal_is_not(bench_module) -> None:
    load = bench_module("_kafka_load")
    assert load._retriable(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
    assert load._retriable(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
    assert not load._retriable(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert not load._retriable(ValueError("not Kafka"))
