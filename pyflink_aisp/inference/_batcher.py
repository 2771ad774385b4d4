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

Pipelined batch path: given ``launch_rows``/``collect`` and a ``pipeline_depth``
above 1 (a CUDA handler's), the batching thread keeps up to that many launched
chunk batches in a FIFO. When a chunk batch is ready it is launched *before* the
oldest in flight is collected, so batch n+1 is prepared and enqueued while batch
n computes; when nothing is ready (or the FIFO is full) the oldest is collected.
A batch's outcomes are recorded when it is collected, each row once. The
per-record path stays synchronous: a record batch runs once nothing is in flight.
With depth 1, ``run_rows`` is called and waited for, as without a launcher.

With ``latency_slo_ms`` set, an :class:`~pyflink_aisp.inference.SloController`
sees every batch and moves the batch size and wait of the record path between
batches. Chunks are not cut by its batch size: a chunk's outcome is ready when
its last row has run, so batches below the cap only add model calls (the job
with ``--latency-slo-ms 150`` at 60 % of its maximum load, 2 cores: p99
Kafka-in to Kafka-out 4,249 ms while the controller cut chunks, 953 ms with
fixed cuts and 930 ms with cost cuts since; ``bench/REPORT.md``).

Failures: a batch whose model call raises is bisected until the failing
records are alone; they get the exception, the rest their results. An
out-of-memory error (:func:`is_out_of_memory`) is split the same way, once the
failed attempt's frames are cleared and ``on_oom`` ran (see ``_inflight``), and
also caps later batches below the size that ran out of memory. A launch or a
collect that raises collects the other batches in flight first, then runs that
batch's rows synchronously (launch and collect at once), bisecting as above.

Metrics: a pipelined batch's ``compute_s`` runs from its launch to its collect;
the cost model is fed from the later of its launch and the previous batch's
collect (the device's time for it alone, as batches compute one after another),
or, when the launched handle timed its own run (a ``compute_s`` attribute:
concurrent CPU runs, which do not compute one after another), that time.

Thread-safety: ``submit``/``submit_async``/``submit_chunk``/``close`` from any
thread; ``run_batch``, ``run_rows``, ``launch_rows``, ``collect``, ``on_oom`` and
``on_batch`` run on the batching thread only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError, InferenceError
from pyflink_aisp.inference._chunks import Chunk, ChunkQueue
from pyflink_aisp.inference._cost import BatchCostModel, BatchCuts
from pyflink_aisp.inference._inflight import Failed, Isolation, Launched, forget_frames, is_out_of_memory
from pyflink_aisp.inference._queue import BatchingConfig, BatchQueue
from pyflink_aisp.inference._slo import Knobs, SloController

__all__ = ["BatchReport", "BatchStats", "BatchingConfig", "MicroBatcher", "is_out_of_memory"]

T = TypeVar("T")
R = TypeVar("R")

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Pending(Generic[T, R]):
    item: T
    future: Future[R]
    arrived_s: float
    tokens: int


#: What the batching thread does next: a record batch, ``(chunk, rows, pipelined)``, or a collect.
_Work = list[_Pending[T, R]] | tuple[Chunk, npt.NDArray[np.intp], bool] | Launched


@dataclass(frozen=True)
class BatchReport:
    """What one model call did (passed to ``on_batch``).

    Attributes:
        size: Records in the batch.
        padded_tokens: ``size`` x the longest record's token count.
        queue_wait_s: Per record, seconds from submit to the batch leaving.
        compute_s: Seconds in ``run_batch`` (including bisection retries); for a
            pipelined batch, from its launch to its collect.
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
        launch_rows: The pipelined batch path: ``(payload, rows)`` → a handle,
            starting the model batch without waiting for it; needs ``run_rows``
            and ``collect``. None: every chunk batch runs through ``run_rows``.
        collect: ``handle`` → the launched batch's results, one per row, in order
            (waits for them). Each handle is collected once, in launch order, except
            handles with ``add_done_callback(fn)`` and ``done()`` (``concurrent.futures.Future``):
            while all in flight are such, the batching thread waits for one to finish or for
            new work instead of waiting on the oldest, so a chunk submitted meanwhile launches
            beside them below ``pipeline_depth`` (e.g. one record from each of two callers on
            two concurrent runs), and each is collected once done, ahead of older ones.
        pipeline_depth: Most launched batches not yet collected (an int, or a
            callable read before each batch, e.g. the model's after a hot swap);
            1 (or no ``launch_rows``): ``run_rows`` is called and waited for.
        on_oom: Called after an out-of-memory error, once the failed attempt's frames
            are cleared and before it is split and retried (e.g. empty a CUDA cache).

    Raises:
        ConfigError: ``launch_rows`` without ``collect`` or ``run_rows`` (or ``collect``
            without ``launch_rows``), or an int ``pipeline_depth`` below 1.
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
        launch_rows: Callable[[Any, npt.NDArray[np.intp]], Any] | None = None,
        collect: Callable[[Any], Sequence[R]] | None = None,
        pipeline_depth: int | Callable[[], int] = 1,
        on_oom: Callable[[], None] | None = None,
    ) -> None:
        if (launch_rows is None) != (collect is None) or (launch_rows is not None and run_rows is None):
            raise ConfigError("launch_rows needs collect and run_rows, and collect needs launch_rows")
        if isinstance(pipeline_depth, int) and pipeline_depth < 1:
            raise ConfigError(f"pipeline_depth must be >= 1, got {pipeline_depth}")
        self._run_batch = run_batch
        self._run_rows = run_rows
        self._launch_rows, self._collect = launch_rows, collect
        self._depth = pipeline_depth
        self._on_oom = on_oom
        self._inflight: deque[Launched] = deque()  # the batching thread's only
        self._last_done_s: float | None = None
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

    @property
    def pipeline_depth(self) -> int:
        """Most chunk batches in flight now (1 without a launcher, or when the depth callable
        raises or returns no int: logged, and the batches in flight are collected first)."""
        if self._launch_rows is None:
            return 1
        try:
            return max(1, int(self._depth() if callable(self._depth) else self._depth))
        except Exception:  # a broken hook must not stop the batching thread (its futures would hang)
            _log.exception("pipeline_depth failed; running model batches one at a time")
            return 1

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
            payload: Passed to ``run_rows`` (or ``launch_rows``) with the rows of each model batch.
            lengths: ``(n,)`` int64 tokens per row (sorting, budget, buckets).

        Returns:
            A future of ``n`` outcomes in row order: the model function's result for
            the row, or the exception its model call raised for it alone; it resolves
            once every row has its outcome (each row gets exactly one).

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
        """Stop the batching thread after the batch running and those in flight are
        collected; records and chunk rows still queued fail with :class:`InferenceError`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            work = self._next_work()
            if work is None:
                return
            self._guarded(work)

    def _guarded(self, work: _Work[T, R]) -> None:
        """Run one unit of work: a record batch, a chunk batch (``pipelined``: launch it)
        or the collect of a launched batch; an error outside the model's own fails its items."""
        try:
            if isinstance(work, Launched):
                self._collect_launched(work)
            elif isinstance(work, tuple):
                chunk, rows, pipelined = work
                (self._launch_chunk if pipelined else self._run_chunk)(chunk, rows)
            else:
                self._run(work)
        except BaseException as exc:  # SystemExit & co. from a handler: fail the batch, keep serving
            _log.exception("batch failed outside the model's own errors")
            error = InferenceError(f"the batch failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            if isinstance(work, Launched | tuple):
                chunk, rows = (work.chunk, work.rows) if isinstance(work, Launched) else work[:2]
                if chunk.record(rows, [error] * len(rows)):
                    _resolve(chunk.future, chunk.outcomes)
            else:
                for pending in work:
                    _resolve(pending.future, error)

    def _next_work(self) -> _Work[T, R] | None:
        """Wait until there is work (or close): a record batch, ``(chunk, rows, pipelined)``
        or the oldest launched batch to collect; None once closed and nothing is in flight."""
        with self._cond:
            while not self._closed:
                knobs = self.knobs
                self._queue.set_limits(max_batch_size=knobs.max_batch_size, max_wait_ms=knobs.max_wait_ms)
                now = self._clock()
                chunk_s = self._chunks.oldest_arrival_s()
                record_s = self._queue.oldest_arrival_s()
                records_first = chunk_s is None or (record_s is not None and record_s <= chunk_s)
                if self._queue.ready(now) and records_first:
                    # the per-record path is synchronous: it runs with nothing in flight
                    return self._inflight.popleft() if self._inflight else self._queue.take()
                depth = self.pipeline_depth
                if chunk_s is not None and len(self._inflight) < depth:
                    # launched BEFORE the oldest in flight is collected: it overlaps that one's compute.
                    # A chunk resolves when its last row has run: smaller batches than the cap only
                    # add calls, so the SLO controller's batch size is not used here
                    cost = self.cost_model.cost if self._config.batch_cuts is BatchCuts.COST else None
                    taken = self._chunks.take(min(self._config.max_batch_size, self._size_cap), cost)
                    assert taken is not None  # a chunk is queued
                    return taken[0], taken[1], depth > 1
                if self._inflight:
                    finished = next((e for e in self._inflight if e.done is not None and e.done()), None)
                    if finished is not None:  # ahead of older batches still running
                        self._inflight.remove(finished)
                        return finished
                    if any(e.done is None for e in self._inflight):
                        return self._inflight.popleft()  # a handle that cannot wake us: wait on it
                deadline = self._queue.deadline_s()
                self._idle_wait = True
                self._cond.wait(None if deadline is None else max(deadline - now, 0.0))
                self._idle_wait = False
            if self._inflight:  # collected before what is queued fails
                return self._inflight.popleft()
            self._fail_queued()
            return None

    def _watch(self, handle: Any) -> Callable[[], bool] | None:
        """``handle.done`` once a callback that wakes the batching thread is registered on it
        (a Future-like handle), else None (the handle is collected by waiting on it)."""
        add, done = getattr(handle, "add_done_callback", None), getattr(handle, "done", None)
        if not (callable(add) and callable(done)):
            return None
        add(lambda _handle: self._wake())
        return done  # type: ignore[no-any-return]

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _fail_queued(self) -> None:
        """On close (under the lock): every queued record and chunk row fails."""
        closed = InferenceError("the batcher closed before this record was run")
        while self._queue:
            for pending in self._queue.take():
                _resolve(pending.future, closed)
        for chunk in self._chunks.drain():
            rest = chunk.order[chunk.cursor:]
            chunk.record(rest, [closed] * len(rest))
            _resolve(chunk.future, chunk.outcomes)

    def _run_chunk(self, chunk: Chunk, rows: npt.NDArray[np.intp]) -> None:
        """One model batch of a chunk, synchronous: run (bisecting failures), record, report."""
        assert self._run_rows is not None  # submit_chunk refuses chunks without it
        run_rows = self._run_rows
        knobs, dispatched = self.knobs, self._clock()
        self.stats.add(len(rows))
        self._isolated(chunk, rows, lambda part: run_rows(chunk.payload, part), knobs, dispatched)

    def _launch_chunk(self, chunk: Chunk, rows: npt.NDArray[np.intp]) -> None:
        """One model batch of a chunk, pipelined: launch it and queue it for collection;
        a launch that raises collects the batches in flight, then runs it synchronously."""
        assert self._launch_rows is not None
        knobs, dispatched = self.knobs, self._clock()
        self.stats.add(len(rows))
        try:
            handle = self._launch_rows(chunk.payload, rows)
        except Exception as exc:
            error = exc
        else:
            self._inflight.append(Launched(chunk, rows, handle, dispatched, knobs, self._watch(handle)))
            return
        forget_frames(error, keep_traceback=True)  # the failed launch's data dies before anything runs
        self._collect_all()  # an OOM retry must not compete with batches in flight for memory
        self._isolated(chunk, rows, self._launch_and_collect(chunk), knobs, dispatched, error)

    def _collect_launched(self, entry: Launched) -> None:
        """Collect the oldest launched batch: record its outcomes and report it; a collect
        that raises collects the other batches in flight, then runs it synchronously."""
        assert self._collect is not None
        try:
            results: list[Any] = list(self._collect(entry.handle))
        except Exception as exc:
            error = exc
        else:
            if len(results) != len(entry.rows):
                wrong = ValueError(f"collect returned {len(results)} results for {len(entry.rows)} rows")
                results = [Failed(wrong)] * len(entry.rows)
            own = getattr(entry.handle, "compute_s", None)  # a run that timed itself (concurrent CPU runs)
            busy_from = (self._clock() - own if isinstance(own, int | float)
                         else max(entry.dispatched_s, self._last_done_s or entry.dispatched_s))
            self._finish(entry.chunk, entry.rows, results, entry.knobs, entry.dispatched_s, busy_from, False)
            return
        forget_frames(error, keep_traceback=True)
        self._collect_all()
        self._isolated(entry.chunk, entry.rows, self._launch_and_collect(entry.chunk), entry.knobs,
                       entry.dispatched_s, error)

    def _collect_all(self) -> None:
        while self._inflight:
            self._guarded(self._inflight.popleft())

    def _launch_and_collect(self, chunk: Chunk) -> Callable[[npt.NDArray[np.intp]], Sequence[R]]:
        """The pipelined model function made synchronous (failure isolation)."""
        assert self._launch_rows is not None and self._collect is not None
        launch, collect = self._launch_rows, self._collect
        return lambda part: collect(launch(chunk.payload, part))

    def _isolated(self, chunk: Chunk, rows: npt.NDArray[np.intp], call: Callable[[Any], Sequence[R]],
                  knobs: Knobs, dispatched: float, failed: Exception | None = None) -> None:
        """Run ``call`` on ``rows`` until each has an outcome (``failed``: it already raised), then finish."""
        isolation = Isolation(self.stats, self._on_oom)
        outcomes = isolation.run(rows, call, failed)
        self._cap_after_oom(isolation, len(rows))
        self._finish(chunk, rows, outcomes, knobs, dispatched, dispatched, isolation.split)

    def _finish(self, chunk: Chunk, rows: npt.NDArray[np.intp], outcomes: list[Any], knobs: Knobs,
                dispatched: float, busy_from: float, split: bool) -> None:
        """Record a chunk batch's outcomes (resolving the chunk when it is complete) and report it.
        The cost model sees ``busy_from`` → now: a pipelined batch is charged from the later of
        its launch and the previous batch's collect, the device's time for it alone."""
        done = self._clock()
        self._last_done_s = done
        results = [outcome.error if isinstance(outcome, Failed) else outcome for outcome in outcomes]
        failed = sum(isinstance(outcome, Failed) for outcome in outcomes)
        self.stats.failed += failed
        padded_tokens = len(rows) * int(chunk.lengths[rows].max())
        if not failed and not split:  # the chunk path's lengths are real token counts
            self.cost_model.observe(padded_tokens, done - busy_from)
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
        isolation = Isolation(self.stats, self._on_oom)
        outcomes = isolation.run([p.item for p in batch], self._run_batch)
        self._cap_after_oom(isolation, len(batch))
        done = self._clock()
        failed = sum(isinstance(outcome, Failed) for outcome in outcomes)
        self.stats.failed += failed  # counted before a caller can see its result (and read the gauge)
        for pending, outcome in zip(batch, outcomes, strict=True):
            _resolve(pending.future, outcome.error if isinstance(outcome, Failed) else outcome)
        self._report(size=len(batch), padded_tokens=len(batch) * max(p.tokens for p in batch),
                     queue_wait_s=tuple(dispatched - p.arrived_s for p in batch),
                     latencies_s=[done - p.arrived_s for p in batch],
                     dispatched=dispatched, done=done, failed=failed, knobs=knobs)

    def _cap_after_oom(self, isolation: Isolation, size: int) -> None:
        """After an OOM, cap batches at the largest size that ran: one bad record must not cap at 1."""
        if isolation.oom_seen:
            self._size_cap = min(self._size_cap, max(isolation.largest_ok, 1))
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
