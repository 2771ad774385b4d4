"""Small Kafka admin and read helpers on confluent-kafka (topics, read-to-end)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from concurrent.futures import Future

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pyflink_aisp.errors import KafkaError

__all__ = ["create_topics", "default_bootstrap_servers", "delete_topics", "list_topics", "read_topic"]


def default_bootstrap_servers() -> str:
    """``$AISP_KAFKA_BOOTSTRAP``, else the local stack's broker: ``127.0.0.1:$AISP_KAFKA_PORT``
    (9092 when unset), the same variable ``aisp local up`` reads."""
    explicit = os.environ.get("AISP_KAFKA_BOOTSTRAP")
    return explicit or f"127.0.0.1:{os.environ.get('AISP_KAFKA_PORT', '9092')}"


def _admin(bootstrap_servers: str) -> AdminClient:
    # log_level 2: connection errors become our one KafkaError, not a screen of librdkafka lines
    return AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 2})


def list_topics(bootstrap_servers: str, timeout_s: float = 10.0) -> set[str]:
    """Names of the topics on the cluster (also the check that a broker answers).

    Raises:
        KafkaError: no broker answered within ``timeout_s``.
    """
    try:
        return set(_admin(bootstrap_servers).list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise KafkaError(
            f"no Kafka broker answered at {bootstrap_servers} within {timeout_s:.0f} s ({exc}); "
            "start one with `aisp local up` or pass --bootstrap-servers"
        ) from exc


def create_topics(
    bootstrap_servers: str, topics: Iterable[str], *, partitions: int = 1, timeout_s: float = 30.0
) -> None:
    """Create topics (replication factor 1) and wait until each exists; existing ones are kept.

    Raises:
        KafkaError: no broker answered, or creation failed for a reason other than "already exists".
    """
    list_topics(bootstrap_servers, timeout_s=min(timeout_s, 10.0))
    new = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics]
    admin = _admin(bootstrap_servers)  # keep a reference: the futures die with the client
    _await_all(admin.create_topics(new, operation_timeout=timeout_s), "create",
               ignore="TOPIC_ALREADY_EXISTS", timeout_s=timeout_s)


def delete_topics(bootstrap_servers: str, topics: Iterable[str], timeout_s: float = 30.0) -> None:
    """Delete topics; ones that do not exist are ignored.

    Raises:
        KafkaError: deletion failed for another reason.
    """
    names = list(topics)
    if not names:
        return
    admin = _admin(bootstrap_servers)  # keep a reference: the futures die with the client
    _await_all(admin.delete_topics(names, operation_timeout=timeout_s), "delete",
               ignore="UNKNOWN_TOPIC_OR_PART", timeout_s=timeout_s)


def _await_all(futures: dict[str, Future[None]], action: str, *, ignore: str, timeout_s: float) -> None:
    """Wait for per-topic admin futures; an error named ``ignore`` is not one."""
    for topic, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].name() != ignore:
                raise KafkaError(f"cannot {action} topic {topic}: {exc}") from exc


def read_topic(
    bootstrap_servers: str,
    topic: str,
    *,
    min_count: int = 0,
    timeout_s: float = 60.0,
    quiet_s: float | None = None,
    read_committed: bool = True,
) -> list[Message]:
    """Read every record of ``topic`` from the beginning to its current end.

    Reads until at least ``min_count`` records were read and either each
    partition's position reaches its high watermark or (with ``quiet_s``) no
    record arrived for ``quiet_s`` seconds; or until ``timeout_s`` passes (then
    returns what it has). ``quiet_s`` is for topics a running exactly-once job
    writes to: its open transaction holds the read_committed end below the high
    watermark. With ``read_committed`` only committed transactional records are
    returned (what an exactly-once consumer sees).

    Raises:
        KafkaError: the topic does not exist or a consumer error occurred.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"aisp-reader-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
    })
    try:
        meta = consumer.list_topics(topic, timeout=10)
        if topic not in meta.topics or meta.topics[topic].error is not None:
            raise KafkaError(f"topic {topic} does not exist on {bootstrap_servers}")
        parts = [TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions]
        consumer.assign(parts)
        return _drain(consumer, parts, min_count, time.monotonic() + timeout_s, quiet_s)
    finally:
        consumer.close()


def _drain(
    consumer: Consumer,
    parts: list[TopicPartition],
    min_count: int,
    deadline: float,
    quiet_s: float | None,
) -> list[Message]:
    out: list[Message] = []
    last = time.monotonic()
    while time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=1000, timeout=0.5):
            if msg.error():
                raise KafkaError(f"consumer error on {msg.topic()}[{msg.partition()}]: {msg.error()}")
            out.append(msg)
            last = time.monotonic()
        if len(out) < min_count:
            continue
        if quiet_s is not None and time.monotonic() - last >= quiet_s:
            break
        if _at_end(consumer, parts):
            break
    return out


def _at_end(consumer: Consumer, parts: list[TopicPartition]) -> bool:
    for tp, pos in zip(parts, consumer.position(parts), strict=True):
        _, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
        if pos.offset < 0:
            if high > 0:
                return False
        elif pos.offset < high:
            return False
    return True
