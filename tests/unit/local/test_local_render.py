"""Rendering of server.properties, the broker's log4j2 config and Flink's config.yaml."""

import yaml

from pyflink_aisp.local import (
    FlinkClusterConfig,
    KafkaBrokerConfig,
    pyflink_home,
    render_flink_config,
    render_kafka_log4j2,
    render_server_properties,
)


def _props(text):
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


def test_server_properties_kraft_single_node(tmp_path):
    cfg = KafkaBrokerConfig(state_dir=tmp_path, port=19092, controller_port=19093)
    props = _props(render_server_properties(cfg))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == str(tmp_path / "kafka" / "data")
    for key in [
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "num.partitions",
    ]:
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "true"


def test_log4j2_writes_into_log_dir(tmp_path):
    text = render_kafka_log4j2(tmp_path / "logs")
    assert f"appender.file.fileName = {tmp_path / 'logs' / 'server.log'}" in text
    assert "rootLogger.appenderRef.file.ref = FILE" in text


def test_flink_config_flattens_base_and_overrides(tmp_path):
    cfg = FlinkClusterConfig(
        state_dir=tmp_path,
        rest_port=18081,
        rpc_port=16123,
        python_executable="/venv/bin/python",
        extra_config={"foo.bar": "x"},
    )
    base = {
        "rest": {"address": "0.0.0.0", "port": 8081},
        "env": {"java": {"opts": {"all": "--add-opens=a"}}},
        "parallelism.default": 4,
    }
    conf = yaml.safe_load(render_flink_config(cfg, base))
    assert conf["rest.port"] == 18081
    assert conf["rest.address"] == "localhost"
    assert conf["rest.bind-address"] == "localhost"
    assert conf["jobmanager.rpc.port"] == 16123
    assert conf["env.java.opts.all"] == "--add-opens=a"
    assert conf["parallelism.default"] == 1
    assert conf["taskmanager.numberOfTaskSlots"] == 4
    assert conf["taskmanager.memory.process.size"] == "3072m"
    assert conf["taskmanager.memory.managed.size"] == "512m"
    assert conf["taskmanager.memory.jvm-metaspace.size"] == "768m"  # room for many jobs' class loaders
    assert conf["jobmanager.memory.process.size"] == "1024m"
    assert conf["python.executable"] == conf["python.client.executable"] == "/venv/bin/python"
    assert conf["execution.checkpointing.dir"] == (tmp_path / "flink" / "checkpoints").as_uri()
    assert conf["env.log.dir"] == str(tmp_path / "flink" / "log")
    assert conf["foo.bar"] == "x"
    assert conf["heartbeat.interval"] == 2000 and "heartbeat.timeout" not in conf  # fast kill -9 detection
    assert all(not isinstance(v, dict) for v in conf.values())  # flat keys only


def test_flink_config_from_pyflink_conf_keeps_java_opts(tmp_path):
    base = yaml.safe_load((pyflink_home() / "conf" / "config.yaml").read_text())
    conf = yaml.safe_load(render_flink_config(FlinkClusterConfig(state_dir=tmp_path), base))
    assert "--add-opens=java.base/java.lang=ALL-UNNAMED" in conf["env.java.opts.all"]
    assert conf["rest.port"] == 8081


def test_flink_run_command_and_env(tmp_path):
    from pyflink_aisp.local import flink_env, flink_run_command

    cfg = FlinkClusterConfig(state_dir=tmp_path, rest_port=18081, python_executable="/venv/bin/python")
    cmd = flink_run_command(tmp_path / "job.py", "--topic", "t", config=cfg)
    assert cmd[0] == str(pyflink_home() / "bin" / "flink")
    assert cmd[1:] == [
        "run",
        "-m",
        "localhost:18081",
        "-pyexec",
        "/venv/bin/python",
        "-pyclientexec",
        "/venv/bin/python",
        "-py",
        str(tmp_path / "job.py"),
        "--topic",
        "t",
    ]
    env = flink_env(cfg)
    assert env["FLINK_CONF_DIR"] == str(tmp_path / "flink" / "conf")
    assert env["FLINK_LOG_DIR"] == str(tmp_path / "flink" / "log")
    assert env["FLINK_PID_DIR"] == str(tmp_path / "flink" / "pid")
    assert env["FLINK_HOME"] == str(pyflink_home())


def test_default_flink_command_follows_recorded_ports(tmp_path, monkeypatch):
    from pyflink_aisp.local import LocalStack, LocalStackConfig, flink_run_command

    LocalStack(LocalStackConfig(state_dir=tmp_path, flink_rest_port=18181))._record({})
    monkeypatch.setenv("AISP_LOCAL_DIR", str(tmp_path))
    assert "localhost:18181" in flink_run_command("job.py")
