"""A topic of another shape ({"review_id", "body", "lang"}) through `flink run`. Issue 25: the batch run
says it dead-lettered everything and why; with --max-dead-letter-rate the job fails with that line.
Issue 21: the field mapping options score it, lang kept."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

pytestmark = pytest.mark.e2e

N = 150
ROOT = Path(__file__).resolve().parents[2]
FIELDS = "no 'text' field; the object's fields: 'body', 'lang', 'review_id'"


def _foreign_topic(stack, name: str, n: int = N) -> str:
    bootstrap = str(stack.status().bootstrap_servers)
    create_topics(bootstrap, [name, f"{name}-out", f"{name}-out.dlq"])
    records = [{"review_id": r.id, "body": r.text, "lang": "en"} for r in load_rotten_tomatoes()[:n]]
    assert ingest_records(bootstrap, name, records, progress=False).delivered == n
    return bootstrap


def _run(stack, model_assets, bootstrap: str, topic: str, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap, "--input-topic", topic,
        "--output-topic", f"{topic}-out", "--mode", "batch", "--model-dir", str(model_assets.directory),
        *flags)
    return subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)


def test_a_batch_run_over_a_topic_of_another_shape_says_what_it_dead_lettered_and_why(stack, model_assets):
    bootstrap = _foreign_topic(stack, "foreign-batch")
    proc = _run(stack, model_assets, bootstrap, "foreign-batch")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("review_sentiment: ")]
    (summary,) = [line for line in lines if " finished in " in line]
    assert summary.endswith(f": {N} in, 0 out, {N} dead letters (missing_text {N})"), summary
    (warning,) = [line for line in lines if "warning:" in line]
    assert warning == ("review_sentiment: warning: 100 % of the range was dead-lettered, most as "
                       "missing_text: the job reads the text at --text-field (default /text) of each JSON "
                       "object: point --text-field (and --id-field) at your records' fields, e.g. "
                       "--text-field /body, or check --input-topic")
    letters = [json.loads(m.value()) for m in read_topic(bootstrap, "foreign-batch-out.dlq", min_count=N,
                                                          timeout_s=60)]
    assert len(letters) == N and {(d["reason"], d["detail"]) for d in letters} == {("missing_text", FIELDS)}


def test_with_max_dead_letter_rate_the_job_fails_at_once_with_the_line(stack, model_assets):
    bootstrap = _foreign_topic(stack, "foreign-strict", 600)  # > 0.5 x the watch's 1,000-record window
    proc = _run(stack, model_assets, bootstrap, "foreign-strict", "--max-dead-letter-rate", "0.5")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("review_sentiment: error: ")]
    assert len(errors) == 1, out[-3000:]
    assert " cancelled: 100 % of the last " in errors[0]
    assert " records were dead-lettered, " in errors[0] and f"as missing_text ({FIELDS}): " in errors[0]
    assert errors[0].endswith("(above --max-dead-letter-rate 0.5 of 1000 records)")
    # nothing of the range was committed: the run failed before its one commit at the end
    assert read_topic(bootstrap, "foreign-strict-out.dlq", timeout_s=5) == []


MAPPING = ("--text-field", "/body", "--id-field", "/review_id", "--keep-fields", "/lang")


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_the_same_topic_is_scored_by_options_alone_with_lang_kept(stack, model_assets, mode):
    """Issue 21's first acceptance: {"review_id", "body", "lang"} scored by --text-field, --id-field and
    --keep-fields alone, in both modes through flink run: every review once, its own id, lang kept after
    it, the score the model gives its body."""
    topic = f"foreign-mapped-{mode}"
    bootstrap = _foreign_topic(stack, topic)
    reviews = load_rotten_tomatoes()[:N]
    # the streaming run keeps every field ('*'): lang is the one that is neither the text nor the id
    mapping = MAPPING if mode == "batch" else (*MAPPING[:-1], "*")
    if mode == "batch":
        proc = _run(stack, model_assets, bootstrap, topic, *mapping)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f": {N} in, {N} out, 0 dead letters" in proc.stdout
        job_id = None
    else:
        cmd = stack.flink_run_command(
            str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", bootstrap,
            "--input-topic", topic, "--output-topic", f"{topic}-out",
            "--model-dir", str(model_assets.directory), "--checkpoint-interval-ms", "1000", *mapping)
        cmd.insert(cmd.index("run") + 1, "-d")
        proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        job_id = re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)
    try:
        out = read_topic(bootstrap, f"{topic}-out", min_count=N, timeout_s=180, quiet_s=2)
    finally:
        if job_id is not None:
            subprocess.run([stack.flink_run_command("x")[0], "cancel", job_id], env=stack.flink_env(),
                           capture_output=True, timeout=120)
    docs = [json.loads(m.value()) for m in out]
    assert sorted(d["id"] for d in docs) == sorted(r.id for r in reviews)
    assert all(list(d) == ["id", "lang", "label", "score", "model_sha256"] for d in docs)
    assert {d["lang"] for d in docs} == {"en"}
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    expected = {r.id: float(s) for r, s in zip(reviews, scores, strict=True)}
    assert all(d["score"] == pytest.approx(expected[d["id"]], abs=1e-5) for d in docs)
    assert read_topic(bootstrap, f"{topic}-out.dlq", timeout_s=3) == []


def test_a_topic_of_plain_text_values_is_scored_with_value_format_raw(stack, model_assets):
    """--value-format raw: each value is the review's text (UTF-8, no JSON), scored under its
    topic/partition/offset; a value that is not UTF-8 is an invalid_utf8 dead letter."""
    from confluent_kafka import Producer

    bootstrap = str(stack.status().bootstrap_servers)
    topic = "plain-text"
    create_topics(bootstrap, [topic, f"{topic}-out", f"{topic}-out.dlq"])
    reviews = load_rotten_tomatoes()[:N]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for r in reviews:
        producer.produce(topic, value=r.text.encode("utf-8"))
    producer.produce(topic, value=b"\xff\xfe not utf-8")
    assert producer.flush(60) == 0
    proc = _run(stack, model_assets, bootstrap, topic, "--value-format", "raw")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f": {N + 1} in, {N} out, 1 dead letters (invalid_utf8 1)" in proc.stdout
    docs = {json.loads(m.value())["id"]: json.loads(m.value())
            for m in read_topic(bootstrap, f"{topic}-out", min_count=N, timeout_s=60)}
    assert sorted(docs) == sorted(f"{topic}/0/{offset}" for offset in range(N))
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    for i, score in enumerate(scores):
        assert docs[f"{topic}/0/{i}"]["score"] == pytest.approx(float(score), abs=1e-5)


@pytest.mark.parametrize(("mode", "operator", "value_format"), [("batch", "arrow", "raw"),
                                                                 ("streaming", "async", "json"),
                                                                 ("streaming", "record", "json")])
def test_the_kafka_key_is_the_id_with_id_field_key(stack, model_assets, job_outputs, mode, operator,
                                                    value_format):
    """--id-field key: each output's id (and Kafka key) is its record's key; a record without a key is
    scored under its coordinates; a key that is not UTF-8 is a bad_id dead letter."""
    from confluent_kafka import Producer

    bootstrap = str(stack.status().bootstrap_servers)
    topic = f"keyed-{mode}"
    create_topics(bootstrap, [topic, f"{topic}-out", f"{topic}-out.dlq"], partitions=1)
    reviews = load_rotten_tomatoes()[:N]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for r in reviews:
        value = r.text if value_format == "raw" else json.dumps({"id": "not-this", "text": r.text})
        producer.produce(topic, key=f"key-{r.id}".encode(), value=value.encode("utf-8"))
    keyless = "no key here" if value_format == "raw" else json.dumps({"text": "no key here"})
    producer.produce(topic, value=keyless.encode())
    producer.produce(topic, key=b"\xff\xfe", value=keyless.encode())
    assert producer.flush(60) == 0
    stdout, read = job_outputs(stack, mode, (
        "--bootstrap-servers", bootstrap, "--input-topic", topic, "--output-topic", f"{topic}-out",
        "--model-dir", str(model_assets.directory), "--value-format", value_format, "--id-field", "key",
        "--operator", operator, "--checkpoint-interval-ms", "1000"),
        {f"{topic}-out": N + 1, f"{topic}-out.dlq": 1})
    if mode == "batch":
        assert f": {N + 2} in, {N + 1} out, 1 dead letters (bad_id 1)" in stdout
    docs = {json.loads(m.value())["id"]: json.loads(m.value()) for m in read[f"{topic}-out"]}
    assert sorted(docs) == sorted([f"key-{r.id}" for r in reviews] + [f"{topic}/0/{N}"])
    assert all(m.key().decode() == json.loads(m.value())["id"] for m in read[f"{topic}-out"])
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    assert all(docs[f"key-{r.id}"]["score"] == pytest.approx(float(s), abs=1e-5)
               for r, s in zip(reviews, scores, strict=True))
    (letter,) = [json.loads(m.value()) for m in read[f"{topic}-out.dlq"]]
    assert letter["reason"] == "bad_id" and letter["detail"].startswith("the Kafka key is not UTF-8")
