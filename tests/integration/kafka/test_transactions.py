"""Transactions that outlive their job (issue 11.7): the brokers' ceiling checked before a job
starts, a killed producer's open transaction listed with Kafka's own tool and aborted by fencing."""

import re

import pytest
from confluent_kafka import Producer

from pyflink_aisp.alignment import read_range, resolve_range, topic_offsets
from pyflink_aisp.cli import main as aisp
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.kafka import (
    abort_transactions,
    broker_transaction_max_timeout_ms,
    check_transaction_timeout,
    create_topics,
    list_transactions,
)
from pyflink_aisp.pipeline import PipelineOptions

pytestmark = pytest.mark.integration


def test_the_brokers_ceiling_is_read_and_a_longer_job_timeout_refused(kafka_bootstrap, topic, model_assets):
    assert broker_transaction_max_timeout_ms(kafka_bootstrap) == 7_200_000  # the local stack's setting
    check_transaction_timeout(kafka_bootstrap, 3_600_000)
    with pytest.raises(ConfigError, match=re.escape("--transaction-timeout-ms 7200001 exceeds the brokers' "
                                                    "transaction.max.timeout.ms 7200000 at ")):
        check_transaction_timeout(kafka_bootstrap, 7_200_001)

    from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

    t_in = topic("in")
    create_topics(kafka_bootstrap, [t_in])
    options = PipelineOptions.from_args(["--bootstrap-servers", kafka_bootstrap, "--input-topic", t_in,
                                         "--output-topic", topic("out"), "--mode", "batch",
                                         "--model-dir", str(model_assets.directory),
                                         "--transaction-timeout-ms", "9000000"])
    ceiling = re.escape("exceeds the brokers' transaction.max.timeout.ms 7200000")
    with pytest.raises(ConfigError, match=ceiling):
        build_pipeline(make_environment(options), options)


def test_an_open_transaction_is_listed_and_aborted_so_readers_move_on(kafka_bootstrap, topic, capsys):
    t = topic("out")
    job = f"job-{t}"
    create_topics(kafka_bootstrap, [t])
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{job}-scores-0-3"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(t, value=str(i).encode())
    producer.flush(30)  # then the job "dies": its transaction stays open
    del producer

    assert topic_offsets(kafka_bootstrap, t).latest == {0: 0}  # the open transaction holds the LSO
    (info,) = list_transactions(kafka_bootstrap, job)
    assert (info.transactional_id, info.state) == (f"{job}-scores-0-3", "Ongoing")
    assert aisp(["transactions", "list", "--job-name", job, "--bootstrap-servers", kafka_bootstrap]) == 0
    assert f"1 transactions with prefix '{job}', 1 open" in capsys.readouterr().out

    # without a cluster to ask whether the job is live, abort is refused unless forced
    no_cluster = ["--flink-rest-url", "http://127.0.0.1:1"]
    assert aisp(["transactions", "abort", "--job-name", job, "--bootstrap-servers", kafka_bootstrap,
                 *no_cluster]) == 1
    assert f"cannot tell whether job '{job}' is live" in capsys.readouterr().err
    assert aisp(["transactions", "abort", "--job-name", job, "--bootstrap-servers", kafka_bootstrap,
                 "--force"]) == 0
    assert f"aborted 1 open transactions: {job}-scores-0-3" in capsys.readouterr().out
    assert topic_offsets(kafka_bootstrap, t).latest == {0: 6}  # 5 aborted records + the abort marker
    assert read_range(kafka_bootstrap, resolve_range(kafka_bootstrap, t, "earliest", "latest")) == []
    assert [r.state for r in list_transactions(kafka_bootstrap, job)] == ["Empty"]  # fenced: a new epoch
    assert abort_transactions(kafka_bootstrap, job) == []  # nothing open any more
    with pytest.raises(ConfigError, match="prefix is needed"):
        list_transactions(kafka_bootstrap, "")
