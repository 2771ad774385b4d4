"""Dynamic micro-batching on one batching thread per model.

Records arrive one at a time through :meth:`MicroBatcher.submit` (thread-safe,
returns a ``concurrent.futures.Future``) or ``await submit_async`` (from any
asyncio event loop: PyFlink's ``AsyncFunction`` and ``AsyncScalarFunction``
run one per operator). One batching thread forms batches with a
:class:`~pyflink_aisp.inference._queue.BatchQueue` and calls the model, so
every operator of a Python worker can share one model and one batcher
(:class:`~pyflink_aisp.inference.ModelRuntime`). When the model is idle a
batch leaves as soon as the queue says one is ready (a full length bucket, or
the oldest record waited ``max_wait_ms``); while it computes, records
accumulate and the next batch leaves when it is free.

With ``latency_slo_ms`` set, an :class:`~pyflink_aisp.inference.SloController`
sees every batch and moves the batch size and wait between batches.

Failures: a batch whose model call raises is bisected until the failing
records are alone; they get the exception, the rest their results. An
out-of-memory error (:func:`is_out_of_memory`) is split the same way and also
caps later batches below the size that ran out of memory.

Thread-safety: ``submit``/``submit_async``/``close`` from any thread;
``run_batch`` and ``on_batch`` run on the batching thread only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pyflink_aisp.errors import InferenceError
from pyflink_aisp.inference._queue import BatchingConfig, BatchQueue
from pyflink_aisp.inference._slo import Knobs, SloController

__all__ = ["BatchReport", "BatchStats", "BatchingConfig", "MicroBatcher", "is_out_of_memory"]

T = TypeVar("T")
R = TypeVar("R")

_log = logging.getLogger(__name__)

#: Substrings of out-of-memory messages: ONNX Runtime ("Failed to allocate memory",
#: BFC arena), CUDA ("out of memory", cudaErrorMemoryAllocation), cuBLAS/cuDNN alloc failures.
_OOM_MARKERS = ("out of memory", "failed to allocate memory", "cudaerrormemoryallocation",
                "cublas_status_alloc_failed", "cudnn_status_alloc_failed", "bfcarena")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says the device or host ran out of memory: ``MemoryError``,
    ``torch.cuda.OutOfMemoryError`` (matched by name, torch is optional), or an
    ONNX Runtime / CUDA error whose message names an allocation failure."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    return any(marker in text for marker in _OOM_MARKERS)


@dataclass(frozen=True)
class _Failed:
    """The outcome of an item whose model call raised (kept apart from results)."""

    error: BaseException


@dataclass(frozen=True)
class _Pending(Generic[T, R]):
    item: T
    future: Future[R]
    arrived_s: float
    tokens: int


@dataclass(frozen=True)
class BatchReport:
    """What one model call did (passed to ``on_batch``).

    Attributes:
        size: Records in the batch.
        padded_tokens: ``size`` x the longest record's token count.
        queue_wait_s: Per record, seconds from submit to the batch leaving.
        compute_s: Seconds in ``run_batch`` (including bisection retries).
        failed: Records whose inference failed.
        knobs: Batch size and wait in force when the batch left.
    """

    size: int
    padded_tokens: int
    queue_wait_s: tuple[float, ...]
    compute_s: float
    failed: int
    knobs: Knobs


@dataclass
class BatchStats:
    """Counts kept by a batcher (written by the batching thread)."""

    batches: int = 0
    records: int = 0
    failed: int = 0
    max_batch_size: int = 0
    bisections: int = 0
    oom_splits: int = 0
    sizes: dict[int, int] = field(default_factory=dict)

    def add(self, size: int) -> None:
        """Record one dispatched batch of ``size`` records."""
        self.batches += 1
        self.records += size
        self.max_batch_size = max(self.max_batch_size, size)
        self.sizes[size] = self.sizes.get(size, 0) + 1


class MicroBatcher(Generic[T, R]):
    """Gathers submitted items into batches for one model function.

    Args:
        run_batch: Called with a list of items; returns one result per item, in order.
        config: Batch size, wait, token budget, buckets, and the optional p99 target.
        clock: Monotonic seconds (injected in tests).
        on_batch: Called after each batch with its :class:`BatchReport`.
        name: Name of the batching thread.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        config: BatchingConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_batch: Callable[[BatchReport], None] | None = None,
        name: str = "aisp-batcher",
    ) -> None:
        self._run_batch = run_batch
        self._config = config
        self._clock = clock
        self._on_batch = on_batch
        self._queue: BatchQueue[_Pending[T, R]] = BatchQueue(config)
        self._cond = threading.Condition()
        self._closed = False
        self._idle_wait = False
        self._size_cap = config.max_batch_size
        self._largest_ok, self._oom_seen = 0, False
        self.controller = (
            SloController(latency_slo_ms=config.latency_slo_ms, max_batch_size=config.max_batch_size,
                          max_wait_ms=config.max_wait_ms)
            if config.latency_slo_ms is not None else None
        )
        self.stats = BatchStats()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def knobs(self) -> Knobs:
        """Batch size and wait in force now (the controller's, capped after an OOM)."""
        knobs = self.controller.knobs if self.controller else Knobs(
            self._config.max_batch_size, self._config.max_wait_ms)
        return Knobs(min(knobs.max_batch_size, self._size_cap), knobs.max_wait_ms)

    def submit(self, item: T, tokens: int = 1) -> Future[R]:
        """Queue one item of ``tokens`` tokens; its future resolves with the result
        or the exception ``run_batch`` raised for it alone.

        Raises:
            InferenceError: the batcher is closed.
        """
        future: Future[R] = Future()
        with self._cond:
            if self._closed:
                raise InferenceError("the batcher is closed")
            now = self._clock()
            self._queue.put(_Pending(item, future, now, tokens), now, tokens)
            if self._idle_wait and (len(self._queue) == 1 or self._queue.ready(now)):
                self._cond.notify()
        return future

    async def submit_async(self, item: T, tokens: int = 1) -> R:
        """:meth:`submit` awaited on the running event loop."""
        return await asyncio.wrap_future(self.submit(item, tokens))

    def close(self) -> None:
        """Stop the batching thread after the batch in flight; records still
        queued fail with :class:`InferenceError`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run(batch)
            except BaseException as exc:  # SystemExit & co. from a handler: fail the batch, keep serving
                _log.exception("batch of %d failed outside the model's own errors", len(batch))
                error = InferenceError(f"the batch failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                for pending in batch:
                    _resolve(pending.future, error)

    def _next_batch(self) -> list[_Pending[T, R]] | None:
        """Wait until a batch is ready (or close); returns None when closed."""
        with self._cond:
            while not self._closed:
                knobs = self.knobs
                self._queue.set_limits(max_batch_size=knobs.max_batch_size, max_wait_ms=knobs.max_wait_ms)
                now = self._clock()
                if self._queue.ready(now):
                    return self._queue.take()
                deadline = self._queue.deadline_s()
                self._idle_wait = True
                self._cond.wait(None if deadline is None else max(deadline - now, 0.0))
                self._idle_wait = False
            closed = InferenceError("the batcher closed before this record was run")
            while self._queue:
                for pending in self._queue.take():
                    _resolve(pending.future, closed)
            return None

    def _run(self, batch: list[_Pending[T, R]]) -> None:
        knobs = self.knobs
        dispatched = self._clock()
        self.stats.add(len(batch))
        self._largest_ok, self._oom_seen = 0, False
        outcomes = self._run_isolating([p.item for p in batch])
        if self._oom_seen:  # cap at the largest size that ran: one bad record must not cap at 1
            self._size_cap = min(self._size_cap, max(self._largest_ok, 1))
            _log.warning("out of memory on a batch of %d; batches now at most %d", len(batch), self._size_cap)
        done = self._clock()
        failed = 0
        for pending, outcome in zip(batch, outcomes, strict=True):
            failed += isinstance(outcome, _Failed)
            _resolve(pending.future, outcome.error if isinstance(outcome, _Failed) else outcome)
        self.stats.failed += failed
        if self.controller is not None:
            self.controller.observe_batch(now_s=done, latencies_s=[done - p.arrived_s for p in batch],
                                          compute_s=done - dispatched)
        if self._on_batch is not None:
            report = BatchReport(len(batch), len(batch) * max(p.tokens for p in batch),
                                 tuple(dispatched - p.arrived_s for p in batch), done - dispatched,
                                 failed, knobs)
            try:
                self._on_batch(report)
            except Exception:  # metrics must never fail inference
                _log.exception("on_batch callback failed")

    def _run_isolating(self, items: list[T]) -> list[R | _Failed]:
        """``run_batch(items)``; when it raises, bisect: run each half again until the
        failing items are alone, so one poison record fails only itself. After an
        out-of-memory error, later batches are capped at the largest size that ran."""
        try:
            results: list[R | _Failed] = list(self._run_batch(items))
        except Exception as exc:
            oom = is_out_of_memory(exc)
            self._oom_seen = self._oom_seen or oom
            if len(items) == 1:
                return [_Failed(exc)]
            if oom:
                self.stats.oom_splits += 1
            else:
                self.stats.bisections += 1
            mid = len(items) // 2
            return self._run_isolating(items[:mid]) + self._run_isolating(items[mid:])
        if len(results) != len(items):
            error = ValueError(f"run_batch returned {len(results)} results for {len(items)} items")
            return [_Failed(error)] * len(items)
        self._largest_ok = max(self._largest_ok, len(items))
        return results


def _resolve(future: Future[R], outcome: R | BaseException) -> None:
    """Set a future's result or exception, unless its caller cancelled it."""
    if future.done():
        return
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:  # cancelled between the check and the set
        pass
