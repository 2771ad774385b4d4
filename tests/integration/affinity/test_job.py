"""The main job with ``--gpu-affinity`` at parallelism 2: each subtask leases, applies, releases (12.5).

What this proves on a host without a GPU: a real PyFlink job (MiniCluster, real
Kafka broker, the real model) whose two inference subtasks each call the real
service over loopback in ``open()``, get distinct leases (the service's
placement spreads them over two NUMA nodes, each with its own CPU), apply them
(no GPU visible: ``--device cpu`` asks for CPU leases) and release both in
``close()`` when the job ends (state ``released``, not ``expired``: the TTL is 10
minutes). In the MiniCluster, PyFlink runs the Python functions of both subtasks
in this test process (its loopback mode), so the process was pinned to the union
of the two CPU sets while they ran, and is back to its CPU set and
``CUDA_VISIBLE_DEVICES`` afterwards (asserted); one-CPU-set-per-worker pinning is
what a cluster's separate Python workers get, checked per process in
tests/unit/affinity/test_worker.py. What it does not prove here: a GPU lease reaching CUDA
(``CUDA_VISIBLE_DEVICES`` = a GPU or MIG uuid before CUDA initialises); that part
is covered by the unit test of ``apply_lease`` in a child process and by
``bench/gpu_affinity_check.py`` on a GPU host. The service runs with ``--no-auth``
here: the token reaches workers through the TaskManager's environment, which a
shared MiniCluster JVM fixes at its start; the token checks are in test_service.py.
"""

from __future__ import annotations

import json
import os

import pytest

from pyflink_aisp.affinity import AffinityClient, ClientConfig, LeaseKind, LeaseState
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline.flink import build_pipeline, make_environment

pytestmark = pytest.mark.integration


def _this_host_as_two_numa_nodes(path) -> list[list[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    nodes = [cpus[:half], cpus[half:]] if len(cpus) > 1 else [cpus]
    doc = {"host": "this-host", "numa_nodes": [{"id": i, "cpus": c} for i, c in enumerate(nodes)], "gpus": []}
    path.write_text(json.dumps(doc))
    return nodes


@pytest.mark.parametrize("operator", ["arrow", "async"])
def test_two_subtasks_take_distinct_leases_and_release_them_at_job_end(
    operator, affinity_service, kafka_bootstrap, topic, model_assets, tmp_path, affinity_checks
) -> None:
    settled, check_numa_spread = affinity_checks
    nodes = _this_host_as_two_numa_nodes(tmp_path / "host.json")
    service = affinity_service(tmp_path / "host.json", token=None, ttl_s=600)
    reviews = load_rotten_tomatoes()[500:540]
    t_in, t_out = topic("in"), topic("out")
    create_topics(kafka_bootstrap, [t_in], partitions=2)
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(kafka_bootstrap, t_in, records, progress=False).delivered == len(reviews)
    options = PipelineOptions.from_args(
        [
            "--bootstrap-servers",
            kafka_bootstrap,
            "--input-topic",
            t_in,
            "--output-topic",
            t_out,
            "--mode",
            "batch",
            "--model-dir",
            str(model_assets.directory),
            "--parallelism",
            "2",
            "--operator",
            operator,
            "--device",
            "cpu",
            "--gpu-affinity",
            service.url,
        ]
    )
    before = (sorted(os.sched_getaffinity(0)), os.environ.get("CUDA_VISIBLE_DEVICES"))
    build_pipeline(make_environment(options), options).wait()
    state = settled(
        lambda: (sorted(os.sched_getaffinity(0)), os.environ.get("CUDA_VISIBLE_DEVICES")),
        lambda v: v == before,
    )
    assert state == before

    out = read_topic(kafka_bootstrap, t_out, min_count=len(reviews))
    assert sorted(json.loads(m.value())["id"] for m in out) == sorted(r.id for r in reviews)
    client = AffinityClient(ClientConfig(url=service.url))
    leases = settled(
        lambda: client.leases(job=options.name),
        lambda ls: len(ls) == 2 and all(x.state is LeaseState.RELEASED for x in ls),
    )
    assert sorted(x.subtask for x in leases) == [0, 1]
    assert len({x.id for x in leases}) == 2 and len({x.operator for x in leases}) == 1
    assert all(x.state is LeaseState.RELEASED and x.released_at is not None for x in leases)
    assert all(x.kind is LeaseKind.CPU and x.cuda_visible_devices == "" for x in leases)
    check_numa_spread(leases, nodes)
