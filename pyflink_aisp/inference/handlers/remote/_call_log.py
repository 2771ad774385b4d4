"""A call log for remote models: a record answered before a failover is not sent again.

After a TaskManager loss Flink replays every record since the last completed checkpoint, so
without a log each of them is sent to the server (and paid) again; a record that failed for
good is retried from scratch with a fresh deadline, every restart (flink-agents #1105). The log
is a Kafka topic beside the job's own topics, so it survives the loss of any TaskManager and is
read by whichever worker replays the record:

- **key**: the sha256 (hex) of the model's identity and one record's request as it would be
  sent (model name, API path, prompt or input, sampling parameters, JSON schema; for a V2 row,
  the input tensor's name and datatype, the row's data and the outputs asked for), prefixed by
  16 hex digits of the identity alone; a worker keeps only the entries of its own model. The
  key is the content, not the record's offset: the SQL functions do not see offsets, and two
  records with one input share one call (the answer of a deterministic request, or the first
  sample of a sampled one).
- **value**: JSON ``{"kind": "ok" | "invalid" | "failed" | "started", "at": epoch s, ...}``: an
  answer (``result``), an answer that did not fit the task (``detail``), a request that
  failed for good (``status``, ``timeout``, ``detail``; its dead letter comes again without a
  call), or a first attempt's start (``at``), so that a record's deadline counts from its first
  attempt across restarts.
- **topic**: created on first use with ``cleanup.policy=compact,delete`` (the latest entry per
  key survives compaction) and ``retention.ms`` of 7 days (Kafka's default); a topic made by
  the user is taken as it is. Each worker reads the whole topic when it opens (its memory holds
  one entry per distinct input of its model within the retention).

Writes are idempotent (``enable.idempotence``) and flushed before a batch's results return to
the operator: a result that reaches the job's output is in the log. A worker lost between the
server's answer and the flush makes that call once more after the restart; nothing else is
sent twice. The API key travels in a header: it is never part of a key or an entry.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pyflink_aisp.errors import (
    ConfigError,
    InvalidModelOutputError,
    ModelError,
    PromptTooLongError,
    RemoteError,
    RemoteTimeoutError,
)

__all__ = ["CallLog", "CallLogConfig", "answer_with_log", "call_key"]

#: ``retention.ms`` of a topic the log creates: Kafka's default ``log.retention.hours`` (168).
RETENTION_MS = 7 * 24 * 3600 * 1000
#: Longest a flush of one batch's entries may take before the batch fails (seconds).
FLUSH_TIMEOUT_S = 30.0
_KINDS = frozenset({"ok", "invalid", "failed", "started"})


@dataclass(frozen=True, kw_only=True)
class CallLogConfig:
    """Where a remote model's call log is.

    Attributes:
        topic: The Kafka topic (created compacted when missing).
        bootstrap_servers: The brokers, ``host:port[,host:port...]``.

    Raises:
        ConfigError: An empty topic or server list, or a topic name Kafka refuses
            (``[a-zA-Z0-9._-]``, at most 249 characters).
    """

    topic: str
    bootstrap_servers: str

    def __post_init__(self) -> None:
        if not self.topic or len(self.topic) > 249 or not all(c.isalnum() or c in "._-" for c in self.topic):
            raise ConfigError(f"call log topic {self.topic!r}: a Kafka topic name is 1-249 characters of "
                              "[a-zA-Z0-9._-]")
        if not self.bootstrap_servers.strip():
            raise ConfigError("the call log needs Kafka bootstrap servers")


def call_key(scope: str, request: Any) -> str:
    """The log key of one record's request: ``<16 hex of sha256(scope)>:<sha256 of scope and the
    request as canonical JSON (sorted keys)>``.

    Raises:
        TypeError: The request is not JSON-serialisable.
    """
    prefix = hashlib.sha256(scope.encode("utf-8")).hexdigest()[:16]
    text = json.dumps([scope, request], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return f"{prefix}:{hashlib.sha256(text.encode('utf-8')).hexdigest()}"


class CallLog:
    """One worker's view of a call log topic (see the module docstring).

    Thread-safety: every method may be called from several threads.

    Args:
        config: The topic and brokers.
        scope: The model's identity (e.g. ``openai:MODEL``); only entries of keys made with it
            are kept.
        read_timeout_s: Longest :meth:`open` may read.
    """

    def __init__(self, config: CallLogConfig, *, scope: str, read_timeout_s: float = 120.0) -> None:
        self.config = config
        self.scope = scope
        self._prefix = call_key(scope, None).split(":", 1)[0] + ":"
        self._read_timeout_s = read_timeout_s
        self._entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._errors: list[str] = []
        self.hits = 0

    @property
    def size(self) -> int:
        """Entries of this model held."""
        return len(self._entries)

    def open(self) -> CallLog:
        """Create the topic if missing, read it to its end, start the producer.

        Raises:
            ModelError: The brokers cannot be reached, the topic cannot be created or read in
                ``read_timeout_s``.
        """
        servers = self.config.bootstrap_servers
        self._ensure_topic()
        consumer = Consumer({"bootstrap.servers": servers, "group.id": f"aisp-call-log-{time.monotonic_ns()}",
                             "enable.auto.commit": False, "enable.partition.eof": True})
        try:
            meta = consumer.list_topics(self.config.topic, timeout=10)
            partitions = sorted(meta.topics[self.config.topic].partitions)
            ends = {p: consumer.get_watermark_offsets(TopicPartition(self.config.topic, p), timeout=10)[1]
                    for p in partitions}
            todo = {p for p, end in ends.items() if end > 0}
            consumer.assign([TopicPartition(self.config.topic, p, OFFSET_BEGINNING) for p in todo])
            deadline = time.monotonic() + self._read_timeout_s
            while todo:
                if time.monotonic() > deadline:
                    raise ModelError(f"call log {self.config.topic}: not read to its end in "
                                     f"{self._read_timeout_s:g} s")
                message = consumer.poll(1.0)
                if message is None:
                    continue
                error, offset, partition = message.error(), message.offset() or 0, message.partition() or 0
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if offset >= ends[partition]:
                            todo.discard(partition)
                        continue
                    raise ModelError(f"call log {self.config.topic}: {error}")
                self._load(message.key(), message.value())
                if offset + 1 >= ends[partition]:
                    todo.discard(partition)
        except KafkaException as exc:
            raise ModelError(f"call log {self.config.topic} on {servers}: {exc}") from exc
        finally:
            consumer.close()
        self._producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "acks": "all",
                                   "linger.ms": 5})
        return self

    def _ensure_topic(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.config.bootstrap_servers})
        try:
            meta = admin.list_topics(timeout=10)
        except KafkaException as exc:
            raise ModelError(f"call log: Kafka at {self.config.bootstrap_servers} is unreachable: "
                             f"{exc}") from exc
        if self.config.topic in meta.topics:
            return
        topic = NewTopic(self.config.topic, num_partitions=1, replication_factor=-1, config={
            "cleanup.policy": "compact,delete", "retention.ms": str(RETENTION_MS)})
        for future in admin.create_topics([topic], operation_timeout=30).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another worker made it
                    raise ModelError(f"call log: cannot create topic {self.config.topic}: {exc}") from exc

    def _load(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        name = key.decode("utf-8", "replace")
        if not name.startswith(self._prefix):
            return
        if value is None:  # a tombstone
            self._entries.pop(name, None)
            return
        try:
            entry = json.loads(value)
        except ValueError:
            return
        if isinstance(entry, dict) and entry.get("kind") in _KINDS:
            self._entries[name] = entry

    def get(self, key: str) -> dict[str, Any] | None:
        """The latest entry of ``key``, or None."""
        with self._lock:
            return self._entries.get(key)

    def put(self, entries: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Write ``(key, entry)`` pairs (each entry a JSON object with ``kind``); call
        :meth:`flush` before the results they log leave the worker.

        Raises:
            ModelError: :meth:`open` was not called.
            TypeError: An entry is not JSON-serialisable.
        """
        if self._producer is None:
            raise ModelError("the call log is not open")
        for key, entry in entries:
            value = json.dumps(entry, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            with self._lock:
                self._entries[key] = entry
            self._producer.produce(self.config.topic, key=key.encode("utf-8"), value=value.encode("utf-8"),
                                   on_delivery=self._delivered)
        self._producer.poll(0)

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is not None:
            with self._lock:
                self._errors.append(str(error))

    def flush(self) -> None:
        """Wait until every entry written is in the topic.

        Raises:
            ModelError: Entries were not delivered within :data:`FLUSH_TIMEOUT_S` or failed (the
                batch fails and its records are replayed; nothing is lost).
        """
        if self._producer is None:
            return
        left = self._producer.flush(FLUSH_TIMEOUT_S)
        with self._lock:
            errors, self._errors = self._errors, []
        if left or errors:
            raise ModelError(f"call log {self.config.topic}: {left} entries not delivered in "
                             f"{FLUSH_TIMEOUT_S:g} s; {errors[:3]}")

    def close(self) -> None:
        """Flush what is pending (best effort) and drop the producer."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(5.0)


def _entry(result: Any, encode: Callable[[Any], Any]) -> dict[str, Any]:
    """The log entry of one fresh result (a prediction, or the error returned in its place)."""
    at = time.time()
    if isinstance(result, InvalidModelOutputError):
        return {"kind": "invalid", "at": at, "detail": str(result)}
    if isinstance(result, RemoteError):
        return {"kind": "failed", "at": at, "status": result.status, "detail": str(result),
                "timeout": isinstance(result, RemoteTimeoutError),
                "too_long": isinstance(result, PromptTooLongError)}
    return {"kind": "ok", "at": at, "result": encode(result)}


def _replayed(entry: dict[str, Any], decode: Callable[[Any], Any]) -> Any:
    """The result (or the error) an entry logged."""
    if entry["kind"] == "ok":
        return decode(entry.get("result"))
    detail = f"{entry.get('detail')} (from the call log: this request failed before a restart)"
    if entry["kind"] == "invalid":
        return InvalidModelOutputError(str(entry.get("detail")))
    status = entry.get("status")
    error = RemoteTimeoutError if entry.get("timeout") else (
        PromptTooLongError if entry.get("too_long") else RemoteError)
    return error(detail, status if isinstance(status, int) else None)


def answer_with_log(log: CallLog, keys: Sequence[str], deadline_s: float,
                    call: Callable[[list[int], Callable[[int, list[Any]], None]], list[Any]], *,
                    encode: Callable[[Any], Any] = lambda r: r,
                    decode: Callable[[Any], Any] = lambda v: v) -> list[Any]:
    """One result (or the error in its place) per record, from the log where it holds the record's
    key, else from ``call`` (each fresh outcome logged as it comes, all flushed before returning).

    A record whose first attempt started (a ``started`` entry) more than ``deadline_s`` ago, before
    a restart, is a :class:`~pyflink_aisp.errors.RemoteTimeoutError` without a request; a record
    never seen gets a ``started`` entry before its request.

    Args:
        log: The worker's open log.
        keys: Each record's :func:`call_key`.
        deadline_s: The per-record deadline (seconds), counted from the first attempt.
        call: ``call(indices, on_final)`` makes the requests of the records at ``indices`` (into
            ``keys``) and returns one outcome per index, in order; it calls ``on_final(first,
            outcomes)`` as soon as the outcomes of ``indices[first:first + len(outcomes)]`` are final.
        encode / decode: A prediction to JSON and back.

    Raises:
        ModelError: The entries could not be flushed (the batch fails and is replayed).
    """
    results: list[Any] = [None] * len(keys)
    todo: list[int] = []
    started: list[tuple[str, dict[str, Any]]] = []
    now = time.time()
    for i, key in enumerate(keys):
        entry = log.get(key) or {}
        kind = entry.get("kind")
        if kind in ("ok", "invalid", "failed"):
            results[i] = _replayed(entry, decode)
            log.hits += 1
        elif kind == "started" and now - float(entry.get("at", now)) > deadline_s:
            results[i] = RemoteTimeoutError(
                f"the record's deadline of {deadline_s:g} s passed since its first attempt before a "
                f"restart (call log {log.config.topic})")
            log.put([(key, {"kind": "failed", "at": now, "timeout": True, "status": None,
                           "detail": str(results[i])})])
        else:
            todo.append(i)
            if kind is None:
                started.append((key, {"kind": "started", "at": now}))
    log.put(started)

    def logged(first: int, outcomes: list[Any]) -> None:  # as each answer comes
        log.put((keys[todo[first + k]], _entry(r, encode)) for k, r in enumerate(outcomes))

    fresh = call(todo, logged) if todo else []
    log.flush()
    for i, r in zip(todo, fresh, strict=True):
        results[i] = r
    return results
