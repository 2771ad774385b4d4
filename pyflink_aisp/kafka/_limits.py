"""How large a record a Kafka sink can write: producer and topic limits.

A producer refuses a record whose serialized batch exceeds its
``max.request.size`` (default 1 MiB, Kafka ``ProducerConfig``) or its
``buffer.memory`` (default 32 MiB), and the broker
refuses a batch larger than the topic's ``max.message.bytes`` (default
1,048,588, from the broker's ``message.max.bytes``); either way the send fails
with ``RecordTooLargeException`` and an exactly-once Flink sink fails the job.
:func:`sink_record_limit` turns both into one budget for key + value bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from pyflink_aisp.errors import KafkaError

__all__ = ["DEFAULT_BUFFER_MEMORY", "DEFAULT_MAX_REQUEST_SIZE", "RECORD_OVERHEAD_BYTES", "sink_record_limit",
           "topic_max_message_bytes"]

#: Kafka producer default ``max.request.size`` (bytes).
DEFAULT_MAX_REQUEST_SIZE = 1_048_576
#: Kafka producer default ``buffer.memory`` (bytes): a record larger than it is refused too.
DEFAULT_BUFFER_MEMORY = 33_554_432
#: Bytes kept free for the record-batch and record headers around key and value:
#: a v2 batch header is 61 bytes and a record's own overhead at most 21
#: (``DefaultRecordBatch.RECORD_BATCH_OVERHEAD``, ``DefaultRecord.MAX_RECORD_OVERHEAD``);
#: rounded up to 1 KiB for headers a sink may add.
RECORD_OVERHEAD_BYTES = 1024


def topic_max_message_bytes(
    bootstrap_servers: str, topics: Iterable[str], timeout_s: float = 30.0
) -> dict[str, int]:
    """Each topic's effective ``max.message.bytes`` (its own, or the broker default).

    Raises:
        KafkaError: No broker answered, a topic does not exist, or the config
            cannot be read (e.g. not authorized to describe it).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 2})
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    limits: dict[str, int] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=timeout_s).items():
        try:
            entry = future.result(timeout=timeout_s)["max.message.bytes"]
        except (KafkaException, KeyError, TimeoutError) as exc:
            raise KafkaError(f"cannot read max.message.bytes of topic {resource.name} on "
                             f"{bootstrap_servers}: {exc}") from exc
        limits[resource.name] = int(entry.value)
    return limits


def sink_record_limit(
    bootstrap_servers: str, topics: Iterable[str], *, max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
) -> int:
    """Most UTF-8 bytes of key + value one record may have to be writable to every topic.

    Args:
        bootstrap_servers: The cluster.
        topics: The sink topics (they must exist).
        max_request_size: The sinks' producer ``max.request.size``.

    Returns:
        ``min(max_request_size, buffer.memory (32 MiB), each topic's max.message.bytes) -``
        :data:`RECORD_OVERHEAD_BYTES`.

    Raises:
        KafkaError: As :func:`topic_max_message_bytes`.
    """
    limits = topic_max_message_bytes(bootstrap_servers, sorted(set(topics)))
    return min(max_request_size, DEFAULT_BUFFER_MEMORY, *limits.values()) - RECORD_OVERHEAD_BYTES
