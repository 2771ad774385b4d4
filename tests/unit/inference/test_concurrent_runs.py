"""Concurrent ONNX Runtime runs on the CPU: the run pool, the sentiment model and handler with
``concurrent_runs``, and the batcher charging a batch the compute its run timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import (
    BatchCuts,
    BatchingConfig,
    MicroBatcher,
    ModelHandler,
    ModelRuntime,
    Prepared,
)
from pyflink_aisp.inference.handlers import OnnxSentimentModel, SentimentHandler
from pyflink_aisp.inference.handlers._onnx_runs import RunPool
from pyflink_aisp.models import ModelAssets

TEXTS = ["Dull.", "An utterly charming, beautifully acted film " * 6, "Funny and warm.", "",
         "The plot makes no sense and the jokes fall flat, but the cast tries hard.", "Wonderful!",
         "A long, winding, self-indulgent mess of a movie " * 12, "Not bad at all."] * 3


def test_two_runs_compute_at_once_and_time_themselves() -> None:
    pool = RunPool(2)
    both = threading.Barrier(2, timeout=10)  # passes only when two calls wait at the same time

    def call(tag: str) -> tuple[str, str]:
        time.sleep(0.05)
        both.wait()
        return tag, threading.current_thread().name

    first, second = pool.launch(call, "a"), pool.launch(call, "b")
    (tag_a, thread_a), (tag_b, thread_b) = first.result(timeout=10), second.result(timeout=10)
    assert (tag_a, tag_b) == ("a", "b") and thread_a != thread_b
    assert thread_a.startswith("aisp-ort-run") and thread_b.startswith("aisp-ort-run")
    assert first.compute_s is not None and 0.05 <= first.compute_s < 5
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(RuntimeError):
        pool.launch(call, "c")


def test_one_run_computes_on_the_callers_thread_and_keeps_errors_in_the_future() -> None:
    pool = RunPool(1)
    assert pool.launch(lambda: threading.current_thread().name).result() == threading.current_thread().name

    def boom() -> None:
        raise ValueError("bad batch")

    failed = pool.launch(boom)
    with pytest.raises(ValueError, match="bad batch"):
        failed.result()
    assert failed.compute_s is not None


@pytest.mark.parametrize("runs", [0, 9])
def test_the_number_of_runs_is_checked(runs: int) -> None:
    with pytest.raises(ConfigError, match=r"1\.\.8"):
        RunPool(runs)


def test_launched_rows_equal_predict_rows(quick_assets: ModelAssets) -> None:
    model = OnnxSentimentModel(quick_assets, intra_op_num_threads=1, concurrent_runs=2)
    try:
        tokens = model.encode(TEXTS)
        batches = [np.arange(start, min(start + 3, len(TEXTS))) for start in range(0, len(TEXTS), 3)]
        launched = [model.launch_rows(tokens, rows) for rows in batches]
        for rows, future in zip(batches, launched, strict=True):
            scores, embeddings = future.result(timeout=60)
            want_scores, want_embeddings = model.predict_rows(tokens, rows)
            np.testing.assert_allclose(scores, want_scores, atol=1e-5)
            np.testing.assert_allclose(embeddings, want_embeddings, atol=1e-5)
    finally:
        model.close()


def test_concurrent_runs_are_refused_with_io_binding(quick_assets: ModelAssets) -> None:
    with pytest.raises(ConfigError, match="CPU provider without IO binding"):
        OnnxSentimentModel(quick_assets, io_binding=True, concurrent_runs=2)


def test_the_handlers_runs_are_the_runtimes_pipeline_depth_and_give_the_same_scores(
        quick_assets: ModelAssets) -> None:
    with pytest.raises(ConfigError, match="concurrent_runs"):
        SentimentHandler(quick_assets, concurrent_runs=0)
    scores: dict[int, list[float]] = {}
    for runs, threads in ((1, 2), (2, 1)):
        handler = SentimentHandler(quick_assets, intra_op_num_threads=threads, concurrent_runs=runs)
        runtime = ModelRuntime.acquire(handler, BatchingConfig(max_batch_size=2, batch_cuts=BatchCuts.FIXED),
                                       key=f"runs-{runs}")
        try:
            assert runtime.pipeline_depth == runs
            outcomes = runtime.infer_batch(TEXTS)
        finally:
            runtime.release()
        scores[runs] = [o.prediction[0] for o in outcomes]  # type: ignore[union-attr]
    np.testing.assert_allclose(scores[2], scores[1], atol=1e-5)
    assert len(set(np.round(scores[1], 4))) > 3  # real, different scores


class _TimedHandler(ModelHandler[str, int, object]):
    """Two batches in flight; each launch's handle says its run took ``RUN_S``."""

    RUN_S = 0.25

    def load_model(self) -> object:
        return object()

    def run_inference(self, batch: Sequence[str], model: object) -> list[int]:
        return [len(text) for text in batch]

    def prepare_batch(self, batch: Sequence[str], model: object) -> Prepared:
        return Prepared(list(batch), np.array([len(text) for text in batch], dtype=np.int64))

    def run_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: object) -> list[int]:
        return [len(prepared.payload[row]) for row in rows]

    def pipeline_depth(self, model: object) -> int:
        return 2

    def launch_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: object) -> Any:
        return SimpleNamespace(results=self.run_prepared(prepared, rows, model), compute_s=self.RUN_S)

    def collect_prepared(self, handle: Any, model: object) -> list[int]:
        return list(handle.results)


