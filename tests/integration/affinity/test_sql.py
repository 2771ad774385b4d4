"""The SQL functions with ``aisp.gpu-affinity``: each parallel instance takes, applies and releases a lease.

As test_job.py, on this host's CPUs (CPU leases, no GPU visible); the SQL
functions read the service URL from the job parameter, and without a job name
key their leases by ``aisp-sql-<host>-<worker pid>``.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from confluent_kafka import Producer

from pyflink_aisp.affinity import AffinityClient, ClientConfig, LeaseKind, LeaseState
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics
from pyflink_aisp.pipeline import InferenceOptions
from pyflink_aisp.pipeline.sql import configure_table_env

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("function", ["sentiment", "sentiment_pandas"])
def test_sql_function_instances_lease_and_release(
    function, affinity_service, kafka_bootstrap, topic, model_assets, tmp_path, affinity_checks
) -> None:
    settled, check_numa_spread = affinity_checks
    from pyflink.table import EnvironmentSettings, TableEnvironment

    from pyflink_aisp.jars import pipeline_jars_value

    cpus = sorted(os.sched_getaffinity(0))
    nodes = [cpus[: len(cpus) // 2], cpus[len(cpus) // 2 :]] if len(cpus) > 1 else [cpus]
    (tmp_path / "host.json").write_text(
        json.dumps(
            {
                "host": "this-host",
                "numa_nodes": [{"id": i, "cpus": c} for i, c in enumerate(nodes)],
                "gpus": [],
            }
        )
    )
    service = affinity_service(tmp_path / "host.json", token=None, ttl_s=600)
    t_in = topic("in")
    create_topics(kafka_bootstrap, [t_in], partitions=2)
    reviews = load_rotten_tomatoes()[600:640]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i, r in enumerate(reviews):
        producer.produce(t_in, key=r.id, value=json.dumps({"id": r.id, "text": r.text}), partition=i % 2)
    assert producer.flush(30) == 0

    t_env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    settings = t_env.get_config()
    settings.set("pipeline.jars", pipeline_jars_value())
    settings.set("python.executable", sys.executable)
    settings.set("python.client.executable", sys.executable)
    settings.set("parallelism.default", "2")
    configure_table_env(
        t_env,
        InferenceOptions(model_dir=model_assets.directory, intra_op_threads=1, gpu_affinity=service.url),
    )
    t_env.execute_sql(f"""
        CREATE TEMPORARY TABLE reviews (`id` STRING, `text` STRING) WITH (
          'connector' = 'kafka', 'topic' = '{t_in}', 'properties.bootstrap.servers' = '{kafka_bootstrap}',
          'properties.group.id' = 'g-{t_in}', 'scan.startup.mode' = 'earliest-offset',
          'scan.bounded.mode' = 'latest-offset', 'format' = 'json')""")
    t_env.execute_sql(
        f"CREATE TEMPORARY SYSTEM FUNCTION {function} AS "
        f"'pyflink_aisp.pipeline.sql.{function}' LANGUAGE PYTHON"
    )
    before = (sorted(os.sched_getaffinity(0)), os.environ.get("CUDA_VISIBLE_DEVICES"))
    with t_env.execute_sql(f"SELECT id, {function}(`text`).score FROM reviews").collect() as rows:
        got = {row[0]: row[1] for row in rows}
    # the functions ran in this process (PyFlink's loopback mode) and give its CPUs and env back on close
    state = settled(
        lambda: (sorted(os.sched_getaffinity(0)), os.environ.get("CUDA_VISIBLE_DEVICES")),
        lambda v: v == before,
    )
    assert state == before
    assert set(got) == {r.id for r in reviews} and all(s is not None for s in got.values())

    client = AffinityClient(ClientConfig(url=service.url))
    leases = settled(
        client.leases, lambda ls: len(ls) == 2 and all(x.state is LeaseState.RELEASED for x in ls)
    )
    assert sorted(x.subtask for x in leases) == [0, 1]
    assert len({x.id for x in leases}) == 2
    assert all(x.job.startswith("aisp-sql-") and x.kind is LeaseKind.CPU for x in leases)
    assert all(x.state is LeaseState.RELEASED for x in leases)
    check_numa_spread(leases, nodes)
