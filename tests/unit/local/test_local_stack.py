"""LocalStack without real services: taken ports, pid files, down, status, port changes.

A "fake broker" (conftest) is a sleeping Python process whose command line names
the state dir's server.properties, recorded in kafka.pid as `up` would.
"""

import subprocess
import sys

import pytest

from pyflink_aisp.errors import EnvironmentSetupError
from pyflink_aisp.local import (
    FlinkCluster,
    FlinkClusterConfig,
    KafkaBroker,
    KafkaBrokerConfig,
    LocalStack,
    LocalStackConfig,
    find_free_port,
)
from pyflink_aisp.local._procs import is_alive, write_pid_file


def _no_jars():
    raise AssertionError("must fail before resolving jars")


def test_kafka_port_taken(tmp_path, listening):
    broker = KafkaBroker(
        KafkaBrokerConfig(state_dir=tmp_path, port=listening, controller_port=find_free_port()), jars=_no_jars
    )
    with pytest.raises(EnvironmentSetupError) as info:
        broker.start()
    msg = str(info.value)
    assert f"port {listening}" in msg and "--kafka-port" in msg and "AISP_KAFKA_PORT" in msg


def test_kafka_controller_port_taken(tmp_path, listening):
    broker = KafkaBroker(
        KafkaBrokerConfig(state_dir=tmp_path, port=find_free_port(), controller_port=listening), jars=_no_jars
    )
    with pytest.raises(EnvironmentSetupError, match=f"port {listening}.*--controller-port"):
        broker.start()


def test_flink_rest_port_taken(tmp_path, listening):
    cluster = FlinkCluster(
        FlinkClusterConfig(state_dir=tmp_path, rest_port=listening, rpc_port=find_free_port())
    )
    with pytest.raises(EnvironmentSetupError, match=f"port {listening}.*--flink-rest-port"):
        cluster.start()
    assert not (tmp_path / "flink" / "conf").exists()  # failed before writing anything


def test_stack_up_reports_taken_port(tmp_path, listening):
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path, kafka_port=listening, with_flink=False))
    with pytest.raises(EnvironmentSetupError, match=f"port {listening}"):
        stack.up()


def test_stale_pid_file_is_not_ours(tmp_path, fake_process):
    broker = KafkaBroker(KafkaBrokerConfig(state_dir=tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_pid_file(broker.pid_path, [dead.pid])
    assert broker.pid() is None
    other = fake_process()  # alive, but not started for this state dir (pid reuse)
    write_pid_file(broker.pid_path, [other.pid])
    assert broker.pid() is None
    assert broker.stop() is False
    assert is_alive(other.pid)
    assert not broker.pid_path.exists()


def test_down_stops_only_recorded_processes(tmp_path, fake_process):
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path))
    broker = KafkaBroker(stack.config.kafka_config())
    ours = fake_process(str(broker.properties_path))
    bystander = fake_process(str(broker.properties_path))  # same marker, never recorded
    write_pid_file(broker.pid_path, [ours.pid])
    assert stack.status().kafka.pids == (ours.pid,)
    status = stack.down()
    assert ours.wait(10) is not None
    assert is_alive(bystander.pid)
    assert not status.kafka.running and status.bootstrap_servers is None
    assert status.lines() == ["kafka: stopped", "flink: stopped"]


def test_down_stops_recorded_flink_daemons(tmp_path, fake_process):
    cluster = FlinkCluster(FlinkClusterConfig(state_dir=tmp_path))
    jm = fake_process("--configDir", str(cluster.config.conf_dir))
    tm = fake_process("--configDir", str(cluster.config.conf_dir))
    for path, proc in zip(cluster.pid_files(), (jm, tm), strict=True):
        write_pid_file(path, [proc.pid])
    assert cluster.pids() == [jm.pid, tm.pid]
    assert LocalStack(LocalStackConfig(state_dir=tmp_path)).down().flink.pids == ()
    assert jm.wait(10) is not None and tm.wait(10) is not None
    assert not any(p.exists() for p in cluster.pid_files())


def test_status_lines_for_a_running_but_silent_broker(tmp_path, fake_process):
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path, kafka_port=find_free_port()))
    broker = KafkaBroker(stack.config.kafka_config())
    proc = fake_process(str(broker.properties_path))
    write_pid_file(broker.pid_path, [proc.pid])
    status = stack.status()
    assert status.kafka.running and not status.kafka.ready
    assert status.lines()[0] == (
        f"kafka: running (not answering) pid {proc.pid} bootstrap 127.0.0.1:{stack.config.kafka_port}"
    )


def test_up_refuses_port_change_while_running(tmp_path, fake_process):
    first = LocalStack(LocalStackConfig(state_dir=tmp_path, kafka_port=find_free_port(), with_flink=False))
    first._record({})
    broker = KafkaBroker(first.config.kafka_config())
    write_pid_file(broker.pid_path, [fake_process(str(broker.properties_path)).pid])
    other = LocalStack(LocalStackConfig(state_dir=tmp_path, kafka_port=find_free_port(), with_flink=False))
    with pytest.raises(EnvironmentSetupError, match="aisp local down"):
        other.up()
    # status of a second handle reports the recorded (running) port, not its own config
    assert other.status().kafka.address == first.config.kafka_config().bootstrap_servers


def test_down_on_empty_state_dir_is_a_no_op(tmp_path):
    status = LocalStack(LocalStackConfig(state_dir=tmp_path / "new")).down()
    assert not status.kafka.running and not status.flink.running
