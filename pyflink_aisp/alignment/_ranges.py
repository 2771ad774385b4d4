"""Bounded offset ranges of a Kafka topic: ``[start, end)`` per partition.

A range is what a BATCH run reads and what a manifest records, so a batch run
and a stream can be compared over the same records and a stream can start
exactly where a batch run ended. Its two bounds are given as text
(:func:`parse_bound`) and resolved against the topic (:func:`resolve_range`):

=========================  ==========================================================
``earliest``               each partition's log start offset
``latest``                 the last stable offset (LSO): the end a ``read_committed``
                           consumer sees now (Kafka ``ListOffsets`` with
                           ``isolation.level = read_committed``, KIP-98), not the high
                           watermark, which an open transaction lies beyond
``timestamp:T``            the first offset whose record timestamp is ≥ T (epoch
                           milliseconds, or ISO 8601 with a zone); the LSO where none is
``offsets:P=O,...``        explicit offsets, every partition named
``group:G``                consumer group G's committed offsets
``checkpoint:JOB``         the offsets of live streaming job JOB's last completed
                           checkpoint (:func:`~pyflink_aisp.alignment.checkpoint_offsets`)
``manifest:PATH``          the end of the range a run manifest records (a stream
                           starts where a batch run ended)
=========================  ==========================================================

A range is checked before a job starts (:func:`resolve_range`): every partition
of the topic covered, ``start ≤ end``, ``start`` not below the log start offset
(records deleted by retention) and ``end`` not beyond the LSO. Offsets are Kafka
offsets: transaction markers take offsets too, so ``end - start`` bounds the
record count from above (a manifest records the count read).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka import KafkaError as KafkaErrorCode
from confluent_kafka.admin import AdminClient, OffsetSpec
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from pyflink_aisp.errors import ConfigError, KafkaError

__all__ = [
    "Bound",
    "BoundKind",
    "PartitionRange",
    "TopicOffsets",
    "TopicRange",
    "parse_bound",
    "resolve_bound",
    "resolve_range",
    "topic_offsets",
]


@dataclass(frozen=True, kw_only=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition (``end`` exclusive)."""

    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.partition < 0 or self.start < 0:
            raise ConfigError(f"partition {self.partition}: partition and start must be >= 0, "
                              f"got start {self.start}")
        if self.start > self.end:
            raise ConfigError(f"partition {self.partition}: start offset {self.start} is after "
                              f"end offset {self.end}")


@dataclass(frozen=True, kw_only=True)
class TopicRange:
    """A bounded range of a topic: one :class:`PartitionRange` per partition, by partition."""

    topic: str
    partitions: tuple[PartitionRange, ...]

    def __post_init__(self) -> None:
        numbers = [p.partition for p in self.partitions]
        if numbers != sorted(set(numbers)):
            raise ConfigError(f"topic {self.topic}: partitions must be distinct and sorted, got {numbers}")

    @property
    def starts(self) -> dict[int, int]:
        """Start offset per partition."""
        return {p.partition: p.start for p in self.partitions}

    @property
    def ends(self) -> dict[int, int]:
        """End offset (exclusive) per partition."""
        return {p.partition: p.end for p in self.partitions}

    def contains(self, partition: int, offset: int) -> bool:
        """Whether ``offset`` of ``partition`` lies in the range."""
        for p in self.partitions:
            if p.partition == partition:
                return p.start <= offset < p.end
        return False

    def to_json(self) -> dict[str, Any]:
        """``{"topic", "partitions": [{"partition", "start", "end"}]}``."""
        return {"topic": self.topic,
                "partitions": [{"partition": p.partition, "start": p.start, "end": p.end}
                               for p in self.partitions]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopicRange:
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: Missing or mistyped fields.
        """
        try:
            parts = tuple(PartitionRange(partition=int(p["partition"]), start=int(p["start"]),
                                         end=int(p["end"])) for p in data["partitions"])
            return cls(topic=str(data["topic"]), partitions=parts)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a topic range: {exc!r}") from exc

    @classmethod
    def between(cls, topic: str, starts: Mapping[int, int], ends: Mapping[int, int]) -> TopicRange:
        """The range from ``starts`` to ``ends`` (same partitions).

        Raises:
            ConfigError: The partitions differ, or a start is after its end.
        """
        if set(starts) != set(ends):
            raise ConfigError(f"topic {topic}: the two bounds cover partitions {sorted(starts)} "
                              f"and {sorted(ends)}")
        return cls(topic=topic, partitions=tuple(PartitionRange(partition=p, start=starts[p], end=ends[p])
                                                 for p in sorted(starts)))


class BoundKind(StrEnum):
    """How a range bound is given (the text before the first ``:``)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    OFFSETS = "offsets"
    GROUP = "group"
    CHECKPOINT = "checkpoint"
    MANIFEST = "manifest"


_NEEDS_ARG = {BoundKind.TIMESTAMP, BoundKind.OFFSETS, BoundKind.GROUP, BoundKind.CHECKPOINT,
              BoundKind.MANIFEST}
_OFFSET_PAIR = re.compile(r"^\s*(\d+)\s*=\s*(\d+)\s*$")


@dataclass(frozen=True, kw_only=True)
class Bound:
    """A parsed range bound: its kind and argument (see the module table)."""

    kind: BoundKind
    arg: str = ""
    timestamp_ms: int | None = None
    offsets: tuple[tuple[int, int], ...] = ()

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.arg}" if self.arg else self.kind.value


