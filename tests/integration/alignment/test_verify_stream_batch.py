"""`aisp verify`: the STREAMING and the BATCH run of the main job over the same 2,000 real reviews
agree; an altered output is found and named (issue 11.4, reading the outputs)."""

import json

import pytest
from confluent_kafka import Producer

from pyflink_aisp.cli import main as aisp
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

pytestmark = pytest.mark.integration

N = 2000


def test_stream_and_batch_agree_and_an_altered_output_is_named(kafka_bootstrap, topic, model_assets, capsys):
    reviews = load_rotten_tomatoes()[:N]
    t_in, t_stream, t_batch, t_altered = topic("in"), topic("stream"), topic("batch"), topic("altered")
    create_topics(kafka_bootstrap, [t_in, t_altered])
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(kafka_bootstrap, t_in, records, progress=False).delivered == N
    common = ["--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in,
              "--model-dir", str(model_assets.directory)]
    batch = PipelineOptions.from_args([*common, "--output-topic", t_batch, "--mode", "batch"])
    build_pipeline(make_environment(batch), batch).wait()
    stream = PipelineOptions.from_args([*common, "--output-topic", t_stream,
                                        "--checkpoint-interval-ms", "1000"])
    run = build_pipeline(make_environment(stream), stream)
    try:
        assert len(read_topic(kafka_bootstrap, t_stream, min_count=N, timeout_s=300, quiet_s=3)) == N
    finally:
        run.get_job_client().cancel().result()

    assert aisp(["verify", t_stream, t_batch, "--bootstrap-servers", kafka_bootstrap]) == 0
    out = capsys.readouterr().out
    assert f"a: {N} records" in out and f"b: {N} records" in out and out.rstrip().endswith("SAME")

    # the batch output with one label flipped and one record dropped
    docs = [json.loads(m.value()) for m in read_topic(kafka_bootstrap, t_batch)]
    flipped, dropped = docs[10]["id"], docs[11]["id"]
    docs[10]["label"] = "rotten" if docs[10]["label"] == "fresh" else "fresh"
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for doc in docs[:11] + docs[12:]:
        producer.produce(t_altered, value=json.dumps(doc))
    assert producer.flush(30) == 0
    assert aisp(["verify", t_stream, t_altered, "--bootstrap-servers", kafka_bootstrap]) == 3
    out = capsys.readouterr().out
    assert f"only in a: 1: {dropped}" in out
    assert f"differs: {flipped}: " in out and out.rstrip().endswith("DIFFERENT")
