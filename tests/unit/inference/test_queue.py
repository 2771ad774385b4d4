"""Batch forming with an explicit clock: exact batch compositions."""

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchingConfig
from pyflink_aisp.inference._queue import BatchQueue


def fill(queue, items, now=0.0):
    for name, tokens in items:
        queue.put(name, now, tokens)


def test_not_ready_until_full_or_waited():
    q = BatchQueue(BatchingConfig(max_batch_size=3, max_wait_ms=10, max_idle_ms=None))
    fill(q, [("a", 1), ("b", 1)], now=1.0)
    assert not q.ready(1.0)
    assert q.deadline_s() == pytest.approx(1.010)
    assert not q.ready(1.0099)
    assert q.ready(1.010)
    q.put("c", 1.005)
    assert q.ready(1.005)  # full before the wait ran out
    assert q.take() == ["a", "b", "c"] and len(q) == 0 and q.deadline_s() is None


def test_full_batches_in_arrival_order_then_the_rest():
    q = BatchQueue(BatchingConfig(max_batch_size=2, max_wait_ms=0))
    fill(q, [(x, 1) for x in "abcde"])
    assert [q.take(), q.take(), q.take(), q.take()] == [["a", "b"], ["c", "d"], ["e"], []]


def test_length_buckets_group_short_and_long_records():
    q = BatchQueue(BatchingConfig(max_batch_size=2, max_wait_ms=5, length_buckets=(16, 64)))
    fill(q, [("s1", 10), ("L1", 100), ("m1", 40), ("s2", 16), ("L2", 65), ("m2", 17)])
    # every bucket is full: the one whose head came first leaves first
    assert q.take() == ["s1", "s2"]
    assert q.take() == ["L1", "L2"]
    assert q.take() == ["m1", "m2"]


def test_oldest_bucket_leaves_when_none_is_full():
    q = BatchQueue(BatchingConfig(max_batch_size=4, max_wait_ms=5, length_buckets=(16,), max_idle_ms=None))
    q.put("long", 0.000, 50)
    q.put("short", 0.001, 5)
    assert not q.ready(0.004)
    assert q.ready(0.005)
    assert q.take() == ["long"]
    assert q.deadline_s() == pytest.approx(0.006)
    assert q.take() == ["short"]


def test_token_budget_limits_padded_size():
    q = BatchQueue(BatchingConfig(max_batch_size=10, max_wait_ms=60_000, max_batch_tokens=100))
    fill(q, [("a", 20), ("b", 30), ("c", 25), ("d", 40), ("e", 10)])
    assert q.ready(0.0)  # a, b, c fill 3 * 30 = 90; adding d would pad to 4 * 40 = 160
    assert q.take() == ["a", "b", "c"]
    assert q.take() == ["d", "e"]  # 2 * 40 = 80


def test_a_record_over_the_budget_runs_alone():
    q = BatchQueue(BatchingConfig(max_batch_size=10, max_wait_ms=0, max_batch_tokens=50))
    fill(q, [("huge", 500), ("x", 5)])
    assert q.take() == ["huge"]
    assert q.take() == ["x"]


@pytest.mark.parametrize(
    "kwargs",
    [{"max_batch_tokens": 0}, {"length_buckets": (64, 16)}, {"length_buckets": (0,)},
     {"length_buckets": (8, 8)}],
)
def test_config_validation(kwargs):
    with pytest.raises(ConfigError):
        BatchingConfig(**kwargs)


def test_a_pause_in_the_input_releases_the_batch_before_max_wait():
    queue = BatchQueue(BatchingConfig(max_batch_size=10, max_wait_ms=50, max_idle_ms=2))
    queue.put("a", 0.000)
    queue.put("b", 0.001)
    queue.put("c", 0.0025)
    assert queue.deadline_s() == pytest.approx(0.0045)  # 2 ms after the last arrival
    assert not queue.ready(0.004)
    assert queue.ready(0.0046)
    assert queue.take() == ["a", "b", "c"]
    steady = BatchQueue(BatchingConfig(max_batch_size=10, max_wait_ms=5, max_idle_ms=2))
    for i in range(8):  # arrivals every 1 ms never pause: max_wait decides
        steady.put(i, i / 1000)
    assert steady.deadline_s() == pytest.approx(0.005)
