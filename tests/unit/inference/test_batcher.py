import asyncio
import threading

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchingConfig, MicroBatcher


class RecordingModel:
    """Doubles each input; records every batch it saw; can block until released."""

    def __init__(self, gate: threading.Event | None = None):
        self.batches: list[list[int]] = []
        self.gate = gate

    def __call__(self, items):
        if self.gate is not None:
            self.gate.wait(5)
        self.batches.append(list(items))
        return [2 * x for x in items]


def run(coro):
    return asyncio.run(coro)


def test_full_batches_leave_without_waiting():
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=4, max_wait_ms=60_000))

    async def go():
        return await asyncio.gather(*(batcher.submit(i) for i in range(8)))

    assert run(go()) == [2 * i for i in range(8)]
    assert model.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    batcher.close()


def test_partial_batch_leaves_after_max_wait():
    model = RecordingModel()
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=100, max_wait_ms=20))

    async def go():
        loop = asyncio.get_running_loop()
        start = loop.time()
        out = await asyncio.gather(*(batcher.submit(i) for i in range(3)))
        return out, loop.time() - start

    out, elapsed_s = run(go())
    assert out == [0, 2, 4]
    assert model.batches == [[0, 1, 2]]
    assert elapsed_s >= 0.02
    batcher.close()


def test_records_accumulate_while_model_is_busy():
    gate = threading.Event()
    model = RecordingModel(gate)
    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=10, max_wait_ms=0))

    async def go():
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.sleep(0)  # first batch [0] is dispatched and blocks in the model
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 6)]
        await asyncio.sleep(0.01)
        gate.set()
        return await asyncio.gather(first, *rest)

    assert run(go()) == [0, 2, 4, 6, 8, 10]
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

    async def go():
        return await asyncio.gather(*(batcher.submit(i) for i in range(8)), return_exceptions=True)

    out = run(go())
    assert out[:5] == [0, 10, 20, 30, 40] and out[6:] == [60, 70]
    assert isinstance(out[5], RuntimeError) and str(out[5]) == "boom"
    # [0..7] fails -> [0..3] ok, [4..7] fails -> [4,5] fails -> [4] ok, [5] fails; [6,7] ok
    assert calls == [list(range(8)), [0, 1, 2, 3], [4, 5, 6, 7], [4, 5], [4], [5], [6, 7]]
    assert batcher.stats.bisections == 3
    batcher.close()


def test_wrong_result_count_is_an_error():
    batcher = MicroBatcher(lambda items: items[:-1], BatchingConfig(max_batch_size=2, max_wait_ms=60_000))

    async def go():
        return await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)

    out = run(go())
    assert all(isinstance(e, ValueError) and "1 results for 2" in str(e) for e in out)
    batcher.close()


@pytest.mark.parametrize("kwargs", [{"max_batch_size": 0}, {"max_wait_ms": -1}])
def test_config_validation(kwargs):
    with pytest.raises(ConfigError):
        BatchingConfig(**kwargs)
