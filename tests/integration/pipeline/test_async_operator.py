"""The DataStream async operator in the main job: real broker, real MiniCluster, real model.

Test handlers wrap the real :class:`SentimentHandler` (they log batch sizes to a
file or slow the real model down); they run in PyFlink's Python worker process,
so they are pickled by value.
"""

import json
import sys
import time
from pathlib import Path

import cloudpickle
import numpy as np
import onnx
import pytest
from confluent_kafka import Producer
from onnx import numpy_helper

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference import publish_model
from pyflink_aisp.inference.handlers import OnnxSentimentModel, SentimentHandler
from pyflink_aisp.kafka import create_topics, read_topic
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

pytestmark = pytest.mark.integration


class BatchLoggingHandler(SentimentHandler):
    """The real model; appends each batch's size to ``log_path`` (one line per batch)."""

    def __init__(self, assets, log_path: Path, delay_s: float = 0.0):
        super().__init__(assets)
        self.log_path = str(log_path)
        self.delay_s = delay_s

    def run_inference(self, batch, model):
        if self.delay_s:
            time.sleep(self.delay_s)  # a slow model: each batch takes at least this long
        with open(self.log_path, "a") as fh:
            fh.write(f"{len(batch)}\n")
        return super().run_inference(batch, model)


@pytest.fixture(scope="module", autouse=True)
def _pickle_handlers_by_value():
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def reviews():
    return load_rotten_tomatoes()[1000:1300]


def _produce(bootstrap, topic, reviews):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for r in reviews:
        producer.produce(topic, key=r.id, value=json.dumps({"id": r.id, "text": r.text}))
    assert producer.flush(30) == 0


def _scores(model, reviews):
    scores, _ = model.predict([r.text for r in reviews])
    return {r.id: float(s) for r, s in zip(reviews, scores, strict=True)}


def _args(bootstrap, t_in, t_out, assets, *extra):
    return ["--bootstrap-servers", bootstrap, "--input-topic", t_in, "--output-topic", t_out,
            "--model-dir", str(assets.directory), "--checkpoint-interval-ms", "1000", "--operator", "async",
            *extra]


@pytest.mark.parametrize(("mode", "ordered"), [("batch", False), ("streaming", True)])
def test_batches_form_under_load_and_outputs_equal_the_models(
    mode, ordered, kafka_bootstrap, topic, model_assets, reviews, tmp_path
):
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in, t_out])
    _produce(kafka_bootstrap, t_in, reviews)  # all waiting before the job starts: load
    log = tmp_path / "batches.txt"
    cfg = PipelineOptions.from_args(_args(kafka_bootstrap, t_in, t_out, model_assets, "--mode", mode,
                                      "--max-batch-size", "64", "--capacity", "128",
                                      *(["--ordered"] if ordered else [])))
    result = build_pipeline(make_environment(cfg), cfg,
                                      handler=BatchLoggingHandler(model_assets, log))
    try:
        if mode == "batch":
            result.wait()
        out = read_topic(kafka_bootstrap, t_out, min_count=len(reviews), timeout_s=180, quiet_s=3)
    finally:
        if mode == "streaming":
            result.get_job_client().cancel().result()
    expected = _scores(OnnxSentimentModel(model_assets), reviews)
    docs = [json.loads(m.value()) for m in out]
    assert sorted(d["id"] for d in docs) == sorted(expected)
    for d in docs:
        assert d["score"] == pytest.approx(expected[d["id"]], abs=1e-5)
        assert d["model_sha256"] == model_assets.sha256
    if ordered:
        assert [d["id"] for d in docs] == [r.id for r in reviews]
    sizes = [int(line) for line in log.read_text().split()]
    assert sum(sizes) == len(reviews)
    assert max(sizes) > 1 and max(sizes) <= 64
    assert len(sizes) < len(reviews) / 4  # real batches, not one call per record


def test_a_slow_model_backpressures_the_source_instead_of_timing_out(
    kafka_bootstrap, topic, model_assets, reviews, tmp_path
):
    t_in, t_out = topic("in"), topic("out")
    dlq = f"{t_out}.dlq"
    create_topics(kafka_bootstrap, [t_in, t_out])
    slow = reviews[:120]
    _produce(kafka_bootstrap, t_in, slow)
    log = tmp_path / "batches.txt"
    # 120 records in batches of <= 8, each batch >= 0.3 s: >= 4.5 s of model time, while a
    # record may wait at most 2 s; only the capacity of 8 in flight keeps every record in time.
    cfg = PipelineOptions.from_args(_args(kafka_bootstrap, t_in, t_out, model_assets, "--mode", "batch",
                                      "--max-batch-size", "8", "--capacity", "8", "--timeout-s", "2"))
    start = time.monotonic()
    build_pipeline(make_environment(cfg), cfg,
                             handler=BatchLoggingHandler(model_assets, log, delay_s=0.3)).wait()
    elapsed = time.monotonic() - start
    out = read_topic(kafka_bootstrap, t_out, min_count=len(slow), timeout_s=60, quiet_s=2)
    assert sorted(json.loads(m.value())["id"] for m in out) == sorted(r.id for r in slow)
    assert read_topic(kafka_bootstrap, dlq, timeout_s=5, quiet_s=2) == []  # nothing timed out
    sizes = [int(line) for line in log.read_text().split()]
    assert sum(sizes) == len(slow) and max(sizes) <= 8
    assert len(sizes) * 0.3 > 2 and elapsed > len(sizes) * 0.3  # the run outlasted the timeout


