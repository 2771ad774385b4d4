"""The record operator at parallelism 2 through ``flink run`` on the standalone cluster (issue 24):
the two subtasks, in one TaskManager's interpreter, run the model side by side (the derived
``--pipeline-depth 2``), and every record of both input partitions is scored once."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics

pytestmark = pytest.mark.e2e

N = 80


def test_two_record_subtasks_score_both_partitions_once(stack, model_assets, job_outputs) -> None:
    bootstrap = str(stack.status().bootstrap_servers)
    topic = "record-p2"
    create_topics(bootstrap, [topic], partitions=2)
    create_topics(bootstrap, [f"{topic}-out", f"{topic}-out.dlq"], partitions=1)
    reviews = load_rotten_tomatoes()[:N]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, r in enumerate(reviews):
        producer.produce(topic, value=json.dumps({"id": r.id, "text": r.text}).encode(), partition=i % 2)
    assert producer.flush(60) == 0
    stdout, read = job_outputs(stack, "streaming", (
        "--bootstrap-servers", bootstrap, "--input-topic", topic, "--output-topic", f"{topic}-out",
        "--model-dir", str(model_assets.directory), "--operator", "record", "--parallelism", "2",
        "--latency-slo-ms", "100", "--checkpoint-interval-ms", "1000"), {f"{topic}-out": N})
    # the client read the cluster's config.yaml: 4 slots a TaskManager hold both subtasks (depth 2)
    assert "(streaming, record operator, pipeline depth 2 (remote, 4 slots per TaskManager))" in stdout
    out = read[f"{topic}-out"]
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in out}
    assert len(out) == N and sorted(docs) == sorted(r.id for r in reviews)
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    assert all(docs[r.id]["score"] == pytest.approx(float(s), abs=1e-5)
               for r, s in zip(reviews, scores, strict=True))
    sources = {dict(m.headers())["aisp.source"].decode().rsplit("/", 2)[1] for m in out}
    assert sources == {"0", "1"}
