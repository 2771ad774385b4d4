"""create_topics without a broker: what it asks for (KIP-464 defaults) and what it reports back."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException
from confluent_kafka.admin import BrokerMetadata, ClusterMetadata, NewTopic, PartitionMetadata, TopicMetadata

import pyflink_aisp.kafka as kafka_api
from pyflink_aisp.errors import ConfigError, KafkaError
from pyflink_aisp.kafka import _admin


class FakeAdmin:
    """An AdminClient stand-in: ``brokers`` brokers; created topics get the broker defaults given."""

    def __init__(self, brokers: int = 1, default_partitions: int = 3, default_rf: int = 1,
                 create_error: int | None = None) -> None:
        self.brokers = brokers
        self.defaults = (default_partitions, default_rf)
        self.create_error = create_error
        self.requests: list[NewTopic] = []
        self.topics: dict[str, tuple[int, int]] = {}

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        meta = ClusterMetadata()
        for i in range(self.brokers):
            b = BrokerMetadata()
            b.id = i
            meta.brokers[i] = b
        for name, (parts, rf) in self.topics.items():
            t = TopicMetadata()
            t.topic = name
            for p in range(parts):
                pm = PartitionMetadata()
                pm.id = p
                pm.replicas = list(range(rf))
                t.partitions[p] = pm
            meta.topics[name] = t
        return meta

    def create_topics(self, new: list[NewTopic], operation_timeout: float = 0) -> dict[str, Future[None]]:
        out: dict[str, Future[None]] = {}
        for nt in new:
            self.requests.append(nt)
            fut: Future[None] = Future()
            if self.create_error is not None:
                fut.set_exception(KafkaException(CKError(self.create_error, "broker says no")))
            elif nt.topic in self.topics:
                fut.set_exception(KafkaException(CKError(CKError.TOPIC_ALREADY_EXISTS, "exists")))
            else:
                parts = self.defaults[0] if nt.num_partitions == -1 else nt.num_partitions
                rf = self.defaults[1] if nt.replication_factor == -1 else nt.replication_factor
                self.topics[nt.topic] = (parts, rf)
                fut.set_result(None)
            out[nt.topic] = fut
        return out


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    def install(**kwargs: int | None) -> FakeAdmin:
        admin = FakeAdmin(**kwargs)  # type: ignore[arg-type]
        monkeypatch.setattr(_admin, "_admin", lambda servers: admin)
        return admin

    return install


def test_default_call_asks_for_broker_defaults_and_reports_what_the_cluster_holds(fake, caplog):
    admin = fake(brokers=3, default_partitions=6, default_rf=3)
    with caplog.at_level(logging.INFO, logger="pyflink_aisp.kafka._admin"):
        infos = kafka_api.create_topics("b:9092", ["out", "dlq"])
    assert [(nt.num_partitions, nt.replication_factor) for nt in admin.requests] == [(-1, -1), (-1, -1)]
    assert infos == [kafka_api.TopicInfo("out", 6, 3, True), kafka_api.TopicInfo("dlq", 6, 3, True)]
    assert "created topic out (6 partitions, replication factor 3)" in caplog.text


def test_explicit_partitions_and_replication_factor_are_sent_as_given(fake):
    admin = fake(brokers=3)
    (info,) = kafka_api.create_topics("b:9092", ["t"], partitions=4, replication_factor=2)
    assert (admin.requests[0].num_partitions, admin.requests[0].replication_factor) == (4, 2)
    assert (info.partitions, info.replication_factor, info.created) == (4, 2, True)


def test_an_existing_topic_is_kept_and_reported_as_not_created(fake):
    admin = fake()
    admin.topics["old"] = (2, 1)
    (info,) = kafka_api.create_topics("b:9092", ["old"], partitions=8)
    assert info == kafka_api.TopicInfo("old", 2, 1, False)


def test_replication_factor_above_the_broker_count_fails_before_any_request(fake):
    admin = fake(brokers=1)
    with pytest.raises(KafkaError) as err:
        kafka_api.create_topics("b:9092", ["t-rf"], replication_factor=3)
    assert str(err.value) == "cannot create topic t-rf with replication factor 3: the cluster has 1 broker(s)"
    assert admin.requests == []


def test_broker_default_replication_factor_above_the_broker_count_names_the_setting(fake):
    fake(brokers=1, create_error=CKError.INVALID_REPLICATION_FACTOR)
    with pytest.raises(KafkaError, match=r"topic t with replication factor default\.replication\.factor: "
                                         r"the cluster has 1 broker\(s\) \(broker says no\)"):
        kafka_api.create_topics("b:9092", ["t"])


def test_other_create_errors_name_the_topic(fake):
    fake(create_error=CKError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaError, match="cannot create topic t: "):
        kafka_api.create_topics("b:9092", ["t"])


@pytest.mark.parametrize("kwargs", [{"partitions": 0}, {"replication_factor": 0}, {"replication_factor": -1}])
def test_counts_below_one_are_config_errors(fake, kwargs):
    admin = fake()
    with pytest.raises(ConfigError, match="must be >= 1 or None"):
        kafka_api.create_topics("b:9092", ["t"], **kwargs)
    assert admin.requests == []


def test_topic_info_is_exported():
    assert "TopicInfo" in kafka_api.__all__
    assert "TopicInfo" in _admin.__all__
