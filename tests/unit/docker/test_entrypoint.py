"""docker/entrypoint.sh's config step, run on this host: the same config code as the local stack."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

from pyflink_aisp.deploy import container_flink_config
from pyflink_aisp.local import pyflink_home, render_flink_config

ROOT = Path(__file__).resolve().parents[3]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def _run(tmp_path, *args, **env):
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("AISP_")}  # only what we set
    full = {**inherited, "AISP_PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
            "AISP_STATE_DIR": str(tmp_path / "state"), "AISP_SHARED_DIR": str(tmp_path / "shared"),
            "AISP_TASKMANAGER_HOST": "tm-1", **env}
    proc = subprocess.run(["bash", str(ENTRYPOINT), *args], env=full, capture_output=True, text=True,
                          timeout=120)
    return proc, full


def test_config_step_writes_the_local_stacks_flink_config_for_the_network(tmp_path):
    proc, env = _run(tmp_path, "config", "jobmanager", AISP_PROMETHEUS_PORT="9250")
    assert proc.returncode == 0, proc.stderr
    conf_dir = tmp_path / "state" / "flink" / "conf"
    assert proc.stdout.strip() == f"jobmanager: wrote {conf_dir}"
    written = (conf_dir / "config.yaml").read_text()
    base = yaml.safe_load((pyflink_home() / "conf" / "config.yaml").read_text())
    assert written == render_flink_config(container_flink_config(env), base)
    conf = yaml.safe_load(written)
    assert conf["jobmanager.rpc.address"] == "jobmanager"
    assert conf["jobmanager.bind-host"] == "0.0.0.0"
    assert conf["taskmanager.host"] == "tm-1"
    assert conf["metrics.reporter.prom.port"] == "9250"
    assert conf["python.executable"] == sys.executable
    assert conf["execution.checkpointing.savepoint-dir"] == (tmp_path / "shared" / "savepoints").as_uri()
    assert (conf_dir / "masters").read_text() == "jobmanager:8081\n"


def test_config_step_for_kafka(tmp_path):
    proc, _ = _run(tmp_path, "config", "kafka", AISP_KAFKA_HOST="broker")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "state" / "kafka" / "server.properties").read_text()
    assert "advertised.listeners=PLAINTEXT://broker:9092\n" in text


def test_bad_role_and_bad_variable_fail_in_one_line(tmp_path):
    proc, _ = _run(tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: entrypoint.sh")
    proc, _ = _run(tmp_path, "config", "taskmanager", AISP_TASK_SLOTS="many")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: AISP_TASK_SLOTS='many' is not an integer"


def test_other_commands_run_as_they_are(tmp_path):
    proc, _ = _run(tmp_path, "echo", "hello")
    assert (proc.returncode, proc.stdout) == (0, "hello\n")
