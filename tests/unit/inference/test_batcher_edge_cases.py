"""Edge cases found by breaking: MicroBatcher robustness (pure Python, no services).

Each test fails on fd007e7; the batching thread dies and every pending and later
record hangs forever (in a job: until the async timeout, then all dead-lettered).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import threading
import time

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchingConfig, MicroBatcher


def _served(batcher: MicroBatcher, item: object, timeout: float = 2.0) -> bool:
    future = batcher.submit(item)
    cf.wait([future], timeout=timeout)
    return future.done()


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_base_exception_from_run_batch_fails_the_batch_not_the_batcher(exc_type: type) -> None:
    calls = []

    def run(items: list[int]) -> list[int]:
        calls.append(len(items))
        if len(calls) == 1:
            raise exc_type("handler called sys.exit / got interrupted")
        return items

    batcher = MicroBatcher(run, BatchingConfig(max_batch_size=4, max_wait_ms=1))
    try:
        first = [batcher.submit(i) for i in range(4)]
        cf.wait(first, timeout=2)
        assert all(f.done() for f in first), "records of the failing batch never resolved"
        assert _served(batcher, 99), "batching thread died: later records are never served"
    finally:
        closer = threading.Thread(target=batcher.close, daemon=True)
        closer.start()
        closer.join(2)


def test_cancelled_future_does_not_kill_the_shared_batcher() -> None:
    """A caller that gives up (future.cancel(), asyncio.wait_for timeout on
    ModelRuntime.infer / submit_async) makes set_result raise InvalidStateError
    on the batching thread, which kills it for every operator of the worker."""

    def run(items: list[int]) -> list[int]:
        time.sleep(0.2)
        return items

    batcher = MicroBatcher(run, BatchingConfig(max_batch_size=2, max_wait_ms=1))
    try:
        batcher.submit(1), batcher.submit(2)  # first batch leaves and computes for 0.2 s
        impatient = batcher.submit(3)
        assert impatient.cancel()
        time.sleep(0.5)
        assert _served(batcher, 4), "batching thread died after a cancelled future"
    finally:
        batcher.close()


def test_cancelled_future_via_asyncio_wait_for() -> None:
    import asyncio

    def run(items: list[int]) -> list[int]:
        time.sleep(0.3)
        return items

    batcher = MicroBatcher(run, BatchingConfig(max_batch_size=1, max_wait_ms=0))

    async def main() -> None:
        batcher.submit(0)  # occupies the model
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(batcher.submit_async(1), timeout=0.05)

    asyncio.run(main())
    try:
        time.sleep(0.8)
        assert _served(batcher, 2), "batching thread died after an asyncio timeout"
    finally:
        batcher.close()


@pytest.mark.parametrize(
    ("wait_ms", "shown"), [(math.inf, "inf"), (math.nan, "nan"), (1e13, "10000000000000.0")]
)
def test_max_wait_ms_non_finite_is_refused(wait_ms: float, shown: str) -> None:
    """--max-wait-ms inf / 1e13 (> threading.TIMEOUT_MAX) once crashed the batching thread
    with OverflowError in Condition.wait; nan made a record wait forever. BatchingConfig
    now refuses them up front (the test used to return early on that refusal)."""
    with pytest.raises(ConfigError) as err:
        BatchingConfig(max_batch_size=8, max_wait_ms=wait_ms)
    assert str(err.value) == f"max_wait_ms must be a finite number of ms up to 3,600,000, got {shown}"


def test_max_wait_ms_at_its_bound_is_served() -> None:
    """The largest wait accepted (one hour) does not overflow the batching thread's wait; the
    partial batch goes out once the queue is idle (max_idle_ms, 2 ms by default)."""
    batcher = MicroBatcher(lambda xs: xs, BatchingConfig(max_batch_size=8, max_wait_ms=3_600_000))
    try:
        future = batcher.submit(1)
        cf.wait([future], timeout=1.0)
        assert future.done(), f"record not served within 1 s (thread alive: {batcher._thread.is_alive()})"
    finally:
        closer = threading.Thread(target=batcher.close, daemon=True)
        closer.start()
        closer.join(2)


def test_one_oom_poison_record_does_not_cap_batches_at_one_forever() -> None:
    """A single record that raises MemoryError alone (others fine): bisection
    proves batches of 32 run, yet the cap ends at 1 for the worker's lifetime."""
    poison = 7

    def run(items: list[int]) -> list[int]:
        if poison in items:
            raise MemoryError("Failed to allocate memory for this record")
        return items

    batcher = MicroBatcher(run, BatchingConfig(max_batch_size=64, max_wait_ms=1))
    try:
        futures = [batcher.submit(i) for i in range(64)]
        cf.wait(futures, timeout=5)
        assert sum(f.exception() is not None for f in futures) == 1
        assert batcher.knobs.max_batch_size >= 32, batcher.knobs
    finally:
        batcher.close()
