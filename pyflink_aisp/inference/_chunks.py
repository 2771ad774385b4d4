"""Model batches cut from whole submitted batches (the batch path; pure, no threads).

A caller that already holds many records (a pandas/Arrow UDF, a vectorized
operator) submits them as one *chunk*: a prepared batch (e.g. tokenized once)
with the token count of every row. :class:`ChunkQueue` keeps the chunks in
arrival order and cuts the head chunk into model batches without any
per-record object: each chunk's rows are sorted once by ``(length bucket,
token count)`` (``numpy.argsort``, stable), and :meth:`ChunkQueue.take` returns
the next run of that order that fits ``max_batch_size`` rows, the padded-token
budget (``rows x longest row <= max_batch_tokens``; rows ascend in length, so
the longest is the last) and one length bucket. Sorting by length before
cutting is what a plain loop over a sorted corpus does; it keeps padding small
(the policy of :class:`~pyflink_aisp.inference.BatchQueue`, applied to rows
that arrived together). Given a fitted call cost, :meth:`ChunkQueue.take`
instead returns the batches of the chunk's least-cost partition within the
same limits (:func:`~pyflink_aisp.inference._cost.cost_cuts`, planned over a
window of rows ahead of the cursor): a run of short rows is no longer padded to
the long row after it.

A model batch holds rows of one chunk only: chunks from several operators of a
worker take turns, oldest first, so a small chunk is never held back to wait
for companions (its records already waited in the caller's own batch).

Not thread-safe: one owner (the batcher's thread, under its lock).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference._cost import CallCost, cost_cuts

__all__ = ["Chunk", "ChunkQueue"]


@dataclass(eq=False)
class Chunk:
    """One submitted batch and its progress.

    Attributes:
        payload: What the model function receives with the rows (a ``Prepared``).
        lengths: ``(n,)`` int64 tokens per row.
        arrived_s: Clock reading at submit (seconds).
        future: Resolves with the ``n`` outcomes (result or exception), in row order.
        order: ``(n,)`` rows sorted by (bucket, length), set by :meth:`ChunkQueue.put`.
        bucket_of: ``(n,)`` bucket of each position of ``order``.
        cursor: Position in ``order`` of the next row to batch.
        cuts: Batch ends (positions in ``order``) planned by :func:`cost_cuts`
            for a window of rows from the cursor on, or None (fixed cuts).
        cuts_rows: The ``max_batch_size`` that ``cuts`` was planned for.
        outcomes: Per row, its result or exception once its batch ran.
        remaining: Rows whose batch has not run yet.
    """

    payload: Any
    lengths: npt.NDArray[np.int64]
    arrived_s: float
    future: Future[list[Any]] = field(default_factory=Future)
    order: npt.NDArray[np.intp] = field(default_factory=lambda: np.empty(0, dtype=np.intp))
    bucket_of: npt.NDArray[np.intp] = field(default_factory=lambda: np.empty(0, dtype=np.intp))
    cursor: int = 0
    cuts: npt.NDArray[np.intp] | None = None
    cuts_rows: int = 0
    outcomes: list[Any] = field(default_factory=list)
    remaining: int = 0

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def record(self, rows: npt.NDArray[np.intp], outcomes: list[Any]) -> bool:
        """Store the outcomes of ``rows``; True when every row of the chunk has one."""
        for row, outcome in zip(rows.tolist(), outcomes, strict=True):
            self.outcomes[row] = outcome
        self.remaining -= len(outcomes)
        return self.remaining == 0


def plan_window(max_batch_size: int) -> int:
    """Rows planned at once by a cost-cut take: 8 batches' worth, at least 256."""
    return max(256, 8 * max_batch_size)


