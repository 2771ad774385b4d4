"""A PyFlink async operator that batches records for a :class:`ModelHandler`.

Use with ``AsyncDataStream.unordered_wait`` / ``ordered_wait``: each record's
``async_invoke`` parks in the worker's :class:`MicroBatcher`, and one model
call serves a whole batch. ``capacity`` of the async operator bounds the
records in flight, so it must be ≥ ``max_batch_size`` for full batches (a
multiple of it lets the next batch form while the model computes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from pyflink.datastream.functions import AsyncFunction, RuntimeContext

from pyflink_aisp.inference._batcher import BatchingConfig, MicroBatcher
from pyflink_aisp.inference._handler import ModelHandler

__all__ = ["BatchedInferenceFunction"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")


class BatchedInferenceFunction(AsyncFunction, Generic[IN, OUT]):
    """Batched model inference as a PyFlink ``AsyncFunction``.

    Args:
        handler: Loads the model (once per worker, in ``open``) and runs batches.
        batching: Batch size and wait.
        extract: Record → model example (e.g. the text of a row).
        emit: ``(record, prediction, model_version)`` → output element.
        dead_letter: ``(record, error)`` → output element for a record whose
            inference failed (after bisection isolated it); None: the error fails
            the job.

    Metrics (operator metric group ``aisp``): counters ``batches``,
    ``recordsInferred``, ``inferenceFailures``; gauges ``lastBatchSize``,
    ``modelLoadTimeMs``.
    """

    def __init__(
        self,
        handler: ModelHandler[Any, Any, Any],
        *,
        batching: BatchingConfig,
        extract: Callable[[IN], Any],
        emit: Callable[[IN, Any, str], OUT],
        dead_letter: Callable[[IN, BaseException], OUT] | None = None,
    ) -> None:
        self._handler = handler
        self._batching = batching
        self._extract = extract
        self._emit = emit
        self._dead_letter = dead_letter
        self._model: Any = None
        self._batcher: MicroBatcher[Any, Any] | None = None
        self._version = ""

    def open(self, runtime_context: RuntimeContext) -> None:
        start = time.perf_counter()
        self._model = self._handler.load_model()
        load_ms = (time.perf_counter() - start) * 1000.0
        self._version = self._handler.model_version()
        self._batcher = MicroBatcher(self._run_batch, self._batching)
        self._last_batch = 0
        group = runtime_context.get_metrics_group().add_group("aisp")
        self._batches = group.counter("batches")
        self._records = group.counter("recordsInferred")
        self._failures = group.counter("inferenceFailures")
        group.gauge("lastBatchSize", lambda: self._last_batch)
        group.gauge("modelLoadTimeMs", lambda: int(load_ms))

    def _run_batch(self, examples: list[Any]) -> Sequence[Any]:
        out = self._handler.run_inference(examples, self._model)
        self._batches.inc()
        self._records.inc(len(examples))
        self._last_batch = len(examples)
        return out

    async def async_invoke(self, value: IN) -> list[OUT]:
        if self._batcher is None:
            raise RuntimeError("BatchedInferenceFunction used before open()")
        try:
            example = self._extract(value)
            tokens = self._handler.example_tokens(example, self._model)
            prediction = await self._batcher.submit(example, tokens)
        except Exception as exc:
            if self._dead_letter is None:
                raise
            self._failures.inc()
            return [self._dead_letter(value, exc)]
        return [self._emit(value, prediction, self._version)]

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
        if self._model is not None:
            self._handler.release_model(self._model)
            self._model = None
