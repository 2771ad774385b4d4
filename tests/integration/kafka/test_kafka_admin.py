"""create_topics against a real broker: broker defaults (KIP-464) and a replication factor it cannot meet."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from pyflink_aisp.errors import KafkaError
from pyflink_aisp.kafka import TopicInfo, create_topics, delete_topics

pytestmark = pytest.mark.integration


def _broker_defaults(bootstrap: str) -> tuple[int, int, int]:
    """(num.partitions, default.replication.factor, broker count) as the cluster reports them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    brokers = admin.list_topics(timeout=10).brokers
    resource = ConfigResource(ResourceType.BROKER, str(min(brokers)))
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    partitions = int(configs["num.partitions"].value)
    return partitions, int(configs["default.replication.factor"].value), len(brokers)


def test_default_call_creates_with_the_broker_defaults(kafka_bootstrap, topic):
    partitions, rf, _ = _broker_defaults(kafka_bootstrap)
    name = topic("defaults")
    try:
        assert create_topics(kafka_bootstrap, [name]) == [TopicInfo(name, partitions, rf, created=True)]
        # a second call keeps the topic and reports it as it is
        assert create_topics(kafka_bootstrap, [name], partitions=partitions + 2) == [
            TopicInfo(name, partitions, rf, created=False)
        ]
    finally:
        delete_topics(kafka_bootstrap, [name])


def test_explicit_partitions_are_created_and_read_back(kafka_bootstrap, topic):
    name = topic("explicit")
    try:
        (info,) = create_topics(kafka_bootstrap, [name], partitions=3, replication_factor=1)
        assert (info.partitions, info.replication_factor, info.created) == (3, 1, True)
    finally:
        delete_topics(kafka_bootstrap, [name])


def test_replication_factor_above_the_broker_count_is_one_clear_error(kafka_bootstrap, topic):
    _, _, brokers = _broker_defaults(kafka_bootstrap)
    name = topic("rf")
    asked = brokers + 1
    with pytest.raises(KafkaError) as err:
        create_topics(kafka_bootstrap, [name], replication_factor=asked)
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"cannot create topic {name} with replication factor {asked}: "
                       f"the cluster has {brokers} broker(s)")
    assert name not in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
