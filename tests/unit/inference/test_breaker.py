"""Tests for FailureRateBreaker: exact window contents, thresholds, messages, threads."""

from __future__ import annotations

import functools
import math
import pickle
import random
import threading
from collections import deque

import pytest

from pyflink_aisp.errors import CircuitOpenError, ConfigError, InferenceError
from pyflink_aisp.inference import BreakerConfig, FailureRateBreaker
from pyflink_aisp.inference._breaker import failure_detail


def _breaker(rate: float, window: int, minimum: int) -> FailureRateBreaker:
    config = BreakerConfig(max_failure_rate=rate, window_records=window, min_records=minimum)
    return FailureRateBreaker(config)


# -- config -------------------------------------------------------------------------


def test_defaults() -> None:
    assert BreakerConfig() == BreakerConfig(max_failure_rate=0.5, window_records=1000, min_records=100)
    assert FailureRateBreaker().config == BreakerConfig()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_failure_rate": 0.0},
        {"max_failure_rate": -0.1},
        {"max_failure_rate": 1.0000001},
        {"max_failure_rate": math.nan},
        {"max_failure_rate": math.inf},
        {"max_failure_rate": True},
        {"max_failure_rate": "0.5"},
        {"window_records": 0},
        {"window_records": -5},
        {"window_records": 10.0},
        {"window_records": True, "min_records": 1},
        {"min_records": 0},
        {"min_records": 2.5},
        {"window_records": 10, "min_records": 11},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        BreakerConfig(**kwargs)  # type: ignore[arg-type]


def test_edge_configs_are_accepted() -> None:
    BreakerConfig(max_failure_rate=1.0, window_records=1, min_records=1)
    BreakerConfig(max_failure_rate=1e-9, window_records=10, min_records=10)
    BreakerConfig(max_failure_rate=1, window_records=5, min_records=5)  # an int rate


# -- window and threshold ---------------------------------------------------------


def test_min_records_holds_the_judgement_back() -> None:
    breaker = _breaker(0.5, 10, 5)
    for _ in range(4):
        breaker.record(True)
    assert breaker.failure_rate == 1.0 and not breaker.is_open
    with pytest.raises(CircuitOpenError):
        breaker.record(True)
    assert breaker.is_open and breaker.trips == 1


def test_rate_equal_to_threshold_opens() -> None:
    breaker = _breaker(0.5, 4, 4)
    breaker.record(True)
    breaker.record(False)
    breaker.record(False)
    with pytest.raises(CircuitOpenError):
        breaker.record(True)  # 2 of 4 = 0.5 >= 0.5


def test_rate_just_below_threshold_stays_closed() -> None:
    breaker = _breaker(0.5, 5, 5)
    for failed in (True, False, True, False, False):
        breaker.record(failed)  # 2 of 5 = 0.4
    assert breaker.failure_rate == 0.4 and not breaker.is_open
    breaker.check()


def test_window_slides_out_old_outcomes() -> None:
    breaker = _breaker(0.75, 4, 4)
    expected = []
    for failed in (True, True, False, False, False, False, True, True):
        breaker.record(failed)
        expected.append((breaker.window_failures, breaker.window_size))
    assert expected == [(1, 1), (2, 2), (2, 3), (2, 4), (1, 4), (0, 4), (1, 4), (2, 4)]
    with pytest.raises(CircuitOpenError):
        breaker.record(True)  # window S F F F (F = failed): 3 of 4 = 0.75
    assert breaker.window_failures == 3


def test_record_many_spreads_failures_evenly() -> None:
    """Outcome i of a batch (t, f) fails iff floor((i+1)f/t) > floor(if/t): here
    t=5, f=2 gives S S F S F (F = failed), dropped in that order as the window slides."""
    breaker = _breaker(1.0, 5, 5)
    breaker.record_many(2, 5)
    assert breaker.window_failures == 2
    fails_left = []
    for _ in range(5):
        breaker.record(False)
        fails_left.append(breaker.window_failures)
    assert fails_left == [2, 2, 1, 1, 0]


