"""``tokenize(text)`` registered in Flink SQL, over a real Kafka topic, in STREAMING and BATCH mode.

The function is registered exactly as a user would
(``CREATE TEMPORARY SYSTEM FUNCTION ... LANGUAGE PYTHON``) and runs in PyFlink's
Python worker as a pandas (Arrow-batched) UDF; its ids must equal the direct
:class:`ArrowTokenizer` output. The BATCH run also sets the truncation length
through a global job parameter, the way a job points the function at another
configuration.
"""

from __future__ import annotations

import json
import sys

import pytest
from confluent_kafka import Producer

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics
from pyflink_aisp.tokenize import MAX_LENGTH_PARAM, ArrowTokenizer, TokenizerConfig, default_tokenizer_path

pytestmark = pytest.mark.integration

N_REVIEWS = 300
EXTRA = {"null-text": None, "empty-text": "", "shouting": "WHAT A FILM!!!"}


def _records() -> dict[str, str | None]:
    records: dict[str, str | None] = {r.id: r.text for r in load_rotten_tomatoes()[:N_REVIEWS]}
    records.update(EXTRA)
    return records


def _produce(bootstrap: str, topic: str, records: dict[str, str | None]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, text in records.items():
        producer.produce(topic, key=key, value=json.dumps({"id": key, "text": text}))
    assert producer.flush(30) == 0


def _table_env(mode: str, job_parameters: dict[str, str]):
    from pyflink.table import EnvironmentSettings, TableEnvironment

    from pyflink_aisp.jars import pipeline_jars_value

    batch = mode == "batch"
    t_env = TableEnvironment.create(
        EnvironmentSettings.in_batch_mode() if batch else EnvironmentSettings.in_streaming_mode()
    )
    config = t_env.get_config()
    config.set("pipeline.jars", pipeline_jars_value())
    config.set("python.executable", sys.executable)
    config.set("python.client.executable", sys.executable)
    config.set("parallelism.default", "1")
    config.set("python.fn-execution.bundle.time", "100")
    if job_parameters:
        config.set("pipeline.global-job-parameters", ",".join(f"{k}:{v}" for k, v in job_parameters.items()))
    return t_env


def _source_ddl(topic: str, bootstrap: str) -> str:
    return f"""
        CREATE TEMPORARY TABLE reviews (`id` STRING, `text` STRING) WITH (
          'connector' = 'kafka',
          'topic' = '{topic}',
          'properties.bootstrap.servers' = '{bootstrap}',
          'properties.group.id' = 'tokenize-{topic}',
          'scan.startup.mode' = 'earliest-offset',
          'scan.bounded.mode' = 'latest-offset',
          'format' = 'json'
        )"""


@pytest.mark.parametrize(("mode", "max_length"), [("streaming", None), ("batch", 16)])
def test_sql_tokenize_over_kafka_equals_the_direct_tokenizer(
    mode, max_length, kafka_bootstrap, topic
) -> None:
    t_in = topic("in")
    create_topics(kafka_bootstrap, [t_in])
    records = _records()
    _produce(kafka_bootstrap, t_in, records)
    params = {MAX_LENGTH_PARAM: str(max_length)} if max_length else {}
    t_env = _table_env(mode, params)
    t_env.execute_sql(_source_ddl(t_in, kafka_bootstrap))
    t_env.execute_sql(
        "CREATE TEMPORARY SYSTEM FUNCTION tokenize AS 'pyflink_aisp.tokenize.sql.tokenize' LANGUAGE PYTHON"
    )
    result = t_env.execute_sql("SELECT id, tokenize(`text`) AS input_ids FROM reviews")
    with result.collect() as rows:
        got = {row[0]: row[1] for row in rows}

    direct = ArrowTokenizer.from_file(default_tokenizer_path(), TokenizerConfig(max_length=max_length or 128))
    keys = list(records)
    expected = direct.encode([records[k] for k in keys]).input_ids.to_pylist()
    assert set(got) == set(keys)
    for key, ids in zip(keys, expected, strict=True):
        assert (None if got[key] is None else list(got[key])) == ids, key
    assert got["null-text"] is None
    assert list(got["empty-text"]) == [101, 102]
    if max_length:  # the job parameter reached the Python worker
        assert max(len(v) for v in got.values() if v is not None) == max_length
