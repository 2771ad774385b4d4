"""The compose topology on this host, without a Docker engine: every container role of the image
started through docker/entrypoint.sh in its own state folder (as in its own container): the Kafka
broker, a JobManager, two TaskManagers with the Prometheus reporter, then the submitter, which
waits for them and runs the main job with `flink run` at parallelism 2."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference.handlers import OnnxSentimentModel
from pyflink_aisp.kafka import create_topics, ingest_records, read_topic
from pyflink_aisp.local import broker_answers, find_free_port, flink_overview

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
N = 120


def _ports(n):
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(find_free_port())
    return sorted(ports)


def _env(state, **more):
    return {**os.environ, "AISP_PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
            "AISP_STATE_DIR": str(state), "AISP_BIND_HOST": "127.0.0.1", **more}


def _start(role, state, **env):
    state.mkdir(parents=True)
    log = open(state / "container.out", "w")  # the child writes it; closed at exit
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), role], env=_env(state, **env), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = Path(log.name)
    return proc


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _wait(check, proc, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        if check():
            return True
        time.sleep(0.5)
    return check()


def _samples(port):
    """Metric name -> values of one reporter endpoint."""
    with urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample.value)
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Kafka, a JobManager and 2 TaskManagers (1 slot each), as docker/compose.yaml runs them."""
    root = tmp_path_factory.mktemp("roles")
    kafka_port, controller, rest, rpc, prom_jm, prom_tm1, prom_tm2 = _ports(7)
    common = {"AISP_JOBMANAGER_HOST": "localhost", "AISP_TASKMANAGER_HOST": "localhost",
              "AISP_FLINK_REST_PORT": str(rest), "AISP_FLINK_RPC_PORT": str(rpc),
              "AISP_SHARED_DIR": str(root / "shared"), "AISP_TASK_SLOTS": "1",
              "AISP_TASKMANAGER_MEMORY_MB": "1536", "AISP_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}"}
    procs = {"kafka": _start("kafka", root / "kafka", AISP_KAFKA_HOST="127.0.0.1",
                             AISP_KAFKA_PORT=str(kafka_port), AISP_KAFKA_CONTROLLER_PORT=str(controller))}
    try:
        procs["jobmanager"] = _start("jobmanager", root / "jm", AISP_PROMETHEUS_PORT=str(prom_jm), **common)
        for name, port in (("tm1", prom_tm1), ("tm2", prom_tm2)):
            procs[name] = _start("taskmanager", root / name, AISP_PROMETHEUS_PORT=str(port), **common)
        url = f"http://localhost:{rest}"
        for name, proc in procs.items():
            ready = (lambda: broker_answers(common["AISP_KAFKA_BOOTSTRAP"])) if name == "kafka" else (
                lambda: (flink_overview(url) or {}).get("taskmanagers") == 2)
            assert _wait(ready, proc, 120), proc.log_path.read_text()[-3000:]
        yield {"root": root, "common": common, "rest_url": url, "procs": procs,
               "prometheus": {"jobmanager": prom_jm, "tm1": prom_tm1, "tm2": prom_tm2}}
    finally:
        for proc in reversed(procs.values()):
            _stop(proc)


def test_kafka_role_serves_a_kraft_broker_with_the_image_defaults(cluster):
    bootstrap = cluster["common"]["AISP_KAFKA_BOOTSTRAP"]
    (info,) = create_topics(bootstrap, ["roles-check"])
    assert info.partitions == 2  # AISP_KAFKA_PARTITIONS default of the image (num.partitions)
    assert len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics["roles-check"]
               .partitions) == 2
    assert "Kafka Server started" in cluster["procs"]["kafka"].log_path.read_text()  # logs on stdout


def test_jobmanager_and_two_taskmanagers_form_a_cluster_with_metrics(cluster):
    overview = flink_overview(cluster["rest_url"])
    assert (overview["taskmanagers"], overview["slots-total"]) == (2, 2)
    ports = cluster["prometheus"]
    assert _samples(ports["jobmanager"])["flink_jobmanager_numRegisteredTaskManagers"] == [2.0]
    for name in ("tm1", "tm2"):
        assert _samples(ports[name])["flink_taskmanager_Status_Shuffle_Netty_TotalMemorySegments"][0] > 0


def test_submit_role_runs_the_main_job_on_the_cluster(cluster, model_assets):
    bootstrap = cluster["common"]["AISP_KAFKA_BOOTSTRAP"]
    t_in, t_out = "roles-reviews", "roles-scores"
    create_topics(bootstrap, [t_in, t_out], partitions=2)
    reviews = load_rotten_tomatoes()[:N]
    records = [{"id": r.id, "text": r.text} for r in reviews]
    assert ingest_records(bootstrap, t_in, records, progress=False).delivered == N
    args = ["--input-topic", t_in, "--output-topic", t_out, "--mode", "batch", "--parallelism", "2",
            "--bootstrap-servers", bootstrap, "--model-dir", str(model_assets.directory)]
    env = _env(cluster["root"] / "submit", **cluster["common"], AISP_EXPECT_TASKMANAGERS="2",
               AISP_JOB=str(ROOT / "jobs" / "review_sentiment.py"), AISP_JOB_ARGS=shlex.join(args))
    proc = subprocess.run(["bash", str(ENTRYPOINT), "submit"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("submit: exec ") and "Job has been submitted with JobID" in proc.stdout

    docs = [json.loads(m.value()) for m in read_topic(bootstrap, t_out, min_count=N, timeout_s=60)]
    scores, _ = OnnxSentimentModel(model_assets).predict([r.text for r in reviews])
    expected = {r.id: float(s) for r, s in zip(reviews, scores, strict=True)}
    assert sorted(d["id"] for d in docs) == sorted(expected)
    for d in docs:
        assert d["score"] == pytest.approx(expected[d["id"]], abs=1e-5)
