"""Run manifests: what a run read, with what model, and what it wrote.

A manifest (JSON) is written at the end of each BATCH run and for each completed
checkpoint of a stream. It records the job name and code version, the runtime
mode, the input range per partition (:class:`~pyflink_aisp.alignment.TopicRange`),
the checkpoint id (streams), the model lineage (the sha256 of the model and
tokenizer files, and the model versions the outputs name), the input, output and
dead-letter counts, and order-independent digests
(:func:`~pyflink_aisp.alignment.multiset_digest`) of the outputs and dead
letters. A range's outputs are found by their lineage header
(:data:`~pyflink_aisp.kafka.SOURCE_HEADER`), so a topic written by several runs,
or a stream that went on past the checkpoint, still gives the range's own.

Two manifests of the same range agree when their counts agree and each input
record has exactly one outcome (``duplicates`` and ``missing`` are 0); their
digests agree when the bytes agree (a stream and a batch run may score in the
last float bits apart: ``aisp verify`` then compares per id within a tolerance).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from pyflink_aisp.alignment._ranges import TopicRange
from pyflink_aisp.alignment._verify import multiset_digest
from pyflink_aisp.errors import ConfigError, KafkaError
from pyflink_aisp.kafka import JOB_HEADER, SOURCE_HEADER

__all__ = ["MANIFEST_FORMAT", "OutcomeTracker", "OutputSummary", "RunManifest", "code_version", "file_sha256",
           "read_range", "summarize_outputs"]

#: Version of the manifest's JSON layout.
MANIFEST_FORMAT = 1


def code_version() -> str:
    """``pyflink-aisp <version>``, and the git commit of a source checkout when known."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = f"pyflink-aisp {version('pyflink-aisp')}"
    except PackageNotFoundError:
        text = "pyflink-aisp (not installed)"
    from pyflink_aisp.home import project_root

    root = project_root()
    head = root / ".git" / "HEAD" if root else None
    if head is not None and head.is_file():
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            ref_file = root / ".git" / ref[5:]  # type: ignore[operator]
            ref = ref_file.read_text().strip() if ref_file.is_file() else ""
        if ref:
            text += f" (git {ref[:12]})"
    return text


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks).

    Raises:
        ConfigError: The file cannot be read.
    """
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read {path} for its sha256: {exc}") from exc
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class OutputSummary:
    """A range's outcomes in the output and dead-letter topics.

    Attributes:
        input_count: Records in the input range (``read_committed``).
        output_count / dlq_count: Outputs / dead letters whose lineage lies in the range.
        output_digest / dlq_digest: :func:`multiset_digest` of their values.
        duplicates: Input records with more than one outcome (outputs + dead letters).
        missing: Input records with no outcome.
        model_versions: Distinct ``model_sha256`` values of the outputs, sorted.
    """

    input_count: int
    output_count: int
    dlq_count: int
    output_digest: str
    dlq_digest: str
    duplicates: int
    missing: int
    model_versions: tuple[str, ...]


def _consumer(servers: str) -> Consumer:
    return Consumer({"bootstrap.servers": servers, "group.id": f"aisp-manifest-{time.monotonic_ns()}",
                     "enable.auto.commit": False, "isolation.level": "read_committed"})


def _read_to(consumer: Consumer, topic: str, ends: Mapping[int, int], sink: Callable[[Message], None],
             timeout_s: float, starts: Mapping[int, int] | None = None, clip: bool = True) -> dict[int, int]:
    """Consume the assigned partitions of ``topic`` until each position reaches ``ends``;
    returns the positions reached.

    ``starts``: where each partition's reading started, taken as its position until the
    consumer knows one (an assignment has none before its first fetch). ``clip``: pass
    on only the records before ``ends`` (else every record consumed).
    """
    known = dict(starts or {})
    todo = dict(ends)
    deadline = time.monotonic() + timeout_s
    while True:
        for tp in consumer.position([TopicPartition(topic, p) for p in todo]):
            if tp.offset >= 0:
                known[tp.partition] = tp.offset
        # past the end also past a final transaction marker
        todo = {p: end for p, end in todo.items() if known.get(p, -1) < end}
        if not todo:
            return known
        if time.monotonic() > deadline:
            raise KafkaError(f"reading {topic} up to offsets {todo} took over {timeout_s} s")
        for msg in consumer.consume(num_messages=1000, timeout=0.2):
            if msg.error():
                raise KafkaError(f"consumer error on {msg.topic()}[{msg.partition()}]: {msg.error()}")
            if not clip or (msg.offset() or 0) < ends.get(msg.partition() or 0, 0):
                sink(msg)


def read_range(servers: str, span: TopicRange, timeout_s: float = 120.0) -> list[Message]:
    """Every committed record of ``span`` (``read_committed``), in partition order.

    Raises:
        KafkaError: A consumer error, or the range was not read within ``timeout_s``.
    """
    parts = [p for p in span.partitions if p.end > p.start]
    out: list[Message] = []
    if not parts:
        return out
    consumer = _consumer(servers)
    try:
        consumer.assign([TopicPartition(span.topic, p.partition, p.start) for p in parts])
        _read_to(consumer, span.topic, {p.partition: p.end for p in parts}, out.append, timeout_s,
                 starts={p.partition: p.start for p in parts})
    except KafkaException as exc:
        raise KafkaError(f"cannot read {span.topic}: {exc}") from exc
    finally:
        consumer.close()
    return out


def _header(msg: Message, name: str) -> str | None:
    for header in msg.headers() or ():
        if header[0] == name and isinstance(header[1], bytes):
            return header[1].decode("utf-8", "replace")
    return None


def _lineage(msg: Message) -> tuple[str, int, int] | None:
    value = _header(msg, SOURCE_HEADER)
    if value is None:
        return None
    head, _, offset = value.rpartition("/")
    topic, _, partition = head.rpartition("/")
    try:
        return topic, int(partition), int(offset)
    except ValueError:
        return None


class OutcomeTracker:
    """Follows a job's output and dead-letter topics (``read_committed``) and keeps
    each outcome by the input record it names (its lineage header), so the outcomes
    of any input range are counted and digested without reading the topics again.

    :meth:`advance` reads each topic up to its last stable offset now: everything a
    checkpoint (or a finished batch run) committed, nothing of an open transaction.
    With ``job``, only the outcomes that job wrote count (its :data:`JOB_HEADER`); with
    ``starts`` (topic → partition → offset), only those at or after these offsets (one
    run's, when they are the topics' ends before it started).
    Not thread-safe.
    """

    def __init__(self, servers: str, input_topic: str, output_topic: str, dlq_topic: str, *,
                 job: str | None = None, starts: Mapping[str, Mapping[int, int]] | None = None) -> None:
        self._servers, self._input, self._job = servers, input_topic, job
        self._starts = {topic: dict(offsets) for topic, offsets in (starts or {}).items()}
        self._topics = (output_topic, dlq_topic)
        self._consumers: dict[str, Consumer] = {}
        self._positions: dict[str, dict[int, int]] = {}
        self._outcomes: dict[str, dict[tuple[int, int], list[bytes]]] = {t: {} for t in self._topics}

    def advance(self, timeout_s: float = 120.0) -> None:
        """Read both topics to their last stable offsets now.

        Raises:
            KafkaError: A topic does not exist or cannot be read in time.
        """
        from pyflink_aisp.alignment._ranges import topic_offsets

        for topic in self._topics:
            ends = topic_offsets(self._servers, topic).latest
            consumer = self._consumers.get(topic)
            if consumer is None:
                consumer = self._consumers[topic] = _consumer(self._servers)
                first = {**topic_offsets(self._servers, topic).earliest, **self._starts.get(topic, {})}
                consumer.assign([TopicPartition(topic, p, first[p]) for p in sorted(ends)])
                self._positions[topic] = first
            store = self._outcomes[topic]

            def keep(msg: Message, store: dict[tuple[int, int], list[bytes]] = store) -> None:
                source = _lineage(msg)
                if self._job is not None and _header(msg, JOB_HEADER) != self._job:
                    return
                if source is not None and source[0] == self._input:
                    store.setdefault((source[1], source[2]), []).append(bytes(msg.value() or b""))

            try:
                self._positions[topic] = _read_to(consumer, topic, ends, keep, timeout_s,
                                                  starts=self._positions[topic], clip=False)
            except KafkaException as exc:
                raise KafkaError(f"cannot read {topic}: {exc}") from exc

    def summary(self, span: TopicRange, timeout_s: float = 120.0) -> OutputSummary:
        """Counts and digests of the outcomes of ``span``'s input records read so far.

        Raises:
            KafkaError: The input range cannot be read.
        """
        inputs = {(m.partition(), m.offset()) for m in read_range(self._servers, span, timeout_s)}
        output, dlq = ([v for key, vs in self._outcomes[t].items() if span.contains(*key) for v in vs]
                       for t in self._topics)
        seen: Counter[tuple[int, int]] = Counter()
        for topic in self._topics:
            for key, values in self._outcomes[topic].items():
                if span.contains(*key):
                    seen[key] += len(values)
        return OutputSummary(
            input_count=len(inputs), output_count=len(output), dlq_count=len(dlq),
            output_digest=multiset_digest(output), dlq_digest=multiset_digest(dlq),
            duplicates=sum(1 for n in seen.values() if n > 1), missing=len(inputs - set(seen)),
            model_versions=_model_versions(output))

    def outcome_counts(self, span: TopicRange) -> tuple[int, int]:
        """``(outputs, dead letters)`` read so far for ``span``'s input records."""
        output, dlq = (sum(len(vs) for key, vs in self._outcomes[t].items() if span.contains(*key))
                       for t in self._topics)
        return output, dlq

    def dead_letter_reasons(self, span: TopicRange) -> Counter[str]:
        """Reason → count of the dead letters read so far for ``span``'s input records (their
        JSON ``reason``; ``"?"`` for a value that is not a dead letter's JSON)."""
        reasons: Counter[str] = Counter()
        for key, values in self._outcomes[self._topics[1]].items():
            if span.contains(*key):
                for value in values:
                    try:
                        reasons[str(json.loads(value).get("reason", "?"))] += 1
                    except (ValueError, AttributeError):
                        reasons["?"] += 1
        return reasons

    def ends(self) -> dict[int, int]:
        """Per input partition, the offset after the last input record with an outcome read so
        far: where a job that writes one outcome per record, in order, resumes."""
        ends: dict[int, int] = {}
        for store in self._outcomes.values():
            for partition, offset in store:
                ends[partition] = max(ends.get(partition, 0), offset + 1)
        return ends

    def outputs(self, span: TopicRange) -> list[bytes]:
        """The output values (not dead letters) of ``span``'s input records read so far."""
        return [v for key, vs in self._outcomes[self._topics[0]].items() if span.contains(*key) for v in vs]

    def close(self) -> None:
        """Close the consumers."""
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()


