"""A PyFlink async operator that batches records for a :class:`ModelHandler`.

Use with ``AsyncDataStream.unordered_wait`` or ``ordered_wait``: each record's
``async_invoke`` parks in the worker's shared
:class:`~pyflink_aisp.inference.ModelRuntime` batcher and one model call
serves a whole batch. The async operator's ``capacity`` bounds the records in
flight: it must be ≥ ``max_batch_size`` for full batches (a multiple lets the
next batch form while the model computes). When the model is slow, the
operator's queue fills and ``process_element`` blocks, which backpressures the
source; records are never dropped for it. The per-record ``timeout`` counts
from the record's entry into the operator, so give it room for ``capacity /
throughput`` seconds; a record that still times out goes to the dead-letter
output (reason ``inference_timeout``) instead of failing the job. The worker
lifecycle (lease, model, breaker, metrics, close) is the
:class:`~pyflink_aisp.pipeline._shell.OperatorShell`'s; this operator keeps the
per-record futures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pyflink.datastream.functions import AsyncFunction, RuntimeContext

from pyflink_aisp.affinity import AffinitySettings, open_affinity
from pyflink_aisp.errors import InferenceTimeoutError
from pyflink_aisp.inference import BatchingConfig, BreakerConfig, ModelHandler, ModelSwapConfig
from pyflink_aisp.outcome import DeadLettered
from pyflink_aisp.pipeline._shell import LeaseOpener, OperatorShell, WorkerSpec
from pyflink_aisp.pipeline._watch import DeadLetterWatchConfig

__all__ = ["BatchedInferenceFunction"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")

_COUNTERS = ("recordsIn", "recordsOut", "deadLetters")
_WINDOWS = ("serializationUs", "endToEndUs")


class BatchedInferenceFunction(AsyncFunction, Generic[IN, OUT]):
    """Batched model inference as a PyFlink ``AsyncFunction``.

    Args:
        handler: Loads the model (once per worker, shared by its operators) and
            runs batches.
        batching: Batch size, wait, token budget, buckets, optional p99 target.
        extract: Record → model example (e.g. the text of a row).
        emit: ``(record, prediction, model_version)`` → output element;
            ``model_version`` is the sha256 of the model that scored it.
        dead_letter: ``(input, error)`` → output element for an input that
            ``prepare`` or ``extract`` rejected, whose inference failed (after
            bisection isolated it) or that timed out; ``input`` is the element as
            the operator received it. None: the error fails the job.
        prepare: Input element → record (e.g. decode raw Kafka bytes), run first on
            the operator's thread; an exception dead-letters the input. None: the
            input is the record. Decoding here instead of in a separate Python
            operator saves one JVM↔Python hop and its serialization per record.
        swap: Where to look for new model versions (hot swap); None: never swap.
        breaker: Circuit breaker over inference outcomes (a failed or timed-out
            inference counts; a rejected ``prepare``/``extract`` or ``emit`` does
            not); when it opens, ``async_invoke`` raises
            :class:`~pyflink_aisp.errors.CircuitOpenError` and the job fails over.
            None: never trips.
        affinity: GPU affinity lease taken in ``open()`` before the model loads
            (:func:`~pyflink_aisp.affinity.open_affinity`); None: none.
        dead_letters: When the dead-letter watch warns or fails the job (None: its
            defaults); it counts every input, dead-lettered or not.
        open_lease: Takes the lease (inject a fake in unit tests).

    Metrics: see :mod:`pyflink_aisp.inference.metrics` (group ``aisp``).
    """

    def __init__(
        self,
        handler: ModelHandler[Any, Any, Any],
        *,
        batching: BatchingConfig,
        extract: Callable[[IN], Any],
        emit: Callable[[IN, Any, str], OUT],
        dead_letter: Callable[[IN, BaseException], OUT] | None = None,
        swap: ModelSwapConfig | None = None,
        prepare: Callable[[IN], Any] | None = None,
        breaker: BreakerConfig | None = None,
        affinity: AffinitySettings | None = None,
        dead_letters: DeadLetterWatchConfig | None = None,
        open_lease: LeaseOpener = open_affinity,
    ) -> None:
        self._extract = extract
        self._emit = emit
        self._dead_letter = dead_letter
        self._prepare = prepare
        self._timeouts: set[int] = set()  # id() of inputs timeout() answered while they ran on
        self._timeouts_lock = threading.Lock()
        spec = WorkerSpec.of(handler, batching=batching, swap=swap, breaker=breaker, affinity=affinity,
                             dead_letters=dead_letters)
        self._shell = OperatorShell(spec, counters=_COUNTERS, windows=_WINDOWS, open_lease=open_lease)

    @property
    def _counts(self) -> dict[str, int]:
        return self._shell.counts

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_timeouts", "_timeouts_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._timeouts, self._timeouts_lock = set(), threading.Lock()

    def open(self, runtime_context: RuntimeContext) -> None:
        """Take the lease, acquire the worker's model and register the metrics.

        Raises:
            ModelError: The model cannot be loaded.
            AffinityError: ``affinity`` is set and no lease could be taken or applied.
        """
        self._shell.open(runtime_context)

    async def async_invoke(self, value: IN) -> list[OUT]:
        """One input → one output (or its dead letter).

        Raises:
            OperatorNotOpenError: Called before ``open()``.
            CircuitOpenError: The breaker opened.
            DeadLetterRateError: The dead-letter share of the watch's window is above
                ``--max-dead-letter-rate``.
        """
        shell = self._shell
        runtime = shell.require("BatchedInferenceFunction.async_invoke")
        start = time.perf_counter()
        shell.counts["recordsIn"] += 1
        try:
            record = value if self._prepare is None else self._prepare(value)
            example = self._extract(record)
            serde = time.perf_counter() - start
        except Exception as exc:
            return self._dead_or_raise(value, exc)
        try:
            inferred = await runtime.infer(example)
        except Exception as exc:
            if self._timed_out(value):
                return []
            shell.judge(exc)
            return self._dead_or_raise(value, exc)
        if self._timed_out(value):  # PyFlink emitted its timeout dead letter and ignores this result
            return []
        shell.judge(None)
        try:
            emitted = time.perf_counter()
            out = self._emit(record, inferred.prediction, inferred.model_version)
        except Exception as exc:
            return self._dead_or_raise(value, exc)
        end = time.perf_counter()
        shell.windows["serializationUs"].add((serde + end - emitted) * 1e6)
        shell.windows["endToEndUs"].add((end - start) * 1e6)
        shell.counts["recordsOut"] += 1
        shell.watch_outcomes(1, ())
        return [out]

    def timeout(self, value: IN) -> list[OUT]:
        """A record waited longer than the operator's timeout: dead-letter it
        (reason ``inference_timeout``) when a dead-letter function is set."""
        error = InferenceTimeoutError("the record waited longer than the async operator's timeout")
        with self._timeouts_lock:
            self._timeouts.add(id(value))
        self._shell.judge(error)
        if self._dead_letter is None:
            return super().timeout(value)
        return [self._dead(value, error)]

    def _timed_out(self, value: IN) -> bool:
        """Whether ``timeout`` already answered for ``value`` (PyFlink does not cancel the
        coroutine): its late outcome must count nowhere, or one record counts twice."""
        with self._timeouts_lock:
            if id(value) in self._timeouts:
                self._timeouts.discard(id(value))
                return True
        return False

    def _dead_or_raise(self, value: IN, error: Exception) -> list[OUT]:
        """The input's dead letter; without a dead-letter function the error fails the job."""
        if self._dead_letter is None:
            raise error
        return [self._dead(value, error)]

    def _dead(self, value: IN, error: BaseException) -> OUT:
        assert self._dead_letter is not None
        self._shell.counts["deadLetters"] += 1
        out = self._dead_letter(value, error)
        self._shell.watch_outcomes(1, (DeadLettered.of_error(error),))
        return out

    def close(self) -> None:
        """Release the worker's model (freed when its last user closes), then the affinity lease."""
        self._shell.close()
