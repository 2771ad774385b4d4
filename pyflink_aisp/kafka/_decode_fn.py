"""The decode step of a job: raw Kafka rows → decoded rows, bad ones to a DLQ side output."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyflink.common import Row, Types
from pyflink.datastream import OutputTag, ProcessFunction

from pyflink_aisp.errors import DecodeError
from pyflink_aisp.kafka._decode import DeadLetter, DecodedRecord, decode_record

__all__ = ["DECODED_TYPE", "DLQ_TAG", "KEY_VALUE_TYPE", "DecodeFunction", "UndecodableRecord", "decode_row"]

#: Rows written to Kafka sinks: ``(key STRING, value STRING)``.
KEY_VALUE_TYPE = Types.ROW_NAMED(["key", "value"], [Types.STRING(), Types.STRING()])
#: Decoded records: ``(id STRING, text STRING, topic STRING, partition INT, offset BIGINT)``.
DECODED_TYPE = Types.ROW_NAMED(
    ["id", "text", "topic", "partition", "offset"],
    [Types.STRING(), Types.STRING(), Types.STRING(), Types.INT(), Types.LONG()],
)
#: Side output of dead letters, as ``(key, value)`` rows: key ``topic/partition/offset``,
#: value the JSON of :meth:`DeadLetter.to_json`.
DLQ_TAG = OutputTag("dlq", KEY_VALUE_TYPE)


class UndecodableRecord(DecodeError):
    """Raised by :func:`decode_row`; ``letter`` is the record's dead letter."""

    def __init__(self, letter: DeadLetter) -> None:
        super().__init__(str(letter.reason), letter.detail)
        self.letter = letter


def _decode(value: Row) -> DecodedRecord | DeadLetter:
    return decode_record(value[0], value[1], value[2], value[3])


def decode_row(value: Row) -> Row:
    """Decode a raw Kafka row ``(value BYTES, topic, partition, offset)`` into a
    :data:`DECODED_TYPE` row ``(id, text, topic, partition, offset)``.

    Raises:
        UndecodableRecord: the record is not a review; its ``letter`` says why.
    """
    result = _decode(value)
    if isinstance(result, DeadLetter):
        raise UndecodableRecord(result)
    return Row(id=result.id, text=result.text, topic=value[1], partition=value[2], offset=value[3])


class DecodeFunction(ProcessFunction):
    """Decodes rows ``(value BYTES, topic, partition, offset)`` from a Kafka source table.

    Emits ``(id, text, topic, partition, offset)`` rows; records that fail to decode go to :data:`DLQ_TAG`
    with their reason and coordinates. Metrics: counter ``aisp.deadLetters``.
    """

    def open(self, runtime_context: Any) -> None:
        self._dead = runtime_context.get_metrics_group().add_group("aisp").counter("deadLetters")

    def process_element(self, value: Row, ctx: ProcessFunction.Context) -> Iterator[Any]:
        result = _decode(value)
        if isinstance(result, DeadLetter):
            self._dead.inc()
            yield DLQ_TAG, Row(key=result.source.default_id(), value=result.to_json())
        else:
            yield Row(id=result.id, text=result.text, topic=value[1], partition=value[2], offset=value[3])
