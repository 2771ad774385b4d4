"""The per-record inference operator, for Flink's thread mode (``--operator record``).

:class:`RecordInferenceFunction` is a general (row-at-a-time) PyFlink scalar function used with
``Table.map`` over the Kafka source table, like the Arrow operator but one record per call: it
takes the row ``value, topic, partition, offset`` (``key`` last when the id is the Kafka key) and
returns the row ``key, value, dead, source``. Decoding, the model call (one
:meth:`~pyflink_aisp.inference.ModelRuntime.infer_batch` of one example), rendering, dead letters,
the breaker and the dead-letter watch are the Arrow operator's own
(:meth:`~pyflink_aisp.pipeline._arrow_op.ArrowInferenceFunction.score_columns`).

The job runs it with ``python.execution-mode: thread``: the function runs in the TaskManager's JVM
through PEMJA (FLIP-206), so a record does not wait for a bundle to end or cross a gRPC hop to a
Python worker process; PyFlink's vectorized (pandas) functions are not supported in that mode, hence
a row-at-a-time function. Nothing is batched: each record is one model call, so this operator suits
low-rate streams where latency counts, the Arrow operator throughput. The Python functions of one
TaskManager share one interpreter and its GIL (the model's own threads release it).

Metrics: the Arrow operator's (``arrowBatches`` counts calls, ``arrowBatchSize`` is 1).
"""

from __future__ import annotations

from typing import Any

from pyflink.common import Row
from pyflink.table.udf import udf

from pyflink_aisp.pipeline._arrow_op import SCORED_ROW_TYPE, ArrowInferenceFunction

__all__ = ["RecordInferenceFunction", "record_inference_udf"]


class RecordInferenceFunction(ArrowInferenceFunction):
    """:class:`~pyflink_aisp.pipeline._arrow_op.ArrowInferenceFunction` one record at a time
    (same arguments, same errors)."""

    def eval(self, row: Row) -> Row:  # type: ignore[override]
        """Row ``(value BYTES, topic STRING, partition INT, offset BIGINT[, key BYTES])`` → row
        ``(key, value, dead, source)``; never raises for a record.

        Raises:
            CircuitOpenError: The circuit breaker tripped.
            DeadLetterRateError: The dead-letter share of the watch's window is too high.
            OperatorNotOpenError: Called before ``open()``.
        """
        keys = [row[4]] if self._mapping.id_from_key else None
        out_keys, values, dead, sources = self.score_columns(
            [row[0]], [row[1]], [row[2]], [row[3]], keys, caller="RecordInferenceFunction.eval")
        return Row(out_keys[0], values[0], dead[0], sources[0])


def record_inference_udf(function: RecordInferenceFunction) -> Any:
    """``function`` as a general (row-at-a-time) UDF for ``Table.map``."""
    return udf(function, result_type=SCORED_ROW_TYPE)
