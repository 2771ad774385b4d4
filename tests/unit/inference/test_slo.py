"""The SLO controller on a synthetic latency model (fake clock, fake model).

A discrete-event simulation drives the real :class:`BatchQueue` and
:class:`SloController`: Poisson arrivals, one model whose compute time is
``fixed + per_record * batch size`` seconds, batches formed exactly as the
batcher forms them. Everything is seeded, so the results are exact.
"""

import math
import random

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchingConfig, SloController
from pyflink_aisp.inference._queue import BatchQueue
from pyflink_aisp.inference._slo import Knobs, percentile


def simulate(config, phases, *, fixed_s=0.004, per_record_s=0.0005, seed=0, controller=None):
    """Run ``phases`` = [(seconds, arrivals per second), ...]; returns completions
    [(arrival_s, done_s)] and the knobs in force at each dispatch [(time_s, Knobs)]."""
    rng = random.Random(seed)
    arrivals, start = [], 0.0
    for seconds, rate in phases:
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= start + seconds:
                break
            arrivals.append(t)
        start += seconds
    queue, done, dispatched = BatchQueue(config), [], []
    t, i, busy_until, in_model = 0.0, 0, math.inf, []
    while i < len(arrivals) or len(queue) or in_model:
        knobs = controller.knobs if controller else Knobs(config.max_batch_size, config.max_wait_ms)
        queue.set_limits(max_batch_size=knobs.max_batch_size, max_wait_ms=knobs.max_wait_ms)
        if not in_model and queue.ready(t):
            in_model = queue.take()
            busy_until = t + fixed_s + per_record_s * len(in_model)
            dispatched.append((t, knobs))
            continue
        next_arrival = arrivals[i] if i < len(arrivals) else math.inf
        deadline = (queue.deadline_s() or math.inf) if not in_model else math.inf
        t = min(next_arrival, busy_until, deadline)
        if t == busy_until:
            done.extend((a, t) for a in in_model)
            if controller:
                controller.observe_batch(now_s=t, latencies_s=[t - a for a in in_model],
                                         compute_s=fixed_s + per_record_s * len(in_model))
            in_model, busy_until = [], math.inf
        elif t == next_arrival:
            queue.put(t, t)
            i += 1
    return done, dispatched


def window_stats(done, start_s, end_s):
    """p99 latency (ms) and throughput (records/s) of records arriving in [start, end)."""
    lat = [d - a for a, d in done if start_s <= a < end_s]
    return percentile(lat, 99) * 1000, len(lat) / (end_s - start_s)


def test_fixed_knobs_miss_a_tight_slo_at_low_load_and_the_controller_meets_it():
    config = BatchingConfig(max_batch_size=256, max_wait_ms=50, max_idle_ms=None)
    fixed, _ = simulate(config, [(60, 100)])
    p99_fixed, _ = window_stats(fixed, 30, 60)
    assert p99_fixed > 50  # every record waits out the 50 ms for companions that never come

    controller = SloController(latency_slo_ms=20, max_batch_size=256, max_wait_ms=50)
    steered, _ = simulate(config, [(60, 100)], controller=controller)
    p99, rate = window_stats(steered, 30, 60)
    assert p99 <= 20
    assert rate == pytest.approx(100, rel=0.1)
    assert controller.knobs.max_wait_ms <= 10


def test_high_load_needs_batches_and_the_controller_grows_them_under_the_slo():
    config = BatchingConfig(max_batch_size=512, max_wait_ms=50, latency_slo_ms=100, max_idle_ms=None)
    controller = SloController(latency_slo_ms=100, max_batch_size=512, max_wait_ms=50)
    done, dispatched = simulate(config, [(60, 1200)], controller=controller)
    p99, rate = window_stats(done, 30, 59)
    assert p99 <= 100
    assert rate == pytest.approx(1200, rel=0.05)  # keeps up: no backlog
    # batches of 8 would serve only 8 / (4 + 4) ms = 1000/s < 1200/s
    assert controller.knobs.max_batch_size >= 16
    assert max(k.max_batch_size for _, k in dispatched[-200:]) >= 16


def test_the_controller_adapts_when_the_load_steps_up():
    controller = SloController(latency_slo_ms=100, max_batch_size=512, max_wait_ms=50)
    config = BatchingConfig(max_batch_size=512, max_wait_ms=50, max_idle_ms=None)
    done, dispatched = simulate(config, [(30, 100), (60, 1200)], controller=controller)
    p99_low, _ = window_stats(done, 10, 30)
    p99_high, rate_high = window_stats(done, 60, 89)
    assert p99_low <= 100 and p99_high <= 100
    assert rate_high == pytest.approx(1200, rel=0.05)
    low_sizes = [k.max_batch_size for t, k in dispatched if 20 <= t < 30]
    high_sizes = [k.max_batch_size for t, k in dispatched if 70 <= t < 90]
    assert min(high_sizes) > min(low_sizes) or max(high_sizes) >= 16


def test_front_holds_only_non_dominated_points():
    controller = SloController(latency_slo_ms=100, max_batch_size=512, max_wait_ms=50)
    simulate(BatchingConfig(max_batch_size=512, max_wait_ms=50, max_idle_ms=None),
             [(40, 1200)], controller=controller)
    front = controller.front()
    assert front, "the controller measured nothing"
    for a in front:
        for b in front:
            assert not (b.p99_ms < a.p99_ms and b.service_rate > a.service_rate)
    assert [p.p99_ms for p in front] == sorted(p.p99_ms for p in front)
    assert [p.service_rate for p in front] == sorted(p.service_rate for p in front)


def test_an_unreachable_slo_settles_at_the_smallest_setting():
    # one record alone takes 4.5 ms of compute: a 2 ms p99 is out of reach
    controller = SloController(latency_slo_ms=2, max_batch_size=64, max_wait_ms=50)
    simulate(BatchingConfig(max_batch_size=64, max_wait_ms=50, max_idle_ms=None),
             [(30, 50)], controller=controller)
    assert controller.knobs == Knobs(1, 0.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"latency_slo_ms": 0}, {"max_batch_size": 0}, {"max_wait_ms": -1}, {"headroom": 1.0}, {"epoch_s": 0}],
)
def test_controller_validation(kwargs):
    args = {"latency_slo_ms": 100, "max_batch_size": 64, "max_wait_ms": 10} | kwargs
    with pytest.raises(ConfigError):
        SloController(**args)


def test_percentile_is_nearest_rank():
    assert percentile([5, 1, 4, 2, 3], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([7], 99) == 7