def parse_bound(text: str) -> Bound:
    """Parse a bound such as ``earliest``, ``timestamp:2026-11-30T12:00:00Z`` or ``offsets:0=10,1=7``.

    Raises:
        ConfigError: One line naming the bad part and the accepted forms.
    """
    head, _, arg = text.strip().partition(":")
    try:
        kind = BoundKind(head.strip().lower())
    except ValueError:
        forms = ", ".join(k.value + (":…" if k in _NEEDS_ARG else "") for k in BoundKind)
        raise ConfigError(f"range bound {text!r}: expected one of {forms}") from None
    if kind in _NEEDS_ARG and not arg.strip():
        raise ConfigError(f"range bound {text!r}: {kind.value} needs an argument after ':'")
    if kind not in _NEEDS_ARG and arg:
        raise ConfigError(f"range bound {text!r}: {kind.value} takes no argument")
    if kind is BoundKind.TIMESTAMP:
        return Bound(kind=kind, arg=arg, timestamp_ms=_timestamp_ms(arg))
    if kind is BoundKind.OFFSETS:
        return Bound(kind=kind, arg=arg, offsets=_offset_pairs(arg))
    return Bound(kind=kind, arg=arg.strip())


def _timestamp_ms(arg: str) -> int:
    text = arg.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"timestamp {text!r}: expected epoch milliseconds or ISO 8601 "
                          "(e.g. 2026-11-30T12:00:00Z)") from None
    if moment.tzinfo is None:
        raise ConfigError(f"timestamp {text!r} has no time zone: add Z or +HH:MM")
    return int(moment.timestamp() * 1000)


def _offset_pairs(arg: str) -> tuple[tuple[int, int], ...]:
    pairs: dict[int, int] = {}
    for item in arg.split(","):
        match = _OFFSET_PAIR.match(item)
        if not match:
            raise ConfigError(f"offsets {arg!r}: expected PARTITION=OFFSET[,PARTITION=OFFSET...], "
                              f"got {item.strip()!r}")
        partition, offset = int(match[1]), int(match[2])
        if partition in pairs:
            raise ConfigError(f"offsets {arg!r}: partition {partition} given twice")
        pairs[partition] = offset
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True, kw_only=True)
class TopicOffsets:
    """A topic's partitions with their log start offsets and last stable offsets now."""

    topic: str
    earliest: dict[int, int]
    latest: dict[int, int]


