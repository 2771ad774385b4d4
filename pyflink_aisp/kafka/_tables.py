"""Flink Kafka source and sink tables with safe exactly-once defaults.

The tables use Flink's Kafka SQL connector (``flink-sql-connector-kafka``, a
``KafkaSource`` / ``KafkaSink`` underneath). The source reads raw value bytes
with their topic, partition and offset (metadata columns), so decoding, and
the dead-letter record of what failed to decode, happen in Python with the
exact coordinates. Sinks write a raw key and value.

Exactly-once defaults (Flink Kafka connector docs, "Fault Tolerance"):
``sink.delivery-guarantee = exactly-once`` with a transactional id prefix
unique per job; ``transaction.timeout.ms`` 10 min here (the packaged job sets
its own, 1 h by default: well above a checkpoint's interval plus timeout and a
restart; it must not exceed the brokers' ``transaction.max.timeout.ms``, 15 min
by default, 2 h on the local stack); consumers read with
``isolation.level = read_committed``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from pyflink_aisp.errors import ConfigError

__all__ = [
    "JOB_HEADER",
    "SOURCE_HEADER",
    "DeliveryGuarantee",
    "KafkaSinkTable",
    "KafkaSourceTable",
    "StartupMode",
]

#: Kafka header of every output and dead letter of the packaged jobs: the input
#: record it came from, ``<topic>/<partition>/<offset>`` (UTF-8). Manifests and
#: ``aisp verify`` select a range's outputs by it.
SOURCE_HEADER = "aisp.source"
#: Kafka header naming the job that wrote an output or dead letter (its ``--job-name``).
JOB_HEADER = "aisp.job"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class DeliveryGuarantee(StrEnum):
    """``sink.delivery-guarantee`` values of the Flink Kafka connector."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    NONE = "none"


class StartupMode(StrEnum):
    """``scan.startup.mode`` values used here."""

    EARLIEST = "earliest-offset"
    LATEST = "latest-offset"
    GROUP_OFFSETS = "group-offsets"
    SPECIFIC_OFFSETS = "specific-offsets"


def _check(name: str, topic: str, bootstrap_servers: str) -> None:
    if not _IDENT.match(name):
        raise ConfigError(f"table name {name!r} is not a plain SQL identifier")
    if not _TOPIC.match(topic):
        raise ConfigError(f"{topic!r} is not a legal Kafka topic name")
    if not bootstrap_servers:
        raise ConfigError("bootstrap_servers must not be empty")


def _with(options: dict[str, str]) -> str:
    def q(s: str) -> str:
        return "'" + s.replace("'", "''") + "'"

    return ",\n  ".join(f"{q(k)} = {q(v)}" for k, v in options.items())


@dataclass(frozen=True, kw_only=True)
class KafkaSourceTable:
    """A Kafka topic as a table ``(value BYTES, topic STRING, partition INT, offset BIGINT)``.

    Attributes:
        name: SQL table name.
        topic: Kafka topic.
        bootstrap_servers: ``host:port[,host:port]``.
        group_id: Consumer group (offsets are committed to it on checkpoints).
        bounded: Stop at the latest offsets seen at job start (``scan.bounded.mode
            = latest-offset``): the run ends. Required in BATCH mode.
        startup_mode: Where reading starts. ``GROUP_OFFSETS`` (the default) resumes
            from the offsets the group committed on its last completed checkpoint, and
            starts at the earliest offset for a group without commits
            (``properties.auto.offset.reset = earliest``). A job restored from a
            savepoint or checkpoint resumes from the offsets in its state instead.
            ``SPECIFIC_OFFSETS`` needs ``start_offsets``.
        start_offsets: Offset per partition where reading starts (``scan.startup.mode
            = specific-offsets``); every partition of the topic named.
        stop_offsets: Offset per partition where reading stops, exclusive
            (``scan.bounded.mode = specific-offsets``): the run ends there; replaces
            ``bounded``'s latest offsets.
        with_key: Add the record's key as a last column ``key BYTES`` (``key.format =
            raw``; null for a record without a key).
    """

    name: str
    topic: str
    bootstrap_servers: str
    group_id: str
    bounded: bool = False
    startup_mode: StartupMode = StartupMode.GROUP_OFFSETS
    start_offsets: dict[int, int] | None = None
    stop_offsets: dict[int, int] | None = None
    with_key: bool = False

    def __post_init__(self) -> None:
        _check(self.name, self.topic, self.bootstrap_servers)
        if not self.group_id:
            raise ConfigError("group_id must not be empty")
        if (self.startup_mode is StartupMode.SPECIFIC_OFFSETS) != (self.start_offsets is not None):
            raise ConfigError("start_offsets go with startup_mode specific-offsets, and only with it")
        for offsets in (self.start_offsets, self.stop_offsets):
            if offsets is not None and (not offsets or any(p < 0 or o < 0 for p, o in offsets.items())):
                raise ConfigError(f"offsets must name partitions and offsets >= 0, got {offsets}")

    def ddl(self) -> str:
        """The ``CREATE TEMPORARY TABLE`` statement."""
        options = {
            "connector": "kafka",
            "topic": self.topic,
            "properties.bootstrap.servers": self.bootstrap_servers,
            "properties.group.id": self.group_id,
            "properties.isolation.level": "read_committed",
            "scan.startup.mode": self.startup_mode.value,
            **({"key.format": "raw", "key.fields": "key", "value.format": "raw",
                "value.fields-include": "EXCEPT_KEY"} if self.with_key else {"format": "raw"}),
        }
        if self.startup_mode is StartupMode.GROUP_OFFSETS:
            options["properties.auto.offset.reset"] = "earliest"
        if self.start_offsets is not None:
            options["scan.startup.specific-offsets"] = _offsets_option(self.start_offsets)
        if self.stop_offsets is not None:
            options["scan.bounded.mode"] = "specific-offsets"
            options["scan.bounded.specific-offsets"] = _offsets_option(self.stop_offsets)
        elif self.bounded:
            options["scan.bounded.mode"] = "latest-offset"
        return (
            f"CREATE TEMPORARY TABLE `{self.name}` (\n"
            "  `value` BYTES,\n"
            "  `topic` STRING METADATA VIRTUAL,\n"
            "  `partition` INT METADATA VIRTUAL,\n"
            "  `offset` BIGINT METADATA VIRTUAL"
            + (",\n  `key` BYTES\n" if self.with_key else "\n")
            + f") WITH (\n  {_with(options)}\n)"
        )


