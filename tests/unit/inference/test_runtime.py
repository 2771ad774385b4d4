"""ModelRuntime: one model per worker, shared batcher, hot swap, metrics (fake model file)."""

import time
from pathlib import Path

import pytest

from pyflink_aisp.checksums import sha256_file, verify_sha256
from pyflink_aisp.errors import ModelError
from pyflink_aisp.inference import (
    BatchingConfig,
    Inferred,
    ModelHandler,
    ModelRuntime,
    ModelSwapConfig,
    publish_model,
)
from pyflink_aisp.inference._swap import read_pointer


class ScaleHandler(ModelHandler[float, float, float]):
    """A 'model' file holding one number; predictions are inputs times it."""

    def __init__(self, path: Path):
        self.path = path
        self.loads: list[str] = []
        self.released: list[float] = []

    def load_model(self) -> float:
        self.loads.append(str(self.path))
        return float(self.path.read_text())

    def model_version(self) -> str:
        return sha256_file(self.path)

    def load_version(self, path: Path, sha256: str) -> float:
        verify_sha256(path, sha256)
        try:
            return float(path.read_text())
        except ValueError as exc:
            raise ModelError(f"{path} is not a scale model") from exc

    def run_inference(self, batch, model):
        return [x * model for x in batch]

    def release_model(self, model: float) -> None:
        self.released.append(model)


def wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "v1.txt"
    path.write_text("2")
    return path


def test_operators_of_a_worker_share_one_model(model_file):
    handler = ScaleHandler(model_file)
    batching = BatchingConfig(max_batch_size=4, max_wait_ms=1)
    first = ModelRuntime.acquire(handler, batching)
    second = ModelRuntime.acquire(ScaleHandler(model_file), batching)  # an equal handler, e.g. unpickled
    assert first is second and handler.loads == [str(model_file)]
    assert [r.prediction for r in first.infer_batch([1.0, 2.0, 3.0])] == [2.0, 4.0, 6.0]
    first.release()
    assert handler.released == []  # still used by the second operator
    second.release()
    assert handler.released == [2.0]
    third = ModelRuntime.acquire(handler, batching)
    assert third is not first  # a fresh runtime after the last release
    third.release()


def test_infer_batch_returns_the_error_of_a_bad_example_only(model_file):
    runtime = ModelRuntime.acquire(ScaleHandler(model_file), BatchingConfig(max_batch_size=8, max_wait_ms=1))
    out = runtime.infer_batch([1.0, "x", 3.0])
    runtime.release()
    assert out[0] == Inferred(2.0, sha256_file(model_file)) and out[2].prediction == 6.0
    assert isinstance(out[1], TypeError)


def test_hot_swap_between_batches_and_refusal_of_bad_versions(model_file, tmp_path):
    pointer = tmp_path / "pointer.json"
    v1 = sha256_file(model_file)
    runtime = ModelRuntime.acquire(ScaleHandler(model_file), BatchingConfig(max_batch_size=8, max_wait_ms=1),
                                   swap=ModelSwapConfig(pointer_path=pointer, poll_interval_s=0.05))
    assert runtime.infer_batch([1.0]) == [Inferred(2.0, v1)]

    v2_file = tmp_path / "v2.txt"
    v2_file.write_text("10")
    v2 = publish_model(pointer, v2_file).sha256
    assert read_pointer(pointer).sha256 == v2
    assert wait_for(lambda: runtime.infer_batch([1.0]) == [Inferred(10.0, v2)])
    assert runtime.swap_state.swaps == 1 and runtime.handler.released == [2.0]

    bad = tmp_path / "v3.txt"
    bad.write_text("not a number")
    publish_model(pointer, bad)
    assert wait_for(lambda: runtime.swap_state.failures == 1)
    error = runtime.swap_state.last_error
    assert "refused model" in error and "not a scale model" in error
    assert runtime.infer_batch([3.0]) == [Inferred(30.0, v2)]  # the old version keeps serving

    pointer.write_text('{"path": "v2.txt", "sha256": "' + "0" * 64 + '"}')  # checksum mismatch
    assert wait_for(lambda: runtime.swap_state.failures == 2)
    assert "ChecksumError" not in runtime.swap_state.last_error  # an AispError: its message, no type
    assert "sha256" in runtime.swap_state.last_error
    pointer.write_text("{broken")
    assert wait_for(lambda: runtime.swap_state.failures == 3)
    assert runtime.infer_batch([1.0]) == [Inferred(10.0, v2)]
    runtime.release()


def test_a_pointer_published_before_start_wins(model_file, tmp_path):
    pointer = tmp_path / "pointer.json"
    v2_file = tmp_path / "v2.txt"
    v2_file.write_text("5")
    v2 = publish_model(pointer, v2_file).sha256
    runtime = ModelRuntime.acquire(ScaleHandler(model_file), BatchingConfig(max_batch_size=8, max_wait_ms=1),
                                   swap=ModelSwapConfig(pointer_path=pointer, poll_interval_s=60))
    assert runtime.infer_batch([1.0]) == [Inferred(5.0, v2)]
    runtime.release()


