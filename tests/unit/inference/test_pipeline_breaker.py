"""Defects found by trying to break the pipelined batch path (issue 23), each pinned by a test.

- ``TorchSentimentModel.predict_rows`` / ``TorchEncoderModel.embed_rows`` are documented as safe
  from several threads, but went through the runner's *counted* launch (the batching thread's
  ring of ``depth + 1``): a third concurrent caller failed with "model batches are in flight".
- A ``pipeline_depth`` callable of :class:`MicroBatcher` that raises killed the batching thread:
  the submitted batch's future never resolved, not even after ``close()``.
- ``ModelRuntime.release()`` never released a model version that was loaded (``ready``) but not
  yet swapped in.
- A ``release_model`` of a swapped-out model that raised at its last collect discarded that
  batch's results (computed by the old model) and re-ran its rows, bisected, on the new model.

Every wait is bounded, so a regression fails instead of hanging; nothing asserts on wall time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from pyflink_aisp.inference import (
    BatchCuts,
    BatchingConfig,
    Inferred,
    MicroBatcher,
    ModelHandler,
    ModelRuntime,
    ModelSwapConfig,
    Prepared,
    publish_model,
)

WAIT_S = 10.0
V1, V2 = "a1" * 32, "b2" * 32
THREADS = 3


# -- the torch models' row methods on several threads ---------------------------------------------


def _all_inside_forward(runner: Any) -> threading.Barrier:
    """Make every forward pass of ``runner`` wait (bounded) until THREADS of them are running."""
    barrier = threading.Barrier(THREADS, timeout=WAIT_S)
    forward = runner.forward

    def gathered(ids: Any, mask: Any, types: Any) -> Any:
        barrier.wait()
        return forward(ids, mask, types)

    runner.forward = gathered
    return barrier


def _on_threads(call: Any) -> tuple[list[Any], list[BaseException]]:
    results: list[Any] = [None] * THREADS
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = call()
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(3 * WAIT_S)
    assert not any(thread.is_alive() for thread in threads)
    return results, errors


def test_predict_rows_may_run_on_several_threads_at_once(model_assets: Any) -> None:
    from pyflink_aisp.inference.handlers import TorchSentimentHandler

    handler = TorchSentimentHandler(model_assets, intra_op_num_threads=1)
    model = handler.load_model()
    texts = ["a fine film", "dull and long", "the best of the year", "meh"]
    tokens = model.encode(texts)
    reference, _ = model.predict(texts)
    _all_inside_forward(model.runner)
    results, errors = _on_threads(lambda: model.predict_rows(tokens, np.arange(len(texts))))
    assert errors == []
    for scores, embeddings in results:
        np.testing.assert_allclose(scores, reference, rtol=0, atol=1e-6)
        assert embeddings.shape == (len(texts), model.embedding_dim)
    assert model.runner.in_flight == 0
    handler.release_model(model)


def test_embed_rows_may_run_on_several_threads_at_once() -> None:
    from pyflink_aisp.inference.handlers import TorchEncoderHandler
    from pyflink_aisp.models import locate_source_model

    handler = TorchEncoderHandler(model_dir=locate_source_model().directory, normalize=True,
                                  intra_op_num_threads=1)
    model = handler.load_model()
    texts = ["a fine film", "dull and long", "the best of the year"]
    prepared = handler.prepare_batch(texts, model)
    reference = np.stack(handler.run_prepared(prepared, np.arange(len(texts)), model))
    _all_inside_forward(model.runner)
    results, errors = _on_threads(lambda: model.embed_rows(prepared.payload, np.arange(len(texts))))
    assert errors == []
    for vectors in results:
        np.testing.assert_allclose(vectors, reference, rtol=0, atol=1e-6)
    handler.release_model(model)


# -- the batcher's pipeline_depth callable --------------------------------------------------------


def test_a_pipeline_depth_callable_that_raises_does_not_stop_the_batching_thread() -> None:
    reads: list[int] = []

    def depth() -> int:
        reads.append(1)
        if len(reads) > 1:
            raise RuntimeError("depth hook broke")
        return 2

    def rows_of(payload: list[int], rows: npt.NDArray[np.intp]) -> list[int]:
        return [10 * payload[i] for i in rows.tolist()]

    batcher: MicroBatcher[int, int] = MicroBatcher(
        lambda items: items, BatchingConfig(max_batch_size=2, max_wait_ms=1, batch_cuts=BatchCuts.FIXED),
        run_rows=rows_of, launch_rows=rows_of, collect=lambda handle: handle, pipeline_depth=depth)
    try:
        future = batcher.submit_chunk(list(range(6)), np.ones(6, dtype=np.int64))
        assert future.result(timeout=WAIT_S) == [0, 10, 20, 30, 40, 50]
        assert batcher.submit_chunk([7], np.ones(1, dtype=np.int64)).result(timeout=WAIT_S) == [70]
    finally:
        batcher.close()
    assert not batcher._thread.is_alive()


# -- hot swap: models loaded and released ---------------------------------------------------------


class _Model:
    def __init__(self, name: str) -> None:
        self.name = name


class SwapHandler(ModelHandler[str, int, _Model]):
    """Synchronous launches (the handle holds the results); versions load from files; depth 2."""

    def __init__(self, fail_release_of: str | None = None) -> None:
        self.fail_release_of = fail_release_of
        self.released: list[str] = []
        self.launches: list[tuple[str, list[str]]] = []
        self.runtime: ModelRuntime | None = None

    def load_model(self) -> _Model:
        return _Model("v1")

    def model_version(self) -> str:
        return V1

    def load_version(self, path: Path, sha256: str) -> _Model:
        return _Model(Path(path).read_text())

    def run_inference(self, batch: Sequence[str], model: _Model) -> list[int]:
        return [len(x) for x in batch]

    def pipeline_depth(self, model: _Model) -> int:
        return 2

    def launch_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: _Model) -> Any:
        texts = [prepared.payload[i] for i in rows.tolist()]
        self.launches.append((model.name, texts))
        if len(self.launches) == 1 and self.runtime is not None:  # swapped in before the next launch
            self.runtime._offer((_Model("v2"), V2))
        return [len(t) for t in texts]

    def release_model(self, model: _Model) -> None:
        self.released.append(model.name)
        if model.name == self.fail_release_of:
            raise RuntimeError(f"cannot release {model.name}")


@pytest.fixture
def made() -> Iterator[list[ModelRuntime]]:
    runtimes: list[ModelRuntime] = []
    yield runtimes
    for runtime in runtimes:
        if runtime in ModelRuntime._registry.values():
            runtime.release()


def test_release_frees_a_version_loaded_but_not_yet_swapped_in(
        tmp_path: Path, made: list[ModelRuntime]) -> None:
    version = tmp_path / "model-v2"
    version.write_text("v2")
    pointer = tmp_path / "pointer.json"
    publish_model(pointer, version)  # read when the runtime starts: v2 loaded, swapped in at the next batch
    handler = SwapHandler()
    runtime = ModelRuntime.acquire(handler, BatchingConfig(),
                                   swap=ModelSwapConfig(pointer_path=pointer, poll_interval_s=3600),
                                   key=f"swap-ready:{id(handler)}")
    made.append(runtime)
    assert runtime.swap_state.ready is not None  # loaded, waiting for a batch
    runtime.release()
    assert sorted(handler.released) == ["v1", "v2"]  # both versions freed, each once


def test_a_failing_release_of_the_swapped_out_model_keeps_its_collected_results(
        made: list[ModelRuntime]) -> None:
    handler = SwapHandler(fail_release_of="v1")
    config = BatchingConfig(max_batch_size=4, max_wait_ms=1, batch_cuts=BatchCuts.FIXED)
    runtime = ModelRuntime.acquire(handler, config, key=f"swap-release:{id(handler)}")
    made.append(runtime)
    handler.runtime = runtime
    batch = ["a" * (i + 1) for i in range(8)]  # two model batches of 4: rows 0-3 on v1, 4-7 on v2
    out = runtime.submit_batch(batch).result(timeout=WAIT_S)
    assert out == [Inferred(len(t), V1 if i < 4 else V2) for i, t in enumerate(batch)]
    assert [name for name, _ in handler.launches] == ["v1", "v2"]  # each row computed once
    assert runtime.batcher.stats.bisections == 0 and runtime.batcher.stats.failed == 0
    assert handler.released == ["v1"]
