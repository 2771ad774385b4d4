"""``aisp ingest``: write records to a Kafka topic with an idempotent producer.

Producer settings: ``enable.idempotence=true`` (which implies ``acks=all``,
retries and ordered delivery per partition; librdkafka CONFIGURATION.md), a
``linger.ms`` of 5 ms for batching. Delivery is counted from the per-message
delivery callbacks, so the final counts are what the broker acknowledged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError as _CKError
from confluent_kafka import Message, Producer
from tqdm import tqdm

from pyflink_aisp.errors import KafkaError

__all__ = ["IngestResult", "ingest_records"]


@dataclass(frozen=True, kw_only=True)
class IngestResult:
    """Outcome of an ingest: records the broker acknowledged and those that failed."""

    topic: str
    delivered: int
    failed: int
    first_error: str | None = None


class _Tally:
    def __init__(self, bar: tqdm) -> None:
        self.delivered = 0
        self.failed = 0
        self.first_error: str | None = None
        self._bar = bar

    def __call__(self, err: _CKError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            self.first_error = self.first_error or f"{msg.topic()}: {err}"
        else:
            self.delivered += 1
        self._bar.update(1)


def ingest_records(
    bootstrap_servers: str,
    topic: str,
    records: Iterable[Mapping[str, Any]],
    *,
    key_field: str | None = "id",
    total: int | None = None,
    progress: bool = True,
    flush_timeout_s: float = 120.0,
) -> IngestResult:
    """Produce each record as a UTF-8 JSON value (key: ``record[key_field]``).

    Args:
        bootstrap_servers: ``host:port``.
        topic: Target topic (auto-created by the broker if allowed).
        records: JSON-serialisable mappings.
        key_field: Field used as the record key, or None for no key.
        total: Count for the progress bar, if known.
        progress: Show a tqdm progress bar on stderr.
        flush_timeout_s: Longest wait for outstanding deliveries at the end.

    Returns:
        Delivered and failed counts; undelivered records at the flush timeout
        count as failed.

    Raises:
        KafkaError: the producer could not be created.
    """
    try:
        producer = Producer({
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        })
    except Exception as exc:  # confluent_kafka raises KafkaException / ValueError on config
        raise KafkaError(f"cannot create producer for {bootstrap_servers}: {exc}") from exc
    with tqdm(total=total, unit="rec", desc=f"ingest {topic}", disable=not progress) as bar:
        tally = _Tally(bar)
        sent = 0
        for record in records:
            key = None if key_field is None else str(record.get(key_field, "")).encode()
            value = json.dumps(record, ensure_ascii=False).encode("utf-8")
            _produce(producer, topic, key, value, tally)
            sent += 1
        remaining = producer.flush(flush_timeout_s)
    failed = tally.failed + remaining
    return IngestResult(
        topic=topic, delivered=tally.delivered, failed=failed, first_error=tally.first_error
    )


def _produce(producer: Producer, topic: str, key: bytes | None, value: bytes, cb: _Tally) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, on_delivery=cb)
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.1)  # local queue full: serve callbacks, then retry