def test_a_run_that_timed_itself_is_charged_that_time() -> None:
    config = BatchingConfig(max_batch_size=2, batch_cuts=BatchCuts.FIXED)
    runtime = ModelRuntime.acquire(_TimedHandler(), config, key="timed")
    try:
        outcomes = runtime.infer_batch(["a", "bb", "ccc", "dddd", "eeeee"])
        assert [o.prediction for o in outcomes] == [1, 2, 3, 4, 5]  # type: ignore[union-attr]
        charged = [seconds for _, seconds in runtime.batcher.cost_model._calls]
    finally:
        runtime.release()
    assert len(charged) == 3  # batches of 2, 2, 1
    assert all(_TimedHandler.RUN_S <= s < _TimedHandler.RUN_S + 0.05 for s in charged), charged


@pytest.mark.parametrize(("runs", "cores", "threads"),
                         [(1, 2, None), (2, 2, 1), (3, 2, 1), (2, 8, 4), (3, 8, 2)])
def test_concurrent_runs_share_the_physical_cores(runs: int, cores: int, threads: int | None) -> None:
    from pyflink_aisp.inference.handlers import run_threads

    assert run_threads(runs, cores) == threads


def test_run_threads_refuses_no_runs() -> None:
    from pyflink_aisp.inference.handlers import run_threads

    with pytest.raises(ConfigError, match="runs must be >= 1"):
        run_threads(0)


