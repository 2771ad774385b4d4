"""Dynamic micro-batching for async operators.

Records arrive one at a time through ``await batcher.submit(x)`` (from
PyFlink's ``AsyncFunction.async_invoke``, which runs on one asyncio event loop
per Python worker). The batcher gathers them and calls the model once per
batch in a worker thread, so the event loop keeps accepting records while the
model computes. A batch is dispatched when the model is idle and either
``max_batch_size`` records wait or the oldest has waited ``max_wait_ms``; while
the model is busy, records accumulate and the next batch leaves as soon as it
is free. This is the dynamic batching policy of NVIDIA Triton's dynamic
batcher (preferred size + max queue delay), applied inside the operator.

Thread-safety: ``submit`` must be called from one event loop; ``run_batch``
runs on the batcher's single executor thread, never concurrently with itself.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pyflink_aisp.errors import ConfigError

__all__ = ["BatchStats", "BatchingConfig", "MicroBatcher"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class BatchingConfig:
    """Knobs of the micro-batcher.

    Attributes:
        max_batch_size: Most records per model call (≥ 1).
        max_wait_ms: Longest a record waits for companions while the model is
            idle, in milliseconds (≥ 0).
    """

    max_batch_size: int = 64
    max_wait_ms: float = 5.0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")


@dataclass
class BatchStats:
    """Counts kept by a batcher (read them from the event loop's thread)."""

    batches: int = 0
    records: int = 0
    max_batch_size: int = 0
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
            in order. Its exception fails every item of that batch.
        config: Batch size and wait.
    """

    def __init__(self, run_batch: Callable[[list[T]], Sequence[R]], config: BatchingConfig) -> None:
        self._run_batch = run_batch
        self._config = config
        self._pending: deque[tuple[T, asyncio.Future[R], float]] = deque()
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aisp-batch")
        self.stats = BatchStats()

    async def submit(self, item: T) -> R:
        """Queue one item and wait for its result.

        Raises:
            Exception: whatever ``run_batch`` raised for the batch holding the item.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future, loop.time()))
        self._maybe_dispatch(loop)
        return await future

    def close(self) -> None:
        """Stop the executor thread (pending items are not run)."""
        if self._timer is not None:
            self._timer.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _maybe_dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._busy or not self._pending:
            return
        waited_s = loop.time() - self._pending[0][2]
        remaining_s = self._config.max_wait_ms / 1000.0 - waited_s
        if len(self._pending) >= self._config.max_batch_size or remaining_s <= 0:
            self._dispatch(loop)
        elif self._timer is None:
            self._timer = loop.call_later(remaining_s, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._maybe_dispatch(loop)

    def _dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        n = min(len(self._pending), self._config.max_batch_size)
        batch = [self._pending.popleft() for _ in range(n)]
        self._busy = True
        self.stats.add(n)
        job = loop.run_in_executor(self._executor, self._run_batch, [b[0] for b in batch])
        job.add_done_callback(lambda done: self._on_done(loop, batch, done))

    def _on_done(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[tuple[T, asyncio.Future[R], float]],
        done: asyncio.Future[Sequence[R]],
    ) -> None:
        self._busy = False
        exc = done.exception()
        results = None if exc is not None else done.result()
        if results is not None and len(results) != len(batch):
            exc = ValueError(f"run_batch returned {len(results)} results for {len(batch)} items")
        for i, (_, fut, _) in enumerate(batch):
            if fut.done():
                continue
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(results[i])  # type: ignore[index]
        self._maybe_dispatch(loop)
