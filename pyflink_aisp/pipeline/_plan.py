"""Where a job's Kafka source starts and stops: the options' range, resolved once.

A BATCH run always reads a resolved range (``--range-start``, default from
``--startup-mode``: earliest; ``--range-end``, default ``latest``, the last
stable offset at start), handed to the source as specific offsets, so its
manifest records exactly what it read. A stream starts at ``--range-start``
when given (e.g. ``manifest:PATH``: where a batch run ended), else by its
startup mode (the group's committed offsets, earliest for a new group), and
stops only with ``--range-end``. PyFlink-free.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pyflink_aisp.alignment import (
    Bound,
    BoundKind,
    OutcomeTracker,
    TopicOffsets,
    TopicRange,
    checkpoint_offsets,
    parse_bound,
    resolve_bound,
    resolve_range,
    topic_offsets,
)
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.kafka import StartupMode, list_topics
from pyflink_aisp.pipeline._config import PipelineOptions

__all__ = ["InputPlan", "group_or_earliest", "plan_input", "rest_url", "resume_offsets"]


@dataclass(frozen=True, kw_only=True)
class InputPlan:
    """The source's offsets.

    Attributes:
        starts: Offset per partition where reading starts (``specific-offsets``),
            or None for the startup mode's.
        span: The bounded range read (always in BATCH mode), or None (a stream without end).
        stream_starts: Where a stream starts (resolved now; its manifests count
            from there), None in BATCH mode.
    """
    starts: dict[int, int] | None = None
    span: TopicRange | None = None
    stream_starts: dict[int, int] | None = None


def rest_url(options: PipelineOptions, config: Mapping[str, str] | None = None) -> str:
    """The Flink REST API for ``checkpoint:JOB`` bounds and stream manifests:
    ``--flink-rest-url``, else the cluster ``flink run`` submits to (``rest.address``
    / ``rest.port`` of ``config``), else ``http://127.0.0.1:$AISP_FLINK_REST_PORT`` (8081)."""
    if options.flink_rest_url:
        return options.flink_rest_url.rstrip("/")
    if config and config.get("execution.target") == "remote":
        address = config.get("rest.address") or config.get("jobmanager.rpc.address") or "localhost"
        return f"http://{address}:{config.get('rest.port', '8081')}"
    return f"http://127.0.0.1:{os.environ.get('AISP_FLINK_REST_PORT', '8081')}"


def group_or_earliest(servers: str, group: str, offsets: TopicOffsets) -> dict[int, int]:
    """The group's committed offsets; the log start where it committed none (a new group)."""
    try:
        return resolve_bound(Bound(kind=BoundKind.GROUP, arg=group), servers, offsets)
    except ConfigError:
        return dict(offsets.earliest)


def resume_offsets(options: PipelineOptions, servers: str, offsets: TopicOffsets) -> dict[int, int]:
    """Where a stream started without a savepoint resumes: per partition, the later of its
    group's committed offset and the end of what it already wrote.

    Flink commits a checkpoint's sink transactions and its source offsets separately
    when the checkpoint completes, and the offset commit can lag (or be lost when the
    job dies in between): the group's offsets alone would then replay records whose
    outcomes are already committed. Every outcome names its input record and job
    (:data:`~pyflink_aisp.kafka.SOURCE_HEADER`, :data:`~pyflink_aisp.kafka.JOB_HEADER`),
    and a checkpoint's outcomes cover a prefix of each partition, so the record after
    the last one with a committed outcome is where the job stopped. Reads the output
    and dead-letter topics once (proportional to their size).

    Raises:
        KafkaError: A topic cannot be read.
    """
    starts = group_or_earliest(servers, options.group, offsets)
    if not {options.output_topic, options.dlq} <= list_topics(servers):
        return starts  # a first run: nothing written yet
    tracker = OutcomeTracker(servers, offsets.topic, options.output_topic, options.dlq, job=options.name)
    try:
        tracker.advance()
        written = tracker.ends()
    finally:
        tracker.close()
    return {p: max(o, written.get(p, 0)) for p, o in starts.items()}


def plan_input(options: PipelineOptions, *, config: Mapping[str, str] | None = None) -> InputPlan:
    """Resolve the options' range against the input topic now.

    Args:
        options: ``input_topic``, ``mode``, ``range_start`` / ``range_end``,
            ``startup_mode``, ``group``.
        config: The Flink environment's configuration (finds the REST API of
            ``checkpoint:JOB`` bounds; see :func:`rest_url`).

    Raises:
        ConfigError: A bound does not fit the topic (unknown or missing partition,
            start after end, below the log start offset, beyond the last stable offset),
            or names a job without a completed checkpoint.
        KafkaError: The topic does not exist or the broker does not answer.
    """
    servers = options.servers
    topic = options.input_topic
    rest = rest_url(options, config)

    def resolver(job: str, offsets: TopicOffsets) -> dict[int, int]:
        group = Bound(kind=BoundKind.GROUP, arg=job)  # a job's group is its name unless set apart
        return checkpoint_offsets(rest, job, lambda: resolve_bound(group, servers, offsets)).offsets

    offsets = topic_offsets(servers, topic)
    start = parse_bound(options.range_start) if options.range_start else None
    startup = options.effective_startup_mode
    if start is None:
        if startup is StartupMode.EARLIEST:
            start_offsets = dict(offsets.earliest)
        elif startup is StartupMode.LATEST:
            start_offsets = dict(offsets.latest)
        elif not options.bounded:
            start_offsets = resume_offsets(options, servers, offsets)
        else:
            start_offsets = group_or_earliest(servers, options.group, offsets)
        start = parse_bound("offsets:" + ",".join(f"{p}={o}" for p, o in sorted(start_offsets.items())))
    end = options.range_end or ("latest" if options.bounded else None)
    if end is not None:
        span = resolve_range(servers, topic, start, end, checkpoint=resolver)
        return InputPlan(starts=span.starts, span=span,
                         stream_starts=span.starts if not options.bounded else None)
    starts = resolve_bound(start, servers, offsets, checkpoint=resolver)
    latest = TopicRange.between(topic, offsets.earliest, offsets.latest)  # checks the bounds below
    for p, o in sorted(starts.items()):
        if not latest.ends[p] >= o >= latest.starts[p]:
            raise ConfigError(f"{topic}[{p}]: start offset {o} ({start}) is outside the partition's "
                              f"offsets [{latest.starts[p]}, {latest.ends[p]}]")
    # resume_offsets decided
    explicit = options.range_start is not None or startup is StartupMode.GROUP_OFFSETS
    return InputPlan(starts=starts if explicit else None, stream_starts=starts)