def _model_versions(values: Iterable[bytes]) -> tuple[str, ...]:
    versions = set()
    for value in values:
        try:
            version = json.loads(value).get("model_sha256")
        except (ValueError, AttributeError):
            continue
        if isinstance(version, str):
            versions.add(version)
    return tuple(sorted(versions))


def summarize_outputs(servers: str, span: TopicRange, output_topic: str, dlq_topic: str, *,
                      timeout_s: float = 120.0) -> OutputSummary:
    """Count and digest the committed outcomes of the input records in ``span`` (one pass
    of an :class:`OutcomeTracker`).

    Raises:
        KafkaError: A topic does not exist or cannot be read.
    """
    tracker = OutcomeTracker(servers, span.topic, output_topic, dlq_topic)
    try:
        tracker.advance(timeout_s)
        return tracker.summary(span, timeout_s)
    finally:
        tracker.close()


@dataclass(frozen=True, kw_only=True)
class RunManifest:
    """One run's (or one checkpoint's) manifest.

    Attributes:
        job_name: ``--job-name``.
        code_version: :func:`code_version`.
        mode: ``batch`` or ``streaming``.
        range: The input range (a stream's: from where it started to the checkpoint).
        checkpoint_id: The stream's completed checkpoint, None for a batch run.
        model_files: File name → sha256 of the model and tokenizer the job loaded.
        output_topic / dlq_topic: Where it wrote.
        summary: Counts and digests of its outcomes.
        created_ms: When the manifest was written (epoch ms).
    """

    job_name: str
    code_version: str
    mode: str
    range: TopicRange
    checkpoint_id: int | None
    model_files: Mapping[str, str]
    output_topic: str
    dlq_topic: str
    summary: OutputSummary
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON-ready data (``format`` first)."""
        s = self.summary
        return {
            "format": MANIFEST_FORMAT, "job_name": self.job_name, "code_version": self.code_version,
            "mode": self.mode, "checkpoint_id": self.checkpoint_id, "created_ms": self.created_ms,
            "range": self.range.to_json(),
            "model": {"files": dict(self.model_files), "versions": list(s.model_versions)},
            "output_topic": self.output_topic, "dlq_topic": self.dlq_topic,
            "counts": {"input": s.input_count, "output": s.output_count, "dlq": s.dlq_count,
                       "duplicates": s.duplicates, "missing": s.missing},
            "digests": {"output": s.output_digest, "dlq": s.dlq_digest},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunManifest:
        """Inverse of :meth:`to_json`.

        Raises:
            ConfigError: Another format or missing fields.
        """
        if data.get("format") != MANIFEST_FORMAT:
            raise ConfigError(f"manifest format {data.get('format')!r} is not {MANIFEST_FORMAT}")
        try:
            counts, digests, model = data["counts"], data["digests"], data["model"]
            summary = OutputSummary(
                input_count=int(counts["input"]), output_count=int(counts["output"]),
                dlq_count=int(counts["dlq"]), duplicates=int(counts["duplicates"]),
                missing=int(counts["missing"]), output_digest=str(digests["output"]),
                dlq_digest=str(digests["dlq"]), model_versions=tuple(model["versions"]))
            return cls(job_name=str(data["job_name"]), code_version=str(data["code_version"]),
                       mode=str(data["mode"]), range=TopicRange.from_json(data["range"]),
                       checkpoint_id=data["checkpoint_id"], model_files=dict(model["files"]),
                       output_topic=str(data["output_topic"]), dlq_topic=str(data["dlq_topic"]),
                       summary=summary, created_ms=int(data["created_ms"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a run manifest: missing or bad {exc}") from exc

    def file_name(self) -> str:
        """``<job>-batch-<created_ms>.json`` or ``<job>-chk-<checkpoint id>.json``."""
        tail = f"chk-{self.checkpoint_id}" if self.checkpoint_id is not None else f"batch-{self.created_ms}"
        return f"{self.job_name}-{tail}.json"

    def write(self, directory: Path) -> Path:
        """Write atomically into ``directory`` (created) and return the path.

        Raises:
            ConfigError: The directory cannot be written.
        """
        path = directory / self.file_name()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            raise ConfigError(f"cannot write manifest {path}: {exc}") from exc
        return path

    @classmethod
    def read(cls, path: Path) -> RunManifest:
        """Read a manifest file.

        Raises:
            ConfigError: Unreadable, not JSON, or not a manifest.
        """
        try:
            return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read manifest {path}: {exc}") from exc