def _admin(servers: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": servers})


def _list_offsets(admin: AdminClient, parts: list[TopicPartition], spec: Callable[[], OffsetSpec],
                  timeout_s: float) -> dict[int, int]:
    futures: dict[TopicPartition, Future[Any]] = admin.list_offsets(
        {tp: spec() for tp in parts}, isolation_level=IsolationLevel.READ_COMMITTED,
        request_timeout=timeout_s)
    try:
        return {tp.partition: int(f.result(timeout=timeout_s).offset) for tp, f in futures.items()}
    except KafkaException as exc:
        raise KafkaError(f"cannot list offsets of {parts[0].topic}: {exc}") from exc


def topic_offsets(servers: str, topic: str, timeout_s: float = 10.0) -> TopicOffsets:
    """Log start offsets and last stable offsets of every partition of ``topic``.

    Raises:
        KafkaError: The broker does not answer or the topic does not exist.
    """
    admin = _admin(servers)
    try:
        meta = admin.list_topics(timeout=timeout_s)  # all topics: naming one may auto-create it
    except KafkaException as exc:
        raise KafkaError(f"cannot reach Kafka at {servers}: {exc}") from exc
    info = meta.topics.get(topic)
    if info is None or info.error is not None:
        raise KafkaError(f"topic {topic} does not exist on {servers}")
    parts = [TopicPartition(topic, p) for p in sorted(info.partitions)]
    return TopicOffsets(topic=topic, earliest=_list_offsets(admin, parts, OffsetSpec.earliest, timeout_s),
                        latest=_list_offsets(admin, parts, OffsetSpec.latest, timeout_s))


def _timestamp_offsets(servers: str, offsets: TopicOffsets, timestamp_ms: int,
                       timeout_s: float) -> dict[int, int]:
    parts = [TopicPartition(offsets.topic, p) for p in sorted(offsets.latest)]
    found = _list_offsets(_admin(servers), parts, lambda: OffsetSpec.for_timestamp(timestamp_ms), timeout_s)
    # -1: no record at or after the timestamp: the partition's current end
    return {p: (o if o >= 0 else offsets.latest[p]) for p, o in found.items()}


#: Group-coordinator errors of a broker that is still loading or moving its
#: ``__consumer_offsets`` partitions (librdkafka does not flag them retriable).
_COORDINATOR_CODES = frozenset({KafkaErrorCode.NOT_COORDINATOR, KafkaErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                KafkaErrorCode.COORDINATOR_NOT_AVAILABLE})


def _retriable(exc: BaseException) -> bool:
    """A Kafka error worth retrying: flagged retriable, or a coordinator that is not ready yet."""
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    error = exc.args[0]
    return bool(getattr(error, "retriable", lambda: False)()) or getattr(error, "code", lambda: None)() in \
        _COORDINATOR_CODES


@retry(retry=retry_if_exception(_retriable), stop=stop_after_delay(30), wait=wait_exponential(0.1, max=2),
       reraise=True)
def _committed(consumer: Any, parts: list[TopicPartition], timeout_s: float) -> list[TopicPartition]:
    return list(consumer.committed(parts, timeout=timeout_s))


def _group_offsets(servers: str, group: str, offsets: TopicOffsets, timeout_s: float) -> dict[int, int]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": servers, "group.id": group, "enable.auto.commit": False})
    try:
        committed = _committed(consumer, [TopicPartition(offsets.topic, p) for p in sorted(offsets.latest)],
                               timeout_s)
    except KafkaException as exc:
        raise KafkaError(f"cannot read the committed offsets of group {group}: {exc}") from exc
    finally:
        consumer.close()
    missing = [tp.partition for tp in committed if tp.offset < 0]
    if len(missing) == len(committed):
        raise ConfigError(f"consumer group {group!r} has no committed offsets on {offsets.topic}")
    # a partition the group never committed (nothing read from it yet): its log start
    return {tp.partition: tp.offset if tp.offset >= 0 else offsets.earliest[tp.partition] for tp in committed}


#: Resolves ``checkpoint:JOB`` to offsets per partition; injected by callers that
#: know the Flink REST endpoint (:func:`pyflink_aisp.alignment.checkpoint_offsets`).
CheckpointResolver = Callable[[str, TopicOffsets], dict[int, int]]


def resolve_bound(bound: Bound, servers: str, offsets: TopicOffsets, *,
                  checkpoint: CheckpointResolver | None = None, timeout_s: float = 10.0) -> dict[int, int]:
    """Offsets per partition for ``bound`` on the topic of ``offsets``.

    Raises:
        ConfigError: Partitions missing or unknown, a manifest of another topic, or
            ``checkpoint:`` without a resolver.
        KafkaError: The broker does not answer.
    """
    kind = bound.kind
    if kind is BoundKind.EARLIEST:
        return dict(offsets.earliest)
    if kind is BoundKind.LATEST:
        return dict(offsets.latest)
    if kind is BoundKind.TIMESTAMP:
        assert bound.timestamp_ms is not None  # set by parse_bound
        return _timestamp_offsets(servers, offsets, bound.timestamp_ms, timeout_s)
    if kind is BoundKind.GROUP:
        return _group_offsets(servers, bound.arg, offsets, timeout_s)
    if kind is BoundKind.CHECKPOINT:
        if checkpoint is None:
            raise ConfigError(f"range bound {bound}: needs the Flink REST address of the streaming job")
        return checkpoint(bound.arg, offsets)
    if kind is BoundKind.MANIFEST:
        return _manifest_end(Path(bound.arg), offsets.topic)
    given = dict(bound.offsets)
    unknown = sorted(set(given) - set(offsets.latest))
    missing = sorted(set(offsets.latest) - set(given))
    if unknown:
        raise ConfigError(f"range bound {bound}: topic {offsets.topic} has no partition {unknown[0]} "
                          f"(partitions 0..{max(offsets.latest)})")
    if missing:
        raise ConfigError(f"range bound {bound}: partitions {missing} of {offsets.topic} not given "
                          "(name every partition)")
    return given


def _manifest_end(path: Path, topic: str) -> dict[int, int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        span = TopicRange.from_json(data["range"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read the range of manifest {path}: {exc}") from exc
    if span.topic != topic:
        raise ConfigError(f"manifest {path} covers topic {span.topic}, not {topic}")
    return span.ends


def resolve_range(servers: str, topic: str, start: Bound | str, end: Bound | str, *,
                  checkpoint: CheckpointResolver | None = None, timeout_s: float = 10.0) -> TopicRange:
    """The range ``[start, end)`` of ``topic``, checked against the topic now.

    Args:
        servers: Kafka bootstrap servers.
        topic: The input topic.
        start: Where the range starts (a :class:`Bound` or its text).
        end: Where it ends (exclusive).
        checkpoint: Resolves ``checkpoint:JOB`` bounds.
        timeout_s: Per broker request.

    Returns:
        One :class:`PartitionRange` per partition of the topic.

    Raises:
        ConfigError: A bound does not parse; a partition is unknown or missing; a
            start is after its end; a start lies below the log start offset (the
            records were deleted by retention); an end lies beyond the last stable offset.
        KafkaError: The topic does not exist or the broker does not answer.
    """
    offsets = topic_offsets(servers, topic, timeout_s)
    start_b = parse_bound(start) if isinstance(start, str) else start
    end_b = parse_bound(end) if isinstance(end, str) else end
    starts = resolve_bound(start_b, servers, offsets, checkpoint=checkpoint, timeout_s=timeout_s)
    ends = resolve_bound(end_b, servers, offsets, checkpoint=checkpoint, timeout_s=timeout_s)
    for p in sorted(offsets.latest):
        if starts[p] < offsets.earliest[p]:
            raise ConfigError(f"{topic}[{p}]: start offset {starts[p]} ({start_b}) is below the log start "
                              f"offset {offsets.earliest[p]}: those records were deleted by retention")
        if ends[p] > offsets.latest[p]:
            raise ConfigError(f"{topic}[{p}]: end offset {ends[p]} ({end_b}) is beyond the last stable "
                              f"offset {offsets.latest[p]}")
        if starts[p] > ends[p]:
            raise ConfigError(f"{topic}[{p}]: start offset {starts[p]} ({start_b}) is after end offset "
                              f"{ends[p]} ({end_b})")
    return TopicRange.between(topic, starts, ends)