class ChunkQueue:
    """Submitted chunks, oldest first, cut into model batches.

    Args:
        length_buckets: Ascending inclusive upper bounds (tokens) of the length
            buckets, as ``BatchingConfig.length_buckets``; a batch never spans two.
        max_batch_tokens: Padded-token budget per batch, or None.
    """

    def __init__(self, length_buckets: tuple[int, ...] = (), max_batch_tokens: int | None = None) -> None:
        self._bounds = np.asarray(length_buckets, dtype=np.int64)
        self._budget = max_batch_tokens
        self._chunks: deque[Chunk] = deque()

    def __len__(self) -> int:
        """Chunks with rows still to batch."""
        return len(self._chunks)

    def put(self, chunk: Chunk) -> None:
        """Queue a chunk (sorts its rows once); an empty chunk resolves at once."""
        if chunk.lengths.ndim != 1:
            raise ConfigError(f"chunk lengths must be (n,), got shape {chunk.lengths.shape}")
        n = len(chunk)
        chunk.outcomes = [None] * n
        chunk.remaining = n
        if n == 0:
            chunk.future.set_result([])
            return
        buckets = np.searchsorted(self._bounds, chunk.lengths, side="left")
        chunk.order = np.lexsort((chunk.lengths, buckets)).astype(np.intp)
        chunk.bucket_of = buckets[chunk.order]
        self._chunks.append(chunk)

    def oldest_arrival_s(self) -> float | None:
        """Submit time of the head chunk (seconds), or None when empty."""
        return self._chunks[0].arrived_s if self._chunks else None

    def take(
        self, max_batch_size: int, cost: CallCost | None = None
    ) -> tuple[Chunk, npt.NDArray[np.intp]] | None:
        """The next model batch: the head chunk and ``(k,)`` rows of it, ``k >= 1``.

        Args:
            max_batch_size: Most rows per batch.
            cost: A fitted call cost: the chunk's remaining rows are cut where
                :func:`~pyflink_aisp.inference._cost.cost_cuts` says (planned
                :func:`plan_window` rows at a time, again when ``max_batch_size``
                changes). None: fixed cuts, each batch as long as the limits allow.

        Raises:
            ConfigError: ``max_batch_size`` < 1.
        """
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not self._chunks:
            return None
        chunk = self._chunks[0]
        start = chunk.cursor
        if cost is not None:
            stop = self._planned_stop(chunk, max_batch_size, cost)
        else:
            stop = self._fixed_stop(chunk, max_batch_size)
        chunk.cursor = stop
        if stop == len(chunk):
            self._chunks.popleft()
        return chunk, chunk.order[start:stop]

    def _fixed_stop(self, chunk: Chunk, max_batch_size: int) -> int:
        start = chunk.cursor
        stop = min(start + max_batch_size, len(chunk))
        same_bucket = chunk.bucket_of[start:stop] == chunk.bucket_of[start]
        stop = start + (int(np.argmin(same_bucket)) if not same_bucket.all() else stop - start)
        if self._budget is not None and stop - start > 1:
            longest = chunk.lengths[chunk.order[start:stop]]  # ascending within a bucket
            padded = np.arange(1, stop - start + 1) * longest
            fits = padded <= self._budget
            stop = start + max(1, int(np.argmin(fits)) if not fits.all() else stop - start)
        return stop

    def _planned_stop(self, chunk: Chunk, max_batch_size: int, cost: CallCost) -> int:
        """The end of the next planned batch. Plans cover a window of
        :func:`plan_window` rows from the cursor (planning runs under the batcher's
        lock: 1,024 rows x 32 sizes take ~5 ms, 100,000 rows ~0.5 s); the window's
        last batch is planned again with the rows after it."""
        start = chunk.cursor
        if chunk.cuts is None or chunk.cuts_rows != max_batch_size or start >= chunk.cuts[-1]:
            end = min(len(chunk), start + plan_window(max_batch_size))
            rest = chunk.order[start:end]
            cuts = start + cost_cuts(chunk.lengths[rest], cost, max_rows=max_batch_size,
                                     max_tokens=self._budget, buckets=chunk.bucket_of[start:end])
            chunk.cuts = cuts[:-1] if end < len(chunk) and len(cuts) > 1 else cuts
            chunk.cuts_rows = max_batch_size
        return int(chunk.cuts[np.searchsorted(chunk.cuts, start, side="right")])

    def drain(self) -> list[Chunk]:
        """Remove and return every queued chunk (on close)."""
        chunks = list(self._chunks)
        self._chunks.clear()
        return chunks
