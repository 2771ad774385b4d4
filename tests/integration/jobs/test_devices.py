"""Runtime and device selection through the main job on a real broker and MiniCluster (issue 10.1)."""

import json

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel, TorchSentimentHandler
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("operator", ["arrow", "async"])
def test_the_torch_runtime_scores_like_onnx_in_the_job(operator, kafka_bootstrap, topic, model_assets):
    reviews = load_rotten_tomatoes()[200:240]
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in])
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(kafka_bootstrap, t_in, records, progress=False).delivered == len(reviews)
    options = PipelineOptions.from_args([
        "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--mode", "batch", "--model-dir", str(model_assets.directory), "--runtime", "torch",
        "--device", "cpu", "--operator", operator])
    build_pipeline(make_environment(options), options).wait()
    out = {d["id"]: d for d in (json.loads(m.value()) for m in read_topic(kafka_bootstrap, t_out,
                                                                           min_count=len(reviews)))}
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    version = TorchSentimentHandler(model_assets).model_version()
    assert set(out) == {r.id for r in reviews}
    for r, score in zip(reviews, scores, strict=True):
        assert out[r.id]["score"] == pytest.approx(float(score), abs=1e-5)
        assert out[r.id]["model_sha256"] == version != model_assets.sha256


def test_a_second_streaming_job_on_a_consumed_topic_gets_every_record(kafka_bootstrap, topic, model_assets):
    """Issue 11.1: the group and transactional ids derive from the job name (default
    aisp-<input>-<output>), so a second job into another output does not inherit the first
    job's committed offsets (before: 0 outputs for the records the first had consumed)."""
    reviews = load_rotten_tomatoes()[300:330]
    t_in, t_a, t_b = topic("in"), topic("a"), topic("b")
    create_topics(kafka_bootstrap, [t_in])
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(kafka_bootstrap, t_in, records, progress=False).delivered == len(reviews)
    for t_out in (t_a, t_b):
        options = PipelineOptions.from_args([
            "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
            "--model-dir", str(model_assets.directory), "--checkpoint-interval-ms", "500"])
        assert options.group == options.name == f"aisp-{t_in}-{t_out}"
        run = build_pipeline(make_environment(options), options)
        try:
            out = read_topic(kafka_bootstrap, t_out, min_count=len(reviews), timeout_s=120, quiet_s=2)
        finally:
            run.get_job_client().cancel().result()
        assert sorted(json.loads(m.value())["id"] for m in out) == sorted(r.id for r in reviews)