def test_batch_larger_than_window_keeps_its_last_outcomes_at_its_rate() -> None:
    breaker = _breaker(0.5, 1000, 100)
    breaker.record_many(600, 2000)  # kept: the last 1000 of 2000 -> ceil(1000 * 600 / 2000) = 300
    assert (breaker.window_failures, breaker.window_size) == (300, 1000)
    assert breaker.records_total == 2000 and breaker.failures_total == 600
    small = _breaker(1.0, 2, 1)
    small.record_many(1, 3)  # S S F -> keeps S F
    assert (small.window_failures, small.window_size) == (1, 2)
    one = _breaker(1.0, 1, 1)
    with pytest.raises(CircuitOpenError):
        one.record_many(1, 3)  # the failure is the last outcome: ceil(1 * 1 / 3) = 1


def test_record_many_of_zero_records_only_judges() -> None:
    breaker = _breaker(0.5, 10, 1)
    breaker.record_many(0, 0)
    assert breaker.window_size == 0 and breaker.failure_rate == 0.0
    breaker.record_many(0, 3)
    assert (breaker.window_failures, breaker.window_size) == (0, 3)


@pytest.mark.parametrize("args", [(-1, 3), (4, 3), (1.0, 3), (1, 3.0), (True, 3), (1, None)])
def test_record_many_refuses_bad_counts(args: tuple[object, object]) -> None:
    breaker = _breaker(0.5, 10, 1)
    with pytest.raises(ValueError):
        breaker.record_many(*args)  # type: ignore[arg-type]
    assert breaker.records_total == 0


