"""The image's roles run on this host through docker/entrypoint.sh (no Docker engine needed):
the Kafka broker, a JobManager and a TaskManager with the Prometheus reporter, each in its
own state folder as it would be in its own container."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from pyflink_aisp.local import broker_answers, find_free_port, flink_overview

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def _ports(n):
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(find_free_port())
    return sorted(ports)


def _start(role, state, **env):
    full = {**os.environ, "AISP_PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
            "AISP_STATE_DIR": str(state), "AISP_BIND_HOST": "127.0.0.1", **env}
    log = open(state.parent / f"{state.name}.out", "w")  # the child writes it; closed at exit
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), role], env=full, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    proc.log_path = log.name
    return proc


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _samples(port):
    """Metric name -> value of one reporter endpoint (one sample per name here: one host)."""
    with urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def _wait(check, proc, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        if check():
            return True
        time.sleep(0.5)
    return check()


def test_kafka_role_serves_a_kraft_broker_with_the_image_defaults(tmp_path):
    port, controller = _ports(2)
    proc = _start("kafka", tmp_path / "kafka", AISP_KAFKA_HOST="127.0.0.1", AISP_KAFKA_PORT=str(port),
                  AISP_KAFKA_CONTROLLER_PORT=str(controller))
    try:
        bootstrap = f"127.0.0.1:{port}"
        assert _wait(lambda: broker_answers(bootstrap), proc, 90), Path(proc.log_path).read_text()[-3000:]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("roles-check")])["roles-check"].result(timeout=30)
        topic = admin.list_topics(timeout=10).topics["roles-check"]
        assert len(topic.partitions) == 2  # AISP_KAFKA_PARTITIONS default of the image
        assert "Kafka Server started" in Path(proc.log_path).read_text()  # logs on stdout
    finally:
        _stop(proc)


def test_jobmanager_and_taskmanager_roles_form_a_cluster_with_metrics(tmp_path):
    rest, rpc, prom_jm, prom_tm = _ports(4)
    common = {"AISP_JOBMANAGER_HOST": "localhost", "AISP_TASKMANAGER_HOST": "localhost",
              "AISP_FLINK_REST_PORT": str(rest), "AISP_FLINK_RPC_PORT": str(rpc),
              "AISP_SHARED_DIR": str(tmp_path / "shared"), "AISP_TASK_SLOTS": "2"}
    jm = _start("jobmanager", tmp_path / "jm", AISP_PROMETHEUS_PORT=str(prom_jm), **common)
    tm = None
    try:
        url = f"http://localhost:{rest}"
        assert _wait(lambda: flink_overview(url) is not None, jm, 120), Path(jm.log_path).read_text()[-3000:]
        tm = _start("taskmanager", tmp_path / "tm", AISP_PROMETHEUS_PORT=str(prom_tm), **common)
        registered = _wait(lambda: (flink_overview(url) or {}).get("taskmanagers") == 1, tm, 120)
        assert registered, Path(tm.log_path).read_text()[-3000:]
        assert flink_overview(url)["slots-total"] == 2
        assert _samples(prom_tm)["flink_taskmanager_Status_Shuffle_Netty_TotalMemorySegments"] > 0
        assert _samples(prom_jm)["flink_jobmanager_numRegisteredTaskManagers"] == 1.0
    finally:
        for proc in (tm, jm):
            if proc is not None:
                _stop(proc)
