"""Where to cut length-sorted rows into model batches: a fitted cost per call and per padded token.

A model call on ``k`` rows padded to ``L`` tokens costs about ``a + b * k * L``
seconds: a fixed part per call (kernel launches, thread-pool wake-ups, the
framework's own work) and a part per padded token (long batches cost slightly
more than linearly: the attention's ``L**2`` term). The fit's measured accuracy
and the choice of cuts are decision record 2
(``docs/decisions/0002-cost-based-batch-cuts.md``, ``bench/batch_cuts.py``).

Cutting a length-sorted run of rows into batches of a fixed size pads each
batch to its longest row; with few rows of spread-out lengths (a trickle: a
dozen records per Arrow batch) that padding is most of the work, while cutting
at every row pays ``a`` per row. :func:`cost_cuts` finds the cuts that minimise
the summed cost exactly, by dynamic programming over the sorted rows: the
optimal partition of a sorted sequence into contiguous groups, the batch
scheduler of TurboTransformers (Fang et al., "TurboTransformers: An Efficient
GPU Serving System For Transformer Models", PPoPP 2021, section 4.2), here with
the batcher's limits (rows per batch, padded-token budget, length buckets).

:class:`BatchCostModel` fits ``a`` and ``b`` online (a robust line fit) over
the last batches the model really ran (their padded tokens and compute time),
so the same code cuts well on a CPU (large ``b``) and on a GPU (large ``a``).
When the calls seen so far place ``a`` at or below 0 (a long batch costs
slightly more than linearly, so the fitted intercept can fall below 0), ``a``
is floored at one token's work (``b``): cutting fixed instead kept the padding
of spread-out lengths that the cuts exist to remove, and never ran the smaller
batches a better fit needs.

Pure and single-threaded (the batcher's thread owns one).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError

__all__ = ["BatchCostModel", "BatchCuts", "CallCost", "cost_cuts"]


class BatchCuts(enum.StrEnum):
    """How the batch path cuts a submitted batch's length-sorted rows into model batches."""

    #: Runs of ``max_batch_size`` rows (within the token budget and buckets), as a plain loop does.
    FIXED = "fixed"
    #: The cuts of least fitted cost (:func:`cost_cuts`); fixed until the cost model is fitted.
    COST = "cost"


@dataclass(frozen=True)
class CallCost:
    """A fitted cost of one model call: ``per_call_s + per_token_s * rows * longest``.

    Attributes:
        per_call_s: Seconds every call costs (``a``, > 0).
        per_token_s: Seconds per padded token (``b``, > 0).
    """

    per_call_s: float
    per_token_s: float

    def __post_init__(self) -> None:
        if not (self.per_call_s > 0 and self.per_token_s > 0):
            raise ConfigError(f"call costs must be > 0, got {self.per_call_s}, {self.per_token_s}")

    def seconds(self, rows: int, longest: int) -> float:
        """Predicted seconds of one call on ``rows`` rows padded to ``longest`` tokens."""
        return self.per_call_s + self.per_token_s * rows * longest


