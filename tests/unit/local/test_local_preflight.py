"""`up` checks everything before it starts anything: ports (naming who holds them), Java, stack.json.

No real service starts here: KafkaBroker.start / FlinkCluster.start are replaced
by stubs that fail the test if reached when they must not be.
"""

import io
import os

import pytest

from pyflink_aisp.errors import EnvironmentSetupError, ServiceError
from pyflink_aisp.local import (
    FlinkCluster,
    FlinkClusterConfig,
    KafkaBroker,
    LocalStack,
    LocalStackConfig,
    find_free_port,
    run_local_command,
)
from pyflink_aisp.local._procs import write_pid_file


@pytest.fixture
def no_start(monkeypatch):
    def refuse(self):
        raise AssertionError(f"{type(self).__name__}.start must not be reached")

    monkeypatch.setattr(KafkaBroker, "start", refuse)
    monkeypatch.setattr(FlinkCluster, "start", refuse)


@pytest.fixture
def no_java(monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)


def _config(state_dir, **ports):
    free = {n: find_free_port() for n in ("kafka_port", "kafka_controller_port", "flink_rest_port")}
    free.update(ports)
    return LocalStackConfig(state_dir=state_dir, **free, flink_rpc_port=find_free_port())


def test_taken_flink_port_fails_before_kafka_starts(tmp_path, listening, no_start):
    stack = LocalStack(_config(tmp_path, flink_rest_port=listening))
    with pytest.raises(EnvironmentSetupError, match=f"port {listening}.*--flink-rest-port"):
        stack.up()
    assert not (tmp_path / "kafka").exists()
    assert not (tmp_path / "stack.json").exists()


def test_taken_port_error_names_the_old_broker(tmp_path, fake_process, no_start):
    old = tmp_path / "old" / "kafka" / "server.properties"
    holder = fake_process("-cp", "x.jar", "kafka.Kafka", str(old), listen=True)
    stack = LocalStack(_config(tmp_path / "new", kafka_port=holder.port))
    with pytest.raises(EnvironmentSetupError) as info:
        stack.up()
    msg = str(info.value)
    assert f"port {holder.port} on 127.0.0.1 is taken by pid {holder.pid} (" in msg
    assert f"… kafka.Kafka {old})" in msg and f"stop it with `kill {holder.pid}`" in msg
    assert f"not by a broker started from {tmp_path / 'new'}" in msg


def test_flink_start_without_java_gives_the_setup_hint(tmp_path, no_java):
    config = FlinkClusterConfig(state_dir=tmp_path, rest_port=find_free_port(), rpc_port=find_free_port())
    with pytest.raises(EnvironmentSetupError, match=r"java not found on PATH.*Java 17"):
        FlinkCluster(config).start()
    assert not (tmp_path / "flink" / "conf").exists()


def test_flink_start_with_a_java_home_without_java(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    config = FlinkClusterConfig(state_dir=tmp_path, rest_port=find_free_port(), rpc_port=find_free_port())
    with pytest.raises(EnvironmentSetupError, match=r"no-jdk/bin/java not found.*JAVA_HOME"):
        FlinkCluster(config).start()


def test_up_with_kafka_running_and_no_java_fails_before_flink(tmp_path, fake_process, no_java, no_start):
    stack = LocalStack(_config(tmp_path))
    broker = KafkaBroker(stack.config.kafka_config())
    write_pid_file(broker.pid_path, [fake_process(str(broker.properties_path)).pid])
    with pytest.raises(EnvironmentSetupError, match="java not found on PATH"):
        stack.up()


@pytest.mark.parametrize(
    ("text", "why"),
    [("{not json", "Expecting property name"), ("[9092]", "a JSON list"), ('{"kafka_port": "x"}', "'x'")],
)
def test_corrupt_stack_json_is_an_error_until_down(tmp_path, text, why, no_start):
    record = tmp_path / "stack.json"
    record.write_text(text)
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path))
    for action in (stack.status, stack.up, stack.flink_config):
        with pytest.raises(ServiceError) as info:
            action()
        assert str(record) in str(info.value) and why in str(info.value)
        assert "`aisp local down`" in str(info.value) and "delete it" in str(info.value)
    assert not stack.down().kafka.running
    assert not record.exists()
    assert stack.status().lines() == ["kafka: stopped", "flink: stopped"]


def test_cli_status_with_corrupt_stack_json_exits_1(tmp_path, capsys):
    import argparse

    (tmp_path / "stack.json").write_text("{")
    args = argparse.Namespace(
        local_command="status", state_dir=tmp_path, kafka_port=None, kafka_controller_port=None,
        flink_rest_port=None, no_flink=False,
    )  # fmt: skip
    assert run_local_command(args, io.StringIO()) == 1
    assert "stack.json is corrupt" in capsys.readouterr().err


def test_down_removes_stack_json(tmp_path):
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path, kafka_port=19876))
    stack._record({})
    assert (tmp_path / "stack.json").exists()
    stack.down()
    assert not (tmp_path / "stack.json").exists()
    assert os.listdir(tmp_path) == [".lock"]
