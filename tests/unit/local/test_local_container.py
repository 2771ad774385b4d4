"""Container roles: settings from AISP_* variables, the submitter's argv, waiting for services."""

import sys

import pytest
import yaml

from pyflink_aisp.deploy import (
    configure_role,
    container_flink_config,
    container_kafka_config,
    submit_command,
    wait_for_services,
)
from pyflink_aisp.errors import ConfigError, ServiceError
from pyflink_aisp.local import FlinkClusterConfig, LocalStackConfig, prometheus_settings, pyflink_home
from pyflink_aisp.local._flink_config import PROMETHEUS_FACTORY


def _env(tmp_path, **more):
    return {"AISP_STATE_DIR": str(tmp_path / "state"), "AISP_SHARED_DIR": str(tmp_path / "shared"),
            "AISP_TASKMANAGER_HOST": "10.0.0.7", **more}


def test_flink_settings_of_a_container(tmp_path):
    cfg = container_flink_config(_env(tmp_path, AISP_TASK_SLOTS="3", AISP_FLINK_REST_PORT="18081"))
    assert (cfg.jobmanager_host, cfg.taskmanager_host, cfg.bind_host) == ("jobmanager", "10.0.0.7", "0.0.0.0")
    assert (cfg.rest_port, cfg.rpc_port, cfg.task_slots) == (18081, 6123, 3)
    assert cfg.prometheus_ports == (9249,)
    assert cfg.python_executable == sys.executable
    assert cfg.extra_config["execution.checkpointing.dir"] == (tmp_path / "shared" / "checkpoints").as_uri()


def test_prometheus_off_and_bad_numbers(tmp_path):
    assert container_flink_config(_env(tmp_path, AISP_PROMETHEUS_PORT="off")).prometheus_port is None
    with pytest.raises(ConfigError, match="AISP_TASK_SLOTS='two' is not an integer"):
        container_flink_config(_env(tmp_path, AISP_TASK_SLOTS="two"))


def test_unknown_role_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="unknown container role 'worker'; expected one of jobmanager"):
        configure_role("worker", _env(tmp_path))


def test_kafka_role_writes_server_properties_for_the_network(tmp_path):
    path = configure_role("kafka", _env(tmp_path, AISP_KAFKA_PARTITIONS="4"))
    props = dict(ln.split("=", 1) for ln in path.read_text().splitlines() if ln and not ln.startswith("#"))
    assert props["listeners"] == "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://kafka:9092"
    assert props["controller.quorum.voters"] == "1@kafka:9093"
    assert props["num.partitions"] == "4"
    assert props["log.dirs"] == str(tmp_path / "state" / "kafka" / "data")
    log4j = (path.parent / "log4j2.properties").read_text()
    assert "appender.file.type = Console" in log4j and "RollingFile" not in log4j
    assert container_kafka_config(_env(tmp_path)).bootstrap_servers == "kafka:9092"


def test_submitter_runs_the_main_job_on_the_jobmanager(tmp_path):
    env = _env(tmp_path, AISP_JOB_ARGS="--input-topic reviews --output-topic 'my scores'")
    argv = submit_command(env)
    assert argv[:4] == [str(pyflink_home() / "bin" / "flink"), "run", "-m", "jobmanager:8081"]
    assert argv[4:] == ["-pyexec", sys.executable, "-pyclientexec", sys.executable,
                        "-py", "/opt/aisp/jobs/review_sentiment.py",
                        "--input-topic", "reviews", "--output-topic", "my scores"]
    with pytest.raises(ConfigError, match="AISP_JOB_ARGS is not shell-quoted"):
        submit_command(_env(tmp_path, AISP_JOB_ARGS="--x 'open"))


def test_wait_for_services_names_what_is_missing(tmp_path):
    ticks = iter([0.0, 1.0, 5.0])
    env = _env(tmp_path, AISP_KAFKA_BOOTSTRAP="127.0.0.1:1", AISP_WAIT_TIMEOUT_S="3")
    with pytest.raises(ServiceError, match=r"Kafka at 127.0.0.1:1 not ready within 3 s"):
        wait_for_services(env, sleep=lambda s: None, clock=lambda: next(ticks))


def test_prometheus_range_on_the_local_stack(tmp_path):
    cfg = LocalStackConfig(state_dir=tmp_path, prometheus_port=19249).flink_config()
    assert prometheus_settings(cfg) == {
        "metrics.reporter.prom.factory.class": PROMETHEUS_FACTORY,
        "metrics.reporter.prom.port": "19249-19250",
    }
    assert PROMETHEUS_FACTORY == "org.apache.flink.metrics.prometheus.PrometheusReporterFactory"
    assert prometheus_settings(FlinkClusterConfig(state_dir=tmp_path)) == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prometheus_port": 8080}, "prometheus ports 8080..8081 overlap the REST/RPC port 8081"),
        ({"prometheus_port": 65535}, "prometheus ports 65535..65536 must be <= 65535"),
        ({"prometheus_port": 0}, "prometheus_port must be an int >= 1"),
        ({"bind_host": "a b"}, "bind_host must be a host name without spaces"),
    ],
)
def test_bad_flink_settings_are_one_line(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        FlinkClusterConfig(state_dir=tmp_path, **kwargs)


def test_stack_refuses_prometheus_ports_on_kafka_ports(tmp_path):
    with pytest.raises(ConfigError, match=r"prometheus ports \(9091, 9092\) overlap the stack's port 9092"):
        LocalStackConfig(state_dir=tmp_path, prometheus_port=9091)


def test_cli_flag_and_env_turn_the_reporter_on(tmp_path):
    from pyflink_aisp.cli import build_parser

    args = build_parser().parse_args(["local", "status", "--prometheus-port", "19300"])
    assert args.prometheus_port == 19300
    env = {"AISP_PROMETHEUS_PORT": "19400", "AISP_LOCAL_DIR": str(tmp_path)}
    assert LocalStackConfig.from_env(env).flink_config().prometheus_ports == (19400, 19401)


def test_flink_conf_of_a_taskmanager_container(tmp_path):
    conf_dir = configure_role("taskmanager", _env(tmp_path))
    conf = yaml.safe_load((conf_dir / "config.yaml").read_text())
    assert conf["jobmanager.rpc.address"] == conf["rest.address"] == "jobmanager"
    assert conf["taskmanager.host"] == "10.0.0.7"
    assert conf["taskmanager.bind-host"] == conf["rest.bind-address"] == "0.0.0.0"
    assert conf["metrics.reporter.prom.port"] == "9249"
    assert (conf_dir / "log4j-console.properties").is_file()  # PyFlink's conf/ files come along
