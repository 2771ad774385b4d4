"""Kafka for pyflink-aisp: Flink source/sink tables with safe exactly-once defaults,
JSON decoding into records or dead letters (:class:`~pyflink_aisp.outcome.DeadLettered`),
and ingestion/admin on confluent-kafka. Importing this package needs no PyFlink.
"""

from __future__ import annotations

from pyflink_aisp.kafka._admin import (
    TopicInfo,
    create_topics,
    default_bootstrap_servers,
    delete_topics,
    list_topics,
    read_topic,
)
from pyflink_aisp.kafka._decode import (
    DecodedRecord,
    KafkaCoordinates,
    decode_record,
    decode_review,
)
from pyflink_aisp.kafka._ingest import IngestResult, ingest_records
from pyflink_aisp.kafka._limits import sink_record_limit, topic_max_message_bytes
from pyflink_aisp.kafka._mapping import DEFAULT_MAPPING, FieldMapping, ValueFormat, parse_pointer
from pyflink_aisp.kafka._tables import (
    JOB_HEADER,
    SOURCE_HEADER,
    DeliveryGuarantee,
    KafkaSinkTable,
    KafkaSourceTable,
    StartupMode,
)
from pyflink_aisp.kafka._transactions import (
    TransactionInfo,
    abort_transactions,
    broker_transaction_max_timeout_ms,
    check_transaction_timeout,
    list_transactions,
)

__all__ = [
    "DEFAULT_MAPPING",
    "JOB_HEADER",
    "SOURCE_HEADER",
    "DecodedRecord",
    "DeliveryGuarantee",
    "FieldMapping",
    "IngestResult",
    "KafkaCoordinates",
    "KafkaSinkTable",
    "KafkaSourceTable",
    "StartupMode",
    "TopicInfo",
    "TransactionInfo",
    "ValueFormat",
    "abort_transactions",
    "broker_transaction_max_timeout_ms",
    "check_transaction_timeout",
    "create_topics",
    "decode_record",
    "decode_review",
    "default_bootstrap_servers",
    "delete_topics",
    "ingest_records",
    "list_topics",
    "list_transactions",
    "parse_pointer",
    "read_topic",
    "sink_record_limit",
    "topic_max_message_bytes",
]