def _offsets_option(offsets: dict[int, int]) -> str:
    """``partition:0,offset:42;partition:1,offset:7`` (the connector's specific-offsets form)."""
    return ";".join(f"partition:{p},offset:{o}" for p, o in sorted(offsets.items()))


@dataclass(frozen=True, kw_only=True)
class KafkaSinkTable:
    """A table ``(key STRING, value STRING)`` written to a Kafka topic as raw UTF-8.

    Attributes:
        name: SQL table name.
        topic: Kafka topic.
        bootstrap_servers: ``host:port[,host:port]``.
        delivery_guarantee: Exactly-once by default (needs checkpoints in STREAMING
            mode; in BATCH mode transactions commit when the input ends).
        transactional_id_prefix: Unique per job and sink; required for exactly-once.
        transaction_timeout_ms: Kafka producer ``transaction.timeout.ms``.
        max_request_size: Kafka producer ``max.request.size`` in bytes (Kafka's default 1 MiB).
        linger_ms: Kafka producer ``linger.ms`` in ms; None: the client's default (5 ms in
            kafka-clients 4.x, KIP-1030).
        with_headers: Add a writable ``headers MAP<STRING, BYTES>`` column (the
            connector's ``headers`` metadata): the job writes each output's lineage
            there (:data:`SOURCE_HEADER`).
    """

    name: str
    topic: str
    bootstrap_servers: str
    transactional_id_prefix: str
    delivery_guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    transaction_timeout_ms: int = 600_000
    max_request_size: int = 1_048_576
    with_headers: bool = False
    linger_ms: int | None = None

    def __post_init__(self) -> None:
        _check(self.name, self.topic, self.bootstrap_servers)
        if self.linger_ms is not None and self.linger_ms < 0:
            raise ConfigError(f"linger_ms must be >= 0, got {self.linger_ms}")
        if self.max_request_size < 1:
            raise ConfigError(f"max_request_size must be >= 1 byte, got {self.max_request_size}")
        if self.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            if not self.transactional_id_prefix:
                raise ConfigError("exactly-once needs a transactional_id_prefix")
        if not 1_000 <= self.transaction_timeout_ms <= 2**31 - 1:
            raise ConfigError("transaction_timeout_ms must be within [1000, 2147483647] (a Java int; "
                              "the brokers' transaction.max.timeout.ms bounds it further)")

    def ddl(self) -> str:
        """The ``CREATE TEMPORARY TABLE`` statement."""
        options = {
            "connector": "kafka",
            "topic": self.topic,
            "properties.bootstrap.servers": self.bootstrap_servers,
            "key.format": "raw",
            "key.fields": "key",
            "value.format": "raw",
            "value.fields-include": "EXCEPT_KEY",
            "sink.delivery-guarantee": self.delivery_guarantee.value,
            "properties.transaction.timeout.ms": str(self.transaction_timeout_ms),
            "properties.max.request.size": str(self.max_request_size),
        }
        if self.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            options["sink.transactional-id-prefix"] = self.transactional_id_prefix
        if self.linger_ms is not None:
            options["properties.linger.ms"] = str(self.linger_ms)
        return (
            f"CREATE TEMPORARY TABLE `{self.name}` (\n"
            "  `key` STRING,\n"
            "  `value` STRING"
            + (",\n  `headers` MAP<STRING, BYTES> METADATA\n" if self.with_headers else "\n")
            + f") WITH (\n  {_with(options)}\n)"
        )
