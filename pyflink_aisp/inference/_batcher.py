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

Whole batches arrive through :meth:`MicroBatcher.submit_chunk` (the batch path:
one future per submitted batch, no per-record object): the same thread cuts
them into model batches with a :class:`~pyflink_aisp.inference._chunks.ChunkQueue`
(sorted by length, within ``max_batch_size``, the token budget and the length
buckets; with ``batch_cuts`` ``cost``, at the cuts of least cost fitted from
the chunk batches that ran, :mod:`~pyflink_aisp.inference._cost`) and calls
``run_rows``. When both kinds wait, the older goes first.

With ``latency_slo_ms`` set, an :class:`~pyflink_aisp.inference.SloController`
sees every batch and moves the batch size and wait of the record path between
batches. Chunks are not cut by its batch size: a chunk's outcome is ready when
its last row has run, so batches below the cap only add model calls (the job
with ``--latency-slo-ms 150`` at 60 % of its maximum load, 2 cores: p99
Kafka-in to Kafka-out 4,249 ms while the controller cut chunks, 953 ms with
fixed cuts and 930 ms with cost cuts since; ``bench/REPORT.md``).

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
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError, InferenceError
from pyflink_aisp.inference._chunks import Chunk, ChunkQueue
from pyflink_aisp.inference._cost import BatchCostModel, BatchCuts
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
        run_rows: The batch path's model function: ``(payload, rows)`` → one
            result per row of ``rows`` (``(k,)`` indices into the submitted
            chunk), in order; None: :meth:`submit_chunk` is refused.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        config: BatchingConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_batch: Callable[[BatchReport], None] | None = None,
        name: str = "aisp-batcher",
        run_rows: Callable[[Any, npt.NDArray[np.intp]], Sequence[R]] | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._run_rows = run_rows
        self._chunks = ChunkQueue(config.length_buckets, config.max_batch_tokens)
        #: Fitted from every chunk batch that ran whole; cuts chunks when ``batch_cuts`` is ``cost``.
        self.cost_model = BatchCostModel()
        self._config = config
        self._clock = clock
        self._on_batch = on_batch
        self._queue: BatchQueue[_Pending[T, R]] = BatchQueue(config)
        self._cond = threading.Condition()
        self._closed = False
        self._idle_wait = False
        self._size_cap = config.max_batch_size
        self._largest_ok, self._oom_seen, self._split = 0, False, False
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

    def submit_chunk(self, payload: Any, lengths: npt.NDArray[np.int64]) -> Future[list[R | BaseException]]:
        """Queue a whole batch of ``n = len(lengths)`` rows (the batch path).

        Args:
            payload: Passed to ``run_rows`` with the rows of each model batch.
            lengths: ``(n,)`` int64 tokens per row (sorting, budget, buckets).

        Returns:
            A future of ``n`` outcomes in row order: ``run_rows``'s result for
            the row, or the exception its model call raised for it alone.

        Raises:
            ConfigError: No ``run_rows`` was given.
            InferenceError: The batcher is closed.
        """
        if self._run_rows is None:
            raise ConfigError("this batcher has no run_rows function: submit_chunk is not available")
        with self._cond:
            if self._closed:
                raise InferenceError("the batcher is closed")
            chunk = Chunk(payload, np.asarray(lengths, dtype=np.int64), self._clock())
            self._chunks.put(chunk)
            if self._idle_wait:
                self._cond.notify()
        return chunk.future

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
                if isinstance(batch, tuple):
                    self._run_chunk(*batch)
                else:
                    self._run(batch)
            except BaseException as exc:  # SystemExit & co. from a handler: fail the batch, keep serving
                _log.exception("batch failed outside the model's own errors")
                error = InferenceError(f"the batch failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                if isinstance(batch, tuple):
                    if batch[0].record(batch[1], [error] * len(batch[1])):
                        _resolve(batch[0].future, batch[0].outcomes)
                else:
                    for pending in batch:
                        _resolve(pending.future, error)

    def _next_batch(self) -> list[_Pending[T, R]] | tuple[Chunk, npt.NDArray[np.intp]] | None:
        """Wait until a batch is ready (or close): records, or ``(chunk, rows)``;
        None when closed."""
        with self._cond:
            while not self._closed:
                knobs = self.knobs
                self._queue.set_limits(max_batch_size=knobs.max_batch_size, max_wait_ms=knobs.max_wait_ms)
                now = self._clock()
                chunk_s = self._chunks.oldest_arrival_s()
                record_s = self._queue.oldest_arrival_s()
                records_first = chunk_s is None or (record_s is not None and record_s <= chunk_s)
                if self._queue.ready(now) and records_first:
                    return self._queue.take()
                if chunk_s is not None:
                    # a chunk resolves when its last row has run: smaller batches than the
                    # cap only add calls, so the SLO controller's batch size is not used here
                    cost = self.cost_model.cost if self._config.batch_cuts is BatchCuts.COST else None
                    return self._chunks.take(min(self._config.max_batch_size, self._size_cap), cost)
                deadline = self._queue.deadline_s()
                self._idle_wait = True
                self._cond.wait(None if deadline is None else max(deadline - now, 0.0))
                self._idle_wait = False
            closed = InferenceError("the batcher closed before this record was run")
            while self._queue:
                for pending in self._queue.take():
                    _resolve(pending.future, closed)
            for chunk in self._chunks.drain():
                rest = chunk.order[chunk.cursor:]
                chunk.record(rest, [closed] * len(rest))
                _resolve(chunk.future, chunk.outcomes)
            return None

    def _run_chunk(self, chunk: Chunk, rows: npt.NDArray[np.intp]) -> None:
        """One model batch of a chunk: run (bisecting failures), record, report."""
        assert self._run_rows is not None  # submit_chunk refuses chunks without it
        run_rows = self._run_rows
        knobs = self.knobs
        dispatched = self._clock()
        self.stats.add(len(rows))
        self._largest_ok, self._oom_seen, self._split = 0, False, False
        outcomes = self._run_isolating(rows, lambda part: run_rows(chunk.payload, part))
        self._cap_after_oom(len(rows))
        done = self._clock()
        failed = 0
        results: list[Any] = []
        for outcome in outcomes:
            if isinstance(outcome, _Failed):
                failed += 1
                results.append(outcome.error)
            else:
                results.append(outcome)
        self.stats.failed += failed
        padded_tokens = len(rows) * int(chunk.lengths[rows].max())
        if not failed and not self._split:  # the chunk path's lengths are real token counts
            self.cost_model.observe(padded_tokens, done - dispatched)
        if chunk.record(rows, results):
            _resolve(chunk.future, chunk.outcomes)
        waited = dispatched - chunk.arrived_s
        self._report(size=len(rows), padded_tokens=padded_tokens,
                     queue_wait_s=(waited,) * len(rows), latencies_s=[done - chunk.arrived_s] * len(rows),
                     dispatched=dispatched, done=done, failed=failed, knobs=knobs)

    def _run(self, batch: list[_Pending[T, R]]) -> None:
        knobs = self.knobs
        dispatched = self._clock()
        self.stats.add(len(batch))
        self._largest_ok, self._oom_seen, self._split = 0, False, False
        outcomes = self._run_isolating([p.item for p in batch], self._run_batch)
        self._cap_after_oom(len(batch))
        done = self._clock()
        failed = sum(isinstance(outcome, _Failed) for outcome in outcomes)
        self.stats.failed += failed  # counted before a caller can see its result (and read the gauge)
        for pending, outcome in zip(batch, outcomes, strict=True):
            _resolve(pending.future, outcome.error if isinstance(outcome, _Failed) else outcome)
        self._report(size=len(batch), padded_tokens=len(batch) * max(p.tokens for p in batch),
                     queue_wait_s=tuple(dispatched - p.arrived_s for p in batch),
                     latencies_s=[done - p.arrived_s for p in batch],
                     dispatched=dispatched, done=done, failed=failed, knobs=knobs)

    def _cap_after_oom(self, size: int) -> None:
        """After an OOM, cap batches at the largest size that ran: one bad record must not cap at 1."""
        if self._oom_seen:
            self._size_cap = min(self._size_cap, max(self._largest_ok, 1))
            _log.warning("out of memory on a batch of %d; batches now at most %d", size, self._size_cap)

    def _report(self, *, size: int, padded_tokens: int, queue_wait_s: tuple[float, ...],
                latencies_s: list[float], dispatched: float, done: float, failed: int, knobs: Knobs) -> None:
        """Feed the SLO controller and the ``on_batch`` callback."""
        if self.controller is not None:
            self.controller.observe_batch(now_s=done, latencies_s=latencies_s, compute_s=done - dispatched)
        if self._on_batch is not None:
            report = BatchReport(size, padded_tokens, queue_wait_s, done - dispatched, failed, knobs)
            try:
                self._on_batch(report)
            except Exception:  # metrics must never fail inference
                _log.exception("on_batch callback failed")

    def _run_isolating(self, items: Any, call: Callable[[Any], Sequence[R]]) -> list[R | _Failed]:
        """``call(items)``; when it raises, bisect: run each half again until the
        failing items are alone, so one poison record fails only itself. After an
        out-of-memory error, later batches are capped at the largest size that ran.
        ``items`` is a list of records or a ``(k,)`` array of chunk rows."""
        try:
            results: list[R | _Failed] = list(call(items))
        except Exception as exc:
            oom = is_out_of_memory(exc)
            self._oom_seen = self._oom_seen or oom
            if len(items) == 1:
                return [_Failed(exc)]
            self._split = True
            if oom:
                self.stats.oom_splits += 1
            else:
                self.stats.bisections += 1
            mid = len(items) // 2
            return self._run_isolating(items[:mid], call) + self._run_isolating(items[mid:], call)
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
