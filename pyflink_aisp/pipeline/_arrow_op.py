"""The batch-native inference operator: Arrow record batches in, Arrow record batches out.

:class:`ArrowInferenceFunction` is a vectorized (``func_type="pandas"``) PyFlink
scalar function used with ``Table.map`` over the Kafka source table: PyFlink
hands it one pandas DataFrame per Arrow batch (up to
``python.fn-execution.arrow.batch.size`` records) with the columns ``value``
(raw bytes), ``topic``, ``partition``, ``offset``, and takes back a DataFrame
``key``, ``value``, ``dead``, ``source`` (JSON output or dead letter, and the input
record's ``topic/partition/offset``, its lineage; the split into the
two sinks happens in the JVM). Per batch: every value is JSON-decoded (bad
ones become dead letters with their reason), the texts go to the worker's
shared :class:`~pyflink_aisp.inference.ModelRuntime` in one
:meth:`~pyflink_aisp.inference.ModelRuntime.infer_batch` call (one tokenizer
call; the batcher cuts the model's real batches, sorted by length, within the
batch size, token budget, buckets and OOM cap in force), and the outcomes are
rendered. No per-record future, coroutine or token count.

Records leave in their input order. A bundle ends after
``python.fn-execution.bundle.time``; outputs go to the sinks then.

Metrics (operator group ``aisp``, gauges): ``recordsIn``, ``recordsOut``,
``deadLetters``, ``arrowBatches``, P50/P99/Max of ``arrowBatchSize``,
``serializationUs`` (decode + render per Arrow batch) and ``endToEndUs``
(per Arrow batch, entry to output), plus the runtime's own (batch sizes,
queue wait, compute, swaps).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyflink.table import DataTypes
from pyflink.table.udf import FunctionContext, ScalarFunction, udf

from pyflink_aisp.affinity import AffinitySettings, open_affinity
from pyflink_aisp.errors import ConfigError, InferenceError, OversizedOutputError
from pyflink_aisp.inference import (
    BatchingConfig,
    BreakerConfig,
    FailureRateBreaker,
    ModelHandler,
    ModelRuntime,
    ModelSwapConfig,
    handler_key,
)
from pyflink_aisp.inference.metrics import Window, bind_breaker_metrics, register_window
from pyflink_aisp.kafka import DeadLetter, DecodedRecord, decode_record
from pyflink_aisp.outcome import (
    DEFAULT_MAX_RECORD_BYTES,
    MIN_RECORD_BYTES,
    DeadLettered,
    Reason,
    reason_of,
    render_dead_letter,
    render_scored,
)

__all__ = ["SCORED_ROW_TYPE", "ArrowInferenceFunction", "arrow_inference_udf"]

#: Output rows of the operator: Kafka key and value, and whether it is a dead letter.
SCORED_ROW_TYPE = DataTypes.ROW([
    DataTypes.FIELD("key", DataTypes.STRING()),
    DataTypes.FIELD("value", DataTypes.STRING()),
    DataTypes.FIELD("dead", DataTypes.BOOLEAN()),
    DataTypes.FIELD("source", DataTypes.STRING()),
])


class ArrowInferenceFunction(ScalarFunction):  # type: ignore[misc]
    """Decode, infer and render one Arrow batch of raw Kafka records.

    Args:
        handler: Loads the model (once per worker, shared by its operators) and
            runs the model batches.
        batching: Batch size, token budget, buckets, optional p99 target.
        swap: Hot-swap pointer to poll; None: never swap.
        with_embedding: Add the sentiment model's embedding to each output.
        max_record_bytes: Most UTF-8 bytes of key + value a sink can write
            (:func:`~pyflink_aisp.kafka.sink_record_limit`): a larger output
            becomes an ``oversized_output`` dead letter; dead letters always fit.
        breaker: Circuit breaker over inference failures (decode dead letters do
            not count); None: never trips.
        affinity: GPU affinity lease taken in ``open()`` before the model loads
            (:func:`~pyflink_aisp.affinity.open_affinity`); None: none.
    """

    def __init__(self, handler: ModelHandler[Any, Any, Any], *, batching: BatchingConfig,
                 swap: ModelSwapConfig | None = None, with_embedding: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 breaker: BreakerConfig | None = None, affinity: AffinitySettings | None = None) -> None:
        if max_record_bytes < MIN_RECORD_BYTES:
            raise ConfigError(f"max_record_bytes must be >= {MIN_RECORD_BYTES}, got {max_record_bytes}")
        self._handler = handler
        self._handler_key = handler_key(handler)  # here, on the client: see handler_key
        self._batching = batching
        self._swap = swap
        self._with_embedding = with_embedding
        self._max_record_bytes = max_record_bytes
        self._breaker_config = breaker
        self._breaker: FailureRateBreaker | None = None
        self._runtime: ModelRuntime | None = None
        self._affinity_settings = affinity
        self._affinity: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_runtime"] = None
        state["_breaker"] = None
        state["_affinity"] = None
        return state

    def open(self, function_context: FunctionContext) -> None:
        """Acquire the worker's model and register the metrics.

        Raises:
            ModelError: The model cannot be loaded.
            AffinityError: ``affinity`` is set and no lease could be taken or applied.
        """
        self._affinity = open_affinity(self._affinity_settings, function_context)  # before CUDA starts
        self._runtime = ModelRuntime.acquire(self._handler, self._batching, swap=self._swap,
                                             key=self._handler_key)
        self._breaker = None if self._breaker_config is None else FailureRateBreaker(self._breaker_config)
        self._counts = {"recordsIn": 0, "recordsOut": 0, "deadLetters": 0, "arrowBatches": 0}
        self._sizes, self._serde_us, self._e2e_us = Window(), Window(), Window()
        try:
            group = function_context.get_metric_group().add_group("aisp")
        except RuntimeError:  # python.metric.enabled = false
            return
        for name in self._counts:
            group.gauge(name, self._count_reader(name))
        for name, window in (("arrowBatchSize", self._sizes), ("serializationUs", self._serde_us),
                             ("endToEndUs", self._e2e_us)):
            register_window(group, name, window)
        self._runtime.bind_metrics(group)
        if self._breaker is not None:
            bind_breaker_metrics(group, self._breaker)
        if self._affinity is not None:
            self._affinity.bind_metrics(group)

    def _count_reader(self, name: str) -> Callable[[], int]:
        return lambda: self._counts[name]

    def eval(self, frame: Any) -> Any:
        """``(n, 4)`` DataFrame ``value, topic, partition, offset`` → ``(n, 4)``
        DataFrame ``key, value, dead, source`` (``source``: the input record,
        ``topic/partition/offset``), in input order; never raises for a record.

        Raises:
            CircuitOpenError: The circuit breaker tripped (too many inference
                failures in its window): the job fails and Flink restarts it from
                the last checkpoint, instead of dead-lettering the stream.
        """
        import pandas as pd

        runtime = self._runtime
        if runtime is None:
            raise RuntimeError("ArrowInferenceFunction.eval called before open()")
        start = time.perf_counter()
        raw = frame.iloc[:, 0].tolist()
        topics = frame.iloc[:, 1].tolist()
        partitions = list(map(_coordinate, frame.iloc[:, 2].tolist()))
        offsets = list(map(_coordinate, frame.iloc[:, 3].tolist()))
        decoded = list(map(decode_record, raw, topics, partitions, offsets))
        good = [i for i, d in enumerate(decoded) if isinstance(d, DecodedRecord)]
        texts = [d.text for d in decoded if isinstance(d, DecodedRecord)]
        decoded_s = time.perf_counter()
        outcomes = runtime.infer_batch(texts) if texts else []
        inferred_s = time.perf_counter()
        keys: list[str] = [""] * len(decoded)
        values: list[str] = [""] * len(decoded)
        dead = [True] * len(decoded)
        limit = self._max_record_bytes
        for i, letter in enumerate(decoded):
            if isinstance(letter, DeadLetter):
                keys[i], values[i] = render_dead_letter(letter.outcome(), limit)
        failed, last_error = 0, None
        for i, outcome in zip(good, outcomes, strict=True):
            record = decoded[i]
            assert isinstance(record, DecodedRecord)
            if not isinstance(outcome, BaseException):
                try:
                    keys[i] = record.id
                    values[i] = render_scored(record.id, outcome.prediction, outcome.model_version,
                                              with_embedding=self._with_embedding, max_record_bytes=limit)
                    dead[i] = False
                    continue
                except (OversizedOutputError, InferenceError) as exc:
                    outcome = exc
            if reason_of(outcome) is Reason.INFERENCE_ERROR:
                failed, last_error = failed + 1, outcome
            failure = DeadLettered.of_error(outcome, id=record.id, topic=topics[i], partition=partitions[i],
                                            offset=offsets[i], value=_raw_bytes(raw[i]))
            keys[i], values[i] = render_dead_letter(failure, limit)
        end = time.perf_counter()
        self._record(len(decoded), len(decoded) - sum(dead), start, decoded_s, inferred_s, end)
        if self._breaker is not None:
            self._breaker.record_many(failed, len(good), last_error)
        sources = [f"{t}/{p}/{o}" for t, p, o in zip(topics, partitions, offsets, strict=True)]
        return pd.DataFrame({"key": keys, "value": values, "dead": dead, "source": sources})

    def _record(self, n: int, scored: int, start: float, decoded: float, inferred: float, end: float) -> None:
        self._counts["recordsIn"] += n
        self._counts["recordsOut"] += scored
        self._counts["deadLetters"] += n - scored
        self._counts["arrowBatches"] += 1
        self._sizes.add(n)
        self._serde_us.add((decoded - start + end - inferred) * 1e6)
        self._e2e_us.add((end - start) * 1e6)

    def close(self) -> None:
        """Release the worker's model (freed when its last user closes), then the affinity lease."""
        if self._runtime is not None:
            self._runtime.release()
            self._runtime = None
        if self._affinity is not None:
            self._affinity.close()
            self._affinity = None


def _coordinate(value: Any) -> int:
    """A partition or offset as an int; -1 (Kafka's "unknown") when Flink passed a null
    (pandas: NaN)."""
    return -1 if value is None or value != value else int(value)


def _raw_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def arrow_inference_udf(function: ArrowInferenceFunction) -> Any:
    """``function`` as a pandas UDF for ``Table.map`` (input: all columns of the table)."""
    return udf(function, result_type=SCORED_ROW_TYPE, func_type="pandas")
