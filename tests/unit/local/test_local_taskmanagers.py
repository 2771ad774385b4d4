"""Several TaskManagers and a Python-isolated cluster (issue 13): config, config.yaml, env, stack.json."""

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from pyflink_aisp.errors import ConfigError, ServiceError
from pyflink_aisp.local import (
    FlinkClusterConfig,
    LocalStack,
    LocalStackConfig,
    daemon_env,
    render_flink_config,
)
from pyflink_aisp.local._cli import _taskmanagers


def test_taskmanagers_default_to_one_and_reach_the_flink_config(tmp_path):
    assert FlinkClusterConfig(state_dir=tmp_path).taskmanagers == 1
    cfg = LocalStackConfig(state_dir=tmp_path, flink_taskmanagers=3, flink_isolated_python=True)
    flink = cfg.flink_config()
    assert (flink.taskmanagers, flink.isolated_python) == (3, True)


@pytest.mark.parametrize("value", [0, -1, 17, True, "2", 1.5])
def test_bad_taskmanager_counts_are_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="taskmanagers"):
        LocalStackConfig(state_dir=tmp_path, flink_taskmanagers=value)


def test_taskmanagers_from_the_environment(tmp_path):
    cfg = LocalStackConfig.from_env({"AISP_FLINK_TASKMANAGERS": "2"}, state_dir=tmp_path)
    assert cfg.flink_taskmanagers == 2
    with pytest.raises(ConfigError, match="AISP_FLINK_TASKMANAGERS"):
        LocalStackConfig.from_env({"AISP_FLINK_TASKMANAGERS": "two"}, state_dir=tmp_path)


def test_cli_taskmanagers_argument():
    assert _taskmanagers("2") == 2
    for bad in ("0", "17", "x"):
        with pytest.raises(Exception, match=r"1\.\.16"):
            _taskmanagers(bad)


def test_config_yaml_spreads_slots_only_with_several_taskmanagers(tmp_path):
    one = yaml.safe_load(render_flink_config(FlinkClusterConfig(state_dir=tmp_path), {}))
    two = yaml.safe_load(render_flink_config(FlinkClusterConfig(state_dir=tmp_path, taskmanagers=2), {}))
    assert "taskmanager.load-balance.mode" not in one
    assert two["taskmanager.load-balance.mode"] == "slots"


def test_isolated_cluster_names_no_python_in_its_config(tmp_path):
    shared = yaml.safe_load(render_flink_config(FlinkClusterConfig(state_dir=tmp_path), {}))
    isolated = yaml.safe_load(render_flink_config(
        FlinkClusterConfig(state_dir=tmp_path, isolated_python=True), {}))
    assert shared["python.executable"] == sys.executable
    assert "python.executable" not in isolated and "python.client.executable" not in isolated


def test_isolated_daemon_env_drops_the_venv(tmp_path, monkeypatch):
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join([venv_bin, "/usr/bin", "/bin"]))
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    shared = daemon_env(FlinkClusterConfig(state_dir=tmp_path))
    isolated = daemon_env(FlinkClusterConfig(state_dir=tmp_path, isolated_python=True))
    assert shared["PATH"].split(os.pathsep)[0] == venv_bin and shared["PYTHONPATH"] == "/somewhere"
    assert isolated["PATH"].split(os.pathsep) == ["/usr/bin", "/bin"]
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYFLINK_CLIENT_EXECUTABLE"):
        assert name not in isolated
    assert isolated["FLINK_CONF_DIR"] == str(tmp_path / "flink" / "conf")


def test_stack_json_records_the_taskmanagers_of_up(tmp_path):
    stack = LocalStack(LocalStackConfig(state_dir=tmp_path, flink_taskmanagers=2))
    stack._record({})
    recorded = json.loads((tmp_path / "stack.json").read_text())
    assert recorded["flink_taskmanagers"] == 2
    # a later `status` without --taskmanagers expects the cluster `up` started
    assert LocalStack(LocalStackConfig(state_dir=tmp_path)).flink_config().taskmanagers == 2


def test_a_corrupt_taskmanager_count_in_stack_json_is_named(tmp_path):
    (tmp_path / "stack.json").write_text(json.dumps({"kafka_port": 9092, "flink_taskmanagers": "2"}))
    with pytest.raises(ServiceError, match="flink_taskmanagers is not an int"):
        LocalStack(LocalStackConfig(state_dir=tmp_path)).status()