class RecordingGroup:
    def __init__(self):
        self.gauges = {}

    def gauge(self, name, read):
        self.gauges[name] = read


def test_metrics_are_gauges_with_units_in_their_names(model_file):
    runtime = ModelRuntime.acquire(ScaleHandler(model_file), BatchingConfig(max_batch_size=4, max_wait_ms=1))
    group = RecordingGroup()
    runtime.bind_metrics(group)
    runtime.infer_batch([1.0] * 10)
    values = {name: read() for name, read in group.gauges.items()}
    runtime.release()
    assert values["recordsInferred"] == 10 and values["batches"] >= 3
    assert values["batchSizeMax"] == 4 and 1 <= values["batchSizeP50"] <= 4
    assert values["queueWaitUsP99"] >= values["queueWaitUsP50"] >= 0
    assert values["computeUsMax"] > 0 and values["maxBatchSizeKnob"] == 4 and values["maxWaitUsKnob"] == 1000
    assert values["modelVersion"] == int(sha256_file(model_file)[:12], 16)
    assert values["sloP99Us"] == 0 and values["modelSwapFailures"] == 0


def test_publish_refuses_a_missing_file(tmp_path):
    with pytest.raises(ModelError):
        publish_model(tmp_path / "p.json", tmp_path / "nope.onnx")


def test_aisp_model_publish_writes_the_pointer(tmp_path, capsys):
    from pyflink_aisp.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"not really onnx, but hashed all the same")
    assert main(["model", "publish", str(tmp_path / "ptr.json"), str(model)]) == 0
    pointer = read_pointer(tmp_path / "ptr.json")
    assert pointer.path == model.resolve() and pointer.sha256 == sha256_file(model)
    assert pointer.sha256 in capsys.readouterr().out
    assert main(["model", "publish", str(tmp_path / "ptr.json"), str(tmp_path / "missing.onnx")]) == 1
    assert "does not exist" in capsys.readouterr().err


# -- handlers that came by value (issue 9.2: a handler class in the job script under `flink run`) ----


def _by_value_handler_class():
    """A handler class as a Flink worker sees one from the job script: defined in ``__main__``
    (not importable there), with a lambda attribute; the standard pickle refuses it."""
    class MainScriptHandler(ModelHandler[float, float, float]):
        def __init__(self, factor: float):
            self.factor = factor
            self.transform = lambda x: x * factor
            self.loads = 0

        def load_model(self) -> float:
            self.loads += 1
            return self.factor

        def run_inference(self, batch, model):
            return [self.transform(x) for x in batch]

    MainScriptHandler.__module__ = "__main__"
    MainScriptHandler.__qualname__ = "MainScriptHandler"
    return MainScriptHandler


def test_a_handler_shipped_by_value_shares_one_runtime_per_worker():
    import pickle

    import cloudpickle

    from pyflink_aisp.inference._runtime import handler_key

    handler = _by_value_handler_class()(3.0)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(handler)
    key = handler_key(handler)  # on the client, where the operators are built
    assert key == handler_key(handler) and key.startswith("MainScriptHandler:")
    blob = cloudpickle.dumps((handler, key))  # what the job graph carries
    (first, key1), (second, key2) = cloudpickle.loads(blob), cloudpickle.loads(blob)  # two operators
    other_handler = _by_value_handler_class()(5.0)
    other, other_key = cloudpickle.loads(cloudpickle.dumps((other_handler, handler_key(other_handler))))
    assert other_key != key
    config = BatchingConfig(max_batch_size=4, max_wait_ms=1.0)
    a = ModelRuntime.acquire(first, config, key=key1)
    b = ModelRuntime.acquire(second, config, key=key2)
    c = ModelRuntime.acquire(other, config, key=other_key)
    try:
        assert a is b and a is not c
        assert first.loads == 1 and second.loads == 0  # one model for both operators
        assert [r.prediction for r in a.infer_batch([1.0, 2.0])] == [3.0, 6.0]
        assert [r.prediction for r in c.infer_batch([1.0])] == [5.0]
    finally:
        for runtime in (a, b, c):
            runtime.release()


def test_a_handler_that_no_pickler_takes_gets_a_runtime_of_its_own():
    import threading

    handler_class = _by_value_handler_class()
    unpicklable = handler_class(2.0)
    unpicklable.lock = threading.Lock()  # neither pickle nor cloudpickle serialize a lock
    twin = handler_class(2.0)
    twin.lock = threading.Lock()
    config = BatchingConfig(max_batch_size=4, max_wait_ms=1.0)
    a = ModelRuntime.acquire(unpicklable, config)
    again = ModelRuntime.acquire(unpicklable, config)
    b = ModelRuntime.acquire(twin, config)
    try:
        assert a is again and a is not b
        assert [r.prediction for r in a.infer_batch([4.0])] == [8.0]
    finally:
        for runtime in (a, again, b):
            runtime.release()
