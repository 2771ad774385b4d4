"""Issue 9: bad inputs and operator mistakes, each as the small input that broke the job,
run through the main job on a real broker and a real PyFlink MiniCluster."""

import base64
import json
import sys

import cloudpickle
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel, SentimentHandler
from pyflink_aisp.kafka import create_topics, read_topic
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

pytestmark = pytest.mark.integration

HUGE_ID = "中" * 200_000  # 600 KB as a key and 600 KB again in the value (UTF-8): 1.2 MB in all
LONG_TEXT_BYTES = 900_000


@pytest.fixture(scope="module")
def reviews():
    return load_rotten_tomatoes()[:40]


def _long_text():
    """A 900 KB review made of real ones (the model sees its first 128 tokens)."""
    texts = [r.text for r in load_rotten_tomatoes()[100:]]
    out, size = [], 0
    for text in texts * 10:
        out.append(text)
        size += len(text) + 1
        if size >= LONG_TEXT_BYTES:
            break
    return " ".join(out)


def _produce(bootstrap, topic, values):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "message.max.bytes": 1_000_000})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0


def _options(bootstrap, t_in, t_out, t_dlq, model_assets, *extra):
    return PipelineOptions.from_args([
        "--bootstrap-servers", bootstrap, "--input-topic", t_in, "--output-topic", t_out,
        "--dlq-topic", t_dlq, "--model-dir", str(model_assets.directory), *extra])


@pytest.mark.parametrize("operator", ["arrow", "async"])
def test_oversized_outputs_and_json_edge_cases_are_dead_lettered_and_the_rest_scored(
    operator, kafka_bootstrap, topic, model_assets, reviews
):
    """9.1 (an output over max.request.size), 9.3 (a 900 KB text), 9.5 (BOM, NaN, repeated names)."""
    t_in, t_out, t_dlq = topic("in"), topic("out"), topic("dlq")
    create_topics(kafka_bootstrap, [t_in])
    good = [json.dumps({"id": r.id, "text": r.text}).encode() for r in reviews]
    long_text = _long_text()
    special = [
        (json.dumps({"id": HUGE_ID, "text": "ok"}, ensure_ascii=False).encode(), "oversized_output"),
        (b"\xef\xbb\xbf" + json.dumps({"id": "bom", "text": "A gripping, beautifully acted film."}).encode(),
         None),
        (b'{"id": "nan", "text": "fine", "weight": NaN}', "invalid_json"),
        (b'{"id": "dup", "text": "first", "text": "second"}', "duplicate_key"),
        (json.dumps({"id": "long", "text": long_text}).encode(), None),
    ]
    assert len(special[0][0]) == 600_000 + len('{"id": "", "text": "ok"}')
    _produce(kafka_bootstrap, t_in, good[:20] + [v for v, _ in special] + good[20:])
    options = _options(kafka_bootstrap, t_in, t_out, t_dlq, model_assets, "--mode", "batch",
                       "--operator", operator)
    build_pipeline(make_environment(options), options).wait()

    out = {m.key().decode(): json.loads(m.value()) for m in read_topic(kafka_bootstrap, t_out, min_count=42)}
    texts = {r.id: r.text for r in reviews}
    texts |= {"bom": "A gripping, beautifully acted film.", "long": long_text}
    assert set(out) == set(texts)
    scores, _ = OnnxSentimentModel(model_assets).predict(list(texts.values()))
    for (rid, _), score in zip(texts.items(), scores, strict=True):
        assert out[rid]["score"] == pytest.approx(float(score), abs=1e-5), rid

    dlq = read_topic(kafka_bootstrap, t_dlq, min_count=3)
    letters = {json.loads(m.value())["reason"]: (m.key().decode(), json.loads(m.value())) for m in dlq}
    assert set(letters) == {"oversized_output", "invalid_json", "duplicate_key"}
    key, huge = letters["oversized_output"]
    assert key == f"{t_in}/0/20"  # the id is too long to be a key: the coordinates are
    assert (huge["topic"], huge["partition"], huge["offset"]) == (t_in, 0, 20)
    assert huge["id"] == HUGE_ID[:1024]
    assert huge["detail"].startswith("OversizedOutputError: output of 1200")
    assert "over the sink's limit of 1047552 bytes" in huge["detail"]
    kept = base64.b64decode(huge["value_base64"])
    assert kept == special[0][0][:len(kept)]
    assert letters["invalid_json"][1]["detail"] == "NaN is not a JSON number (RFC 8259 section 6)"
    assert letters["duplicate_key"][1]["offset"] == 23
    assert all(len(m.value()) + len(m.key()) <= 1_047_552 for m in dlq)


