"""After an out-of-memory error, the failed attempt's data (e.g. its CUDA tensors) is dead before the
batch is split and retried, and before ``on_out_of_memory`` runs.

Each fake model call keeps a fresh ``Activations`` object in a local, as a forward pass keeps its
tensors, and raises an out-of-memory error for batches above a size. While the halves are retried
inside the ``except`` block of the failed call, its traceback keeps that local alive; the tests
assert, through weak references, that it is gone (by reference counting, without a garbage
collection) when the next call starts and when the OOM hook is called.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.inference import (
    BatchCuts,
    BatchingConfig,
    Inferred,
    MicroBatcher,
    ModelHandler,
    ModelRuntime,
    Prepared,
)

WAIT_S = 10.0


class Activations:
    """Stands for a forward pass's tensors (weak-referenceable)."""


class Probe:
    """Calls a fake model; remembers the activations of failed calls and, at every later call
    and at every OOM hook, which of them were still alive."""

    def __init__(self, limit: int, error: type[Exception] = MemoryError,
                 message: str = "CUDA out of memory. Tried to allocate 2.00 GiB (simulated)") -> None:
        self.limit, self.error, self.message = limit, error, message
        self.failed: list[weakref.ref[Activations]] = []
        self.alive_at_call: list[int] = []  # per call: failed attempts' activations still alive
        self.alive_at_oom: list[int] = []
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def alive(self) -> int:
        return sum(ref() is not None for ref in self.failed)

    def call(self, items: Sequence[Any]) -> list[int]:
        with self._lock:
            self.alive_at_call.append(self.alive())
            self.sizes.append(len(items))
        activations = Activations()  # held by this frame while the "forward pass" runs
        if len(items) > self.limit:
            self.failed.append(weakref.ref(activations))
            raise self.error(self.message)
        return [2 * len(str(x)) for x in items]

    def on_oom(self) -> None:
        self.alive_at_oom.append(self.alive())


def test_the_failed_attempt_is_dead_when_its_first_half_runs() -> None:
    probe = Probe(limit=2)
    batcher: MicroBatcher[int, int] = MicroBatcher(probe.call, BatchingConfig(max_batch_size=8,
                                                                             max_wait_ms=60_000))
    futures = [batcher.submit(i) for i in range(8)]
    assert [f.result(timeout=WAIT_S) for f in futures] == [2 * len(str(i)) for i in range(8)]
    batcher.close()
    assert probe.sizes == [8, 4, 2, 2, 4, 2, 2]  # split, as before
    assert len(probe.failed) == 3
    assert probe.alive_at_call == [0] * 7  # no failed attempt's data alive when a later call ran


def test_on_oom_runs_after_the_release_and_before_the_halves() -> None:
    probe = Probe(limit=2)
    calls: list[str] = []

    def model(items: Sequence[Any]) -> list[int]:
        calls.append(f"run {len(items)}")
        return probe.call(items)

    def on_oom() -> None:
        calls.append("oom")
        probe.on_oom()

    batcher: MicroBatcher[int, int] = MicroBatcher(
        model, BatchingConfig(max_batch_size=4, max_wait_ms=60_000), on_oom=on_oom)
    assert [f.result(timeout=WAIT_S) for f in [batcher.submit(i) for i in range(4)]] == [2] * 4
    batcher.close()
    assert calls == ["run 4", "oom", "run 2", "run 2"]
    assert probe.alive_at_oom == [0]


def test_a_lone_failing_item_keeps_its_error_but_not_its_data() -> None:
    probe = Probe(limit=0)
    hooks: list[int] = []
    batcher: MicroBatcher[int, int] = MicroBatcher(
        probe.call, BatchingConfig(max_batch_size=2, max_wait_ms=60_000),
        on_oom=lambda: hooks.append(probe.alive()))
    futures = [batcher.submit(i) for i in range(2)]
    errors = [f.exception(timeout=WAIT_S) for f in futures]
    batcher.close()
    for error in errors:
        assert isinstance(error, MemoryError) and "CUDA out of memory" in str(error)
        assert error.__traceback__ is not None  # still printable
    assert probe.alive() == 0 and hooks == [0, 0, 0]  # the batch of 2, then each item alone
    assert batcher.stats.failed == 2 and batcher.stats.oom_splits == 1


def test_a_failure_that_is_not_an_oom_does_not_call_the_hook() -> None:
    probe = Probe(limit=1, error=RuntimeError, message="poisoned batch")
    hooks: list[int] = []
    batcher: MicroBatcher[int, int] = MicroBatcher(
        probe.call, BatchingConfig(max_batch_size=2, max_wait_ms=60_000), on_oom=lambda: hooks.append(1))
    futures = [batcher.submit(i) for i in range(2)]
    assert [f.result(timeout=WAIT_S) for f in futures] == [2, 2]
    batcher.close()
    assert batcher.stats.bisections == 1 and batcher.stats.oom_splits == 0 and hooks == []
    assert probe.alive_at_call == [0, 0, 0]  # bisection also drops the failed attempt first


class ProbeHandler(ModelHandler[str, int, object]):
    """The batch path: ``run_prepared`` (``depth`` 1) or ``collect_prepared`` (``depth`` 2)
    is the fake model call; ``on_out_of_memory`` records what was alive."""

    def __init__(self, probe: Probe, depth: int) -> None:
        self.probe, self.depth = probe, depth
        self.oom_models: list[object] = []

    def load_model(self) -> object:
        return object()

    def run_inference(self, batch: Sequence[str], model: object) -> list[int]:
        return self.probe.call(batch)

    def pipeline_depth(self, model: object) -> int:
        return self.depth

    def run_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: object) -> list[int]:
        return self.probe.call([prepared.payload[i] for i in rows.tolist()])

    def launch_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: object) -> Any:
        return [prepared.payload[i] for i in rows.tolist()]

    def collect_prepared(self, handle: Any, model: object) -> list[int]:
        return self.probe.call(handle)

    def on_out_of_memory(self, model: object) -> None:
        self.oom_models.append(model)
        self.probe.on_oom()


def test_the_runtime_releases_the_failed_attempt_on_both_batch_paths() -> None:
    for depth in (1, 2):
        probe = Probe(limit=2)
        handler = ProbeHandler(probe, depth)
        runtime = ModelRuntime.acquire(handler, BatchingConfig(max_batch_size=4, max_wait_ms=1,
                                                               batch_cuts=BatchCuts.FIXED),
                                       key=f"probe:{id(handler)}")
        try:
            texts = [str(10 ** i) for i in range(8)]
            assert runtime.infer_batch(texts) == [Inferred(2 * len(t), "unversioned") for t in texts]
        finally:
            runtime.release()
        assert probe.failed, depth
        assert probe.alive_at_call == [0] * len(probe.alive_at_call), depth
        assert probe.alive_at_oom == [0] * len(probe.failed), depth
        assert handler.oom_models == [runtime._model] * len(probe.failed), depth
