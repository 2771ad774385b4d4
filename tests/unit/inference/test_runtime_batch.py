"""ModelRuntime's batch path (submit_batch / infer_batch) with a fake handler: order,
model batches sorted and cut, token budget and buckets, isolation of failures."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from pyflink_aisp.errors import InferenceError
from pyflink_aisp.inference import BatchingConfig, Inferred, ModelHandler, ModelRuntime, Prepared

VERSION = "fe" * 32


class Model:
    """The 'model': scores a text as 10 x its length."""


class LengthHandler(ModelHandler[str, int, Model]):
    """Texts are their own token count (``len``); ``"poison"`` fails any model call that holds it;
    a non-``str`` example fails ``prepare_batch``. Records every call (on the batching thread)."""

    def __init__(self) -> None:
        self.loads = 0
        self.prepared: list[list[Any]] = []
        self.model_batches: list[list[str]] = []   # examples of each run_prepared call, in row order
        self.record_batches: list[list[str]] = []  # examples of each run_inference call (per-record path)
        self.models: set[int] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # the runtime key pickles the handler: keep it stable
        return {}

    def load_model(self) -> Model:
        self.loads += 1
        return Model()

    def model_version(self) -> str:
        return VERSION

    def example_tokens(self, example: str, model: Model) -> int:
        if not isinstance(example, str):
            raise TypeError(f"not a text: {example!r}")
        return len(example)

    def prepare_batch(self, batch: Sequence[str], model: Model) -> Prepared:
        self.prepared.append(list(batch))
        return super().prepare_batch(batch, model)

    def run_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: Model) -> list[int]:
        examples = [prepared.payload[i] for i in rows.tolist()]
        with self._lock:
            self.model_batches.append(examples)
            self.models.add(id(model))
        if "poison" in examples:
            raise RuntimeError("poisoned batch")
        return [10 * len(x) for x in examples]

    def run_inference(self, batch: Sequence[str], model: Model) -> list[int]:
        with self._lock:
            self.record_batches.append(list(batch))
            self.models.add(id(model))
        return [10 * len(x) for x in batch]


@pytest.fixture
def acquire() -> Iterator[Any]:
    """``acquire(**batching)``: a runtime over a fresh LengthHandler, released after the test."""
    runtimes: list[ModelRuntime] = []

    def make(**batching: Any) -> tuple[ModelRuntime, LengthHandler]:
        handler = LengthHandler()
        runtime = ModelRuntime.acquire(handler, BatchingConfig(max_wait_ms=1, **batching))
        runtimes.append(runtime)
        return runtime, handler

    yield make
    for runtime in runtimes:
        runtime.release()
    assert not ModelRuntime._registry


def texts(*lengths: int) -> list[str]:
    """Distinct texts of the given lengths (the n-th is made of the n-th letter)."""
    return [chr(ord("a") + i) * n for i, n in enumerate(lengths)]


def test_outcomes_come_back_in_input_order(acquire) -> None:
    runtime, handler = acquire(max_batch_size=3)
    batch = texts(5, 1, 3, 2, 4, 6, 1)
    out = runtime.infer_batch(batch)
    assert out == [Inferred(10 * len(x), VERSION) for x in batch]
    assert handler.prepared == [batch]  # one prepare call for the whole batch


def test_model_batches_are_sorted_by_length_and_cut_at_max_batch_size(acquire) -> None:
    runtime, handler = acquire(max_batch_size=3)
    batch = texts(5, 1, 3, 2, 4, 6, 1)
    runtime.infer_batch(batch)
    assert [[len(x) for x in b] for b in handler.model_batches] == [[1, 1, 2], [3, 4, 5], [6]]
    order = [[1, 6, 3], [2, 4, 0], [5]]  # stable: the two 1-token texts keep their input order
    assert handler.model_batches == [[batch[i] for i in rows] for rows in order]
    stats = runtime.batcher.stats
    assert (stats.batches, stats.records, stats.max_batch_size, stats.sizes) == (3, 7, 3, {3: 2, 1: 1})


def test_the_token_budget_cuts_model_batches(acquire) -> None:
    runtime, handler = acquire(max_batch_size=8, max_batch_tokens=10)
    batch = texts(12, 1, 3, 2, 9, 1, 4, 3, 5, 2)
    out = runtime.infer_batch(batch)
    assert [o.prediction for o in out] == [10 * len(x) for x in batch]
    # rows x longest row <= 10; the 12-token text is over the budget alone and still runs, alone
    assert [[len(x) for x in b] for b in handler.model_batches] == [[1, 1, 2, 2], [3, 3], [4, 5], [9], [12]]


def test_length_buckets_keep_model_batches_apart(acquire) -> None:
    runtime, handler = acquire(max_batch_size=8, length_buckets=(2, 4))
    batch = texts(1, 3, 5, 2, 4, 6, 2, 40)
    runtime.infer_batch(batch)
    assert [[len(x) for x in b] for b in handler.model_batches] == [[1, 2, 2], [3, 4], [5, 6, 40]]


def test_buckets_budget_and_size_together(acquire) -> None:
    runtime, handler = acquire(max_batch_size=4, length_buckets=(4,), max_batch_tokens=12)
    runtime.infer_batch(texts(4, 1, 1, 1, 1, 1, 3, 8, 6, 2))
    assert [[len(x) for x in b] for b in handler.model_batches] == [[1, 1, 1, 1], [1, 2, 3], [4], [6], [8]]


def test_a_failing_row_is_bisected_out(acquire) -> None:
    runtime, handler = acquire(max_batch_size=4)
    batch = ["aa", "bbbbbbbbb", "poison", "c"]  # sorted by length: c, aa, poison, bbbbbbbbb
    out = runtime.infer_batch(batch)
    assert [out[0], out[1], out[3]] == [Inferred(20, VERSION), Inferred(90, VERSION), Inferred(10, VERSION)]
    assert isinstance(out[2], RuntimeError) and str(out[2]) == "poisoned batch"
    assert handler.model_batches == [
        ["c", "aa", "poison", "bbbbbbbbb"],  # the model batch fails...
        ["c", "aa"],                         # ... its halves run again
        ["poison", "bbbbbbbbb"],
        ["poison"],                          # alone, it fails alone
        ["bbbbbbbbb"],
    ]
    stats = runtime.batcher.stats
    assert (stats.batches, stats.records, stats.failed, stats.bisections) == (1, 4, 1, 2)


def test_a_bad_example_in_prepare_batch_fails_only_itself(acquire) -> None:
    runtime, handler = acquire(max_batch_size=8)
    batch: list[Any] = ["aaa", None, "b", "cc"]
    out = runtime.infer_batch(batch)
    assert [out[0], out[2], out[3]] == [Inferred(30, VERSION), Inferred(10, VERSION), Inferred(20, VERSION)]
    assert isinstance(out[1], TypeError) and "not a text: None" in str(out[1])
    # prepare_batch on halves until the bad example is alone
    assert handler.prepared == [["aaa", None, "b", "cc"], ["aaa", None], ["aaa"], [None], ["b", "cc"]]
    # each prepared part is its own chunk: the bad example never reaches the model
    assert sorted(handler.model_batches) == [["aaa"], ["b", "cc"]]
    assert runtime.batcher.stats.failed == 0


def test_an_empty_batch_returns_an_empty_list(acquire) -> None:
    runtime, handler = acquire()
    assert runtime.infer_batch([]) == []
    assert runtime.submit_batch([]).result(timeout=5) == []
    assert handler.prepared == [] and handler.model_batches == []
    assert runtime.batcher.stats.batches == 0


def test_a_prepare_batch_of_the_wrong_size_fails_its_rows_not_the_call(acquire) -> None:
    runtime, handler = acquire()

    def one_short(batch: Sequence[str], model: Model) -> Prepared:
        kept = list(batch)[:-1]
        return Prepared(kept, np.ones(len(kept), dtype=np.int64))

    handler.prepare_batch = one_short  # type: ignore[method-assign]
    out = runtime.infer_batch(["a", "b"])
    assert [type(o) for o in out] == [InferenceError, InferenceError]
    assert [str(o) for o in out] == ["prepare_batch returned 0 rows for 1 examples"] * 2
    assert handler.model_batches == []


def test_the_record_path_and_the_batch_path_share_one_model(acquire) -> None:
    runtime, handler = acquire(max_batch_size=4)
    second = ModelRuntime.acquire(LengthHandler(), runtime.batching)  # an equal handler: same runtime
    try:
        assert second is runtime and handler.loads == 1
        per_record = [runtime.submit(x).result(timeout=5) for x in ("a", "bb")]
        batched = second.infer_batch(texts(1, 2, 3))
    finally:
        second.release()
    assert per_record == [Inferred(10, VERSION), Inferred(20, VERSION)]
    assert batched == [Inferred(10, VERSION), Inferred(20, VERSION), Inferred(30, VERSION)]
    assert handler.record_batches == [["a"], ["bb"]] and handler.model_batches == [["a", "bb", "ccc"]]
    assert len(handler.models) == 1  # one model object served both paths
    stats = runtime.batcher.stats
    assert (stats.batches, stats.records) == (3, 5)  # the stats count both paths


def test_infer_batch_after_the_last_release_is_an_error() -> None:
    handler = LengthHandler()
    runtime = ModelRuntime.acquire(handler, BatchingConfig(max_wait_ms=1))
    other = ModelRuntime.acquire(LengthHandler(), runtime.batching)
    assert other is runtime
    other.release()  # one user left: still serving
    assert runtime.infer_batch(["a"]) == [Inferred(10, VERSION)]
    runtime.release()
    assert not ModelRuntime._registry
    with pytest.raises(InferenceError, match="closed"):
        runtime.infer_batch(["a"])


def test_an_arrow_batch_with_a_null_fails_only_the_null_row(acquire: Any) -> None:
    """Arrow input reaches the default hooks as Python values (not Arrow scalars); a null
    fails its own row when the batch is prepared again in parts (found by a breaker run)."""
    import pyarrow as pa

    runtime, handler = acquire(max_batch_size=8)
    for batch in (pa.array(["ab", None, "abcd"]), pa.chunked_array([["ab", None], ["abcd"]])):
        out = runtime.infer_batch(batch)
        assert [o.prediction for o in (out[0], out[2])] == [20, 40]  # type: ignore[union-attr]
        assert isinstance(out[1], TypeError) and "None" in str(out[1])
    parts = [part for part in handler.prepared if len(part) < 3]  # prepared again in parts, as lists
    assert parts and all(x is None or isinstance(x, str) for part in parts for x in part)
