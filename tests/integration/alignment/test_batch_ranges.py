"""BATCH runs of the main job over resolved ranges (issue 11.2): a topic written transactionally (with an
aborted transaction and commit markers, FLINK-34470) is read to its end and the run ends; an explicit
sub-range scores exactly its records, and its manifest says so."""

import json
import time

import pytest
from confluent_kafka import Producer

from pyflink_aisp.alignment import RunManifest, topic_offsets
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, read_topic
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import run_job

pytestmark = pytest.mark.integration


def _transactional(bootstrap, topic, batches):
    """Each batch in its own transaction; a batch of None is written and aborted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"writer-{topic}"})
    producer.init_transactions(30)
    for batch, commit in batches:
        producer.begin_transaction()
        for r in batch:
            producer.produce(topic, key=r.id, value=json.dumps({"id": r.id, "text": r.text}))
        producer.flush(30)  # written to the partition (an abort would purge what is still queued)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    # EndTxn returns once the coordinator logged the outcome; the markers reach the partition
    # (and move its last stable offset) a moment later
    deadline = time.monotonic() + 30
    while topic_offsets(bootstrap, topic).latest[0] < 93 and time.monotonic() < deadline:
        time.sleep(0.1)


def test_batch_over_a_transactional_topic_ends_and_a_sub_range_scores_exactly_its_records(
    kafka_bootstrap, topic, model_assets, tmp_path
):
    reviews = load_rotten_tomatoes()[2000:2090]
    t_in = topic("in")
    create_topics(kafka_bootstrap, [t_in])
    # offsets: 0..29 + marker 30, aborted 31..60 + marker 61, 62..91 + marker 92
    _transactional(kafka_bootstrap, t_in, [(reviews[:30], True), (reviews[30:60], False),
                                           (reviews[60:], True)])
    common = ["--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--mode", "batch",
              "--model-dir", str(model_assets.directory), "--manifest-dir", str(tmp_path)]

    t_part = topic("part")
    sub_range = ["--range-start", "offsets:0=10", "--range-end", "offsets:0=70"]
    assert run_job(PipelineOptions.from_args([*common, "--output-topic", t_part, "--job-name", "part",
                                              *sub_range])) == 0
    ids = sorted(json.loads(m.value())["id"] for m in read_topic(kafka_bootstrap, t_part))
    assert ids == sorted(r.id for r in reviews[10:30] + reviews[60:68])  # offsets 10..29 and 62..69
    (part,) = [RunManifest.read(p) for p in tmp_path.glob("part-batch-*.json")]
    assert (part.range.starts, part.range.ends, part.summary.input_count) == ({0: 10}, {0: 70}, 28)
    assert part.summary.output_count == 28 and part.summary.dlq_count == 0

    t_all = topic("all")
    assert run_job(PipelineOptions.from_args([*common, "--output-topic", t_all, "--job-name", "all"])) == 0
    ids = sorted(json.loads(m.value())["id"] for m in read_topic(kafka_bootstrap, t_all))
    assert ids == sorted(r.id for r in reviews[:30] + reviews[60:])  # the aborted ones are not read
    (whole,) = [RunManifest.read(p) for p in tmp_path.glob("all-batch-*.json")]
    assert whole.range.ends == {0: 93} and whole.summary.input_count == 60
    assert (whole.summary.output_count, whole.summary.missing, whole.summary.duplicates) == (60, 0, 0)