def test_a_handler_with_two_runs_and_no_thread_count_gives_each_run_half_the_cores(
        quick_assets: ModelAssets, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyflink_aisp.inference.handlers._onnx_runs as runs_module

    monkeypatch.setattr(runs_module.psutil, "cpu_count", lambda logical=True: 4)
    split = SentimentHandler(quick_assets, concurrent_runs=2).load_model()
    given = SentimentHandler(quick_assets, concurrent_runs=2, intra_op_num_threads=3).load_model()
    one = SentimentHandler(quick_assets, intra_op_num_threads=None).load_model()
    assert split._session.get_session_options().intra_op_num_threads == 2
    assert given._session.get_session_options().intra_op_num_threads == 3
    assert one._session.get_session_options().intra_op_num_threads == 0  # ORT's default stands


def _future_launcher(release: dict[int, threading.Event], launched: list[int]) -> Any:
    """launch_rows whose run of payload ``[k]`` finishes only when ``release[k]`` is set."""
    pool = RunPool(2)

    def run(k: int) -> list[int]:
        assert release[k].wait(timeout=10)
        return [10 * k]

    def launch(payload: list[int], rows: npt.NDArray[np.intp]) -> Any:
        launched.append(payload[0])
        return pool.launch(run, payload[0])

    return launch, pool


@pytest.mark.parametrize("depth", [2, 1])
def test_a_chunk_that_arrives_while_one_runs_launches_beside_it_below_the_depth(depth: int) -> None:
    # the second caller's one-record chunk must not wait for the first one's run to be collected
    release = {1: threading.Event(), 2: threading.Event()}
    launched: list[int] = []
    launch, pool = _future_launcher(release, launched)
    batcher: MicroBatcher[int, int] = MicroBatcher(
        lambda items: items, BatchingConfig(max_batch_size=4, max_wait_ms=0, batch_cuts=BatchCuts.FIXED),
        run_rows=lambda payload, rows: launch(payload, rows).result(), launch_rows=launch,
        collect=lambda handle: handle.result(), pipeline_depth=depth)
    try:
        first = batcher.submit_chunk([1], np.ones(1, dtype=np.int64))
        deadline = time.monotonic() + 10
        while launched != [1] and time.monotonic() < deadline:
            time.sleep(0.005)
        second = batcher.submit_chunk([2], np.ones(1, dtype=np.int64))
        time.sleep(0.2)  # the batching thread's chance to launch the second chunk
        beside = launched == [1, 2]
        release[2].set()
        if depth == 2:
            assert second.result(timeout=10) == [20]  # done while the first still runs
            assert not first.done()
        release[1].set()
        assert first.result(timeout=10) == [10] and second.result(timeout=10) == [20]
        assert beside is (depth == 2)  # one run at a time: the second waits for the first
    finally:
        release[1].set()
        release[2].set()
        batcher.close()
        pool.close()


@pytest.mark.parametrize("depth", [2, 3])
def test_many_callers_on_concurrent_runs_each_get_their_own_results(depth: int) -> None:
    # runs that finish out of launch order, chunks of 1-5 rows from four threads: every row gets its
    # own result once, and nothing hangs
    import random

    pool = RunPool(depth)
    rng = random.Random(7)
    delays = [rng.uniform(0.0, 0.003) for _ in range(1000)]

    def run(payload: list[int], rows: list[int], delay: float) -> list[int]:
        time.sleep(delay)
        return [payload[i] * 10 for i in rows]

    def launch(payload: list[int], rows: npt.NDArray[np.intp]) -> Any:
        return pool.launch(run, payload, rows.tolist(), delays[payload[0] % 1000])

    batcher: MicroBatcher[int, int] = MicroBatcher(
        lambda items: items, BatchingConfig(max_batch_size=2, max_wait_ms=0, batch_cuts=BatchCuts.FIXED),
        run_rows=lambda payload, rows: [payload[i] * 10 for i in rows.tolist()], launch_rows=launch,
        collect=lambda handle: handle.result(), pipeline_depth=depth)
    failures: list[str] = []

    def caller(c: int) -> None:
        for k in range(40):
            size = 1 + (c + k) % 5
            payload = [c * 1000 + k * 10 + i for i in range(size)]
            got = batcher.submit_chunk(payload, np.ones(size, dtype=np.int64)).result(timeout=10)
            if got != [v * 10 for v in payload]:
                failures.append(f"caller {c} chunk {k}: {got}")

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    try:
        assert not any(t.is_alive() for t in threads) and failures == []
    finally:
        batcher.close()
        pool.close()


def test_close_while_the_batching_thread_waits_on_a_running_batch_collects_it() -> None:
    release = {1: threading.Event(), 2: threading.Event()}
    launched: list[int] = []
    launch, pool = _future_launcher(release, launched)
    batcher: MicroBatcher[int, int] = MicroBatcher(
        lambda items: items, BatchingConfig(max_batch_size=4, max_wait_ms=0, batch_cuts=BatchCuts.FIXED),
        run_rows=lambda payload, rows: launch(payload, rows).result(), launch_rows=launch,
        collect=lambda handle: handle.result(), pipeline_depth=2)
    first = batcher.submit_chunk([1], np.ones(1, dtype=np.int64))
    deadline = time.monotonic() + 10
    while launched != [1] and time.monotonic() < deadline:
        time.sleep(0.005)
    threading.Timer(0.2, release[1].set).start()
    try:
        batcher.close()  # returns once the run in flight is collected
        assert first.done() and first.result(timeout=0) == [10]
    finally:
        release[1].set()
        pool.close()
