import asyncio
import threading

import pytest

from pyflink_aisp.errors import ConfigError, InferenceError
from pyflink_aisp.inference import BatchingConfig, MicroBatcher, is_out_of_memory


class RecordingModel:
    """Doubles each input; records every batch; can block until released."""

    def __init__(self, gate: threading.Event | None = None):
        self.batches: list[list[int]] = []
        self.gate = gate
        self.entered = threading.Event()

    def __call__(self, items):
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(5)
        self.batches.append(list(items))
        return [2 * x for x in items]


def results(futures):
    return [f.result(timeout=5) for f in futures]


def test_full_batches_leave_without_waiting():
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=4, max_wait_ms=60_000))
    assert results([batcher.submit(i) for i in range(8)]) == [2 * i for i in range(8)]
    assert model.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    batcher.close()


def test_partial_batch_leaves_after_max_wait():
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=100, max_wait_ms=30))
    futures = [batcher.submit(i) for i in range(3)]
    assert not futures[0].done()  # still waiting for companions
    assert results(futures) == [0, 2, 4]
    assert model.batches == [[0, 1, 2]]
    assert batcher.stats.batches == 1
    batcher.close()


def test_submit_async_from_an_event_loop():
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=5, max_wait_ms=60_000))

    async def go():
        return await asyncio.gather(*(batcher.submit_async(i) for i in range(5)))

    assert asyncio.run(go()) == [0, 2, 4, 6, 8]
    assert model.batches == [[0, 1, 2, 3, 4]]
    batcher.close()


def test_records_accumulate_while_model_is_busy():
    gate = threading.Event()
    model = RecordingModel(gate)
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=10, max_wait_ms=0))
    first = batcher.submit(0)
    assert model.entered.wait(5)  # batch [0] is in the model, blocked on the gate
    rest = [batcher.submit(i) for i in range(1, 6)]
    gate.set()
    assert results([first, *rest]) == [0, 2, 4, 6, 8, 10]
    assert model.batches == [[0], [1, 2, 3, 4, 5]]
    assert batcher.stats.batches == 2 and batcher.stats.max_batch_size == 5
    batcher.close()


def test_a_poison_record_is_isolated_by_bisection():
    calls = []

    def model(items):
        calls.append(list(items))
        if 5 in items:
            raise RuntimeError("boom")
        return [10 * x for x in items]

    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=8, max_wait_ms=60_000))
    futures = [batcher.submit(i) for i in range(8)]
    out = [f.exception(timeout=5) or f.result() for f in futures]
    assert out[:5] == [0, 10, 20, 30, 40] and out[6:] == [60, 70]
    assert isinstance(out[5], RuntimeError) and str(out[5]) == "boom"
    # [0..7] fails -> [0..3] ok, [4..7] fails -> [4,5] fails -> [4] ok, [5] fails; [6,7] ok
    assert calls == [list(range(8)), [0, 1, 2, 3], [4, 5, 6, 7], [4, 5], [4], [5], [6, 7]]
    assert batcher.stats.bisections == 3 and batcher.stats.failed == 1 and batcher.stats.oom_splits == 0
    batcher.close()


def test_out_of_memory_splits_the_batch_and_caps_later_batches():
    calls = []

    def model(items):
        calls.append(len(items))
        if len(items) > 2:
            raise MemoryError("simulated: batch too large")
        return [x + 1 for x in items]

    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=8, max_wait_ms=60_000))
    assert results([batcher.submit(i) for i in range(8)]) == list(range(1, 9))
    # 8 -> OOM (cap 4): 4 -> OOM (cap 2): 2, 2; then 4 -> OOM: 2, 2
    assert calls == [8, 4, 2, 2, 4, 2, 2]
    assert batcher.stats.oom_splits == 3 and batcher.stats.failed == 0
    assert batcher.knobs.max_batch_size == 2
    calls.clear()
    assert results([batcher.submit(i) for i in range(6)]) == list(range(1, 7))
    assert calls == [2, 2, 2]  # no more OOM: later batches stay at the capped size
    batcher.close()


@pytest.mark.parametrize(
    ("error", "oom"),
    [
        (MemoryError(), True),
        (RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (type("OutOfMemoryError", (RuntimeError,), {})("torch"), True),
        (RuntimeError("index out of range"), False),
        (ValueError("bad input"), False),
    ],
)
def test_out_of_memory_detection(error, oom):
    assert is_out_of_memory(error) is oom


def test_wrong_result_count_is_an_error():
    batcher = MicroBatcher(lambda items: items[:-1], BatchingConfig(max_batch_size=2, max_wait_ms=60_000))
    futures = [batcher.submit(1), batcher.submit(2)]
    errors = [f.exception(timeout=5) for f in futures]
    assert all(isinstance(e, ValueError) and "1 results for 2" in str(e) for e in errors)
    batcher.close()


def test_close_fails_queued_records_and_refuses_new_ones():
    batcher = MicroBatcher(RecordingModel(), BatchingConfig(max_batch_size=10, max_wait_ms=60_000))
    pending = batcher.submit(1)
    batcher.close()
    assert isinstance(pending.exception(timeout=5), InferenceError)
    with pytest.raises(InferenceError):
        batcher.submit(2)


def test_reports_describe_each_batch():
    reports = []
    batcher = MicroBatcher(RecordingModel(), BatchingConfig(max_batch_size=3, max_wait_ms=60_000),
                           on_batch=reports.append)
    results([batcher.submit(i, tokens=t) for i, t in enumerate([5, 9, 7])])
    batcher.close()
    (report,) = reports
    assert report.size == 3 and report.padded_tokens == 27 and report.failed == 0
    assert len(report.queue_wait_s) == 3 and all(w >= 0 for w in report.queue_wait_s)
    assert report.knobs.max_batch_size == 3


@pytest.mark.parametrize("kwargs", [{"max_batch_size": 0}, {"max_wait_ms": -1}, {"latency_slo_ms": 0}])
def test_config_validation(kwargs):
    with pytest.raises(ConfigError):
        BatchingConfig(**kwargs)
