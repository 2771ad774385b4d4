"""The batcher's failure isolation and its model batches in flight (pure, no threads).

:class:`Isolation` runs one model batch and, when the call raises, bisects it until
the failing items are alone: one poison record fails only itself. An out-of-memory
error (:func:`is_out_of_memory`) is split the same way; the batcher then caps later
batches at the largest size that ran.

Memory after an out-of-memory error: the exception's traceback holds the frames of
the failed call, and their locals hold the failed batch's inputs and activations
(e.g. CUDA tensors). Retrying the halves inside the ``except`` block keeps all of
it alive while they run, so the halves compete with the dead batch for memory. The
split therefore happens after the ``except`` block, once the failed attempt's frames
are cleared (:func:`traceback.clear_frames`) and its traceback dropped, and after
the ``on_oom`` callback (a torch handler empties its CUDA cache there).

:class:`Launched` is one model batch of the batch path that the batching thread
launched and has not collected yet (the pipelined path, ``pipeline_depth > 1``).

Not thread-safe: used by the batching thread only.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from pyflink_aisp.inference._chunks import Chunk
from pyflink_aisp.inference._slo import Knobs

__all__ = ["Failed", "Isolation", "IsolationStats", "Launched", "forget_frames", "is_out_of_memory"]

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
class Failed:
    """The outcome of an item whose model call raised (kept apart from results)."""

    error: BaseException


@dataclass(frozen=True, eq=False)
class Launched:
    """A model batch of the batch path launched and not yet collected.

    Attributes:
        chunk: The submitted batch the rows belong to.
        rows: ``(k,)`` rows of ``chunk`` in the batch, in the order results come back.
        handle: What the launch function returned (the handler's own object).
        dispatched_s: Clock reading at launch (seconds).
        knobs: Batch size and wait in force at launch.
        done: Whether the batch has finished, for a handle that can tell (a
            ``concurrent.futures.Future``-like ``done()``), else None.
    """

    chunk: Chunk
    rows: npt.NDArray[np.intp]
    handle: Any
    dispatched_s: float
    knobs: Knobs
    done: Callable[[], bool] | None = None


class IsolationStats(Protocol):
    """What :class:`Isolation` counts (the batcher's ``BatchStats`` has these fields)."""

    bisections: int
    oom_splits: int


def forget_frames(error: BaseException, *, keep_traceback: bool) -> None:
    """Clear the locals of every frame in the tracebacks of ``error`` and the exceptions
    chained to it (``__cause__``/``__context__``), so that the failed call's data dies now.

    Args:
        error: An exception caught after its frames finished (frames still executing
            are skipped by :func:`traceback.clear_frames`).
        keep_traceback: Keep the (cleared) traceback objects for a later report; False
            also drops them.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
            if not keep_traceback:
                current.__traceback__ = None
        current = current.__cause__ or current.__context__


def _attempt(items: Any, call: Callable[[Any], Sequence[Any]]) -> list[Any] | Exception:
    """``call(items)`` as a list, or the exception it raised (returned, so that the
    caller handles it outside any ``except`` block)."""
    try:
        return list(call(items))
    except Exception as exc:
        return exc


class Isolation:
    """One model batch, run until each item has an outcome.

    Args:
        stats: Gets ``bisections`` and ``oom_splits`` counted.
        on_oom: Called after an out-of-memory error, once the failed attempt's frames
            are cleared and before its halves run (None: nothing); an exception it
            raises is logged and ignored.

    Attributes:
        largest_ok: Most items of a call that returned results.
        oom_seen: A call ran out of memory.
        split: A call failed and its items were split (the batch's time is not one call's).
    """

    def __init__(self, stats: IsolationStats, on_oom: Callable[[], None] | None = None) -> None:
        self._stats = stats
        self._on_oom = on_oom
        self.largest_ok, self.oom_seen, self.split = 0, False, False

    def run(self, items: Any, call: Callable[[Any], Sequence[Any]],
            failed: Exception | None = None) -> list[Any]:
        """``call(items)``; when it raises, bisect until the failing items are alone.

        Args:
            items: A list of records or a ``(k,)`` array of chunk rows.
            call: The model function: one result per item, in order.
            failed: What ``call(items)`` already raised (e.g. a pipelined launch or
                collect): split at once instead of calling again. Its frames are cleared.

        Returns:
            ``len(items)`` outcomes in order: a result, or :class:`Failed` with the
            exception of the item's own call (a wrong result count fails every item).
        """
        outcome: list[Any] | Exception | None = failed if failed is not None else _attempt(items, call)
        failed = None
        if isinstance(outcome, list):
            if len(outcome) != len(items):
                error = ValueError(f"run_batch returned {len(outcome)} results for {len(items)} items")
                return [Failed(error)] * len(items)
            self.largest_ok = max(self.largest_ok, len(items))
            return outcome
        assert outcome is not None
        oom = is_out_of_memory(outcome)
        self.oom_seen = self.oom_seen or oom
        alone = len(items) == 1
        forget_frames(outcome, keep_traceback=alone)  # a lone item's error keeps its (cleared) traceback
        kept, outcome = (outcome if alone else None), None  # the failed attempt's data dies here
        if oom:
            self._released()
        if kept is not None:
            return [Failed(kept)]
        self.split = True
        if oom:
            self._stats.oom_splits += 1
        else:
            self._stats.bisections += 1
        mid = len(items) // 2
        return self.run(items[:mid], call) + self.run(items[mid:], call)

    def _released(self) -> None:
        if self._on_oom is None:
            return
        try:
            self._on_oom()
        except Exception:  # freeing a cache must never fail inference
            _log.exception("on_oom callback failed")
