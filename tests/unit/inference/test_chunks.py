"""ChunkQueue: whole submitted batches cut into model batches (pure, no threads)."""

from __future__ import annotations

import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference._chunks import Chunk, ChunkQueue


def chunk(lengths: list[int], arrived_s: float = 0.0, payload: object = None) -> Chunk:
    return Chunk(payload, np.asarray(lengths, dtype=np.int64), arrived_s)


def cuts(queue: ChunkQueue, max_batch_size: int) -> list[tuple[Chunk, list[int]]]:
    """Every batch the queue gives until it is empty: (chunk, rows)."""
    out = []
    while (taken := queue.take(max_batch_size)) is not None:
        out.append((taken[0], taken[1].tolist()))
    return out


def rows_of(batches: list[tuple[Chunk, list[int]]]) -> list[list[int]]:
    return [rows for _, rows in batches]


def test_rows_are_sorted_by_length_and_cut_at_the_batch_size() -> None:
    queue = ChunkQueue()
    queue.put(chunk([5, 1, 3, 2, 4, 6, 1]))
    # stable sort by length: ties keep their input order (rows 1 and 6)
    assert rows_of(cuts(queue, 3)) == [[1, 6, 3], [2, 4, 0], [5]]
    assert len(queue) == 0 and queue.take(3) is None


def test_the_token_budget_bounds_rows_times_longest_row() -> None:
    queue = ChunkQueue(max_batch_tokens=10)
    lengths = [12, 1, 3, 2, 9, 1, 4, 3, 5, 2]
    queue.put(chunk(lengths))
    batches = rows_of(cuts(queue, 8))
    assert [[lengths[r] for r in rows] for rows in batches] == [[1, 1, 2, 2], [3, 3], [4, 5], [9], [12]]
    assert batches == [[1, 5, 3, 9], [2, 7], [6, 8], [4], [0]]  # a row over the budget runs alone
    for rows in batches[:-1]:
        assert len(rows) * max(lengths[r] for r in rows) <= 10


def test_a_batch_holds_one_length_bucket() -> None:
    queue = ChunkQueue(length_buckets=(2, 4))
    lengths = [1, 3, 5, 2, 4, 6, 2, 40]
    queue.put(chunk(lengths))
    batches = rows_of(cuts(queue, 8))
    # buckets: <= 2, 3..4, > 4 (the last bucket takes everything longer)
    assert batches == [[0, 3, 6], [1, 4], [2, 5, 7]]


def test_buckets_budget_and_size_together() -> None:
    queue = ChunkQueue(length_buckets=(4,), max_batch_tokens=12)
    lengths = [4, 1, 1, 1, 1, 1, 3, 8, 6, 2]
    queue.put(chunk(lengths))
    batches = rows_of(cuts(queue, 4))
    # bucket <= 4: 1,1,1,1,1,2,3,4 -> size 4 first, then the budget (4 x 3 = 12 fits, then 4 alone);
    # bucket > 4: 6, 8 -> 2 x 8 = 16 > 12, so one each
    assert [[lengths[r] for r in rows] for rows in batches] == [[1, 1, 1, 1], [1, 2, 3], [4], [6], [8]]
    assert batches == [[1, 2, 3, 4], [5, 9, 6], [0], [8], [7]]


def test_chunks_are_served_fifo_and_never_mixed() -> None:
    queue = ChunkQueue()
    first, second, third = chunk([3, 1, 2], 1.0, "a"), chunk([1], 2.0, "b"), chunk([2, 2, 2, 2, 2], 3.0, "c")
    for c in (first, second, third):
        queue.put(c)
    assert len(queue) == 3 and queue.oldest_arrival_s() == 1.0
    batches = cuts(queue, 2)
    assert [(c.payload, rows) for c, rows in batches] == [
        ("a", [1, 2]), ("a", [0]), ("b", [0]), ("c", [0, 1]), ("c", [2, 3]), ("c", [4])]
    assert queue.oldest_arrival_s() is None


def test_the_head_chunk_leaves_when_its_last_row_is_taken() -> None:
    queue = ChunkQueue()
    first, second = chunk([1, 1, 1], 1.0), chunk([1], 2.0)
    queue.put(first)
    queue.put(second)
    taken = queue.take(2)
    assert taken is not None and taken[0] is first and first.cursor == 2
    assert len(queue) == 2 and queue.oldest_arrival_s() == 1.0
    taken = queue.take(2)
    assert taken is not None and taken[0] is first and taken[1].tolist() == [2]
    assert len(queue) == 1 and queue.oldest_arrival_s() == 2.0


def test_an_empty_chunk_resolves_at_once_and_is_not_queued() -> None:
    queue = ChunkQueue()
    empty = chunk([])
    queue.put(empty)
    assert empty.future.done() and empty.future.result() == []
    assert len(queue) == 0 and queue.take(4) is None


def test_record_collects_outcomes_in_row_order() -> None:
    queue = ChunkQueue()
    c = chunk([3, 1, 2])
    queue.put(c)
    assert c.outcomes == [None, None, None] and c.remaining == 3
    (_, rows), (_, rest) = cuts(queue, 2)
    assert c.record(np.asarray(rows), ["one", "two"]) is False
    error = ValueError("bad")
    assert c.record(np.asarray(rest), [error]) is True
    assert c.outcomes == [error, "one", "two"] and c.remaining == 0


def test_drain_returns_the_queued_chunks() -> None:
    queue = ChunkQueue()
    first, second = chunk([1, 2, 3]), chunk([4])
    queue.put(first)
    queue.put(second)
    queue.take(1)
    assert queue.drain() == [first, second] and len(queue) == 0
    assert first.order[first.cursor:].tolist() == [1, 2]  # the rows that never ran


def test_bad_inputs_are_config_errors() -> None:
    queue = ChunkQueue()
    with pytest.raises(ConfigError, match=r"chunk lengths must be \(n,\)"):
        queue.put(Chunk(None, np.zeros((2, 2), dtype=np.int64), 0.0))
    queue.put(chunk([1]))
    with pytest.raises(ConfigError, match="max_batch_size must be >= 1, got 0"):
        queue.take(0)
