"""Half-running and pid-file-less services: a dead TaskManager, a state folder deleted under a stack.

Fake daemons (conftest) carry the command-line markers of the real ones: Kafka's
``kafka.Kafka <server.properties>``, Flink's entrypoint class and ``--configDir``.
"""

import pytest

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

JM_CLASS = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
TM_CLASS = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"


class Stop(Exception):
    """Raised by the stubbed _run_script: ends start() where a real script would run."""


@pytest.fixture
def scripts(monkeypatch):
    """Records FlinkCluster._run_script calls instead of running bin/ scripts; Java assumed present."""
    calls = []

    def run_script(self, name, *args):
        calls.append((name, *args))
        raise Stop

    monkeypatch.setattr(FlinkCluster, "_run_script", run_script)
    monkeypatch.setattr(FlinkCluster, "_check_java", lambda self: None)
    return calls


def _cluster(tmp_path, **kw):
    kw.setdefault("rest_port", find_free_port())
    return FlinkCluster(FlinkClusterConfig(state_dir=tmp_path, rpc_port=find_free_port(), **kw))


def _dead_pid(fake_process):
    proc = fake_process()
    proc.kill()
    proc.wait()
    return proc.pid


def test_dead_taskmanager_starts_only_a_taskmanager(tmp_path, fake_process, scripts, monkeypatch, listening):
    cluster = _cluster(tmp_path, rest_port=listening)  # the JobManager holds its port: no port error
    jm = fake_process(JM_CLASS, "--configDir", str(cluster.config.conf_dir))
    jm_file, tm_file = cluster.pid_files()
    write_pid_file(jm_file, [jm.pid])
    write_pid_file(tm_file, [_dead_pid(fake_process)])
    monkeypatch.setattr(FlinkCluster, "overview", lambda self, timeout_s=2.0: {"taskmanagers": 1})
    monkeypatch.setattr(FlinkCluster, "_taskmanager_ids", lambda self: {"old-tm"})
    with pytest.raises(Stop):
        cluster.start()
    assert scripts == [("taskmanager.sh", "start")]
    assert is_alive(jm.pid) and jm_file.exists() and not tm_file.exists()
    assert (cluster.config.conf_dir / "config.yaml").is_file()  # written as it was missing


def test_dead_taskmanager_and_silent_jobmanager_restarts_the_cluster(
    tmp_path, fake_process, scripts, monkeypatch
):
    cluster = FlinkCluster(
        FlinkClusterConfig(
            state_dir=tmp_path, rest_port=find_free_port(), rpc_port=find_free_port(), start_timeout_s=0.5
        )
    )
    jm = fake_process(JM_CLASS, "--configDir", str(cluster.config.conf_dir))
    write_pid_file(cluster.pid_files()[0], [jm.pid])
    monkeypatch.setattr(FlinkCluster, "overview", lambda self, timeout_s=2.0: None)
    with pytest.raises(Stop):
        cluster.start()
    assert scripts == [("start-cluster.sh",)]
    assert jm.wait(10) is not None


def test_flink_daemons_without_pid_files_are_found_and_stopped(tmp_path, fake_process):
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path))
    conf = str(stack.config.flink_config().conf_dir)
    jm = fake_process(JM_CLASS, "--configDir", conf)
    tm = fake_process(TM_CLASS, "--configDir", conf)
    script = fake_process("flink-daemon.sh", "start", "taskexecutor", "--configDir", conf)  # no class
    other = fake_process(TM_CLASS, "--configDir", conf + "2")
    assert stack.status().flink.pids == (jm.pid, tm.pid)
    assert not stack.down().flink.running
    assert jm.wait(10) is not None and tm.wait(10) is not None
    assert is_alive(script.pid) and is_alive(other.pid)


def test_broker_without_pid_file_is_found_and_stopped(tmp_path, fake_process):
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path, kafka_port=find_free_port()))
    props = str(KafkaBroker(stack.config.kafka_config()).properties_path)
    orphan = fake_process("-cp", "x.jar", "kafka.Kafka", props)
    bystander = fake_process(props)  # names the file, but does not run kafka.Kafka with it
    status = stack.status()
    assert status.kafka.running and status.kafka.pids == (orphan.pid,)
    assert not stack.down().kafka.running
    assert orphan.wait(10) is not None
    assert is_alive(bystander.pid)


def test_start_restarts_a_broker_that_lost_its_pid_file(tmp_path, fake_process):
    def no_jars():
        raise AssertionError("jars reached: the orphan was stopped and a fresh start began")

    config = KafkaBrokerConfig(state_dir=tmp_path, port=find_free_port(), controller_port=find_free_port())
    broker = KafkaBroker(config, jars=no_jars)
    orphan = fake_process("kafka.Kafka", str(broker.properties_path))
    with pytest.raises(AssertionError, match="jars reached"):
        broker.start()
    assert orphan.wait(10) is not None


def test_daemons_count_as_up_on_one_read_of_their_pids(tmp_path, monkeypatch):
    """The pid list that reached the expected count is the one returned: a second read
    could miss a pid inside execve() (a CI run failed that way right after all were up)."""
    cluster = _cluster(tmp_path, taskmanagers=2)
    reads = iter([[1, 2], [1, 2, 3], [1, 2]])
    monkeypatch.setattr(FlinkCluster, "pids", lambda self: next(reads))
    waited = []
    monkeypatch.setattr(FlinkCluster, "_wait_ready", lambda self, pids, ready=None: waited.append(pids))
    assert cluster._wait_daemons_up() == [1, 2, 3]
    assert waited == [[1, 2, 3]]