def _reference_spread(failures: int, total: int) -> list[bool]:
    return [(i + 1) * failures // total > i * failures // total for i in range(total)]


@pytest.mark.parametrize("window", [1, 3, 7, 64])
def test_window_equals_a_plain_deque_of_the_last_outcomes(window: int) -> None:
    """Random mix of single records and batches (some larger than the window)
    against ``deque(maxlen=window)`` of the documented per-record outcomes; the
    breaker opens exactly when the deque is over the threshold."""
    rng = random.Random(window)
    minimum = max(1, window // 2)
    breaker = _breaker(0.6, window, minimum)
    reference: deque[bool] = deque(maxlen=window)
    trips = 0
    for _ in range(500):
        if rng.random() < 0.5:
            failed = rng.random() < 0.3
            outcomes = [failed]
            call = functools.partial(breaker.record, failed)
        else:
            total = rng.randrange(0, 3 * window + 2)
            failures = rng.randrange(0, total + 1) if total else 0
            outcomes = _reference_spread(failures, total)
            call = functools.partial(breaker.record_many, failures, total)
        reference.extend(outcomes)
        if len(reference) >= minimum and sum(reference) >= 0.6 * len(reference):
            with pytest.raises(CircuitOpenError):
                call()
            assert (breaker.window_failures, breaker.window_size) == (sum(reference), len(reference))
            trips += 1
            breaker.reset()
            reference.clear()
        else:
            call()
        assert (breaker.window_failures, breaker.window_size) == (sum(reference), len(reference))
    assert breaker.trips == trips > 0


# -- open state, message, error -----------------------------------------------------


def test_message_is_one_line_with_rate_window_threshold_and_last_failure() -> None:
    breaker = _breaker(0.5, 4, 2)
    breaker.record(False)
    long_detail = "CUDA error: an illegal memory access was encountered\n" + "x" * 400
    with pytest.raises(CircuitOpenError) as caught:
        breaker.record(True, RuntimeError(long_detail))
    message = str(caught.value)
    detail = ("RuntimeError: CUDA error: an illegal memory access was encountered " + "x" * 400)[:300]
    assert message == (
        "inference failure rate 0.500 (1 of the last 2 records) >= max_failure_rate 0.5 "
        "(window_records 4, min_records 2); failing the job so that Flink restarts it from "
        f"the last checkpoint; last failure: {detail}"
    )
    assert "\n" not in message
    error = caught.value
    assert isinstance(error, InferenceError)
    assert (error.failure_rate, error.failures, error.records, error.max_failure_rate) == (0.5, 1, 2, 0.5)
    assert error.last_failure == detail and len(error.last_failure) == 300
    clone = pickle.loads(pickle.dumps(error))
    assert str(clone) == message and clone.last_failure == detail and clone.failures == 1


def test_failure_detail_forms() -> None:
    assert failure_detail(ValueError("bad  input\nhere")) == "ValueError: bad input here"
    assert failure_detail("TimeoutError: 2 s") == "TimeoutError: 2 s"
    assert failure_detail("y" * 1000) == "y" * 300


def test_last_failure_is_kept_across_successes_and_batches() -> None:
    breaker = _breaker(1.0, 10, 10)
    assert breaker.last_failure == ""
    breaker.record(True, KeyError("k"))
    breaker.record(False, RuntimeError("ignored: not a failure"))
    breaker.record(True)  # no error given: the last detail stays
    assert breaker.last_failure == "KeyError: 'k'"
    breaker.record_many(2, 4, "OSError: disk")
    breaker.record_many(0, 4, "ignored")
    assert breaker.last_failure == "OSError: disk"


def test_unknown_last_failure_is_named_so() -> None:
    breaker = _breaker(1.0, 1, 1)
    with pytest.raises(CircuitOpenError, match=r"last failure: unknown$"):
        breaker.record(True)


def test_open_breaker_latches_until_reset() -> None:
    breaker = _breaker(0.5, 4, 2)
    with pytest.raises(CircuitOpenError):
        breaker.record_many(2, 2, "RuntimeError: boom")
    with pytest.raises(CircuitOpenError) as again:
        breaker.record_many(0, 4)  # the window is now healthy, but it stays open
    assert again.value.failures == 2 and again.value.records == 2  # reports the window that opened it
    with pytest.raises(CircuitOpenError):
        breaker.check()
    assert breaker.is_open and breaker.trips == 1 and breaker.failure_rate == 0.0
    breaker.reset()
    assert not breaker.is_open and breaker.window_size == 0 and breaker.last_failure == ""
    assert (breaker.records_total, breaker.failures_total, breaker.trips) == (6, 2, 1)
    breaker.record(False)
    breaker.check()


def test_gauges_are_plain_numbers() -> None:
    breaker = _breaker(0.9, 10, 10)
    breaker.record_many(3, 8)
    values = (breaker.failure_rate, breaker.window_failures, breaker.window_size,
              breaker.records_total, breaker.failures_total, breaker.trips)
    assert values == (0.375, 3, 8, 8, 3, 0)
    assert [type(v) for v in values] == [float, int, int, int, int, int]


# -- threads ------------------------------------------------------------------------


def test_concurrent_recording_loses_no_outcome() -> None:
    """8 threads, each 2,000 single records and 100 batches of 10; the window holds
    everything, so its counts are exact whatever the interleaving."""
    per_thread = 2_000 + 100 * 10
    breaker = _breaker(1.0, 8 * per_thread, 1)
    barrier = threading.Barrier(8)

    def work(index: int) -> None:
        barrier.wait()
        for k in range(2_000):
            breaker.record(index % 2 == 0 and k % 4 == 0, "RuntimeError: x")
        for _ in range(100):
            breaker.record_many(3 if index % 2 else 0, 10)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected_failures = 4 * 500 + 4 * 300
    assert (breaker.window_size, breaker.window_failures) == (8 * per_thread, expected_failures)
    assert (breaker.records_total, breaker.failures_total) == (8 * per_thread, expected_failures)
    assert not breaker.is_open


def test_concurrent_failures_trip_once_and_every_thread_sees_it() -> None:
    breaker = _breaker(0.5, 100, 50)
    barrier = threading.Barrier(6)
    raised = [0] * 6

    def work(index: int) -> None:
        barrier.wait()
        for _ in range(200):
            try:
                breaker.record(True, "RuntimeError: CUDA error")
            except CircuitOpenError:
                raised[index] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert breaker.trips == 1 and breaker.window_failures == 100
    assert sum(raised) == 6 * 200 - 49  # every record after the 50th raised
    assert all(count > 0 for count in raised)
