"""Kafka pieces of the inference benchmark: a broker, broker-stamped topics, load, latency join.

- :func:`bench_broker`: a KRaft broker of the embedded stack on free loopback
  ports in a temporary folder (as ``tests/conftest.py`` starts one), stopped on exit.
- :func:`create_stamped_topics`: topics with ``message.timestamp.type =
  LogAppendTime``, so the broker stamps every record when it appends it
  (Kafka topic config docs) and input and output times share one clock.
- :func:`produce_at_rate`: a confluent-kafka producer that writes records at a
  fixed rate (records are due at ``t0 + i / rate``; the loop sends what is due
  and sleeps until the next one).
- :func:`collect_stamps`: key -> LogAppendTime (ms) of a topic, read with a
  chosen isolation level, until enough keys arrived.
- :func:`join_latencies`: per key, output time minus input time.

Keys are the review ids: the job writes each result with its record's id as
the Kafka key, so the join needs no JSON parsing.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

__all__ = [
    "EndOffsets",
    "LoadResult",
    "bench_broker",
    "collect_stamps",
    "create_stamped_topics",
    "end_offset",
    "join_latencies",
    "missing",
    "produce_all",
    "produce_at_rate",
]


@contextlib.contextmanager
def bench_broker() -> Iterator[str]:
    """Start a Kafka broker on free ports for the benchmark; yields ``bootstrap.servers``."""
    from pyflink_aisp.local import KafkaBroker, KafkaBrokerConfig, find_free_port

    port = find_free_port()
    controller = find_free_port()
    while controller == port:
        controller = find_free_port()
    with tempfile.TemporaryDirectory(prefix="aisp-bench-kafka-") as state:
        broker = KafkaBroker(KafkaBrokerConfig(state_dir=Path(state), port=port, controller_port=controller,
                                               heap_mb=1024))
        broker.start()
        try:
            yield broker.config.bootstrap_servers
        finally:
            broker.stop()


def create_stamped_topics(bootstrap: str, topics: Sequence[str], timeout_s: float = 30.0, *,
                          partitions: int = 1) -> None:
    """Create topics of ``partitions`` partitions whose records get the broker's append time.

    Raises:
        confluent_kafka.KafkaException: creation failed.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})  # no info lines at teardown
    new = [NewTopic(t, num_partitions=partitions, replication_factor=1,
                    config={"message.timestamp.type": "LogAppendTime"}) for t in topics]
    for future in admin.create_topics(new, operation_timeout=timeout_s).values():
        future.result(timeout=timeout_s)


def _producer(bootstrap: str) -> Producer:
    # linger.ms 0: a record leaves when produced (the broker's stamp is what counts anyway)
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})


def _value(key: str, text: str) -> bytes:
    return json.dumps({"id": key, "text": text}, ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    """What a rate-limited load phase sent.

    Attributes:
        keys: Keys in send order.
        start_s: Wall clock (``time.time()``) when the first record was due.
        seconds: Send duration, seconds.
        target_per_s: Requested rate, records/s.
    """

    keys: list[str]
    start_s: float
    seconds: float
    target_per_s: float

    @property
    def achieved_per_s(self) -> float:
        """Records sent per second."""
        return len(self.keys) / self.seconds if self.seconds > 0 else 0.0


def produce_at_rate(
    bootstrap: str, topic: str, texts: Sequence[str], *, rate_per_s: float, seconds: float, key_prefix: str
) -> LoadResult:
    """Write ``{"id", "text"}`` records at ``rate_per_s`` for ``seconds`` (texts cycle).

    Record ``i`` has key ``f"{key_prefix}{i}"`` and is due at ``t0 + i / rate_per_s``.

    Returns:
        The keys sent and the achieved rate.
    """
    producer = _producer(bootstrap)
    total = int(rate_per_s * seconds)
    keys: list[str] = []
    t0 = time.time()
    while len(keys) < total:
        due = min(total, int((time.time() - t0) * rate_per_s) + 1)
        while len(keys) < due:
            key = f"{key_prefix}{len(keys)}"
            try:
                producer.produce(topic, key=key.encode(), value=_value(key, texts[len(keys) % len(texts)]))
            except BufferError:
                producer.poll(0.01)
                continue
            keys.append(key)
        producer.poll(0)
        time.sleep(max(0.0, t0 + len(keys) / rate_per_s - time.time()))
    elapsed = time.time() - t0
    producer.flush(30)
    return LoadResult(keys=keys, start_s=t0, seconds=elapsed, target_per_s=rate_per_s)


def produce_all(bootstrap: str, topic: str, records: Sequence[tuple[str, str]]) -> None:
    """Write ``(key, text)`` records as fast as the producer goes, and wait for delivery."""
    producer = _producer(bootstrap)
    for key, text in records:
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=_value(key, text))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)


