"""Range resolution against a real topic (issue 11.2): every bound kind, the bad ones, the last
stable offset under an open transaction, and reading a range of a transactional topic to its end."""

import json
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from pyflink_aisp.alignment import (
    OutcomeTracker,
    TopicRange,
    read_range,
    resolve_range,
    topic_offsets,
)
from pyflink_aisp.errors import ConfigError, KafkaError
from pyflink_aisp.kafka import SOURCE_HEADER, create_topics

pytestmark = pytest.mark.integration


def _produce(bootstrap, topic, counts, timestamp_ms=None):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors = []
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=f"{partition}-{i}".encode(), partition=partition,
                             timestamp=timestamp_ms or 0, on_delivery=lambda e, _m: e and errors.append(e))
    assert producer.flush(30) == 0 and errors == []


@pytest.fixture
def two_partitions(kafka_bootstrap, topic):
    name = topic("ranges")
    create_topics(kafka_bootstrap, [name], partitions=2)
    _produce(kafka_bootstrap, name, {0: 30, 1: 20}, timestamp_ms=1_600_000_000_000)
    _produce(kafka_bootstrap, name, {0: 5, 1: 5}, timestamp_ms=1_700_000_000_000)
    return name


def test_each_bound_kind_resolves_against_the_topic(kafka_bootstrap, two_partitions, tmp_path):
    t = two_partitions
    whole = resolve_range(kafka_bootstrap, t, "earliest", "latest")
    assert whole.starts == {0: 0, 1: 0} and whole.ends == {0: 35, 1: 25}
    assert len(read_range(kafka_bootstrap, whole)) == 60

    explicit = resolve_range(kafka_bootstrap, t, "offsets:0=3,1=4", "offsets:0=10,1=4")
    values = [m.value().decode() for m in read_range(kafka_bootstrap, explicit)]
    assert values == [f"0-{i}" for i in range(3, 10)]  # partition 1's range is empty

    late = resolve_range(kafka_bootstrap, t, "timestamp:2023-11-14T22:13:20Z", "latest")
    assert late.starts == {0: 30, 1: 20}  # the first records at or after 1.7e12 ms
    assert resolve_range(kafka_bootstrap, t, "timestamp:1650000000000", "latest").starts == {0: 30, 1: 20}
    assert resolve_range(kafka_bootstrap, t, "timestamp:1750000000000", "latest").starts == {0: 35, 1: 25}

    group = f"g-{time.monotonic_ns()}"
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    consumer.commit(offsets=[TopicPartition(t, 0, 12), TopicPartition(t, 1, 7)], asynchronous=False)
    consumer.close()
    assert resolve_range(kafka_bootstrap, t, f"group:{group}", "latest").starts == {0: 12, 1: 7}

    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"range": explicit.to_json()}))
    assert resolve_range(kafka_bootstrap, t, f"manifest:{manifest}", "latest").starts == {0: 10, 1: 4}


@pytest.mark.parametrize(("start", "end", "message"), [
    ("offsets:0=0,1=0,2=0", "latest", "has no partition 2"),
    ("offsets:0=0", "latest", "partitions [1] of"),
    ("offsets:0=20,1=0", "offsets:0=10,1=5",
     "[0]: start offset 20 (offsets:0=20,1=0) is after end offset 10"),
    ("earliest", "offsets:0=36,1=25",
     "[0]: end offset 36 (offsets:0=36,1=25) is beyond the last stable offset 35"),
    ("group:never-committed", "latest", "consumer group 'never-committed' has no committed offsets"),
    ("checkpoint:some-job", "latest", "needs the Flink REST address"),
])
def test_a_bad_range_is_refused_in_one_line(kafka_bootstrap, two_partitions, start, end, message):
    with pytest.raises(ConfigError) as err:
        resolve_range(kafka_bootstrap, two_partitions, start, end)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_start_below_the_log_start_offset_is_refused(kafka_bootstrap, two_partitions):
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_records([TopicPartition(two_partitions, 0, 10)]).values():
        future.result(timeout=30)  # retention, by hand: offsets 0..9 of partition 0 are gone
    assert resolve_range(kafka_bootstrap, two_partitions, "earliest", "latest").starts == {0: 10, 1: 0}
    with pytest.raises(ConfigError, match=r"\[0\]: start offset 5 .* below the log start offset 10: those "
                                          "records were deleted by retention"):
        resolve_range(kafka_bootstrap, two_partitions, "offsets:0=5,1=0", "latest")


def test_latest_is_the_last_stable_offset_and_a_transactional_range_reads_to_its_end(kafka_bootstrap, topic):
    t = topic("txn")
    create_topics(kafka_bootstrap, [t])
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{t}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(t, value=str(i).encode())
    producer.commit_transaction(30)  # offsets 0..9, the commit marker at 10
    producer.begin_transaction()
    for _ in range(5):
        producer.produce(t, value=b"open")
    producer.flush(30)  # written, not committed: offsets 11..15
    try:
        offsets = topic_offsets(kafka_bootstrap, t)
        assert offsets.latest == {0: 11}  # the last stable offset, not the high watermark (16)
        span = resolve_range(kafka_bootstrap, t, "earliest", "latest")
        values = [m.value() for m in read_range(kafka_bootstrap, span, timeout_s=30)]
        assert values == [str(i).encode() for i in range(10)]  # ends past the commit marker
        with pytest.raises(ConfigError, match="beyond the last stable offset 11"):
            resolve_range(kafka_bootstrap, t, "earliest", "offsets:0=16")
    finally:
        producer.abort_transaction(30)


def test_outcomes_are_attributed_to_their_input_range_by_lineage(kafka_bootstrap, topic):
    t_in, t_out, t_dlq = topic("in"), topic("out"), topic("dlq")
    create_topics(kafka_bootstrap, [t_in, t_out, t_dlq])
    _produce(kafka_bootstrap, t_in, {0: 6})
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for offset in (0, 1, 2, 2, 4):  # offset 2 twice (a duplicate), 3 dead-lettered, 5 missing
        producer.produce(t_out, value=json.dumps({"id": str(offset), "model_sha256": "m1"}).encode(),
                         headers=[(SOURCE_HEADER, f"{t_in}/0/{offset}".encode())])
    producer.produce(t_out, value=b"{}", headers=[(SOURCE_HEADER, f"other-topic/0/{1}".encode())])
    producer.produce(t_dlq, value=b'{"reason": "x"}', headers=[(SOURCE_HEADER, f"{t_in}/0/3".encode())])
    assert producer.flush(30) == 0
    tracker = OutcomeTracker(kafka_bootstrap, t_in, t_out, t_dlq)
    try:
        tracker.advance()
        whole = tracker.summary(TopicRange.between(t_in, {0: 0}, {0: 6}))
        head = tracker.summary(TopicRange.between(t_in, {0: 0}, {0: 2}))
    finally:
        tracker.close()
    assert (whole.input_count, whole.output_count, whole.dlq_count) == (6, 5, 1)
    assert (whole.duplicates, whole.missing, whole.model_versions) == (1, 1, ("m1",))
    assert (head.input_count, head.output_count, head.dlq_count) == (2, 2, 0)
    assert (head.duplicates, head.missing) == (0, 0)
    assert head.output_digest != whole.output_digest


def test_reading_a_range_of_a_missing_topic_fails_clearly(kafka_bootstrap, topic):
    missing = topic("never-created")
    with pytest.raises(KafkaError, match=f"topic {missing} does not exist"):
        topic_offsets(kafka_bootstrap, missing)
