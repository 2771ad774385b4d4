"""bench/_kafka_load.py: which Kafka errors the bench's offset reads retry (a topic just made)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException


def test_a_topic_whose_leader_is_not_known_yet_is_retried_and_a_refusal_is_not(bench_module) -> None:
    load = bench_module("_kafka_load")
    assert load._retriable(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
    assert load._retriable(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
    assert not load._retriable(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert not load._retriable(ValueError("not Kafka"))


@pytest.mark.integration
def test_one_end_offset_reader_sees_records_written_after_its_first_poll(
    bench_module, kafka_bootstrap, topic
) -> None:
    load = bench_module("_kafka_load")
    name = topic("out")
    load.create_stamped_topics(kafka_bootstrap, [name], partitions=2)
    with load.EndOffsets(kafka_bootstrap, name) as offsets:
        assert offsets.end() == 0
        load.produce_all(kafka_bootstrap, name, [(f"k{i}", f"text {i}") for i in range(7)])
        assert offsets.end() == 7  # asked of the broker again, not the first answer cached
        load.produce_all(kafka_bootstrap, name, [("k7", "text 7")])
        assert offsets.end() == 8
    assert load.end_offset(kafka_bootstrap, name) == 8
