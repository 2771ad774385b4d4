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
rendered by the handler's :class:`~pyflink_aisp.inference.Task` (its own output
fields between ``id`` and ``model_sha256``). No per-record future, coroutine or
token count. With a pipelined model (a CUDA handler's ``pipeline_depth`` > 1) that
call submits the Arrow batch as consecutive slices of two model batches without
waiting between them, so tokenizing slice k+1 on this thread overlaps the device
computing slice k; on the CPU (depth 1) it is one submitted batch. The worker
lifecycle (lease, model, breaker, metrics, close) is the
:class:`~pyflink_aisp.pipeline._shell.OperatorShell`'s.

Records leave in their input order. A bundle ends after
``python.fn-execution.bundle.time``; outputs go to the sinks then.

Metrics (operator group ``aisp``, gauges): ``recordsIn``, ``recordsOut``,
``deadLetters``, ``arrowBatches``, ``deadLetterAlarm`` and ``deadLetterSharePercent``
(the :class:`~pyflink_aisp.pipeline._watch.DeadLetterWatch`), P50/P99/Max of ``arrowBatchSize``,
``serializationUs`` (decode + render per Arrow batch) and ``endToEndUs``
(per Arrow batch, entry to output), plus the runtime's own (batch sizes,
queue wait, compute, swaps).
"""

from __future__ import annotations

import time
from itertools import repeat
from pathlib import Path
from typing import Any

from pyflink.table import DataTypes
from pyflink.table.udf import FunctionContext, ScalarFunction, udf

from pyflink_aisp.affinity import AffinitySettings, open_affinity
from pyflink_aisp.errors import ConfigError, InferenceError, OversizedOutputError
from pyflink_aisp.inference import BatchingConfig, BreakerConfig, Inferred, ModelHandler, ModelSwapConfig
from pyflink_aisp.inference.tasks import check_kept_names, check_task, render_prediction
from pyflink_aisp.kafka import DEFAULT_MAPPING, DecodedRecord, FieldMapping, decode_record
from pyflink_aisp.outcome import (
    DEFAULT_MAX_RECORD_BYTES,
    MIN_RECORD_BYTES,
    DeadLettered,
    Reason,
    reason_of,
    render_dead_letter,
)
from pyflink_aisp.pipeline._shell import LeaseOpener, OperatorShell, WorkerSpec
from pyflink_aisp.pipeline._trace import LatencyTrace
from pyflink_aisp.pipeline._watch import DeadLetterWatchConfig

__all__ = ["SCORED_ROW_TYPE", "ArrowInferenceFunction", "arrow_inference_udf"]

#: Output rows of the operator: Kafka key and value, and whether it is a dead letter.
SCORED_ROW_TYPE = DataTypes.ROW([
    DataTypes.FIELD("key", DataTypes.STRING()),
    DataTypes.FIELD("value", DataTypes.STRING()),
    DataTypes.FIELD("dead", DataTypes.BOOLEAN()),
    DataTypes.FIELD("source", DataTypes.STRING()),
])

_COUNTERS = ("recordsIn", "recordsOut", "deadLetters", "arrowBatches")
_WINDOWS = ("arrowBatchSize", "serializationUs", "endToEndUs")


#: Reasons the circuit breaker counts: the model (or its server) failed, not the record's data.
_MODEL_FAILURES = frozenset({Reason.INFERENCE_ERROR, Reason.REMOTE_ERROR, Reason.REMOTE_TIMEOUT,
                             Reason.INVALID_MODEL_OUTPUT})


class ArrowInferenceFunction(ScalarFunction):  # type: ignore[misc]
    """Decode, infer and render one Arrow batch of raw Kafka records.

    Args:
        handler: Loads the model (once per worker, shared by its operators), runs
            the model batches and declares the output fields (:meth:`ModelHandler.task`).
        batching: Batch size, token budget, buckets, optional p99 target.
        swap: Hot-swap pointer to poll; None: never swap.
        with_embedding: Ask the handler's task for each record's embedding too.
        max_record_bytes: Most UTF-8 bytes of key + value a sink can write
            (:func:`~pyflink_aisp.kafka.sink_record_limit`): a larger output
            becomes an ``oversized_output`` dead letter; dead letters always fit.
        breaker: Circuit breaker over inference failures (decode dead letters do
            not count); None: never trips.
        affinity: GPU affinity lease taken in ``open()`` before the model loads
            (:func:`~pyflink_aisp.affinity.open_affinity`); None: none.
        dead_letters: When the dead-letter watch warns or fails the job (None: its defaults).
        mapping: Where each record's text and id are, and the fields its output keeps.
        latency_trace: Directory of the per-Arrow-batch latency trace
            (:mod:`~pyflink_aisp.pipeline._trace`); None: no trace.
        open_lease: Takes the lease (inject a fake in unit tests).

    Raises:
        ConfigError: ``max_record_bytes`` below :data:`~pyflink_aisp.outcome.MIN_RECORD_BYTES`,
            or the handler declares no task, or a mapping with a second text (``text_pair``)
            for a handler that does not accept pairs, or prompt fields other than the handler's.
    """

    def __init__(self, handler: ModelHandler[Any, Any, Any], *, batching: BatchingConfig,
                 swap: ModelSwapConfig | None = None, with_embedding: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 breaker: BreakerConfig | None = None, affinity: AffinitySettings | None = None,
                 dead_letters: DeadLetterWatchConfig | None = None,
                 mapping: FieldMapping = DEFAULT_MAPPING, latency_trace: Path | None = None,
                 open_lease: LeaseOpener = open_affinity) -> None:
        if max_record_bytes < MIN_RECORD_BYTES:
            raise ConfigError(f"max_record_bytes must be >= {MIN_RECORD_BYTES}, got {max_record_bytes}")
        self._task = check_task(handler.task(with_embedding=with_embedding))
        self._max_record_bytes = max_record_bytes
        self._mapping = mapping
        check_kept_names(mapping.kept_names, self._task)
        if mapping.text_pair is not None and not handler.accepts_text_pairs:
            raise ConfigError(f"--text-pair-field {mapping.text_pair}: {type(handler).__name__} takes one "
                              "text per record; pair models run as --classifier or --encoder-onnx (or a "
                              "handler whose accepts_text_pairs is True)")
        if mapping.prompt_names != list(handler.prompt_fields):
            raise ConfigError(f"--prompt-fields {list(mapping.prompt_fields)} fill the placeholders "
                              f"{mapping.prompt_names}, but {type(handler).__name__} takes "
                              f"{list(handler.prompt_fields) or 'none'}: prompt fields are a generation "
                              "model's (--remote-api openai-chat or openai-completions)")
        spec = WorkerSpec.of(handler, batching=batching, swap=swap, breaker=breaker, affinity=affinity,
                             dead_letters=dead_letters)
        self._shell = OperatorShell(spec, counters=_COUNTERS, windows=_WINDOWS, open_lease=open_lease)
        self._trace = LatencyTrace(latency_trace) if latency_trace is not None else None

    def open(self, function_context: FunctionContext) -> None:
        """Take the lease, acquire the worker's model and register the metrics.

        Raises:
            ModelError: The model cannot be loaded.
            AffinityError: ``affinity`` is set and no lease could be taken or applied.
            OSError: The latency trace's file cannot be opened.
        """
        self._shell.open(function_context)
        if self._trace is not None:
            self._trace.open(function_context.get_index_of_this_subtask())

    def eval(self, frame: Any) -> Any:
        """``(n, 4)`` DataFrame ``value, topic, partition, offset`` (``(n, 5)`` with ``key`` last
        when the id is the Kafka key) → ``(n, 4)``
        DataFrame ``key, value, dead, source`` (``source``: the input record,
        ``topic/partition/offset``), in input order; never raises for a record.

        Raises:
            CircuitOpenError: The circuit breaker tripped (too many inference
                failures in its window): the job fails and Flink restarts it from
                the last checkpoint, instead of dead-lettering the stream.
            DeadLetterRateError: The dead-letter share of the watch's window is above
                ``--max-dead-letter-rate``.
            OperatorNotOpenError: Called before ``open()``.
        """
        import pandas as pd

        keys = frame.iloc[:, 4].tolist() if self._mapping.id_from_key else None
        out_keys, values, dead, sources = self.score_columns(
            frame.iloc[:, 0].tolist(), frame.iloc[:, 1].tolist(), frame.iloc[:, 2].tolist(),
            frame.iloc[:, 3].tolist(), keys, caller="ArrowInferenceFunction.eval")
        return pd.DataFrame({"key": out_keys, "value": values, "dead": dead, "source": sources})

    def score_columns(self, raw: list[Any], topics: list[Any], partitions: list[Any], offsets: list[Any],
                      keys: list[Any] | None, *, caller: str
                      ) -> tuple[list[str], list[str], list[bool], list[str]]:
        """Decode, infer and render ``n`` records given as columns; ``(keys, values, dead, sources)``,
        ``n`` each, in input order (the body of :meth:`eval`, shared with the per-record operator).

        Args:
            raw: Kafka values (bytes; None for a tombstone).
            topics, partitions, offsets: Their coordinates (None/NaN partition or offset: -1).
            keys: Kafka keys when the id is the key, else None.
            caller: Named in :class:`~pyflink_aisp.errors.OperatorNotOpenError`.

        Raises:
            CircuitOpenError, DeadLetterRateError, OperatorNotOpenError: as :meth:`eval`.
        """
        runtime = self._shell.require(caller)
        start, wall_ms = time.perf_counter(), time.time() * 1000.0
        partitions = list(map(_coordinate, partitions))
        offsets = list(map(_coordinate, offsets))
        decoded = list(map(decode_record, raw, topics, partitions, offsets, repeat(self._mapping),
                           repeat(None) if keys is None else keys))
        good = [i for i, d in enumerate(decoded) if isinstance(d, DecodedRecord)]
        texts = [d.model_input for d in decoded if isinstance(d, DecodedRecord)]
        decoded_s = time.perf_counter()
        outcomes = runtime.infer_batch(texts) if texts else []
        inferred_s = time.perf_counter()
        rows = [render_dead_letter(d, self._max_record_bytes) if isinstance(d, DeadLettered) else ("", "")
                for d in decoded]
        dead = [True] * len(decoded)
        letters = [d for d in decoded if isinstance(d, DeadLettered)]
        failed, last_error = 0, None
        for i, outcome in zip(good, outcomes, strict=True):
            record = decoded[i]
            assert isinstance(record, DecodedRecord)
            rows[i], error, letter = self._render(record, outcome, raw[i], topics[i], partitions[i],
                                                  offsets[i])
            dead[i] = error is not None
            if letter is not None:
                letters.append(letter)
            if error is not None and reason_of(error) in _MODEL_FAILURES:
                failed, last_error = failed + 1, error
        end = time.perf_counter()
        self._record(len(decoded), len(decoded) - sum(dead), start, decoded_s, inferred_s, end)
        if self._trace is not None:
            self._trace.write(wall_ms, wall_ms + (decoded_s - start) * 1000.0,
                              wall_ms + (inferred_s - start) * 1000.0, wall_ms + (end - start) * 1000.0,
                              [d.id for d in decoded if isinstance(d, DecodedRecord)])
        self._shell.judge_many(failed, len(good), last_error)
        self._shell.watch_outcomes(len(decoded), letters)
        sources = [f"{t}/{p}/{o}" for t, p, o in zip(topics, partitions, offsets, strict=True)]
        return [k for k, _ in rows], [v for _, v in rows], dead, sources

    def _render(self, record: DecodedRecord, outcome: Inferred | BaseException, raw: Any, topic: str,
                partition: int, offset: int
                ) -> tuple[tuple[str, str], BaseException | None, DeadLettered | None]:
        """``((key, value), None, None)`` of a scored record, else its rendered dead letter, the
        error and the letter."""
        if not isinstance(outcome, BaseException):
            try:
                kept = dict(record.kept) if record.kept else None
                return (record.id, render_prediction(self._task, record.id, outcome.prediction,
                                                     outcome.model_version, kept=kept,
                                                     max_record_bytes=self._max_record_bytes)), None, None
            except (OversizedOutputError, InferenceError) as exc:
                outcome = exc
        letter = DeadLettered.of_error(outcome, id=record.id, topic=topic, partition=partition, offset=offset,
                                       value=_raw_bytes(raw))
        return render_dead_letter(letter, self._max_record_bytes), outcome, letter

    def _record(self, n: int, scored: int, start: float, decoded: float, inferred: float, end: float) -> None:
        counts, windows = self._shell.counts, self._shell.windows
        counts["recordsIn"] += n
        counts["recordsOut"] += scored
        counts["deadLetters"] += n - scored
        counts["arrowBatches"] += 1
        windows["arrowBatchSize"].add(n)
        windows["serializationUs"].add((decoded - start + end - inferred) * 1e6)
        windows["endToEndUs"].add((end - start) * 1e6)

    def close(self) -> None:
        """Release the worker's model (freed when its last user closes), then the affinity lease,
        and close the latency trace."""
        self._shell.close()
        if self._trace is not None:
            self._trace.close()


def _coordinate(value: Any) -> int:
    """A partition or offset as an int; -1 (Kafka's "unknown") when Flink passed a null
    (pandas: NaN)."""
    return -1 if value is None or value != value else int(value)


def _raw_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def arrow_inference_udf(function: ArrowInferenceFunction) -> Any:
    """``function`` as a pandas UDF for ``Table.map`` (input: all columns of the table)."""
    return udf(function, result_type=SCORED_ROW_TYPE, func_type="pandas")
