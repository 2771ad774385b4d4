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
output (reason ``inference_timeout``) instead of failing the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pyflink.datastream.functions import AsyncFunction, RuntimeContext

from pyflink_aisp.affinity import AffinitySettings, open_affinity
from pyflink_aisp.errors import InferenceError, InferenceTimeoutError
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

__all__ = ["BatchedInferenceFunction"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")


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

    Metrics: see :mod:`pyflink_aisp.inference.metrics` (group ``aisp``).
    """

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_runtime"] = None
        state["_breaker"] = None
        state["_affinity"] = None
        return state

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
    ) -> None:
        self._handler = handler
        self._handler_key = handler_key(handler)  # here, on the client: see handler_key
        self._batching = batching
        self._extract = extract
        self._emit = emit
        self._dead_letter = dead_letter
        self._swap = swap
        self._prepare = prepare
        self._breaker_config = breaker
        self._breaker: FailureRateBreaker | None = None
        self._runtime: ModelRuntime | None = None
        self._counts = {"recordsIn": 0, "recordsOut": 0, "deadLetters": 0}
        self._affinity_settings = affinity
        self._affinity: Any = None

    def open(self, runtime_context: RuntimeContext) -> None:
        self._affinity = open_affinity(self._affinity_settings, runtime_context)  # before CUDA starts
        self._runtime = ModelRuntime.acquire(self._handler, self._batching, swap=self._swap,
                                             key=self._handler_key)
        self._breaker = None if self._breaker_config is None else FailureRateBreaker(self._breaker_config)
        self._counts = {"recordsIn": 0, "recordsOut": 0, "deadLetters": 0}
        self._serde_us, self._e2e_us = Window(), Window()
        group = runtime_context.get_metrics_group().add_group("aisp")
        for name in self._counts:
            group.gauge(name, self._count_reader(name))
        register_window(group, "serializationUs", self._serde_us)
        register_window(group, "endToEndUs", self._e2e_us)
        self._runtime.bind_metrics(group)
        if self._breaker is not None:
            bind_breaker_metrics(group, self._breaker)
        if self._affinity is not None:
            self._affinity.bind_metrics(group)

    def _count_reader(self, name: str) -> Callable[[], int]:
        return lambda: self._counts[name]

    async def async_invoke(self, value: IN) -> list[OUT]:
        if self._runtime is None:
            raise InferenceError("BatchedInferenceFunction used before open()")
        start = time.perf_counter()
        self._counts["recordsIn"] += 1
        try:
            record = value if self._prepare is None else self._prepare(value)
            example = self._extract(record)
            serde = time.perf_counter() - start
        except Exception as exc:
            if self._dead_letter is None:
                raise
            return [self._dead(value, exc)]
        try:
            inferred = await self._runtime.infer(example)
        except Exception as exc:
            self._judge(exc)
            if self._dead_letter is None:
                raise
            return [self._dead(value, exc)]
        self._judge(None)
        try:
            emitted = time.perf_counter()
            out = self._emit(record, inferred.prediction, inferred.model_version)
        except Exception as exc:
            if self._dead_letter is None:
                raise
            return [self._dead(value, exc)]
        end = time.perf_counter()
        self._serde_us.add((serde + end - emitted) * 1e6)
        self._e2e_us.add((end - start) * 1e6)
        self._counts["recordsOut"] += 1
        return [out]

    def timeout(self, value: IN) -> list[OUT]:
        """A record waited longer than the operator's timeout: dead-letter it
        (reason ``inference_timeout``) when a dead-letter function is set."""
        error = InferenceTimeoutError("the record waited longer than the async operator's timeout")
        self._judge(error)
        if self._dead_letter is None:
            return super().timeout(value)
        return [self._dead(value, error)]

    def _judge(self, error: BaseException | None) -> None:
        """Count one inference outcome in the breaker (raises CircuitOpenError when it opens)."""
        if self._breaker is not None:
            self._breaker.record(error is not None, error)

    def _dead(self, value: IN, error: BaseException) -> OUT:
        assert self._dead_letter is not None
        self._counts["deadLetters"] += 1
        return self._dead_letter(value, error)

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.release()
            self._runtime = None
        if self._affinity is not None:
            self._affinity.close()
            self._affinity = None
