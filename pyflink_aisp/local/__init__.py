"""Embedded dev stack: a Kafka (KRaft) broker and a Flink standalone cluster on loopback.

Typical use (tests, notebooks)::

    stack = LocalStack(LocalStackConfig(state_dir=tmp, kafka_port=19092, with_flink=False))
    status = stack.up()          # idempotent; waits until the broker answers metadata
    status.bootstrap_servers     # '127.0.0.1:19092'
    stack.down()                 # stops only the pids `up` recorded

Jars (Kafka broker classpath, Flink Kafka connector) come from Maven Central via
the poms in ``connectors/`` and are cached under ``<aisp_home>/jars``
(:func:`pyflink_aisp.jars.ensure_jars`). Jobs load the connector with
``pipeline.jars = pipeline_jars_value()`` and are submitted with
``subprocess.run(flink_run_command("job.py"), env=flink_env())``.

Only the dev stack lives here: the production image's container roles are in
:mod:`pyflink_aisp.deploy`, the failure-injection harness in :mod:`pyflink_aisp.chaos`.
"""

from pyflink_aisp.local._cli import add_local_commands, run_jars_command, run_local_command
from pyflink_aisp.local._flink import FlinkCluster, flink_overview
from pyflink_aisp.local._flink_config import (
    FlinkClusterConfig,
    daemon_env,
    prometheus_settings,
    pyflink_home,
    render_flink_config,
    write_flink_conf_dir,
)
from pyflink_aisp.local._kafka import (
    KafkaBroker,
    KafkaBrokerConfig,
    broker_answers,
    render_kafka_log4j2,
    render_server_properties,
)
from pyflink_aisp.local._procs import find_free_port, port_is_free, wait_until
from pyflink_aisp.local._schema_registry import CCOMPAT_PATH, SchemaRegistryServer, ensure_schema_registry
from pyflink_aisp.local._stack import (
    ENV_VARS,
    LocalStack,
    LocalStackConfig,
    ServiceStatus,
    StackStatus,
    default_state_dir,
    flink_env,
    flink_run_command,
)
from pyflink_aisp.local._workers import orphaned_workers, python_workers, reap_processes

__all__ = [
    "CCOMPAT_PATH",
    "ENV_VARS",
    "FlinkCluster",
    "FlinkClusterConfig",
    "KafkaBroker",
    "KafkaBrokerConfig",
    "LocalStack",
    "LocalStackConfig",
    "SchemaRegistryServer",
    "ServiceStatus",
    "StackStatus",
    "add_local_commands",
    "broker_answers",
    "daemon_env",
    "default_state_dir",
    "ensure_schema_registry",
    "find_free_port",
    "flink_env",
    "flink_overview",
    "flink_run_command",
    "orphaned_workers",
    "port_is_free",
    "prometheus_settings",
    "pyflink_home",
    "python_workers",
    "reap_processes",
    "render_flink_config",
    "render_kafka_log4j2",
    "render_server_properties",
    "run_jars_command",
    "run_local_command",
    "wait_until",
    "write_flink_conf_dir",
]