class BatchCostModel:
    """Robust fit of ``seconds = a + b * padded_tokens`` over the last ``window`` model calls
    (``a`` at least ``b``: one token's work per call, when the fit finds no overhead).

    The line is the Theil-Sen estimator (slope: the median of the slopes between
    every two calls of different sizes; intercept: the median residual; Theil
    1950, Sen 1968): a call slowed by a garbage collection or a busy core moves
    it little, where least squares would follow it (up to ~29 % of the calls may
    be such outliers). Refitted every ``refit_every`` new calls (a fit over 256
    calls takes 0.4-2 ms), in :meth:`observe`.

    Args:
        window: Calls kept (the oldest drops out: the fit follows a changed load or model).
        min_calls: Calls needed before :attr:`cost` is given.
        min_spread: The largest observed padded-token count must be at least this
            multiple of the smallest (else the slope is not identifiable).
        refit_every: New calls between two fits.

    Raises:
        ConfigError: not ``2 <= min_calls <= window``, ``min_spread`` <= 1 or ``refit_every`` < 1.
    """

    def __init__(self, window: int = 256, min_calls: int = 16, min_spread: float = 1.5,
                 refit_every: int = 16) -> None:
        if not 2 <= min_calls <= window:
            raise ConfigError(f"need 2 <= min_calls <= window, got {min_calls}, {window}")
        if not min_spread > 1:
            raise ConfigError(f"min_spread must be > 1, got {min_spread}")
        if refit_every < 1:
            raise ConfigError(f"refit_every must be >= 1, got {refit_every}")
        self._calls: deque[tuple[int, float]] = deque(maxlen=window)
        self._min_calls, self._min_spread, self._refit_every = min_calls, min_spread, refit_every
        self._fitted: CallCost | None = None
        self._new, self._tried = 0, False

    def observe(self, padded_tokens: int, seconds: float) -> None:
        """Record one model call that ran whole (no failure, no split); a non-positive or
        non-finite size or time is ignored. Fits when ``min_calls`` calls are in, then
        after every ``refit_every`` new calls (whether the last fit gave a cost or not)."""
        if not (padded_tokens > 0 and 0 < seconds < math.inf):
            return
        self._calls.append((padded_tokens, seconds))
        self._new += 1
        if len(self._calls) >= self._min_calls and (self._new >= self._refit_every or not self._tried):
            self._tried, self._new = True, 0
            self._fitted = self._fit()

    @property
    def cost(self) -> CallCost | None:
        """The last fit's :class:`CallCost`, or None: too few calls, too little spread in
        their sizes, or a fit with a non-positive per-call or per-token part. A plain
        read (the fit runs in :meth:`observe`), so any thread may read it."""
        return self._fitted

    def _fit(self) -> CallCost | None:
        calls = np.asarray(self._calls, dtype=np.float64)
        tokens, seconds = calls[:, 0], calls[:, 1]
        if tokens.max() < self._min_spread * tokens.min():
            return None
        first, second = np.triu_indices(len(tokens), 1)
        run = tokens[second] - tokens[first]
        apart = run != 0
        slope = float(np.median((seconds[second] - seconds[first])[apart] / run[apart]))
        intercept = float(np.median(seconds - slope * tokens))
        if not slope > 0:
            return None
        # No per-call overhead seen (single-threaded runs, or only large batches observed, whose
        # quadratic attention bends the line down): charge one token's work per call, so cuts
        # minimise padding and the smaller batches that follow measure the real overhead.
        return CallCost(max(intercept, slope), slope)


def cost_cuts(
    lengths: npt.NDArray[np.int64],
    cost: CallCost,
    *,
    max_rows: int,
    max_tokens: int | None = None,
    buckets: npt.NDArray[np.intp] | None = None,
) -> npt.NDArray[np.intp]:
    """The cuts of ascending ``lengths`` into batches of least total predicted cost.

    Args:
        lengths: ``(n,)`` tokens per row, ascending.
        cost: The call cost to minimise (:class:`BatchCostModel`).
        max_rows: Most rows per batch (>= 1).
        max_tokens: Padded-token budget per batch (rows x longest); a single row
            always fits. None: no budget.
        buckets: ``(n,)`` length bucket per row (non-decreasing); a batch holds
            one bucket. None: one bucket.

    Returns:
        ``(m,)`` intp batch ends, ascending, the last ``n``: batch ``i`` is rows
        ``[ends[i-1], ends[i])`` (``ends[-1]`` = 0). Empty for ``n`` = 0.

    Raises:
        ConfigError: ``max_rows`` < 1.
    """
    if max_rows < 1:
        raise ConfigError(f"max_rows must be >= 1, got {max_rows}")
    n = len(lengths)
    best = np.zeros(n + 1)
    start_of = np.zeros(n + 1, dtype=np.intp)  # best batch ending at j starts at start_of[j]
    sizes = np.arange(1, min(max_rows, n) + 1)
    for end in range(1, n + 1):
        k = sizes[: min(max_rows, end)]
        longest = int(lengths[end - 1])
        total = best[end - k] + cost.per_call_s + cost.per_token_s * k * longest
        allowed = np.ones(len(k), dtype=bool)
        if max_tokens is not None:
            allowed &= (k * longest <= max_tokens) | (k == 1)
        if buckets is not None:
            allowed &= buckets[end - k] == buckets[end - 1]
        total[~allowed] = np.inf
        pick = int(np.argmin(total))  # the smallest batch among equal costs
        best[end], start_of[end] = total[pick], end - int(k[pick])
    ends = []
    end = n
    while end > 0:
        ends.append(end)
        end = int(start_of[end])
    return np.asarray(ends[::-1], dtype=np.intp)