def collect_stamps(
    bootstrap: str,
    topic: str,
    *,
    want: int,
    timeout_s: float,
    read_committed: bool = False,
    progress_every_s: float = 0.0,
) -> dict[str, int]:
    """Key -> LogAppendTime (ms) of the records of ``topic``, from its start.

    Reads until ``want`` distinct keys arrived or ``timeout_s`` passed. A key
    seen twice (e.g. an aborted transaction's record, visible under
    read_uncommitted) keeps its first time.

    Args:
        bootstrap: ``bootstrap.servers``.
        topic: Topic to read (one partition is enough; all are read).
        want: Keys to wait for.
        timeout_s: Longest wait, seconds.
        read_committed: ``isolation.level``; False sees exactly-once output as
            soon as it is appended, before its transaction commits.
        progress_every_s: Print the count this often (0: never).
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"aisp-bench-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed" if read_committed else "read_uncommitted"})
    stamps: dict[str, int] = {}
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        deadline = time.monotonic() + timeout_s
        shown = time.monotonic()
        while len(stamps) < want and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=2000, timeout=0.5):
                if msg.error() is None and msg.key() is not None:
                    stamps.setdefault(msg.key().decode(), msg.timestamp()[1])
            if progress_every_s and time.monotonic() - shown >= progress_every_s:
                print(f"    {topic}: {len(stamps):,}/{want:,}", flush=True)
                shown = time.monotonic()
    finally:
        consumer.close()
    return stamps


#: A topic just made: its partitions' leaders are not known everywhere yet.
_NOT_READY = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.UNKNOWN_TOPIC_OR_PART)


def _retriable(exc: BaseException) -> bool:
    """A Kafka error that librdkafka flags retriable, or a topic whose leaders are not known yet."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in _NOT_READY)


def end_offset(bootstrap: str, topic: str) -> int:
    """Sum of the partitions' high watermarks (read_uncommitted end; transaction markers count), by a
    consumer made for this one call. Retriable Kafka errors are retried for up to 30 s. To poll, use
    :class:`EndOffsets`: a new client per call costs the broker a connection each time."""
    with EndOffsets(bootstrap, topic) as offsets:
        return offsets.end()


class EndOffsets:
    """One consumer that reads a topic's end offset again and again (a poll loop beside a job).

    A consumer per poll costs the client a new connection and the broker a session each time, CPU
    that the job under test would be charged for; this keeps one.
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        # librdkafka's default read_committed would return the last stable offset: open transactions hidden
        self._consumer = Consumer({"bootstrap.servers": bootstrap,
                                   "group.id": f"aisp-bench-{time.monotonic_ns()}",
                                   "isolation.level": "read_uncommitted"})
        self._topic = topic
        self._partitions: list[TopicPartition] | None = None

    def __enter__(self) -> EndOffsets:
        return self

    def __exit__(self, *exc: object) -> None:
        self._consumer.close()

    @retry(retry=retry_if_exception(_retriable), stop=stop_after_delay(30),
           wait=wait_exponential(0.1, max=2), reraise=True)
    def end(self) -> int:
        """Sum of the partitions' high watermarks, asked of the broker (not cached)."""
        if not self._partitions:  # asked again until the topic has its partitions
            meta = self._consumer.list_topics(self._topic, timeout=10).topics[self._topic]
            self._partitions = [TopicPartition(self._topic, p) for p in meta.partitions]
        return sum(self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
                   for tp in self._partitions)


def join_latencies(
    inputs: Mapping[str, int], outputs: Mapping[str, int], *, keys: Sequence[str], since_ms: int
) -> np.ndarray:
    """Latencies (ms, float64, send order) of ``keys`` whose input was appended at or after ``since_ms``.

    Keys without an output are left out (count them with :func:`missing`).
    """
    values = [outputs[k] - inputs[k] for k in keys if k in inputs and k in outputs and inputs[k] >= since_ms]
    return np.asarray(values, dtype=np.float64)


def missing(inputs: Mapping[str, int], outputs: Mapping[str, int], *, keys: Sequence[str],
            since_ms: int) -> int:
    """Measured keys (input appended at or after ``since_ms``) that have no output."""
    return sum(1 for k in keys if k in inputs and inputs[k] >= since_ms and k not in outputs)
