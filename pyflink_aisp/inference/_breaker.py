"""A circuit breaker on the inference failure rate: fail the job, not the stream.

A model that fails on every batch (a sticky CUDA error, a broken new version)
would otherwise send every record, bisected alone, to the DLQ while offsets
commit and the job stays RUNNING: the output empties silently.
:class:`FailureRateBreaker` watches the outcomes of the last
``window_records`` records that reached the model and *opens* (raises
:class:`~pyflink_aisp.errors.CircuitOpenError`) once at least ``min_records``
are in the window and ``failures / len(window) >= max_failure_rate``. The
operator lets that error fail the job, so Flink's restart strategy restarts it
from the last checkpoint and the records are scored again, rather than lost to
the DLQ.

The pattern is the circuit breaker of M. Nygard, *Release It!* (Pragmatic
Bookshelf, 2007; 2nd ed. 2018), ch. "Stability Patterns: Circuit Breaker",
with a failure-*rate* threshold over a sliding count window as in
Resilience4j's ``CircuitBreaker`` (``failureRateThreshold``,
``slidingWindowType=COUNT_BASED``, ``slidingWindowSize``,
``minimumNumberOfCalls``). Its *half-open* trial is Flink's restart: the
breaker latches open, and a restarted job builds a new, closed one.

Only inference failures count, and the operator decides what they are: a
record whose model call raised (after bisection) or timed out. Bad input
(decode and tokenize dead letters) is data, not a model failure, and is never
recorded.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import CircuitOpenError, ConfigError

__all__ = ["BreakerConfig", "FailureRateBreaker", "failure_detail"]

#: Longest kept detail of the last failure, in characters.
MAX_DETAIL_CHARS = 300


@dataclass(frozen=True, kw_only=True)
class BreakerConfig:
    """Threshold and window of a :class:`FailureRateBreaker`.

    The defaults (half of the last 1,000 records, judged once 100 are in): a
    stream where half the records fail *inference* has a broken model, not bad
    input, because bad input is dead-lettered before the model and never
    counts. A record that fails alone after bisection is rare with a working
    model (a pathological input); 50 % leaves wide room for such bursts while
    a model that fails everything trips after ``min_records`` = 100 records
    (a few batches at the default batch size of 32), long before a checkpoint
    interval's worth of output is dead-lettered. 1,000 records smooth over one
    bad batch of up to 500 records.

    Attributes:
        max_failure_rate: Failure rate in (0, 1] at or above which the breaker
            opens (``failures / len(window) >= max_failure_rate``).
        window_records: How many of the latest record outcomes are kept (≥ 1).
        min_records: Outcomes the window must hold before the rate is judged
            (1 ≤ ``min_records`` ≤ ``window_records``), so a job's first few
            failures do not trip it.

    Raises:
        ConfigError: A value is out of range or of the wrong type.
    """

    max_failure_rate: float = 0.5
    window_records: int = 1000
    min_records: int = 100

    def __post_init__(self) -> None:
        rate = self.max_failure_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
            math.isfinite(rate) and 0.0 < rate <= 1.0
        ):
            raise ConfigError(f"max_failure_rate must be a number in (0, 1], got {rate!r}")
        for name in ("window_records", "min_records"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if self.min_records > self.window_records:
            raise ConfigError(
                f"min_records ({self.min_records}) must be <= window_records ({self.window_records})"
            )


def failure_detail(error: BaseException | str) -> str:
    """``"Type: message"`` of an exception (or the string itself) on one line,
    cut to :data:`MAX_DETAIL_CHARS` characters."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:MAX_DETAIL_CHARS]


@dataclass(frozen=True)
class _Opened:
    """The window when the breaker opened (reported by every later raise)."""

    failure_rate: float
    failures: int
    records: int
    last_failure: str


