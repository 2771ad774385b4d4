"""Dynamic micro-batching for async operators.

Records arrive one at a time through ``await batcher.submit(x)`` (from
PyFlink's ``AsyncFunction.async_invoke``, which runs on one asyncio event loop
per Python worker). The batcher gathers them and calls the model once per
batch in a worker thread, so the event loop keeps accepting records while the
model computes. When the model is idle, a batch leaves as soon as
:class:`~pyflink_aisp.inference._queue.BatchQueue` says one is ready (a full
length bucket, or the oldest record waited ``max_wait_ms``); while the model
is busy, records accumulate and the next batch leaves as soon as it is free.

Thread-safety: ``submit`` must be called from one event loop; ``run_batch``
runs on the batcher's single executor thread, never concurrently with itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pyflink_aisp.inference._queue import BatchingConfig, BatchQueue

__all__ = ["BatchStats", "BatchingConfig", "MicroBatcher"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class _Failed:
    """The outcome of an item whose model call raised (kept apart from results)."""

    error: BaseException


@dataclass
class BatchStats:
    """Counts kept by a batcher (read them from the event loop's thread)."""

    batches: int = 0
    records: int = 0
    max_batch_size: int = 0
    bisections: int = 0
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
        run_batch: Called with a list of items; must return one result per item,
            in order. When it raises, the batch is bisected until the failing
            items are alone; each of those gets the exception, the rest results.
        config: Batch size and wait.
    """

    def __init__(self, run_batch: Callable[[list[T]], Sequence[R]], config: BatchingConfig) -> None:
        self._run_batch = run_batch
        self._config = config
        self._queue: BatchQueue[tuple[T, asyncio.Future[R]]] = BatchQueue(config)
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aisp-batch")
        self.stats = BatchStats()

    async def submit(self, item: T, tokens: int = 1) -> R:
        """Queue one item of ``tokens`` tokens (for length buckets and the token
        budget) and wait for its result.

        Raises:
            Exception: whatever ``run_batch`` raised for the batch holding the item.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._queue.put((item, future), loop.time(), tokens)
        self._maybe_dispatch(loop)
        return await future

    def close(self) -> None:
        """Stop the executor thread (pending items are not run)."""
        if self._timer is not None:
            self._timer.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _maybe_dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._busy or not self._queue:
            return
        if self._queue.ready(loop.time()):
            self._dispatch(loop)
        elif self._timer is None:
            deadline = self._queue.deadline_s()
            if deadline is not None:
                self._timer = loop.call_at(deadline, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._maybe_dispatch(loop)

    def _dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = self._queue.take()
        self._busy = True
        self.stats.add(len(batch))
        job = loop.run_in_executor(self._executor, self._run_isolating, [b[0] for b in batch])
        job.add_done_callback(lambda done: self._on_done(loop, batch, done))

    def _run_isolating(self, items: list[T]) -> list[R | _Failed]:
        """``run_batch(items)``; when it raises, bisect: run each half again until the
        failing items are alone, so one poison record (or a batch too big for the
        device's memory) fails only itself. Runs on the executor thread."""
        try:
            results: list[R | _Failed] = list(self._run_batch(items))
        except Exception as exc:
            if len(items) == 1:
                return [_Failed(exc)]
            self.stats.bisections += 1
            mid = len(items) // 2
            return self._run_isolating(items[:mid]) + self._run_isolating(items[mid:])
        if len(results) != len(items):
            error = ValueError(f"run_batch returned {len(results)} results for {len(items)} items")
            return [_Failed(error)] * len(items)
        return results

    def _on_done(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[tuple[T, asyncio.Future[R]]],
        done: asyncio.Future[list[R | _Failed]],
    ) -> None:
        self._busy = False
        exc = done.exception()
        outcomes: list[R | _Failed] = [_Failed(exc)] * len(batch) if exc is not None else done.result()
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            if fut.done():
                continue
            if isinstance(outcome, _Failed):
                fut.set_exception(outcome.error)
            else:
                fut.set_result(outcome)
        self._maybe_dispatch(loop)
