"""The public API of pyflink_aisp.local: __all__ is complete and importable."""

import importlib

import pytest

import pyflink_aisp.local as local

MODULES = ["_cli", "_flink", "_flink_config", "_kafka", "_procs", "_stack", "_workers"]


def test_all_names_exist_and_are_sorted():
    assert local.__all__ == sorted(local.__all__)
    for name in local.__all__:
        assert hasattr(local, name), name


@pytest.mark.parametrize("module", MODULES)
def test_private_module_all_names_exist(module):
    mod = importlib.import_module(f"pyflink_aisp.local.{module}")
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_init_reexports_the_stack_api():
    for name in [
        "LocalStack",
        "LocalStackConfig",
        "StackStatus",
        "flink_run_command",
        "flink_env",
        "add_local_commands",
        "KafkaBrokerConfig",
    ]:
        assert name in local.__all__


def test_only_the_dev_stack_lives_here():
    """Container roles are deploy's, the chaos harness chaos's, the jar resolver the ground floor's."""
    for name in ["ImageRole", "role_command", "kill_taskmanager", "run_chaos", "ensure_jars", "JarKind"]:
        assert name not in local.__all__, name