class FailureRateBreaker:
    """Sliding-window failure-rate circuit breaker over record outcomes.

    The window is the last ``window_records`` outcomes in the order they were
    recorded, kept in a ring buffer of ``uint8`` flags: :meth:`record` is O(1),
    :meth:`record_many` O(min(total, window_records)). Once open the breaker
    stays open (every later :meth:`record`, :meth:`record_many` and
    :meth:`check` raises) until :meth:`reset`.

    Order inside a batch (:meth:`record_many` gets counts, not positions): the
    ``failures`` of a batch of ``total`` are spread evenly, outcome ``i``
    (0-based) failing iff ``floor((i+1)·f/t) > floor(i·f/t)``. So the last
    ``k`` outcomes of the batch hold exactly ``ceil(k·f/t)`` failures: a batch
    larger than the window keeps its last ``window_records`` outcomes at the
    batch's own rate (rounded up by less than one record), and a batch sliding
    out of the window leaves at that rate too.

    Thread-safety: every method may be called from any thread (one lock).

    Args:
        config: Threshold and window; the default :class:`BreakerConfig`.
    """

    def __init__(self, config: BreakerConfig | None = None) -> None:
        self.config = config if config is not None else BreakerConfig()
        self._lock = threading.Lock()
        self._ring = np.zeros(self.config.window_records, dtype=np.uint8)
        self._reset_window()
        self._records_total = 0
        self._failures_total = 0
        self._trips = 0

    def _reset_window(self) -> None:
        self._ring[:] = 0
        self._next = 0  # ring index the next outcome goes to
        self._filled = 0  # outcomes in the window
        self._failures = 0  # failures in the window
        self._last_failure = ""
        self._opened: _Opened | None = None

    # -- recording ------------------------------------------------------------------

    def record(self, failed: bool, error: BaseException | str | None = None) -> None:
        """Add one record's outcome, then judge the window.

        Args:
            failed: The record's inference failed.
            error: Its failure (kept as the last failure's detail; ignored when
                ``failed`` is false).

        Raises:
            CircuitOpenError: The breaker is (now) open.
        """
        flag = 1 if failed else 0
        with self._lock:
            slot = self._next
            self._failures += flag - int(self._ring[slot])
            self._ring[slot] = flag
            self._filled = min(len(self._ring), self._filled + 1)
            self._next = (slot + 1) % len(self._ring)
            self._count(1, flag, error)
            self._judge()

    def record_many(self, failures: int, total: int, error: BaseException | str | None = None) -> None:
        """Add the outcomes of a batch of ``total`` records of which ``failures``
        failed (spread evenly, see the class docstring), then judge the window.

        Args:
            failures: Records of the batch whose inference failed (0 ≤ ``failures`` ≤ ``total``).
            total: Records in the batch (0 records only re-judges the window).
            error: The batch's last failure (kept when ``failures`` > 0).

        Raises:
            ValueError: ``failures`` or ``total`` is not an int in range.
            CircuitOpenError: The breaker is (now) open.
        """
        for name, value in (("failures", failures), ("total", total)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if failures > total:
            raise ValueError(f"failures ({failures}) must be <= total ({total})")
        flags = _spread(int(failures), int(total), self.config.window_records)
        with self._lock:
            self._write(flags)
            self._count(int(total), int(failures), error)
            self._judge()

    def check(self) -> None:
        """Judge the window without adding an outcome.

        Raises:
            CircuitOpenError: The breaker is open.
        """
        with self._lock:
            self._judge()

    def reset(self) -> None:
        """Close the breaker and empty the window (e.g. after a model swap); totals stay."""
        with self._lock:
            self._reset_window()

    def _write(self, flags: npt.NDArray[np.uint8]) -> None:
        """Append ``flags`` (at most ``window_records`` of them) to the ring, oldest
        dropped first. Slots never written hold 0, so the failures dropped are the
        set flags among the slots overwritten, whether or not the ring was full."""
        size = len(self._ring)
        n = len(flags)
        first = min(n, size - self._next)
        head, tail = slice(self._next, self._next + first), slice(0, n - first)
        dropped = int(np.count_nonzero(self._ring[head])) + int(np.count_nonzero(self._ring[tail]))
        self._ring[head] = flags[:first]
        self._ring[tail] = flags[first:]
        self._failures += int(np.count_nonzero(flags)) - dropped
        self._filled = min(size, self._filled + n)
        self._next = (self._next + n) % size

    def _count(self, total: int, failures: int, error: BaseException | str | None) -> None:
        self._records_total += total
        self._failures_total += failures
        if failures and error is not None:
            self._last_failure = failure_detail(error)

    def _judge(self) -> None:
        """Open the breaker if the window is over the threshold; raise while open."""
        if self._opened is None and self._filled >= self.config.min_records and (
            self._failures >= self.config.max_failure_rate * self._filled
        ):
            self._trips += 1
            self._opened = _Opened(self._failures / self._filled, self._failures, self._filled,
                                   self._last_failure)
        if self._opened is not None:
            opened, cfg = self._opened, self.config
            raise CircuitOpenError(
                f"inference failure rate {opened.failure_rate:.3f} ({opened.failures} of the last "
                f"{opened.records} records) >= max_failure_rate {cfg.max_failure_rate:g} "
                f"(window_records {cfg.window_records}, min_records {cfg.min_records}); failing the job "
                f"so that Flink restarts it from the last checkpoint; "
                f"last failure: {opened.last_failure or 'unknown'}",
                failure_rate=opened.failure_rate,
                failures=opened.failures,
                records=opened.records,
                max_failure_rate=cfg.max_failure_rate,
                last_failure=opened.last_failure,
            )

    # -- gauges ---------------------------------------------------------------------

    @property
    def failure_rate(self) -> float:
        """Failures / outcomes in the window now (0.0 when empty)."""
        with self._lock:
            return self._failures / self._filled if self._filled else 0.0

    @property
    def window_failures(self) -> int:
        """Failed outcomes in the window now."""
        with self._lock:
            return self._failures

    @property
    def window_size(self) -> int:
        """Outcomes in the window now (≤ ``window_records``)."""
        with self._lock:
            return self._filled

    @property
    def records_total(self) -> int:
        """Outcomes recorded since creation (not cleared by :meth:`reset`)."""
        with self._lock:
            return self._records_total

    @property
    def failures_total(self) -> int:
        """Failed outcomes recorded since creation (not cleared by :meth:`reset`)."""
        with self._lock:
            return self._failures_total

    @property
    def trips(self) -> int:
        """How often the breaker opened since creation."""
        with self._lock:
            return self._trips

    @property
    def is_open(self) -> bool:
        """The breaker is open (every record call raises until :meth:`reset`)."""
        with self._lock:
            return self._opened is not None

    @property
    def last_failure(self) -> str:
        """``"Type: message"`` of the last failure recorded with an error ('' if none)."""
        with self._lock:
            return self._last_failure


def _spread(failures: int, total: int, keep: int) -> npt.NDArray[np.uint8]:
    """The last ``min(total, keep)`` outcome flags of a batch of ``total`` with
    ``failures`` spread evenly: outcome ``i`` fails iff ``floor((i+1)f/t) > floor(if/t)``."""
    kept = min(total, keep)
    if kept == 0 or failures == 0:
        return np.zeros(kept, dtype=np.uint8)
    index = np.arange(total - kept, total, dtype=object if total * failures >= 2**62 else np.int64)
    return ((index + 1) * failures // total - index * failures // total).astype(np.uint8)
