"""A pool of reusable numpy buffers for padded batches.

Padded model inputs have a new shape every batch, but after a few batches the
sizes repeat (token lengths are bounded by ``max_length``, and padding to a
multiple or to buckets makes them coarse). :class:`BufferPool` hands out views
into flat buffers it keeps, picks the smallest free buffer that fits (best
fit) and rounds new buffers up to a size class, so a steady stream of
batches allocates nothing after warm-up. This is the free-list scheme of
allocators such as PyTorch's caching allocator, on the host. Sizes are rounded
up to one of 8 classes per power of two (as jemalloc's size classes), so a
buffer wastes less than 25% and a slightly longer batch still finds a fit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError

__all__ = ["BufferPool", "PoolStats"]

_MIN_ELEMENTS = 4096


@dataclass(frozen=True, kw_only=True)
class PoolStats:
    """Counters of a :class:`BufferPool`.

    Attributes:
        allocations: Buffers allocated since creation.
        reuses: Acquisitions served by a free buffer.
        lent: Buffers currently acquired and not released.
        cached_bytes: Bytes in free buffers.
    """

    allocations: int
    reuses: int
    lent: int
    cached_bytes: int


class BufferPool:
    """Reusable flat numpy buffers, handed out as shaped views.

    Thread-safety: all methods may be called from several threads.

    Args:
        max_cached_bytes: Free buffers beyond this many bytes are dropped
            (largest first) when released.

    Raises:
        ConfigError: ``max_cached_bytes`` < 0.
    """

    def __init__(self, max_cached_bytes: int = 256 * 2**20) -> None:
        if max_cached_bytes < 0:
            raise ConfigError(f"max_cached_bytes must be >= 0, got {max_cached_bytes}")
        self.max_cached_bytes = max_cached_bytes
        self._lock = threading.Lock()
        self._free: dict[np.dtype, list[npt.NDArray[np.generic]]] = {}
        self._lent: dict[int, npt.NDArray[np.generic]] = {}
        self._allocations = 0
        self._reuses = 0
        self._cached_bytes = 0

    def acquire(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> npt.NDArray[np.generic]:
        """A C-contiguous array of ``shape`` and ``dtype`` backed by a pooled buffer.

        The contents are undefined (as ``np.empty``). Hand it back with
        :meth:`release` when no longer used.
        """
        kind = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64))
        with self._lock:
            free = self._free.setdefault(kind, [])
            fits = [i for i, b in enumerate(free) if b.size >= size]
            if fits:
                base = free.pop(min(fits, key=lambda i: free[i].size))  # best fit; by index, not ==
                self._cached_bytes -= base.nbytes
                self._reuses += 1
            else:
                base = np.empty(_size_class(size), dtype=kind)
                self._allocations += 1
            self._lent[id(base)] = base
        return base[:size].reshape(shape)

    def release(self, array: npt.NDArray[np.generic]) -> None:
        """Return an array from :meth:`acquire` to the pool.

        Raises:
            ConfigError: ``array`` was not lent by this pool (or was released twice).
        """
        base = array.base if array.base is not None else array
        with self._lock:
            if self._lent.pop(id(base), None) is None:
                raise ConfigError("array was not acquired from this pool, or was already released")
            self._free.setdefault(base.dtype, []).append(base)
            self._cached_bytes += base.nbytes
            if self._cached_bytes > self.max_cached_bytes:
                self._trim()

    def _trim(self) -> None:
        """Drop the largest free buffers until the cache fits ``max_cached_bytes``."""
        buffers = sorted((b for free in self._free.values() for b in free), key=lambda b: b.nbytes)
        while buffers and self._cached_bytes > self.max_cached_bytes:
            largest = buffers.pop()
            self._free[largest.dtype] = [b for b in self._free[largest.dtype] if b is not largest]
            self._cached_bytes -= largest.nbytes

    def stats(self) -> PoolStats:
        """Current counters."""
        with self._lock:
            return PoolStats(
                allocations=self._allocations,
                reuses=self._reuses,
                lent=len(self._lent),
                cached_bytes=self._cached_bytes,
            )


def _size_class(elements: int) -> int:
    """``elements`` rounded up to a multiple of 1/8 of the next power of two (at least 4096)."""
    if elements <= _MIN_ELEMENTS:
        return _MIN_ELEMENTS
    step = (1 << (elements - 1).bit_length()) // 8
    return -(-elements // step) * step
