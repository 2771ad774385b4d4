"""Validation of the frozen configs of the local stack."""

import dataclasses
from pathlib import Path

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.local import FlinkClusterConfig, KafkaBrokerConfig, LocalStackConfig


def test_kafka_defaults(tmp_path):
    cfg = KafkaBrokerConfig(state_dir=tmp_path)
    assert (cfg.port, cfg.controller_port) == (9092, 9093)
    assert cfg.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.kafka_dir == tmp_path / "kafka"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"port": 0},
        {"port": 70000},
        {"port": "9092"},
        {"port": True},
        {"controller_port": -1},
        {"port": 9000, "controller_port": 9000},
        {"heap_mb": 64},
        {"start_timeout_s": 0},
        {"stop_timeout_s": -1},
    ],
)
def test_kafka_rejects(tmp_path, kwargs):
    with pytest.raises(ConfigError):
        KafkaBrokerConfig(state_dir=tmp_path, **kwargs)


def test_configs_are_frozen_and_keyword_only(tmp_path):
    cfg = KafkaBrokerConfig(state_dir=tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        KafkaBrokerConfig(tmp_path)  # type: ignore[misc]


def test_state_dir_is_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert KafkaBrokerConfig(state_dir=Path("rel")).state_dir == tmp_path / "rel"


def test_flink_defaults(tmp_path):
    cfg = FlinkClusterConfig(state_dir=tmp_path)
    assert cfg.rest_url == "http://localhost:8081"
    assert cfg.conf_dir == tmp_path / "flink" / "conf"
    assert (cfg.task_slots, cfg.managed_memory_mb, cfg.taskmanager_memory_mb) == (4, 512, 3072)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rest_port": 0},
        {"rest_port": 7000, "rpc_port": 7000},
        {"task_slots": 0},
        {"taskmanager_memory_mb": 512},
        {"managed_memory_mb": 2000},
        {"jobmanager_memory_mb": 100},
        {"start_timeout_s": 0},
    ],
)
def test_flink_rejects(tmp_path, kwargs):
    with pytest.raises(ConfigError):
        FlinkClusterConfig(state_dir=tmp_path, **kwargs)


def test_flink_extra_config_is_read_only(tmp_path):
    extra = {"a.b": "1"}
    cfg = FlinkClusterConfig(state_dir=tmp_path, extra_config=extra)
    extra["a.b"] = "2"
    assert cfg.extra_config["a.b"] == "1"
    with pytest.raises(TypeError):
        cfg.extra_config["a.b"] = "3"  # type: ignore[index]


def test_stack_ports_must_differ(tmp_path):
    with pytest.raises(ConfigError, match="ports must all differ"):
        LocalStackConfig(state_dir=tmp_path, kafka_port=8081)


def test_stack_validates_service_fields(tmp_path):
    with pytest.raises(ConfigError):
        LocalStackConfig(state_dir=tmp_path, kafka_heap_mb=1)


def test_stack_from_env_then_overrides(tmp_path):
    env = {"AISP_KAFKA_PORT": "19092", "AISP_FLINK_REST_PORT": "18081", "AISP_LOCAL_DIR": str(tmp_path)}
    cfg = LocalStackConfig.from_env(env, kafka_controller_port=19093, flink_rest_port=None)
    assert (cfg.kafka_port, cfg.kafka_controller_port, cfg.flink_rest_port) == (19092, 19093, 18081)
    assert cfg.state_dir == tmp_path
    assert cfg.kafka_config().port == 19092
    assert cfg.flink_config().rest_port == 18081


def test_stack_from_env_bad_int(tmp_path):
    with pytest.raises(ConfigError, match="AISP_KAFKA_PORT"):
        LocalStackConfig.from_env({"AISP_KAFKA_PORT": "abc"}, state_dir=tmp_path)


def test_stack_default_state_dir_is_under_aisp_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AISP_HOME", str(tmp_path))
    assert LocalStackConfig.from_env({}).state_dir == tmp_path / "local"
