"""Inference metrics: sliding-window histograms exposed as Flink gauges.

PyFlink's metric group offers counters, meters, distributions (Beam's sum /
count / min / max) and gauges, but no histogram; and its counters write to
Beam's *per-thread* metrics container, so increments made on the batching
thread or an async function's event loop are lost. Gauges are pulled on the
operator's own thread when a bundle finishes, so every metric here is a gauge
over plain values kept by the runtime and the operators (totals for counts,
percentiles of the last ``window`` samples for latencies and sizes).

Names (operator metric group ``aisp``; units in the name):

* counts: ``recordsIn``, ``recordsOut``, ``deadLetters`` (per operator), with the
  dead-letter watch's ``deadLetterAlarm`` (0/1) and ``deadLetterSharePercent``;
  ``batches``, ``recordsInferred``, ``inferenceFailures``, ``bisections``,
  ``oomSplits``, ``modelSwaps``, ``modelSwapFailures`` (per worker model);
* histograms, each as ``<name>P50``, ``<name>P99``, ``<name>Max``:
  ``batchSize``, ``batchTokens`` (padded tokens), ``queueWaitUs`` (submit →
  batch leaves), ``computeUs`` (one model call), ``serializationUs`` (the
  operator's own record conversion: extract + emit; PyFlink's JVM↔Python
  coder time happens outside user code and is not measurable here),
  ``endToEndUs`` (operator entry → output built);
* state: ``maxBatchSizeKnob``, ``maxWaitUsKnob``, ``sloP99Us`` (last epoch's
  p99 seen by the SLO controller, 0 without one), ``modelLoadTimeMs``,
  ``modelVersion`` (first 12 hex digits of the sha256 as an integer).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Window", "bind_breaker_metrics", "register_window", "version_number"]


class Window:
    """The last ``size`` samples of a quantity, with nearest-rank percentiles.

    Thread-safety: ``add``/``extend`` and the readers may run on different
    threads (a lock guards the deque).
    """

    def __init__(self, size: int = 2048) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, value: float) -> None:
        """Add one sample."""
        with self._lock:
            self._samples.append(value)

    def extend(self, values: Iterable[float]) -> None:
        """Add several samples."""
        with self._lock:
            self._samples.extend(values)

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile ``q`` in (0, 100] of the window; 0.0 when empty."""
        with self._lock:
            ordered = sorted(self._samples)
        if not ordered:
            return 0.0
        return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]

    def __len__(self) -> int:
        return len(self._samples)


def register_window(group: Any, name: str, window: Window) -> None:
    """Register ``<name>P50``, ``<name>P99`` and ``<name>Max`` gauges (rounded ints)
    of ``window`` on a PyFlink metric group."""
    for suffix, q in (("P50", 50.0), ("P99", 99.0), ("Max", 100.0)):
        group.gauge(name + suffix, _rounded(window, q))


def _rounded(window: Window, q: float) -> Callable[[], int]:
    return lambda: round(window.percentile(q))


def version_number(sha256: str) -> int:
    """The first 12 hex digits of a model sha256 as an int (fits a Flink long gauge);
    0 for a version that is not hex."""
    try:
        return int(sha256[:12], 16)
    except ValueError:
        return 0


def bind_breaker_metrics(group: Any, breaker: Any) -> None:
    """Gauges of a :class:`~pyflink_aisp.inference.FailureRateBreaker` (integers, as
    PyFlink gauges are): ``inferenceFailurePermille`` (failures per 1000 outcomes in
    the window), ``breakerWindowFailures``, ``breakerWindowRecords``, ``breakerOpen``
    (0/1) and ``breakerTrips``."""
    group.gauge("inferenceFailurePermille", lambda: round(breaker.failure_rate * 1000))
    group.gauge("breakerWindowFailures", lambda: breaker.window_failures)
    group.gauge("breakerWindowRecords", lambda: breaker.window_size)
    group.gauge("breakerOpen", lambda: int(breaker.is_open))
    group.gauge("breakerTrips", lambda: breaker.trips)
