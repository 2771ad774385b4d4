"""The pipelined batch path (handler pipeline_depth > 1) on a deliberately slow fake device.

The fake device computes launched batches on its own thread, in launch order. Its compute of
batch n waits (at most 10 s) until batch n+1 has been launched (or no batch follows): a batching
thread that collected batch n before launching batch n+1 (the serial path) would make that wait
time out, which the tests assert never happens. Nothing here depends on wall time: the waits are
bounded only so that a regression fails instead of hanging.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from pyflink_aisp.errors import ConfigError, InferenceError
from pyflink_aisp.inference import BatchCuts, BatchingConfig, Inferred, ModelHandler, ModelRuntime, Prepared

WAIT_S = 10.0
V1, V2 = "a1" * 32, "b2" * 32


@dataclass(eq=False)
class Job:
    """One launched batch on the fake device."""

    n: int
    texts: list[str]
    model: Any
    done: threading.Event = field(default_factory=threading.Event)
    results: list[int] = field(default_factory=list)


class FakeDevice:
    """Computes launched batches in launch order on a device thread (10 x the text's length).

    Args:
        total: Batches the test will launch; the compute of batch n waits until batch n+1 is
            launched unless n is the last. None: never wait (failure tests).
        gate: The first launch waits for it (set once the test submitted every chunk), so the
            batching thread only decides with every chunk queued.
    """

    def __init__(self, total: int | None = None, gate: threading.Event | None = None) -> None:
        self.total, self.gate = total, gate
        self.cond = threading.Condition()
        self.timeline: list[tuple[str, int]] = []  # ("launch" | "start" | "end" | "collect", batch)
        self.batches: list[list[str]] = []  # texts of each launched batch, by batch number
        self.models: list[Any] = []  # the model each batch was launched on
        self.timeouts: list[int] = []
        self.in_flight = self.max_in_flight = 0
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._compute, name="fake-device", daemon=True)
        self._thread.start()

    def launch(self, texts: list[str], model: Any) -> Job:
        if self.gate is not None and not self.batches:
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        with self.cond:
            job = Job(len(self.batches), texts, model)
            self.batches.append(texts)
            self.models.append(model)
            self.timeline.append(("launch", job.n))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.cond.notify_all()
        self._jobs.put(job)
        return job

    def collect(self, job: Job) -> list[int]:
        if not job.done.wait(WAIT_S):
            raise TimeoutError(f"batch {job.n} never computed")
        with self.cond:
            self.timeline.append(("collect", job.n))
            self.in_flight -= 1
        return job.results

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(WAIT_S)

    def _compute(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self.cond:
                last = self.total is None or job.n + 1 >= self.total
                if not self.cond.wait_for(lambda job=job, last=last: last or len(self.batches) > job.n + 1,
                                          timeout=WAIT_S):
                    self.timeouts.append(job.n)
                self.timeline.append(("start", job.n))
            job.results = [10 * len(t) for t in job.texts]
            with self.cond:
                self.timeline.append(("end", job.n))
            job.done.set()

    def index(self, kind: str, n: int) -> int:
        return self.timeline.index((kind, n))


class DeviceHandler(ModelHandler[str, int, object]):
    """Texts on the fake device; ``depth`` batches may be in flight. A batch holding ``"bad-launch"``
    fails its launch, one holding ``"bad-collect"`` its collect."""

    def __init__(self, device: FakeDevice, depth: int) -> None:
        self.device, self.depth = device, depth
        self.prepared: list[int] = []  # rows of each prepare_batch call
        self.run_prepared_calls = 0
        self.released: list[object] = []

    def load_model(self) -> object:
        return object()

    def model_version(self) -> str:
        return V1

    def run_inference(self, batch: Sequence[str], model: object) -> list[int]:
        return [10 * len(x) for x in batch]

    def example_tokens(self, example: str, model: object) -> int:
        return len(example)

    def prepare_batch(self, batch: Sequence[str], model: object) -> Prepared:
        with self.device.cond:
            self.device.timeline.append(("prepare", len(self.prepared)))
            self.prepared.append(len(batch))
        return super().prepare_batch(batch, model)

    def pipeline_depth(self, model: object) -> int:
        return self.depth

    def run_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: object) -> list[int]:
        self.run_prepared_calls += 1
        return self.collect_prepared(self.launch_prepared(prepared, rows, model), model)

    def launch_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: object) -> Job:
        texts = [prepared.payload[i] for i in rows.tolist()]
        if "bad-launch" in texts:
            raise RuntimeError("launch refused")
        return self.device.launch(texts, model)

    def collect_prepared(self, handle: Job, model: object) -> list[int]:
        assert handle.model is model  # collected on the model that launched it
        results = self.device.collect(handle)
        if "bad-collect" in handle.texts:
            raise RuntimeError("the batch failed on the device")
        return results

    def release_model(self, model: object) -> None:
        with self.device.cond:
            self.device.timeline.append(("release", len(self.released)))
            self.released.append(model)


@pytest.fixture
def runtimes() -> Iterator[list[ModelRuntime]]:
    made: list[ModelRuntime] = []
    yield made
    for runtime in made:
        runtime.release()
    assert not ModelRuntime._registry


def start(made: list[ModelRuntime], handler: DeviceHandler, max_batch_size: int = 4) -> ModelRuntime:
    config = BatchingConfig(max_batch_size=max_batch_size, max_wait_ms=1, batch_cuts=BatchCuts.FIXED)
    runtime = ModelRuntime.acquire(handler, config, key=f"device:{id(handler)}")
    made.append(runtime)
    return runtime


def texts(chunk: int, n: int) -> list[str]:
    """``n`` distinct texts of chunk ``chunk``, of lengths 1..n (distinct outputs)."""
    return [chr(ord("a") + chunk) * (i + 1) for i in range(n)]


CHUNKS = (9, 5, 12, 3, 8)  # 3 + 2 + 3 + 1 + 2 = 11 model batches of at most 4 rows


@pytest.mark.parametrize("depth", [2, 3])
def test_batch_n_plus_1_is_launched_before_batch_n_is_collected(runtimes, depth: int) -> None:
    gate = threading.Event()
    device = FakeDevice(total=11, gate=gate)
    handler = DeviceHandler(device, depth)
    runtime = start(runtimes, handler)
    assert runtime.pipeline_depth == depth
    batches = [texts(c, n) for c, n in enumerate(CHUNKS)]
    futures = [runtime.submit_batch(b) for b in batches]  # none waited for before the next
    gate.set()
    outcomes = [f.result(timeout=WAIT_S) for f in futures]
    device.close()

    assert device.timeouts == []  # no compute waited in vain for its successor's launch
    assert len(device.batches) == 11
    for n in range(10):
        assert device.index("launch", n + 1) < device.index("collect", n), device.timeline
        assert device.index("launch", n + 1) < device.index("start", n)
    collects = [n for kind, n in device.timeline if kind == "collect"]
    assert collects == list(range(11))  # collected in launch order, each once
    assert device.max_in_flight == depth
    # every row computed exactly once, every outcome right, in input order
    computed = sorted(t for batch in device.batches for t in batch)
    assert computed == sorted(t for b in batches for t in b)
    assert outcomes == [[Inferred(10 * len(t), V1) for t in b] for b in batches]
    assert handler.run_prepared_calls == 0
    stats = runtime.batcher.stats
    assert stats.batches == 11 and stats.records == sum(CHUNKS) and stats.failed == 0


def test_depth_1_never_has_two_batches_in_flight(runtimes) -> None:
    device = FakeDevice()
    handler = DeviceHandler(device, depth=1)
    runtime = start(runtimes, handler)
    batches = [texts(c, n) for c, n in enumerate(CHUNKS)]
    futures = [runtime.submit_batch(b) for b in batches]
    outcomes = [f.result(timeout=WAIT_S) for f in futures]
    device.close()
    assert outcomes == [[Inferred(10 * len(t), V1) for t in b] for b in batches]
    assert device.max_in_flight == 1
    assert handler.run_prepared_calls == 11  # run_prepared called and waited for, as before
    launches_and_collects = [kind for kind, _ in device.timeline if kind in ("launch", "collect")]
    assert launches_and_collects == ["launch", "collect"] * 11


def test_a_launch_that_raises_fails_only_its_bad_row(runtimes) -> None:
    device = FakeDevice()
    handler = DeviceHandler(device, depth=2)
    runtime = start(runtimes, handler)
    first, second = texts(0, 8), texts(1, 7)
    second[3] = "bad-launch"
    futures = [runtime.submit_batch(first), runtime.submit_batch(second)]
    out_first, out_second = (f.result(timeout=WAIT_S) for f in futures)
    device.close()
    assert out_first == [Inferred(10 * len(t), V1) for t in first]
    for text, outcome in zip(second, out_second, strict=True):
        if text == "bad-launch":
            assert isinstance(outcome, RuntimeError) and "launch refused" in str(outcome)
        else:
            assert outcome == Inferred(10 * len(text), V1)
    computed = [t for batch in device.batches for t in batch]
    assert sorted(computed) == sorted(t for t in first + second if t != "bad-launch")  # each row once
    assert runtime.batcher.stats.failed == 1 and runtime.batcher.stats.bisections >= 1


def test_a_collect_that_raises_collects_the_others_first_and_isolates_the_row(runtimes) -> None:
    device = FakeDevice()
    handler = DeviceHandler(device, depth=3)
    runtime = start(runtimes, handler)
    batch = texts(0, 16)
    batch[10] = "bad-collect"  # 11 characters, as the text it replaces: the third model batch
    out = runtime.infer_batch(batch)
    device.close()
    for text, outcome in zip(batch, out, strict=True):
        if text == "bad-collect":
            assert isinstance(outcome, RuntimeError) and "failed on the device" in str(outcome)
        else:
            assert outcome == Inferred(10 * len(text), V1)
    # the batches launched after the failing one were collected before its synchronous retry
    failing, retry = [n for n, b in enumerate(device.batches) if "bad-collect" in b][:2]
    company = range(failing + 1, retry)
    assert company  # the failing batch had company in flight
    for n in company:
        assert device.index("collect", n) < device.index("launch", retry)
    assert device.in_flight == 0  # every launched batch was collected once
    assert runtime.batcher.stats.failed == 1


def test_out_of_memory_at_collect_is_split_after_the_others_and_caps_batches(runtimes) -> None:
    device = FakeDevice()

    class OomHandler(DeviceHandler):
        ooms = 0

        def collect_prepared(self, handle: Job, model: object) -> list[int]:
            results = super().collect_prepared(handle, model)
            if len(handle.texts) > 2:
                raise MemoryError("CUDA out of memory (simulated)")
            return results

        def on_out_of_memory(self, model: object) -> None:
            self.ooms += 1

    handler = OomHandler(device, depth=2)
    runtime = start(runtimes, handler)
    batch = texts(0, 12)
    assert runtime.infer_batch(batch) == [Inferred(10 * len(t), V1) for t in batch]
    device.close()
    assert handler.ooms >= 1 and runtime.batcher.stats.oom_splits >= 1
    assert runtime.batcher.knobs.max_batch_size == 2
    assert runtime.batcher.stats.failed == 0 and device.in_flight == 0


def test_a_hot_swap_with_batches_in_flight_tags_each_batch_with_the_model_that_launched_it(
        runtimes) -> None:
    gate = threading.Event()
    device = FakeDevice(total=6, gate=gate)
    new_model = object()

    class SwappingHandler(DeviceHandler):
        runtime: ModelRuntime

        def launch_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: object) -> Job:
            job = super().launch_prepared(prepared, rows, model)
            if job.n == 2:  # swapped in before the next launch, with batches 1 and 2 in flight
                self.runtime._offer((new_model, V2))
            return job

    handler = SwappingHandler(device, depth=2)
    runtime = start(runtimes, handler)
    handler.runtime = runtime
    old_model = runtime._model
    batch = texts(0, 24)  # 6 model batches of 4
    future = runtime.submit_batch(batch)
    gate.set()
    out = future.result(timeout=WAIT_S)
    device.close()
    order = sorted(range(24), key=lambda i: len(batch[i]))  # rows as the batcher cut them
    for position, row in enumerate(order):
        n = position // 4
        assert out[row] == Inferred(10 * len(batch[row]), V1 if n <= 2 else V2)
    assert device.models == [old_model] * 3 + [new_model] * 3
    assert handler.released == [old_model]  # released once, after its last batch was collected
    assert device.index("collect", 2) < device.index("release", 0) < device.index("collect", 3)
    assert runtime.swap_state.swaps == 1


def test_infer_batch_slices_a_large_batch_and_prepares_ahead(runtimes) -> None:
    """Slices of 2 x max_batch_size rows are all submitted before any is waited for: the first
    launch waits (bounded) until every slice was prepared, which a per-slice wait would never see."""
    device = FakeDevice()
    handler = DeviceHandler(device, depth=2)
    prepared_all = threading.Event()

    def launch(texts: list[str], model: Any, launch: Any = device.launch) -> Job:
        if not device.batches:
            prepared_all.wait(WAIT_S)
            device.timeouts.extend([] if prepared_all.is_set() else [-1])
        return launch(texts, model)

    device.launch = launch  # type: ignore[method-assign]
    original_prepare = handler.prepare_batch

    def prepare(batch: Sequence[str], model: object) -> Prepared:
        prepared = original_prepare(batch, model)
        if len(handler.prepared) == 4:
            prepared_all.set()
        return prepared

    handler.prepare_batch = prepare  # type: ignore[method-assign]
    runtime = start(runtimes, handler, max_batch_size=3)
    batch = texts(0, 20)
    out = runtime.infer_batch(batch)
    device.close()
    assert handler.prepared == [6, 6, 6, 2]
    assert device.timeouts == []
    assert out == [Inferred(10 * len(t), V1) for t in batch]


def test_a_slice_that_cannot_be_submitted_fails_only_its_rows(runtimes, monkeypatch) -> None:
    device = FakeDevice()
    handler = DeviceHandler(device, depth=2)
    runtime = start(runtimes, handler, max_batch_size=2)
    submit, calls = runtime.submit_batch, []

    def flaky(examples: Sequence[str]) -> Any:
        calls.append(len(examples))
        if len(calls) == 2:
            raise InferenceError("refused (simulated)")
        return submit(examples)

    monkeypatch.setattr(runtime, "submit_batch", flaky)
    batch = texts(0, 10)
    out = runtime.infer_batch(batch)
    device.close()
    assert calls == [4, 4, 2]
    assert out[:4] == [Inferred(10 * len(t), V1) for t in batch[:4]]
    assert all(isinstance(o, InferenceError) for o in out[4:8])
    assert out[8:] == [Inferred(10 * len(t), V1) for t in batch[8:]]


def test_depth_1_infer_batch_is_one_submit(runtimes) -> None:
    device = FakeDevice()
    handler = DeviceHandler(device, depth=1)
    runtime = start(runtimes, handler, max_batch_size=2)
    batch = texts(0, 10)
    assert runtime.infer_batch(batch) == [Inferred(10 * len(t), V1) for t in batch]
    device.close()
    assert handler.prepared == [10]


@pytest.mark.parametrize("kind", ["series", "arrow"])
def test_slices_of_a_series_or_an_arrow_array_are_by_position(runtimes, kind: str) -> None:
    device = FakeDevice()
    handler = DeviceHandler(device, depth=2)
    runtime = start(runtimes, handler, max_batch_size=2)
    batch = texts(0, 9)
    if kind == "series":
        import pandas as pd

        examples: Any = pd.Series(batch, index=range(100, 109))
    else:
        import pyarrow as pa

        examples = pa.array(batch)
    assert runtime.infer_batch(examples) == [Inferred(10 * len(t), V1) for t in batch]
    device.close()
    assert handler.prepared == [4, 4, 1]


def test_infer_batch_pipelined_refuses_empty_slices(runtimes) -> None:
    runtime = start(runtimes, DeviceHandler(FakeDevice(), depth=2))
    with pytest.raises(ConfigError):
        runtime.infer_batch_pipelined(["a"], 0)


@pytest.mark.parametrize("depth", [0, -1, True, 2.0])
def test_a_bad_pipeline_depth_is_refused_at_load(depth: Any) -> None:
    handler = DeviceHandler(FakeDevice(), depth=depth)
    with pytest.raises(ConfigError, match="pipeline_depth"):
        ModelRuntime.acquire(handler, BatchingConfig(), key=f"bad:{id(handler)}")
    assert len(handler.released) == 1 and not ModelRuntime._registry


def test_close_collects_batches_in_flight_before_failing_what_is_queued(runtimes) -> None:
    device = FakeDevice()
    release = threading.Event()
    handler = DeviceHandler(device, depth=2)
    runtime = start(runtimes, handler)

    def slow_collect(job: Job, collect: Any = device.collect) -> list[int]:
        release.wait(WAIT_S)
        return collect(job)

    device.collect = slow_collect  # type: ignore[method-assign]
    future = runtime.submit_batch(texts(0, 40))  # 10 model batches
    with device.cond:
        assert device.cond.wait_for(lambda: len(device.batches) == 2, timeout=WAIT_S)
    closer = threading.Thread(target=runtime.batcher.close)
    closer.start()
    with runtime.batcher._cond:  # close() has marked the batcher closed
        assert runtime.batcher._cond.wait_for(lambda: runtime.batcher._closed, timeout=WAIT_S)
    release.set()
    closer.join(WAIT_S)
    outcomes = future.result(timeout=WAIT_S)
    device.close()
    scored = [o for o in outcomes if isinstance(o, Inferred)]
    failed = [o for o in outcomes if isinstance(o, InferenceError)]
    assert len(scored) + len(failed) == 40 and failed and scored
    assert len(scored) == 4 * len(device.batches) and device.in_flight == 0