def test_the_topics_max_message_bytes_bounds_outputs_too(kafka_bootstrap, topic, model_assets, reviews):
    """9.1: an output topic with a small max.message.bytes (100 kB): an output of 120 kB becomes
    an oversized_output dead letter instead of failing the job; the others are written."""
    t_in, t_out, t_dlq = topic("in"), topic("out"), topic("dlq")
    create_topics(kafka_bootstrap, [t_in])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1, config={"max.message.bytes": "100000"})
                                       for t in (t_out, t_dlq)]).values():
        future.result(30)
    big_id = "x" * 60_000
    good = [json.dumps({"id": r.id, "text": r.text}).encode() for r in reviews[:10]]
    big = json.dumps({"id": big_id, "text": "fine"}).encode()
    _produce(kafka_bootstrap, t_in, [*good[:5], big, *good[5:]])
    options = _options(kafka_bootstrap, t_in, t_out, t_dlq, model_assets, "--mode", "batch")
    build_pipeline(make_environment(options), options).wait()
    assert {m.key().decode() for m in read_topic(kafka_bootstrap, t_out, min_count=10)} == {
        r.id for r in reviews[:10]}
    (letter,) = read_topic(kafka_bootstrap, t_dlq, min_count=1)
    doc = json.loads(letter.value())
    assert (doc["reason"], doc["offset"], doc["id"]) == ("oversized_output", 5, big_id[:1024])
    assert "over the sink's limit of 98976 bytes" in doc["detail"]  # 100000 - 1024 record overhead
    assert len(letter.value()) + len(letter.key()) <= 98_976


class BrokenModelHandler(SentimentHandler):
    """The real model after a sticky device error: every model call raises."""

    def run_inference(self, batch, model):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def run_prepared(self, prepared, rows, model):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("operator", ["arrow", "async"])
def test_a_model_that_fails_on_everything_fails_the_job_after_bounded_restarts(
    operator, kafka_bootstrap, topic, model_assets, reviews
):
    """9.8 + 9.1: the circuit breaker fails the job instead of dead-lettering the stream; the
    bounded restart strategy (--restart-attempts 1) ends it after one restart instead of replaying forever.

    ``--failure-window 10`` makes ``min_records`` 1, so the first failure trips the breaker and
    nothing can be dead-lettered. (With a window of 20, ``min_records`` is 2 and the first failure
    of each attempt is dead-lettered by design, then committed if a checkpoint completes before the
    second: a landing CI run saw exactly that, 1 dead letter, so an exact ``[]`` needs window < 20.)"""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    t_in, t_out, t_dlq = topic("in"), topic("out"), topic("dlq")
    create_topics(kafka_bootstrap, [t_in])
    _produce(kafka_bootstrap, t_in, [json.dumps({"id": r.id, "text": r.text}).encode() for r in reviews])
    options = _options(kafka_bootstrap, t_in, t_out, t_dlq, model_assets, "--operator", operator,
                       "--checkpoint-interval-ms", "1000", "--failure-window", "10",
                       "--restart-attempts", "1", "--restart-delay-s", "1", "--max-batch-size", "4")
    result = build_pipeline(make_environment(options), options, handler=BrokenModelHandler(model_assets))
    with pytest.raises(Exception) as failure:
        result.wait()  # streaming: returns only because the job failed for good
    assert "CircuitOpenError" in str(failure.value)
    assert "inference failure rate 1.000" in str(failure.value)
    assert "min_records 1)" in str(failure.value)
    assert "CUDA error: an illegal memory access" in str(failure.value)
    assert read_topic(kafka_bootstrap, t_out, timeout_s=3) == []
    assert read_topic(kafka_bootstrap, t_dlq, timeout_s=3) == []  # nothing dead-lettered and committed


@pytest.mark.parametrize("operator", ["arrow", "async"])
def test_a_sink_topic_too_small_for_a_dead_letter_is_refused_before_the_job_starts(
    operator, kafka_bootstrap, topic, model_assets
):
    """A DLQ topic with max.message.bytes 12000 cannot hold every dead letter (a 1,024-emoji id
    alone is 12 KiB escaped): one line naming the topics and the fix, for both operators."""
    from pyflink_aisp.errors import ConfigError

    t_in, t_out, t_dlq = topic("in"), topic("out"), topic("dlq")
    create_topics(kafka_bootstrap, [t_in, t_out])
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(t_dlq, 1, 1, config={"max.message.bytes": "12000"})])[t_dlq].result(30)
    options = _options(kafka_bootstrap, t_in, t_out, t_dlq, model_assets, "--mode", "batch",
                       "--operator", operator)
    with pytest.raises(ConfigError) as refused:
        build_pipeline(make_environment(options), options)
    assert str(refused.value) == (
        f"the sinks can write records of at most 10976 bytes (key + value; max.message.bytes of {t_out} / "
        f"{t_dlq} and --max-request-size, less 1 KiB), below the 32768 a dead letter may need: raise the "
        "topics' max.message.bytes to at least 33792")
