"""Small Kafka admin and read helpers on confluent-kafka (topics, read-to-end)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from pyflink_aisp.errors import ConfigError, KafkaError

__all__ = [
    "TopicInfo",
    "create_topics",
    "default_bootstrap_servers",
    "delete_topics",
    "list_topics",
    "read_topic",
]

_log = logging.getLogger(__name__)


def default_bootstrap_servers(given: str | None = None) -> str:
    """``given`` when set, else ``$AISP_KAFKA_BOOTSTRAP``, else the local stack's broker:
    ``127.0.0.1:$AISP_KAFKA_PORT`` (9092 when unset), the same variable ``aisp local up`` reads."""
    explicit = given or os.environ.get("AISP_KAFKA_BOOTSTRAP")
    return explicit or f"127.0.0.1:{os.environ.get('AISP_KAFKA_PORT', '9092')}"


def _admin(bootstrap_servers: str) -> AdminClient:
    # log_level 2: connection errors become our one KafkaError, not a screen of librdkafka lines
    return AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 2})


def list_topics(bootstrap_servers: str, timeout_s: float = 10.0) -> set[str]:
    """Names of the topics on the cluster (also the check that a broker answers).

    Raises:
        KafkaError: no broker answered within ``timeout_s``.
    """
    return set(_metadata(_admin(bootstrap_servers), bootstrap_servers, timeout_s).topics)


def _metadata(admin: AdminClient, bootstrap_servers: str, timeout_s: float) -> ClusterMetadata:
    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaError(
            f"no Kafka broker answered at {bootstrap_servers} within {timeout_s:.0f} s ({exc}); "
            "start one with `aisp local up` or pass --bootstrap-servers"
        ) from exc


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as the cluster describes it after :func:`create_topics`.

    Attributes:
        name: The topic.
        partitions: Its partition count, read back from the cluster's metadata.
        replication_factor: Replicas per partition, read back (the smallest over its partitions).
        created: True when this call created it; False when it existed already (then its
            partitions and replication factor are whatever it was created with).
    """

    name: str
    partitions: int
    replication_factor: int
    created: bool


def create_topics(
    bootstrap_servers: str,
    topics: Iterable[str],
    *,
    partitions: int | None = None,
    replication_factor: int | None = None,
    timeout_s: float = 30.0,
) -> list[TopicInfo]:
    """Create topics, wait until each exists and say what the cluster holds.

    ``None`` for ``partitions`` / ``replication_factor`` means the broker's defaults,
    ``num.partitions`` and ``default.replication.factor`` (KIP-464: the request carries
    -1), so a production cluster (e.g. ``min.insync.replicas=2``) gets the replication
    its operators configured, and the single-node local broker gets 1. Existing topics
    are kept as they are. Each result is logged at INFO.

    Returns:
        One :class:`TopicInfo` per requested topic, in order, with partitions and
        replication factor read back from the cluster.

    Raises:
        ConfigError: ``partitions`` or ``replication_factor`` is given and below 1.
        KafkaError: no broker answered; the replication factor asked exceeds the brokers
            the cluster has; creation failed for a reason other than "already exists"; or
            a topic did not show up in the metadata within ``timeout_s``.
    """
    names = list(dict.fromkeys(topics))
    for label, value in (("partitions", partitions), ("replication_factor", replication_factor)):
        if value is not None and value < 1:
            raise ConfigError(f"{label} must be >= 1 or None (broker default), got {value}")
    admin = _admin(bootstrap_servers)  # keep a reference: the futures die with the client
    brokers = len(_metadata(admin, bootstrap_servers, min(timeout_s, 10.0)).brokers)
    if replication_factor is not None and replication_factor > brokers:
        raise KafkaError(_rf_message(names, replication_factor, brokers))
    new = [NewTopic(t, num_partitions=-1 if partitions is None else partitions,
                    replication_factor=-1 if replication_factor is None else replication_factor)
           for t in names]
    created = _create(admin, new, replication_factor, brokers, timeout_s) if new else set()
    infos = _describe(admin, names, created, time.monotonic() + timeout_s)
    for info in infos:
        _log.info("%s topic %s (%d partitions, replication factor %d)",
                  "created" if info.created else "kept existing", info.name, info.partitions,
                  info.replication_factor)
    return infos


def _rf_message(names: list[str], replication_factor: int | str, brokers: int) -> str:
    return (f"cannot create topic {', '.join(names)} with replication factor {replication_factor}: "
            f"the cluster has {brokers} broker(s)")


def _create(
    admin: AdminClient, new: list[NewTopic], replication_factor: int | None, brokers: int, timeout_s: float
) -> set[str]:
    """Send the create request; the names created (not "already exists")."""
    created: set[str] = set()
    for topic, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            fut.result(timeout=timeout_s)
            created.add(topic)
        except KafkaException as exc:
            err = exc.args[0]
            if err.name() == "TOPIC_ALREADY_EXISTS":
                continue
            if err.name() == "INVALID_REPLICATION_FACTOR":
                asked = replication_factor or "default.replication.factor"
                raise KafkaError(f"{_rf_message([topic], asked, brokers)} ({err.str()})") from exc
            raise KafkaError(f"cannot create topic {topic}: {exc}") from exc
    return created


def _describe(admin: AdminClient, names: list[str], created: set[str], deadline: float) -> list[TopicInfo]:
    """Read each topic's partitions and replicas back, polling until the metadata has them."""
    infos: dict[str, TopicInfo] = {}
    while True:
        for name in names:
            if name in infos:
                continue
            meta = admin.list_topics(name, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            topic = meta.topics.get(name)
            if topic is None or topic.error is not None or not topic.partitions:
                continue
            rf = min(len(p.replicas) for p in topic.partitions.values())
            if rf > 0:
                infos[name] = TopicInfo(name, len(topic.partitions), rf, name in created)
        if len(infos) == len(names):
            return [infos[n] for n in names]
        if time.monotonic() >= deadline:
            missing = ", ".join(n for n in names if n not in infos)
            raise KafkaError(f"topic(s) {missing} not in the cluster's metadata after creation")
        time.sleep(0.2)


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
