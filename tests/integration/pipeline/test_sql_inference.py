"""``sentiment(text)`` registered in Flink SQL, over a real Kafka topic, in STREAMING and BATCH mode.

Both functions (the async one and the pandas one) are registered exactly as a
user would (``CREATE TEMPORARY SYSTEM FUNCTION ... LANGUAGE PYTHON``), get the
model directory, batching and a stats directory through global job
parameters (:func:`configure_table_env`), and must give the direct ONNX
Runtime scores for the same texts, tagged with the model's sha256. The topic
is filled before the job starts, so records arrive faster than the model
scores them: the batch-size statistics each worker writes must show batches
of more than one record.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics
from pyflink_aisp.pipeline import InferenceOptions
from pyflink_aisp.pipeline.sql import configure_table_env

pytestmark = pytest.mark.integration

N_REVIEWS = 300
EXTRA: dict[str, str | None] = {"null-text": None, "empty-text": "", "surrogate": "bad \ud800 text"}
MAX_BATCH = 32
FUNCTIONS = {
    "sentiment": "pyflink_aisp.pipeline.sql.sentiment",
    "sentiment_pandas": "pyflink_aisp.pipeline.sql.sentiment_pandas",
}


@pytest.fixture(scope="module")
def records() -> dict[str, str | None]:
    out: dict[str, str | None] = {r.id: r.text for r in load_rotten_tomatoes()[:N_REVIEWS]}
    out.update(EXTRA)
    return out


@pytest.fixture(scope="module")
def direct_scores(records, model_assets) -> dict[str, float]:
    """The model's scores for the same texts, outside Flink (one ONNX Runtime session)."""
    keys = [k for k, v in records.items() if isinstance(v, str) and k != "surrogate"]
    scores, _ = OnnxSentimentModel(model_assets).predict([records[k] for k in keys])
    return {k: float(s) for k, s in zip(keys, scores, strict=True)}