def _version_two(assets, directory: Path) -> Path:
    """The same encoder with the head's intercept moved by +2: other scores, other sha256."""
    model = onnx.load(str(assets.onnx_path))
    for init in model.graph.initializer:
        if init.name == "head_intercept":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(2.0), init.name))
    path = directory / "model-v2.onnx"
    onnx.save(model, str(path))
    return path


def _await_version(bootstrap, t_in, t_out, probes, sha256, seen):
    """Produce ``probes`` one at a time until one comes out scored by ``sha256``.

    The job loads a published version in the background; how long that takes
    depends on the machine, so the test waits for the swap itself rather than a
    fixed time. Returns the probes produced (each is scored by one version or the
    other; the caller checks which).
    """
    sent = []
    for probe in probes:
        _produce(bootstrap, t_in, [probe])
        sent.append(probe)
        out = read_topic(bootstrap, t_out, min_count=seen + len(sent), timeout_s=60, quiet_s=0.5)
        if any(json.loads(m.value())["id"] == probe.id and json.loads(m.value())["model_sha256"] == sha256
               for m in out):
            return sent
        time.sleep(0.5)
    raise AssertionError(f"version {sha256[:12]} was not swapped in after {len(sent)} probes")


def test_hot_swap_mid_stream_tags_outputs_and_refuses_a_bad_model(
    kafka_bootstrap, topic, model_assets, reviews, tmp_path
):
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in, t_out])
    pointer = tmp_path / "model.json"
    publish_model(pointer, model_assets.onnx_path)
    v2_path = _version_two(model_assets, tmp_path)
    v2 = sha256_file(v2_path)
    first, second, third = reviews[:80], reviews[80:160], reviews[160:200]
    cfg = PipelineOptions.from_args(_args(kafka_bootstrap, t_in, t_out, model_assets,
                                      "--model-pointer", str(pointer), "--model-poll-interval-s", "0.5"))
    run = build_pipeline(make_environment(cfg), cfg)
    try:
        _produce(kafka_bootstrap, t_in, first)
        read_topic(kafka_bootstrap, t_out, min_count=len(first), timeout_s=120, quiet_s=1)
        publish_model(pointer, v2_path)
        probes = _await_version(kafka_bootstrap, t_in, t_out, reviews[200:300], v2, len(first))
        _produce(kafka_bootstrap, t_in, second)
        total = len(first) + len(probes) + len(second)
        read_topic(kafka_bootstrap, t_out, min_count=total, timeout_s=120, quiet_s=1)
        bad = tmp_path / "broken.onnx"
        bad.write_bytes(v2_path.read_bytes()[:4096])  # truncated: ONNX Runtime cannot load it
        publish_model(pointer, bad)
        time.sleep(3)  # six polls: the job reads the pointer and fails to load the truncated file at once
        _produce(kafka_bootstrap, t_in, third)
        out = read_topic(kafka_bootstrap, t_out, min_count=total + len(third), timeout_s=120, quiet_s=3)
    finally:
        run.get_job_client().cancel().result()
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in out}
    expected_ids = {r.id for r in reviews[:200] + probes}
    assert len(out) == len(expected_ids) and set(docs) == expected_ids  # none lost, none twice
    v1_model = OnnxSentimentModel(model_assets)
    v1_scores = _scores(v1_model, first + probes)
    assert {docs[r.id]["model_sha256"] for r in first} == {model_assets.sha256}
    assert all(docs[r.id]["score"] == pytest.approx(v1_scores[r.id], abs=1e-5) for r in first)
    v2_model = SentimentHandler(model_assets).load_version(v2_path, v2)
    v2_scores = _scores(v2_model, second + third + probes)
    assert docs[probes[-1].id]["model_sha256"] == v2
    for r in probes:  # each probe is scored by the version its tag names
        want = v1_scores if docs[r.id]["model_sha256"] == model_assets.sha256 else v2_scores
        assert docs[r.id]["model_sha256"] in {model_assets.sha256, v2}
        assert docs[r.id]["score"] == pytest.approx(want[r.id], abs=1e-5)
    assert {docs[r.id]["model_sha256"] for r in second + third} == {v2}  # the bad model was refused
    assert all(docs[r.id]["score"] == pytest.approx(v2_scores[r.id], abs=1e-5) for r in second + third)
