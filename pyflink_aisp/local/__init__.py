"""Embedded dev stack: a Kafka (KRaft) broker and a Flink standalone cluster on loopback.

Typical use (tests, notebooks)::

    stack = LocalStack(LocalStackConfig(state_dir=tmp, kafka_port=19092, with_flink=False))
    status = stack.up()          # idempotent; waits until the broker answers metadata
    status.bootstrap_servers     # '127.0.0.1:19092'
    stack.down()                 # stops only the pids `up` recorded

Jars (Kafka broker classpath, Flink Kafka connector) come from Maven Central via
the poms in ``connectors/`` and are cached under ``<aisp_home>/jars``
(:func:`ensure_jars`). Jobs load the connector with
``pipeline.jars = pipeline_jars_value()`` and are submitted with
``subprocess.run(flink_run_command("job.py"), env=flink_env())``.
"""

from pyflink_aisp.local._chaos import JobProgress, job_progress, kill_taskmanager, wait_recovered
from pyflink_aisp.local._chaos_run import FailureEvent, FailurePlan, FailureResult, run_chaos
from pyflink_aisp.local._cli import add_local_commands, run_jars_command, run_local_command
from pyflink_aisp.local._container import (
    ImageRole,
    add_container_commands,
    configure_role,
    container_flink_config,
    container_kafka_config,
    role_command,
    submit_command,
    wait_for_services,
)
from pyflink_aisp.local._flink import FlinkCluster, flink_overview
from pyflink_aisp.local._flink_config import (
    FlinkClusterConfig,
    daemon_env,
    flink_env,
    flink_run_command,
    prometheus_settings,
    pyflink_home,
    render_flink_config,
    write_flink_conf_dir,
)
from pyflink_aisp.local._jars import (
    JarKind,
    connectors_dir,
    ensure_jars,
    flink_connector_jars,
    pipeline_jars_value,
    require_tools,
)
from pyflink_aisp.local._kafka import (
    KafkaBroker,
    KafkaBrokerConfig,
    broker_answers,
    render_kafka_log4j2,
    render_server_properties,
)
from pyflink_aisp.local._procs import find_free_port, port_is_free
from pyflink_aisp.local._stack import (
    ENV_VARS,
    LocalStack,
    LocalStackConfig,
    ServiceStatus,
    StackStatus,
    default_state_dir,
)
from pyflink_aisp.local._workers import orphaned_workers, python_workers, reap_processes

__all__ = [
    "ENV_VARS",
    "FailureEvent",
    "FailurePlan",
    "FailureResult",
    "FlinkCluster",
    "FlinkClusterConfig",
    "ImageRole",
    "JarKind",
    "JobProgress",
    "KafkaBroker",
    "KafkaBrokerConfig",
    "LocalStack",
    "LocalStackConfig",
    "ServiceStatus",
    "StackStatus",
    "add_container_commands",
    "add_local_commands",
    "broker_answers",
    "configure_role",
    "connectors_dir",
    "container_flink_config",
    "container_kafka_config",
    "daemon_env",
    "default_state_dir",
    "ensure_jars",
    "find_free_port",
    "flink_connector_jars",
    "flink_env",
    "flink_overview",
    "flink_run_command",
    "job_progress",
    "kill_taskmanager",
    "orphaned_workers",
    "pipeline_jars_value",
    "port_is_free",
    "prometheus_settings",
    "pyflink_home",
    "python_workers",
    "reap_processes",
    "render_flink_config",
    "render_kafka_log4j2",
    "render_server_properties",
    "require_tools",
    "role_command",
    "run_chaos",
    "run_jars_command",
    "run_local_command",
    "submit_command",
    "wait_for_services",
    "wait_recovered",
    "write_flink_conf_dir",
]