def _produce(bootstrap: str, topic: str, records: dict[str, str | None]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, text in records.items():
        # ensure_ascii keeps the lone surrogate as a \ud800 escape (valid JSON, invalid UTF-16 text)
        producer.produce(topic, key=key, value=json.dumps({"id": key, "text": text}))
    assert producer.flush(30) == 0


def _table_env(mode: str, config: InferenceOptions):
    from pyflink.table import EnvironmentSettings, TableEnvironment

    from pyflink_aisp.jars import pipeline_jars_value

    t_env = TableEnvironment.create(
        EnvironmentSettings.in_batch_mode() if mode == "batch" else EnvironmentSettings.in_streaming_mode()
    )
    settings = t_env.get_config()
    settings.set("pipeline.jars", pipeline_jars_value())
    settings.set("python.executable", sys.executable)
    settings.set("python.client.executable", sys.executable)
    settings.set("parallelism.default", "1")
    configure_table_env(t_env, config)
    return t_env


def _source_ddl(topic: str, bootstrap: str) -> str:
    return f"""
        CREATE TEMPORARY TABLE reviews (`id` STRING, `text` STRING) WITH (
          'connector' = 'kafka',
          'topic' = '{topic}',
          'properties.bootstrap.servers' = '{bootstrap}',
          'properties.group.id' = 'sentiment-{topic}',
          'scan.startup.mode' = 'earliest-offset',
          'scan.bounded.mode' = 'latest-offset',
          'format' = 'json'
        )"""


def _read_stats(directory: Path, records: int, timeout_s: float = 30.0) -> list[dict]:
    """The workers' stats files, once they account for ``records`` records (the
    files are rewritten every 0.1 s; the last write may land after the job ends)."""
    deadline = time.monotonic() + timeout_s
    stats: list[dict] = []
    while time.monotonic() < deadline:
        stats = [json.loads(p.read_text()) for p in directory.glob("aisp-stats-*.json")]
        if sum(s["records"] for s in stats) >= records:
            break
        time.sleep(0.2)
    return stats


@pytest.mark.parametrize("function", list(FUNCTIONS))
@pytest.mark.parametrize("mode", ["streaming", "batch"])
def test_sql_sentiment_over_kafka_equals_the_direct_model(
    mode, function, records, direct_scores, model_assets, kafka_bootstrap, topic, tmp_path
) -> None:
    t_in = topic("in")
    create_topics(kafka_bootstrap, [t_in])
    _produce(kafka_bootstrap, t_in, records)
    stats_dir = tmp_path / "stats"
    config = InferenceOptions(
        model_dir=model_assets.directory, max_batch_size=MAX_BATCH, intra_op_threads=1, stats_dir=stats_dir,
    )
    t_env = _table_env(mode, config)
    t_env.execute_sql(_source_ddl(t_in, kafka_bootstrap))
    t_env.execute_sql(
        f"CREATE TEMPORARY SYSTEM FUNCTION {function} AS '{FUNCTIONS[function]}' LANGUAGE PYTHON"
    )
    started = time.monotonic()
    result = t_env.execute_sql(
        f"SELECT id, s.score, s.label, s.model_sha256, s.reason "
        f"FROM (SELECT id, {function}(`text`) AS s FROM reviews)"
    )
    with result.collect() as rows:
        got = {row[0]: tuple(row[1:]) for row in rows}
    elapsed = time.monotonic() - started

    assert set(got) == set(records)
    for key, expected in direct_scores.items():
        score, label, sha, reason = got[key]
        assert reason is None, (key, reason)
        assert score == pytest.approx(expected, abs=1e-5), key
        assert label == ("fresh" if score >= 0.5 else "rotten"), key
        assert sha == model_assets.sha256, key
    assert got["null-text"] == (None, None, None, None)
    # A text that is not valid Unicode either scores (decoded with a replacement) or is a
    # per-row error; it never fails the job.
    score, _, _, reason = got["surrogate"]
    assert (score is None) != (reason is None)
    assert reason in (None, "inference_error")

    scored = len(records) - 1  # all but the null text reach the model
    stats = _read_stats(stats_dir, scored)
    assert stats, f"no stats file in {stats_dir}"
    total = sum(s["records"] for s in stats)
    largest = max(s["max_batch_size"] for s in stats)
    batches = sum(s["batches"] for s in stats)
    print(
        f"\n{mode}/{function}: {len(got)} rows in {elapsed:.1f} s; {total} records in {batches} batches, "
        f"largest {largest}; sizes {[s['sizes'] for s in stats]}; surrogate row {got['surrogate']}"
    )
    assert total == scored
    assert all(s["model_sha256"] == model_assets.sha256 for s in stats)
    assert 1 < largest <= MAX_BATCH  # batches formed under load, capped by the config
    if function == "sentiment":  # the default max-concurrent-operations (10) would cap it at 10
        assert largest > 10
    assert batches < total


SQL_JOB = Path(__file__).resolve().parents[3] / "jobs" / "sql" / "review_sentiment.sql"


def _sql_statements(text: str) -> list[str]:
    """The statements of a SQL client script: ``--`` comment lines dropped, split at
    a ``;`` that ends a line (a ``;`` inside a line, as in a topic list, stays)."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in re.split(r";[ \t]*(?:\n|$)", "\n".join(lines)) if s.strip()]


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, f"{old!r} not in {SQL_JOB.name}"
    return text.replace(old, new)


def test_sql_job_file_scores_to_kafka_and_dead_letters_the_rest(
    records, direct_scores, model_assets, kafka_bootstrap, topic
) -> None:
    """jobs/sql/review_sentiment.sql, statement by statement, in BATCH mode over a bounded topic."""
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    from pyflink_aisp.jars import pipeline_jars_value
    from pyflink_aisp.kafka import read_topic

    t_in, t_out, t_dlq = topic("in"), topic("out"), topic("dlq")
    create_topics(kafka_bootstrap, [t_in, t_out, t_dlq])
    good = dict(list(direct_scores.items())[:60])
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for key in good:
        producer.produce(t_in, key=key, value=json.dumps({"id": key, "text": records[key]}))
    producer.produce(t_in, key="null-text", value=json.dumps({"id": "null-text", "text": None}))
    producer.produce(t_in, key="no-text", value=json.dumps({"id": "no-text", "label": "fresh"}))
    producer.produce(t_in, key="not-json", value=b'{"id": "not-json", "text": ')
    assert producer.flush(30) == 0

    script = SQL_JOB.read_text(encoding="utf-8")
    script = _replace(script, "'execution.runtime-mode' = 'streaming'", "'execution.runtime-mode' = 'batch'")
    script = _replace(
        script,
        "'scan.startup.mode' = 'group-offsets',",
        "'scan.startup.mode' = 'earliest-offset',\n  'scan.bounded.mode' = 'latest-offset',",
    )
    script = _replace(script, "'scores-sql' ELSE 'scores-sql.dlq'", f"'{t_out}' ELSE '{t_dlq}'")
    script = _replace(script, "'topic' = 'scores-sql;scores-sql.dlq'", f"'topic' = '{t_out};{t_dlq}'")
    script = _replace(script, "'topic' = 'reviews'", f"'topic' = '{t_in}'")
    script = _replace(script, "127.0.0.1:9092", kafka_bootstrap)
    script = _replace(script, "'aisp-sql-review-sentiment'", f"'{t_in}'")

    statements = _sql_statements(script)
    # SET is the SQL client's; a TableEnvironment takes the same keys as its configuration.
    sets = [re.fullmatch(r"SET\s+'([^']+)'\s*=\s*'([^']*)'", s, re.IGNORECASE) for s in statements]
    conf = Configuration()
    for match in filter(None, sets):
        conf.set_string(match[1], match[2])
    conf.set_string("pipeline.jars", pipeline_jars_value())
    conf.set_string("python.executable", sys.executable)
    conf.set_string("python.client.executable", sys.executable)
    t_env = TableEnvironment.create(EnvironmentSettings.new_instance().with_configuration(conf).build())
    *setup, insert = [s for s, match in zip(statements, sets, strict=True) if match is None]
    for statement in setup:
        t_env.execute_sql(statement)
    plan = t_env.explain_sql(insert)
    optimized = plan.split("== Optimized Execution Plan ==")[-1]
    assert optimized.count("sentiment(") == 1, optimized  # one Python call per row
    t_env.execute_sql(insert).wait()

    scores = {m.key().decode(): json.loads(m.value()) for m in read_topic(kafka_bootstrap, t_out)}
    assert set(scores) == set(good)
    for key, doc in scores.items():
        assert doc["score"] == pytest.approx(good[key], abs=1e-5)
        assert doc["label"] == ("fresh" if doc["score"] >= 0.5 else "rotten")
        assert doc["model_sha256"] == model_assets.sha256
    dead = {json.loads(m.value())["id"]: json.loads(m.value()) for m in read_topic(kafka_bootstrap, t_dlq)}
    assert set(dead) == {"null-text", "no-text"}  # not-json is skipped by the JSON format
    for doc in dead.values():
        assert doc["reason"] == "missing_text" and doc["topic"] == t_in and doc["offset"] >= len(good)
