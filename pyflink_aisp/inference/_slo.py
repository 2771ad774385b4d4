"""SLO controller: batch size and wait steered online to a p99 latency target.

The batcher reports every finished batch (each record's latency from submit
to result, and the model's compute time). The controller groups reports into
*epochs* (at least ``epoch_s`` seconds and ``min_epoch_records`` records) and
measures, per epoch, for the knobs in force:

* ``p99``: the 99th percentile record latency (nearest rank);
* ``service rate`` μ = records / model compute seconds: the throughput this
  setting sustains when the model never idles (what batching improves);
* ``arrival rate`` λ = records / epoch seconds (the offered load it saw);
* ``fill``: mean batch size / the batch size knob.

Knobs live on a grid: batch sizes on a doubling ladder 1, 2, 4, … up to
``max_batch_size`` (included), waits 0 and ``slo/32 · 2^k`` up to
``min(max_wait_ms, slo/2)``. Each measured grid point is kept with its
(EWMA-smoothed) p99 and μ and the λ it was measured at; the non-dominated
points (higher μ, lower p99) form the Pareto front (:meth:`SloController.front`).
After each epoch the controller decides, in this order:

1. **Overload** (p99 > SLO and μ < 1.2 λ, i.e. utilisation above ~83 %): the
   queue grows because the model cannot keep up; only a larger batch raises
   μ, so step the batch size up the ladder when batches fill at least half
   (waiting less would not help); at the top of the ladder, stay.
2. **Violation** (p99 > SLO otherwise): go to the best measured point under the
   SLO if there is one, else halve the wait, else halve the batch size
   (multiplicative decrease).
3. **Headroom** (p99 < ``headroom`` x SLO): explore one unmeasured neighbour
   that can raise μ: the next batch size when batches fill at least half, else
   the next wait (longer waits give fuller batches at low load).
4. Otherwise **exploit**: move to the measured point with the highest μ whose
   p99 is under the SLO (stay if it is the current one).

Points measured at an arrival rate more than ``load_change`` times away from
the current one are dropped (a load change invalidates their latency), and
points older than ``max_age_epochs`` are forgotten so the grid is re-explored.

Sources: additive-increase / multiplicative-decrease of the batch size under
a latency SLO is Clipper's adaptive batching (Crankshaw et al., "Clipper: A
Low-Latency Online Prediction Serving System", NSDI 2017, §4.3). Keeping the
measured configurations' throughput/latency Pareto front and choosing the
highest-throughput point under the SLO follows the configuration search of
"INFaaS: Automated Model-less Inference Serving" (Romero et al., USENIX ATC
2021) on a grid small enough to explore online. The overload rule is the
queueing fact that latency diverges as utilisation λ/μ → 1.

Not thread-safe: the batching thread owns it; other threads may read
:attr:`SloController.knobs` (an immutable value swapped atomically).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyflink_aisp.errors import ConfigError

__all__ = ["Knobs", "ParetoPoint", "SloController"]


@dataclass(frozen=True, order=True)
class Knobs:
    """One setting of the two batching knobs.

    Attributes:
        max_batch_size: Most records per model call.
        max_wait_ms: Longest a record waits for companions, in milliseconds.
    """

    max_batch_size: int
    max_wait_ms: float


@dataclass(frozen=True)
class ParetoPoint:
    """A measured setting.

    Attributes:
        knobs: The setting.
        p99_ms: Smoothed p99 record latency in milliseconds.
        service_rate: Smoothed records per second of model compute time.
        arrival_rate: Records per second offered when it was measured.
        epoch: Index of the epoch that last measured it.
    """

    knobs: Knobs
    p99_ms: float
    service_rate: float
    arrival_rate: float
    epoch: int


@dataclass
class _Epoch:
    start_s: float | None = None
    latencies_s: list[float] = field(default_factory=list)
    compute_s: float = 0.0
    batches: int = 0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0 < q ≤ 100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


class SloController:
    """Chooses batch size and wait so that the p99 latency stays under a target.

    Args:
        latency_slo_ms: Target p99 latency in milliseconds (> 0).
        max_batch_size: Largest batch size it may choose (≥ 1).
        max_wait_ms: Longest wait it may choose, in milliseconds (≥ 0).
        epoch_s: Shortest measurement epoch in seconds.
        min_epoch_records: Fewest records per epoch (a p99 needs ~100).
        headroom: Fraction of the SLO under which it explores.
        load_change: Arrival-rate ratio beyond which old measurements are dropped.
        max_age_epochs: Epochs after which a measurement is forgotten.

    Raises:
        ConfigError: An argument is out of range.
    """

    def __init__(
        self,
        *,
        latency_slo_ms: float,
        max_batch_size: int,
        max_wait_ms: float,
        epoch_s: float = 1.0,
        min_epoch_records: int = 100,
        headroom: float = 0.7,
        load_change: float = 1.5,
        max_age_epochs: int = 30,
    ) -> None:
        if not (0 < latency_slo_ms < math.inf) or max_batch_size < 1 or not (0 <= max_wait_ms < math.inf):
            raise ConfigError(
                f"invalid SLO controller bounds: latency_slo_ms={latency_slo_ms}, "
                f"max_batch_size={max_batch_size}, max_wait_ms={max_wait_ms}"
            )
        if epoch_s <= 0 or min_epoch_records < 1 or not 0 < headroom < 1 or load_change <= 1:
            raise ConfigError("epoch_s > 0, min_epoch_records >= 1, 0 < headroom < 1, load_change > 1")
        self.latency_slo_ms = latency_slo_ms
        self._sizes = _size_ladder(max_batch_size)
        self._waits = _wait_ladder(latency_slo_ms, max_wait_ms)
        self._epoch_s = epoch_s
        self._min_records = min_epoch_records
        self._headroom = headroom
        self._load_change = load_change
        self._max_age = max_age_epochs
        self._points: dict[Knobs, ParetoPoint] = {}
        self._epoch = _Epoch()
        self.epochs = 0
        self.last_p99_ms: float | None = None
        start_size = min(range(len(self._sizes)), key=lambda i: abs(self._sizes[i] - 32))
        start_wait = min(range(len(self._waits)), key=lambda i: abs(self._waits[i] - latency_slo_ms / 8))
        self.knobs = Knobs(self._sizes[start_size], self._waits[start_wait])

    def observe_batch(self, *, now_s: float, latencies_s: Sequence[float], compute_s: float) -> None:
        """Report one finished batch: each record's submit→result latency and the
        model's compute time (seconds), at time ``now_s`` (the batcher's clock)."""
        epoch = self._epoch
        if epoch.start_s is None:
            epoch.start_s = now_s - max(latencies_s, default=0.0)
        epoch.latencies_s.extend(latencies_s)
        epoch.compute_s += compute_s
        epoch.batches += 1
        elapsed = now_s - epoch.start_s
        if elapsed >= self._epoch_s and len(epoch.latencies_s) >= self._min_records:
            self._end_epoch(elapsed)
            self._epoch = _Epoch(start_s=now_s)

    def front(self) -> list[ParetoPoint]:
        """The measured points no other point beats on both p99 and service rate,
        by ascending p99."""
        points = sorted(self._points.values(), key=lambda p: (p.p99_ms, -p.service_rate))
        front: list[ParetoPoint] = []
        for point in points:
            if not front or point.service_rate > front[-1].service_rate:
                front.append(point)
        return front

    def _end_epoch(self, elapsed_s: float) -> None:
        epoch = self._epoch
        self.epochs += 1
        n = len(epoch.latencies_s)
        p99_ms = percentile(epoch.latencies_s, 99) * 1000.0
        service = n / epoch.compute_s if epoch.compute_s > 0 else math.inf
        arrival = n / elapsed_s
        fill = n / epoch.batches / self.knobs.max_batch_size
        self.last_p99_ms = p99_ms
        self._forget(arrival)
        self._remember(self.knobs, p99_ms, service, arrival)
        self.knobs = self._decide(p99_ms, service, arrival, fill)

    def _forget(self, arrival: float) -> None:
        for knobs, point in list(self._points.items()):
            ratio = max(arrival, 1e-9) / max(point.arrival_rate, 1e-9)
            too_old = self.epochs - point.epoch > self._max_age
            if too_old or not 1 / self._load_change <= ratio <= self._load_change:
                del self._points[knobs]

    def _remember(self, knobs: Knobs, p99_ms: float, service: float, arrival: float) -> None:
        old = self._points.get(knobs)
        if old is not None:  # EWMA, weight 1/2 on the newest epoch
            p99_ms = (old.p99_ms + p99_ms) / 2
            service = (old.service_rate + service) / 2 if math.isfinite(service) else old.service_rate
        self._points[knobs] = ParetoPoint(knobs, p99_ms, service, arrival, self.epochs)

    def _decide(self, p99_ms: float, service: float, arrival: float, fill: float) -> Knobs:
        slo = self.latency_slo_ms
        size_i = self._sizes.index(self.knobs.max_batch_size)
        wait_i = self._waits.index(self.knobs.max_wait_ms)
        if p99_ms > slo:
            if service < 1.2 * arrival:  # overload: only a larger batch raises μ
                if fill >= 0.5 and size_i + 1 < len(self._sizes):
                    return Knobs(self._sizes[size_i + 1], self.knobs.max_wait_ms)
                return self.knobs  # at the top of the ladder: the SLO is out of reach at this load
            best = self._best_under_slo(exclude=self.knobs)
            if best is not None:
                return best
            if wait_i > 0:
                return Knobs(self.knobs.max_batch_size, self._waits[wait_i // 2])
            return Knobs(self._sizes[size_i // 2], self.knobs.max_wait_ms)
        if p99_ms < self._headroom * slo:
            candidate = self._neighbour(size_i, wait_i, fill)
            if candidate is not None:
                return candidate
        return self._best_under_slo() or self.knobs

    def _neighbour(self, size_i: int, wait_i: int, fill: float) -> Knobs | None:
        """An unmeasured setting next to the current one that may raise μ."""
        options = []
        if fill >= 0.5 and size_i + 1 < len(self._sizes):
            options.append(Knobs(self._sizes[size_i + 1], self.knobs.max_wait_ms))
        if wait_i + 1 < len(self._waits):
            options.append(Knobs(self.knobs.max_batch_size, self._waits[wait_i + 1]))
        return next((k for k in options if k not in self._points), None)

    def _best_under_slo(self, exclude: Knobs | None = None) -> Knobs | None:
        """The measured setting with the highest service rate whose p99 meets the SLO."""
        ok = [p for p in self._points.values() if p.p99_ms <= self.latency_slo_ms and p.knobs != exclude]
        if not ok:
            return None
        return max(ok, key=lambda p: (p.service_rate, -p.p99_ms)).knobs


def _size_ladder(cap: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 < cap:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != cap:
        sizes.append(cap)
    return sizes


def _wait_ladder(slo_ms: float, cap_ms: float) -> list[float]:
    top = min(cap_ms, slo_ms / 2)
    waits = [0.0]
    wait = slo_ms / 32
    while wait < top:
        waits.append(wait)
        wait *= 2
    if top > 0 and waits[-1] != top:
        waits.append(top)
    return waits
