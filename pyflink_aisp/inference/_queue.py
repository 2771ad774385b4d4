"""Batch forming: which waiting records leave together (pure, clock passed in).

Records wait in length buckets (by token count, when the caller knows it).
A batch is *ready* when a bucket can fill a whole batch (``max_batch_size``
records, or as many as fit the token budget), when the oldest record of
all has waited ``max_wait_ms``, or (with ``max_idle_ms``) when no record has
arrived for that long. :meth:`BatchQueue.take` then serves the full
bucket whose head waited longest, else the bucket holding the oldest record,
taking records in arrival order while ``rows * longest row ≤ max_batch_tokens``
(the padded size the model computes). Grouping by length cuts padding; the
budget bounds a batch's compute and memory. (The policy follows dynamic
batching with a max queue delay as in NVIDIA Triton, plus token-budget
batching as in Hugging Face text-embeddings-inference.)

Not thread-safe: one caller (the batcher's event loop) owns it.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference._cost import BatchCuts

__all__ = ["BatchQueue", "BatchingConfig"]

T = TypeVar("T")

#: Longest wait or target accepted, in ms (one hour; a thread's wait must stay finite).
_MAX_MS = 3_600_000


@dataclass(frozen=True, kw_only=True)
class BatchingConfig:
    """Knobs of batch forming.

    The defaults are the packaged jobs' (the options table of
    :mod:`pyflink_aisp.pipeline`): 32 records, measured best on 2 CPU cores for
    the MiniLM model (decision record 4, the Arrow chunk path).

    Attributes:
        max_batch_size: Most records per model call (≥ 1).
        max_wait_ms: Longest a record waits for companions while the model is
            idle, in milliseconds (≥ 0).
        max_batch_tokens: Budget of padded tokens per batch (rows * longest
            row), or None for no budget. A single longer record still runs alone.
        length_buckets: Ascending upper bounds (inclusive, in tokens) of the
            length buckets; longer records share one last bucket. Empty: one bucket.
        latency_slo_ms: Target p99 latency of a record from ``submit`` to its
            result, in milliseconds, or None. When set, an
            :class:`~pyflink_aisp.inference.SloController` moves the batch size
            and wait online, within ``max_batch_size`` and ``max_wait_ms``, to
            the highest-throughput setting whose measured p99 stays under it.
            None: the two knobs stay fixed.
        max_idle_ms: A batch also leaves when no record has arrived for this
            long (milliseconds), or None. The input pausing means no companion
            is coming soon: PyFlink ends each bundle by waiting for every record
            in flight, so without it each bundle's last batch sits out the full
            ``max_wait_ms`` while the pipeline stalls.
        batch_cuts: How whole submitted batches (the batch path) are cut into
            model batches after sorting by length: ``cost`` (default) at the
            cuts of least fitted cost (:mod:`pyflink_aisp.inference._cost`),
            ``fixed`` into runs of ``max_batch_size``.
    """

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_batch_tokens: int | None = None
    length_buckets: tuple[int, ...] = ()
    latency_slo_ms: float | None = None
    max_idle_ms: float | None = 2.0
    batch_cuts: BatchCuts = BatchCuts.COST

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        for name in ("max_wait_ms", "max_idle_ms", "latency_slo_ms"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value <= _MAX_MS):
                raise ConfigError(f"{name} must be a finite number of ms up to {_MAX_MS:,}, got {value}")
        if self.max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ConfigError(f"max_batch_tokens must be >= 1 or None, got {self.max_batch_tokens}")
        bounds = self.length_buckets
        if any(b < 1 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ConfigError(f"length_buckets must be strictly ascending positive ints, got {bounds}")
        if self.max_idle_ms is not None and self.max_idle_ms < 0:
            raise ConfigError(f"max_idle_ms must be >= 0 or None, got {self.max_idle_ms}")
        if self.latency_slo_ms is not None and not self.latency_slo_ms > 0:
            raise ConfigError(f"latency_slo_ms must be > 0 or None, got {self.latency_slo_ms}")
        if not isinstance(self.batch_cuts, BatchCuts):
            raise ConfigError(f"batch_cuts must be a BatchCuts, got {self.batch_cuts!r}")


@dataclass(frozen=True)
class _Waiting(Generic[T]):
    item: T
    tokens: int
    arrived_s: float
    seq: int  # arrival order, breaks ties between equal clock readings


class BatchQueue(Generic[T]):
    """Records waiting for a batch, grouped by length.

    Args:
        config: Batch size, wait, token budget and buckets.
    """

    def __init__(self, config: BatchingConfig) -> None:
        self._config = config
        self._max_batch_size = config.max_batch_size
        self._max_wait_s = config.max_wait_ms / 1000.0
        self._max_idle_s = None if config.max_idle_ms is None else config.max_idle_ms / 1000.0
        self._last_put_s = 0.0
        self._buckets: list[deque[_Waiting[T]]] = [deque() for _ in range(len(config.length_buckets) + 1)]
        self._size = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._size

    def set_limits(self, *, max_batch_size: int, max_wait_ms: float) -> None:
        """Change the batch size and wait in force (the SLO controller's knobs;
        the token budget and buckets stay as configured).

        Raises:
            ConfigError: ``max_batch_size`` < 1 or ``max_wait_ms`` < 0.
        """
        if max_batch_size < 1 or max_wait_ms < 0:
            raise ConfigError(f"invalid limits: max_batch_size={max_batch_size}, max_wait_ms={max_wait_ms}")
        self._max_batch_size = max_batch_size
        self._max_wait_s = max_wait_ms / 1000.0

    def put(self, item: T, now_s: float, tokens: int = 1) -> None:
        """Add a record that arrived at ``now_s`` (seconds) with ``tokens`` tokens."""
        index = bisect.bisect_left(self._config.length_buckets, tokens)
        self._buckets[index].append(_Waiting(item, tokens, now_s, self._seq))
        self._size += 1
        self._seq += 1
        self._last_put_s = max(self._last_put_s, now_s)

    def oldest_arrival_s(self) -> float | None:
        """Arrival time (seconds) of the record that waited longest; None when empty."""
        heads = [b[0].arrived_s for b in self._buckets if b]
        return min(heads) if heads else None

    def deadline_s(self) -> float | None:
        """When the oldest record's wait runs out, or the input has been idle for
        ``max_idle_ms`` (seconds); None when empty."""
        heads = [b[0].arrived_s for b in self._buckets if b]
        if not heads:
            return None
        deadline = min(heads) + self._max_wait_s
        if self._max_idle_s is not None:
            deadline = min(deadline, self._last_put_s + self._max_idle_s)
        return deadline

    def ready(self, now_s: float) -> bool:
        """Whether a batch should leave now (a full bucket, or the oldest wait ran out)."""
        deadline = self.deadline_s()
        if deadline is None:
            return False
        return now_s >= deadline or any(self._is_full(b) for b in self._buckets)

    def take(self) -> list[T]:
        """Remove and return the next batch (empty when nothing waits)."""
        live = [b for b in self._buckets if b]
        if not live:
            return []
        full = [b for b in live if self._is_full(b)]
        bucket = min(full or live, key=lambda b: (b[0].arrived_s, b[0].seq))
        n = self._fit(bucket)
        self._size -= n
        return [bucket.popleft().item for _ in range(n)]

    def _fit(self, bucket: deque[_Waiting[T]]) -> int:
        """How many head records of ``bucket`` one batch takes (≥ 1)."""
        budget = self._config.max_batch_tokens
        longest = 0
        for n, waiting in enumerate(bucket):
            if n == self._max_batch_size:
                return n
            longest = max(longest, waiting.tokens)
            if budget is not None and n > 0 and (n + 1) * longest > budget:
                return n
        return len(bucket)

    def _is_full(self, bucket: deque[_Waiting[T]]) -> bool:
        if len(bucket) >= self._max_batch_size:
            return True
        return self._config.max_batch_tokens is not None and self._fit(bucket) < len(bucket)
