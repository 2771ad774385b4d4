"""The main job on a real broker and a real PyFlink MiniCluster, in BATCH and STREAMING mode."""

import json
import sys
import time

import cloudpickle
import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference import Prepared
from pyflink_aisp.inference.handlers import OnnxSentimentModel, SentimentHandler
from pyflink_aisp.kafka import create_topics, read_topic
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

pytestmark = pytest.mark.integration

N_GOOD = 500
MALFORMED = [
    (b'{"id": "bad-json", "text": ', "invalid_json"),
    (b'{"id": "no-text"}', "missing_text"),
    (b'\xff\xfe{"id": "x", "text": "y"}', "invalid_utf8"),
    (None, "null_value"),
    (b"{}", "missing_text"),
    (b'{"text": "x", "a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "invalid_json"),  # RecursionError
    (b'{"id": ' + b"1" * 5000 + b', "text": "x"}', "invalid_json"),  # int digit limit
    (b'{"id": "s", "text": "a\\ud800b"}', "invalid_unicode"),  # lone surrogate
    (b'{"id": "\\udfff", "text": "ok"}', "invalid_unicode"),
    (b"\xff" + b"x" * 900_000, "invalid_utf8"),  # its dead letter must fit a Kafka record
]


@pytest.fixture(scope="module")
def reviews():
    return load_rotten_tomatoes()[:N_GOOD]


@pytest.fixture(scope="module")
def expected_scores(reviews, model_assets):
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    return {r.id: float(s) for r, s in zip(reviews, scores, strict=True)}


def _produce(bootstrap, topic, reviews):
    """Good reviews with the next malformed record after every 50th (from the 25th);
    returns the malformed records' offsets and reasons."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    offsets, offset = {}, 0
    for i, r in enumerate(reviews):
        producer.produce(topic, key=r.id, value=json.dumps({"id": r.id, "text": r.text, "label": r.label}))
        offset += 1
        if i % 50 == 25:
            value, reason = MALFORMED[i // 50]
            producer.produce(topic, value=value)
            offsets[offset] = reason
            offset += 1
    assert producer.flush(30) == 0
    return offsets


@pytest.mark.parametrize(("mode", "operator"),
                         [("batch", "arrow"), ("streaming", "arrow"), ("batch", "async"),
                          ("batch", "record")])
def test_scores_every_review_once_and_dead_letters_bad_records(
    mode, operator, kafka_bootstrap, topic, model_assets, reviews, expected_scores
):
    t_in, t_out, t_dlq = topic("in"), topic("out"), topic("dlq")
    create_topics(kafka_bootstrap, [t_in, t_out, t_dlq])
    bad_offsets = _produce(kafka_bootstrap, t_in, reviews)
    cfg = PipelineOptions.from_args([
        "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--dlq-topic", t_dlq, "--mode", mode, "--model-dir", str(model_assets.directory),
        "--checkpoint-interval-ms", "1000", "--operator", operator,
    ])
    result = build_pipeline(make_environment(cfg), cfg)
    try:
        if mode == "batch":
            result.wait()
        out = read_topic(kafka_bootstrap, t_out, min_count=N_GOOD, timeout_s=240, quiet_s=4)
        dlq = read_topic(kafka_bootstrap, t_dlq, min_count=len(MALFORMED), timeout_s=60, quiet_s=4)
    finally:
        if mode == "streaming":
            result.get_job_client().cancel().result()

    docs = [json.loads(m.value()) for m in out]
    ids = [d["id"] for d in docs]
    assert len(ids) == N_GOOD and set(ids) == set(expected_scores)
    for d in docs:
        assert d["model_sha256"] == model_assets.sha256
        assert d["score"] == pytest.approx(expected_scores[d["id"]], abs=1e-5)
        assert d["label"] == ("fresh" if expected_scores[d["id"]] >= 0.5 else "rotten")
        assert "embedding" not in d
    assert {m.key().decode() for m in out} == set(expected_scores)

    letters = [json.loads(m.value()) for m in dlq]
    assert {d["offset"]: d["reason"] for d in letters} == bad_offsets
    assert all(d["topic"] == t_in and d["partition"] == 0 and d["id"] is None for d in letters)
    assert [d["value_truncated"] for d in letters].count(True) == 1

    # lineage: every output and dead letter names its input record in the aisp.source header
    good_offsets = sorted(set(range(N_GOOD + len(bad_offsets))) - set(bad_offsets))
    assert sorted(_source_offset(m, t_in) for m in out) == good_offsets
    assert [_source_offset(m, t_in) for m in dlq] == [d["offset"] for d in letters]


def test_the_record_operator_at_parallelism_2_scores_both_partitions_with_concurrent_runs(
    kafka_bootstrap, topic, model_assets, reviews, expected_scores
):
    """``--operator record --parallelism 2`` (thread mode): the two subtasks share one model that runs
    their calls side by side (the derived ``--pipeline-depth 2``, one intra-op thread each on the
    2-core machines here); every review of both partitions is scored once, with the scores of one
    call at a time."""
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in], partitions=2)
    create_topics(kafka_bootstrap, [t_out])
    few = reviews[:120]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i, r in enumerate(few):
        producer.produce(t_in, value=json.dumps({"id": r.id, "text": r.text}).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    cfg = PipelineOptions.from_args([
        "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--mode", "streaming", "--model-dir", str(model_assets.directory), "--operator", "record",
        "--parallelism", "2", "--checkpoint-interval-ms", "1000",
    ])
    assert cfg.concurrent_runs == 2
    result = build_pipeline(make_environment(cfg), cfg)
    try:
        out = read_topic(kafka_bootstrap, t_out, min_count=len(few), timeout_s=240, quiet_s=4)
    finally:
        result.get_job_client().cancel().result()
    docs = [json.loads(m.value()) for m in out]
    assert sorted(d["id"] for d in docs) == sorted(r.id for r in few)
    for d in docs:
        assert d["score"] == pytest.approx(expected_scores[d["id"]], abs=1e-5)
    partitions = {dict(m.headers())["aisp.source"].decode().split("/")[1] for m in out}
    assert partitions == {"0", "1"}


def _source_offset(message, input_topic):
    headers = dict(message.headers())
    assert set(headers) == {"aisp.source", "aisp.job"}
    assert headers["aisp.job"].decode().startswith(f"aisp-{input_topic}-")  # the default job name
    topic, partition, offset = headers["aisp.source"].decode().split("/")
    assert (topic, partition) == (input_topic, "0")
    return int(offset)


def test_embedding_flag_adds_the_384_float_embedding(
    kafka_bootstrap, topic, model_assets, reviews
):
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in, t_out])
    few = reviews[:20]
    _produce(kafka_bootstrap, t_in, few)
    cfg = PipelineOptions.from_args([
        "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--mode", "batch", "--model-dir", str(model_assets.directory), "--with-embedding",
    ])
    build_pipeline(make_environment(cfg), cfg).wait()
    out = read_topic(kafka_bootstrap, t_out, min_count=20)
    docs = {d["id"]: d for d in (json.loads(m.value()) for m in out)}
    _, embeddings = OnnxSentimentModel(model_assets).predict([r.text for r in few])
    for r, e in zip(few, embeddings, strict=True):
        got = np.asarray(docs[r.id]["embedding"], dtype=np.float32)
        assert got.shape == (384,)
        np.testing.assert_allclose(got, e, atol=1e-5)
        assert np.linalg.norm(got) == pytest.approx(1.0, abs=1e-4)


def _committed_offset(bootstrap, group, topic):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()


def test_streaming_restart_resumes_from_the_groups_committed_offsets(
    kafka_bootstrap, topic, model_assets, reviews
):
    t_in, t_out = topic("in"), topic("out")
    group = f"g-{t_in}"
    create_topics(kafka_bootstrap, [t_in, t_out])
    first, second = reviews[:100], reviews[100:150]
    _produce(kafka_bootstrap, t_in, first)  # 100 reviews + 2 malformed: offsets 0..101
    cfg = PipelineOptions.from_args([
        "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--group-id", group, "--model-dir", str(model_assets.directory), "--checkpoint-interval-ms", "500",
    ])
    assert cfg.mode == "streaming" and cfg.startup_mode is None  # group-offsets in streaming

    run = build_pipeline(make_environment(cfg), cfg)
    try:
        assert len(read_topic(kafka_bootstrap, t_out, min_count=100, timeout_s=120, quiet_s=2)) == 100
        deadline = time.monotonic() + 60
        while _committed_offset(kafka_bootstrap, group, t_in) != 102 and time.monotonic() < deadline:
            time.sleep(0.5)  # offsets are committed when a checkpoint completes
        assert _committed_offset(kafka_bootstrap, group, t_in) == 102
    finally:
        run.get_job_client().cancel().result()

    _produce(kafka_bootstrap, t_in, second)
    run = build_pipeline(make_environment(cfg), cfg)
    try:
        out = read_topic(kafka_bootstrap, t_out, min_count=150, timeout_s=120, quiet_s=4)
    finally:
        run.get_job_client().cancel().result()
    ids = [json.loads(m.value())["id"] for m in out]
    assert sorted(ids) == sorted(r.id for r in first + second)


class PoisonedSentimentHandler(SentimentHandler):
    """The real model, but any model batch holding a text with "POISON" raises (a poison
    record), on the per-record path and on the batch path (which keeps the texts beside
    the tokens to know)."""

    def run_inference(self, batch, model):
        if any("POISON" in text for text in batch):
            raise RuntimeError("poisoned input")
        return super().run_inference(batch, model)

    def prepare_batch(self, batch, model):
        prepared = super().prepare_batch(batch, model)
        return Prepared((list(batch), prepared.payload), prepared.lengths)

    def run_prepared(self, prepared, rows, model):
        texts, tokens = prepared.payload
        if any("POISON" in texts[i] for i in rows):
            raise RuntimeError("poisoned input")
        return super().run_prepared(Prepared(tokens, prepared.lengths), rows, model)


def test_a_record_that_fails_inference_goes_to_the_dlq_and_the_rest_score(
    kafka_bootstrap, topic, model_assets, reviews, expected_scores
):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    t_in, t_out, t_dlq = topic("in"), topic("out"), topic("dlq")
    create_topics(kafka_bootstrap, [t_in, t_out, t_dlq])
    good = reviews[:60]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i, r in enumerate(good):
        producer.produce(t_in, value=json.dumps({"id": r.id, "text": r.text}))
        if i == 29:
            producer.produce(t_in, value=json.dumps({"id": "poison", "text": "POISON pill"}))
    assert producer.flush(30) == 0
    cfg = PipelineOptions.from_args([
        "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--dlq-topic", t_dlq, "--mode", "batch", "--model-dir", str(model_assets.directory),
        "--max-wait-ms", "1000",  # one batch of all 61 records: the poison must be bisected out
    ])
    build_pipeline(make_environment(cfg), cfg,
                             handler=PoisonedSentimentHandler(model_assets)).wait()
    out = {json.loads(m.value())["id"]: json.loads(m.value())
           for m in read_topic(kafka_bootstrap, t_out, min_count=60)}
    assert set(out) == {r.id for r in good}
    for r in good:
        assert out[r.id]["score"] == pytest.approx(expected_scores[r.id], abs=1e-5)
    (letter,) = [json.loads(m.value()) for m in read_topic(kafka_bootstrap, t_dlq, min_count=1)]
    assert letter["reason"] == "inference_error" and "poisoned input" in letter["detail"]
    assert (letter["id"], letter["topic"], letter["partition"], letter["offset"]) == ("poison", t_in, 0, 30)


def test_a_second_model_runs_in_the_job_by_options_alone(kafka_bootstrap, topic, reviews):
    """paraphrase-MiniLM-L3-v2 (another package, another ONNX signature: token states only)
    wired in by flags: the job writes its mean-pooled, normalised embeddings."""
    from pyflink_aisp.inference.handlers import OnnxEncoderHandler, Pooling
    from pyflink_aisp.models import locate_paraphrase_minilm
    from pyflink_aisp.models._paraphrase_minilm import PARAPHRASE_TOKEN_OUTPUT

    second = locate_paraphrase_minilm()
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in, t_out])
    few = reviews[:40]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for r in few:
        producer.produce(t_in, value=json.dumps({"id": r.id, "text": r.text}))
    assert producer.flush(30) == 0
    cfg = PipelineOptions.from_args([
        "--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--mode", "batch", "--encoder-onnx", str(second.onnx_path), "--encoder-tokenizer",
        str(second.tokenizer_path), "--encoder-output", PARAPHRASE_TOKEN_OUTPUT, "--encoder-pooling", "mean",
        "--encoder-normalize",
    ])
    build_pipeline(make_environment(cfg), cfg).wait()
    out = read_topic(kafka_bootstrap, t_out, min_count=40)
    docs = {d["id"]: d for d in (json.loads(m.value()) for m in out)}
    handler = OnnxEncoderHandler(model_path=second.onnx_path, tokenizer_path=second.tokenizer_path,
                                 output=PARAPHRASE_TOKEN_OUTPUT, pooling=Pooling.MEAN, normalize=True)
    expected = handler.run_inference([r.text for r in few], handler.load_model())
    assert set(docs) == {r.id for r in few}
    for r, e in zip(few, expected, strict=True):
        doc = docs[r.id]
        assert set(doc) == {"id", "embedding", "model_sha256"}
        assert doc["model_sha256"] == handler.model_version()
        np.testing.assert_allclose(np.asarray(doc["embedding"], dtype=np.float32), e, atol=1e-5)
