"""Cost-based cuts of length-sorted rows (pure): the fitted call cost and the optimal partition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference._chunks import Chunk, ChunkQueue, plan_window
from pyflink_aisp.inference._cost import BatchCostModel, CallCost, cost_cuts


def total(lengths: list[int], ends: list[int], cost: CallCost) -> float:
    starts = [0, *ends[:-1]]
    return sum(cost.seconds(e - s, lengths[e - 1]) for s, e in zip(starts, ends, strict=True))


def brute_force(lengths: list[int], cost: CallCost, max_rows: int, max_tokens: int | None,
                buckets: list[int] | None) -> float:
    """Least total cost over every way to cut ``lengths`` (2^(n-1) of them)."""
    n, best = len(lengths), float("inf")
    for mask in itertools.product((False, True), repeat=n - 1):
        ends = [i + 1 for i, cut in enumerate(mask) if cut] + [n]
        starts = [0, *ends[:-1]]
        ok = all(
            e - s <= max_rows
            and (max_tokens is None or e - s == 1 or (e - s) * lengths[e - 1] <= max_tokens)
            and (buckets is None or buckets[s] == buckets[e - 1])
            for s, e in zip(starts, ends, strict=True)
        )
        if ok:
            best = min(best, total(lengths, ends, cost))
    return best


def test_a_short_run_and_a_long_row_are_cut_apart() -> None:
    cost = CallCost(5.0, 1.0)
    # one batch: 5 + 4 x 10 = 45; [1, 1, 1] + [10]: (5 + 3) + (5 + 10) = 23; each alone: 4 x 5 + 13 = 33
    assert cost_cuts(np.array([1, 1, 1, 10]), cost, max_rows=8).tolist() == [3, 4]


def test_a_large_call_cost_keeps_rows_together_and_a_small_one_splits_them() -> None:
    lengths = np.array([10, 12, 14, 30])
    assert cost_cuts(lengths, CallCost(1000.0, 1.0), max_rows=8).tolist() == [4]
    assert cost_cuts(lengths, CallCost(1e-6, 1.0), max_rows=8).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("seed", range(40))
def test_the_cuts_are_optimal_within_every_limit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 11))
    lengths = np.sort(rng.integers(1, 60, n))
    cost = CallCost(float(rng.uniform(0.1, 50)), float(rng.uniform(0.01, 2)))
    max_rows = int(rng.integers(1, 6))
    max_tokens = None if seed % 3 == 0 else int(rng.integers(20, 150))
    buckets = None if seed % 2 == 0 else np.searchsorted([20, 40], lengths, side="left")
    ends = cost_cuts(lengths, cost, max_rows=max_rows, max_tokens=max_tokens, buckets=buckets)
    listed = lengths.tolist()
    assert ends[-1] == n and np.all(np.diff(ends) > 0)
    starts = [0, *ends[:-1].tolist()]
    for s, e in zip(starts, ends.tolist(), strict=True):
        assert e - s <= max_rows
        assert max_tokens is None or e - s == 1 or (e - s) * listed[e - 1] <= max_tokens
        assert buckets is None or buckets[s] == buckets[e - 1]
    want = brute_force(listed, cost, max_rows, max_tokens, None if buckets is None else buckets.tolist())
    assert total(listed, ends.tolist(), cost) == pytest.approx(want, rel=1e-12)


def test_no_rows_no_cuts_and_bad_limits_are_refused() -> None:
    assert cost_cuts(np.array([], dtype=np.int64), CallCost(1.0, 1.0), max_rows=4).tolist() == []
    with pytest.raises(ConfigError, match="max_rows"):
        cost_cuts(np.array([1]), CallCost(1.0, 1.0), max_rows=0)
    with pytest.raises(ConfigError, match="> 0"):
        CallCost(0.0, 1.0)


def test_the_cost_model_recovers_the_call_and_token_costs() -> None:
    model = BatchCostModel(window=64, min_calls=4, refit_every=1)
    for tokens in (100, 200, 300):
        model.observe(tokens, 0.002 + 5e-5 * tokens)
    assert model.cost is None  # 3 calls < min_calls
    model.observe(400, 0.002 + 5e-5 * 400)
    assert model.cost is not None
    assert model.cost.per_call_s == pytest.approx(0.002, rel=1e-9)
    assert model.cost.per_token_s == pytest.approx(5e-5, rel=1e-9)


def test_the_cost_model_follows_the_last_window_of_calls() -> None:
    model = BatchCostModel(window=4, min_calls=4, refit_every=1)
    for tokens in (100, 200, 300, 400):
        model.observe(tokens, 0.002 + 5e-5 * tokens)
    for tokens in (100, 200, 300, 400):  # the model got twice as slow per token
        model.observe(tokens, 0.002 + 1e-4 * tokens)
    assert model.cost is not None and model.cost.per_token_s == pytest.approx(1e-4, rel=1e-9)


def test_calls_without_a_finite_positive_time_are_ignored() -> None:
    model = BatchCostModel(min_calls=4, refit_every=1)
    for tokens in (100, 200, 300, 400):
        model.observe(tokens, 0.002 + 5e-5 * tokens)
    for tokens, seconds in ((500, float("inf")), (500, float("nan")), (500, 0.0), (0, 0.01), (500, -1.0)):
        model.observe(tokens, seconds)
    assert model.cost is not None
    assert (model.cost.per_call_s, model.cost.per_token_s) == (pytest.approx(0.002), pytest.approx(5e-5))


def test_slow_outlier_calls_barely_move_the_fit() -> None:
    model = BatchCostModel(min_calls=4, refit_every=1)
    rng = np.random.default_rng(3)
    for tokens in rng.integers(64, 2048, 40).tolist():
        model.observe(tokens, 0.002 + 5e-5 * tokens)
    for tokens in (100, 900, 1500):
        model.observe(tokens, 0.5)  # a garbage collection or a preempted core: 10-100x slower
    assert model.cost is not None
    assert model.cost.per_token_s == pytest.approx(5e-5, rel=0.02)
    assert model.cost.per_call_s == pytest.approx(0.002, rel=0.1)


def test_without_a_fit_the_model_still_refits_only_every_refit_every_calls(monkeypatch) -> None:
    """Chunks whose batches all have one size never give a fit: that must not cost a fit per call."""
    model = BatchCostModel(min_calls=16, refit_every=16)
    fits = []
    real_fit = model._fit
    monkeypatch.setattr(model, "_fit", lambda: fits.append(1) or real_fit())
    for _ in range(100):
        model.observe(32 * 40, 0.05)
        assert model.cost is None
    assert len(fits) == 1 + (100 - 16) // 16  # at the 16th call, then every 16 more


def test_the_fit_is_refreshed_every_refit_every_calls() -> None:
    model = BatchCostModel(window=64, min_calls=4, refit_every=4)
    for tokens in (100, 200, 300, 400):
        model.observe(tokens, 0.002 + 5e-5 * tokens)
    first = model.cost
    assert first is not None
    for tokens in (100, 200, 300):
        model.observe(tokens, 0.004 + 5e-5 * tokens)
    assert model.cost is first  # 3 new calls: not refitted yet
    model.observe(400, 0.004 + 5e-5 * 400)
    assert model.cost is not first


def test_no_fit_without_spread_or_slope_and_a_floor_on_the_per_call_part() -> None:
    same = BatchCostModel(min_calls=4, refit_every=1)
    for _ in range(8):
        same.observe(320, 0.02)  # one size only: the slope is unknown
    assert same.cost is None
    falling = BatchCostModel(min_calls=4, refit_every=1)
    for tokens in (100, 200, 300, 400):
        falling.observe(tokens, 0.05 - 1e-4 * tokens)  # slope < 0
    assert falling.cost is None
    no_overhead = BatchCostModel(min_calls=4, refit_every=1)
    for tokens in (100, 200, 300, 400):
        no_overhead.observe(tokens, 1e-4 * tokens - 0.001)  # intercept < 0
    fitted = no_overhead.cost  # no overhead seen: one token's work per call, cuts minimise padding
    assert fitted is not None and fitted.seconds(1, 1) == pytest.approx(2e-4)
    assert fitted.seconds(2, 100) == pytest.approx(1e-4 + 1e-4 * 200)
    with pytest.raises(ConfigError):
        BatchCostModel(window=4, min_calls=8)
    with pytest.raises(ConfigError):
        BatchCostModel(min_spread=1.0)
    with pytest.raises(ConfigError):
        BatchCostModel(refit_every=0)


def test_the_chunk_queue_cuts_where_the_cost_says_and_replans_for_a_new_batch_size() -> None:
    queue = ChunkQueue()
    lengths = [10, 1, 1, 1, 2, 2, 2, 2]
    queue.put(Chunk(None, np.asarray(lengths, dtype=np.int64), 0.0))
    cost = CallCost(4.0, 1.0)
    chunk, rows = queue.take(8, cost)
    first = [lengths[r] for r in rows.tolist()]
    # (4 + 7 x 2) + (4 + 10) = 32; all together 4 + 80; [1] x 3, [2] x 4, [10]: 7 + 12 + 14 = 33
    assert first == [1, 1, 1, 2, 2, 2, 2]
    assert chunk.cuts is not None and chunk.cuts.tolist() == [7, 8]
    chunk2, rows = queue.take(8, cost)
    assert chunk2 is chunk and [lengths[r] for r in rows.tolist()] == [10] and len(queue) == 0

    queue.put(Chunk(None, np.asarray(lengths, dtype=np.int64), 0.0))
    _, rows = queue.take(2, cost)  # planned for 2 rows
    assert len(rows) == 2
    _, rows = queue.take(8, cost)  # the limit changed: the rest is planned again for 8
    assert [lengths[r] for r in rows.tolist()] == [1, 2, 2, 2, 2]


class TimedRows:
    """``run_rows`` whose calls take ``a + b x rows x longest`` on a fake clock; records each batch."""

    def __init__(self, a: float, b: float) -> None:
        self.a, self.b, self.now = a, b, 0.0
        self.batches: list[list[int]] = []

    def clock(self) -> float:
        return self.now

    def __call__(self, lengths: np.ndarray, rows: np.ndarray) -> list[int]:
        picked = lengths[rows].tolist()
        self.batches.append(picked)
        self.now += self.a + self.b * len(picked) * max(picked)
        return picked


@pytest.mark.parametrize("cuts", ["cost", "fixed"])
def test_the_batcher_fits_its_model_calls_and_cuts_chunks_by_cost(cuts: str) -> None:
    from pyflink_aisp.inference import BatchingConfig, MicroBatcher
    from pyflink_aisp.inference._cost import BatchCuts

    model = TimedRows(a=0.002, b=6e-5)
    config = BatchingConfig(max_batch_size=8, batch_cuts=BatchCuts(cuts))
    batcher = MicroBatcher(lambda items: items, config, clock=model.clock, run_rows=model)
    rng = np.random.default_rng(7)
    try:
        for _ in range(6):  # 48 batches of 8 that ran whole: the fit's calls
            lengths = rng.integers(4, 60, 64)
            assert batcher.submit_chunk(lengths, lengths).result(timeout=5) == lengths.tolist()
        fitted = batcher.cost_model.cost
        assert fitted is not None
        assert (fitted.per_call_s, fitted.per_token_s) == (pytest.approx(0.002), pytest.approx(6e-5))
        trickle = np.array([30, 5, 9, 55, 12, 7, 41, 6, 18, 25, 8, 50])
        model.batches.clear()
        assert batcher.submit_chunk(trickle, trickle).result(timeout=5) == trickle.tolist()
    finally:
        batcher.close()
    ordered = np.sort(trickle)
    if cuts == "fixed":
        assert model.batches == [ordered[:8].tolist(), ordered[8:].tolist()]
    else:
        ends = cost_cuts(ordered, fitted, max_rows=8).tolist()
        assert model.batches == [ordered[s:e].tolist() for s, e in zip([0, *ends[:-1]], ends, strict=True)]
        assert len(model.batches) > 2  # the plan differs from the fixed cuts here
        fixed = [ordered[:8].tolist(), ordered[8:].tolist()]
        assert sum(fitted.seconds(len(b), max(b)) for b in model.batches) < sum(
            fitted.seconds(len(b), max(b)) for b in fixed)


def test_a_long_chunk_is_planned_a_window_at_a_time_and_cut_near_the_optimum(monkeypatch) -> None:
    import pyflink_aisp.inference._chunks as chunks

    planned: list[int] = []

    def counting_cuts(lengths, *args, **kwargs):
        planned.append(len(lengths))
        return cost_cuts(lengths, *args, **kwargs)

    monkeypatch.setattr(chunks, "cost_cuts", counting_cuts)
    rng = np.random.default_rng(11)
    lengths = rng.integers(3, 80, 3000)
    cost = CallCost(3.0, 0.06)
    queue = ChunkQueue(length_buckets=(16, 48), max_batch_tokens=1500)
    queue.put(Chunk(None, np.asarray(lengths, dtype=np.int64), 0.0))
    batches = []
    while (taken := queue.take(16, cost)) is not None:
        batches.append(taken[1].tolist())
    rows = [r for b in batches for r in b]
    assert sorted(rows) == list(range(3000))  # each row once
    buckets = np.searchsorted([16, 48], lengths, side="left")
    for b in batches:
        longest = max(lengths[b])
        assert len(b) <= 16 and (len(b) == 1 or len(b) * longest <= 1500) and len(set(buckets[b])) == 1
    assert max(planned) <= plan_window(16) and len(planned) > 3000 // plan_window(16)
    ordered = np.sort(lengths)
    whole = cost_cuts(ordered, cost, max_rows=16, max_tokens=1500, buckets=np.searchsorted([16, 48], ordered))
    best = total(ordered.tolist(), whole.tolist(), cost)
    windowed = sum(cost.seconds(len(b), int(max(lengths[b]))) for b in batches)
    assert best <= windowed <= 1.01 * best
