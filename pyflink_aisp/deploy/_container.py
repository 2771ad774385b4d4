"""Container roles of the pyflink-aisp image: the same config code as the local stack.

``docker/entrypoint.sh ROLE`` runs ``aisp container run ROLE``; ``aisp container
config ROLE`` only writes the role's config (what a test runs on this host). Each
role is configured from ``AISP_*`` environment variables (:data:`CONTAINER_ENV`):

- ``jobmanager`` / ``taskmanager``: :func:`~pyflink_aisp.local.write_flink_conf_dir`
  (the local cluster's ``config.yaml``, with container host names, ``0.0.0.0``
  binds and shared checkpoint folders), then PyFlink's ``bin/jobmanager.sh`` /
  ``taskmanager.sh start-foreground``.
- ``kafka``: :func:`~pyflink_aisp.local.render_server_properties` (KRaft, single
  node, advertised under the service name) and the broker in the foreground.
- ``submit``: waits for the JobManager (and its TaskManagers) and the broker, then
  ``flink run`` of the main job (``AISP_JOB``, ``AISP_JOB_ARGS``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import AispError, ConfigError, ServiceError
from pyflink_aisp.local import (
    FlinkClusterConfig,
    KafkaBroker,
    KafkaBrokerConfig,
    broker_answers,
    daemon_env,
    flink_env,
    flink_overview,
    pyflink_home,
    write_flink_conf_dir,
)

__all__ = [
    "CONTAINER_ENV",
    "ImageRole",
    "add_container_commands",
    "configure_role",
    "container_flink_config",
    "container_kafka_config",
    "role_command",
    "submit_command",
    "wait_for_services",
]


class ImageRole(StrEnum):
    """What one container of the image runs."""

    JOBMANAGER = "jobmanager"
    TASKMANAGER = "taskmanager"
    KAFKA = "kafka"
    SUBMIT = "submit"


#: ``AISP_*`` variables read by the roles, with their defaults ("" = computed or off).
CONTAINER_ENV: Mapping[str, str] = {
    "AISP_STATE_DIR": "/opt/aisp/state",  # configs, logs, Kafka data
    "AISP_SHARED_DIR": "/opt/aisp/shared",  # checkpoints + savepoints: one volume for all Flink containers
    "AISP_BIND_HOST": "0.0.0.0",
    "AISP_JOBMANAGER_HOST": "jobmanager",
    "AISP_TASKMANAGER_HOST": "",  # default: this container's IP address
    "AISP_FLINK_REST_PORT": "8081",
    "AISP_FLINK_RPC_PORT": "6123",
    "AISP_TASK_SLOTS": "2",
    "AISP_JOBMANAGER_MEMORY_MB": "1024",
    "AISP_TASKMANAGER_MEMORY_MB": "3072",
    "AISP_PROMETHEUS_PORT": "9249",  # "off": no reporter
    "AISP_KAFKA_HOST": "kafka",  # the broker's advertised host name
    "AISP_KAFKA_PORT": "9092",
    "AISP_KAFKA_CONTROLLER_PORT": "9093",
    "AISP_KAFKA_PARTITIONS": "2",
    "AISP_KAFKA_HEAP_MB": "512",
    "AISP_EXPECT_TASKMANAGERS": "2",  # submit: wait for this many registered TaskManagers
    "AISP_WAIT_TIMEOUT_S": "300",
    "AISP_JOB": "/opt/aisp/jobs/review_sentiment.py",
    "AISP_JOB_ARGS": "",
}


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(name) or CONTAINER_ENV[name]


def _int(env: Mapping[str, str], name: str) -> int:
    raw = _get(env, name)
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not an integer") from exc


def _role(role: ImageRole | str) -> ImageRole:
    try:
        return ImageRole(role)
    except ValueError as exc:
        choices = ", ".join(r.value for r in ImageRole)
        raise ConfigError(f"unknown container role {role!r}; expected one of {choices}") from exc


def _own_address() -> str:
    """This container's IP address (what the JobManager connects back to)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def container_flink_config(environ: Mapping[str, str] | None = None) -> FlinkClusterConfig:
    """The Flink settings of a JobManager / TaskManager container.

    Args:
        environ: Variables (default ``os.environ``); see :data:`CONTAINER_ENV`.

    Raises:
        ConfigError: A variable is not an integer, or the settings are invalid.
    """
    env = os.environ if environ is None else environ
    shared = Path(_get(env, "AISP_SHARED_DIR"))
    prometheus = _get(env, "AISP_PROMETHEUS_PORT")
    return FlinkClusterConfig(
        state_dir=Path(_get(env, "AISP_STATE_DIR")),
        rest_port=_int(env, "AISP_FLINK_REST_PORT"),
        rpc_port=_int(env, "AISP_FLINK_RPC_PORT"),
        task_slots=_int(env, "AISP_TASK_SLOTS"),
        jobmanager_memory_mb=_int(env, "AISP_JOBMANAGER_MEMORY_MB"),
        taskmanager_memory_mb=_int(env, "AISP_TASKMANAGER_MEMORY_MB"),
        jobmanager_host=_get(env, "AISP_JOBMANAGER_HOST"),
        taskmanager_host=env.get("AISP_TASKMANAGER_HOST") or _own_address(),
        bind_host=_get(env, "AISP_BIND_HOST"),
        prometheus_port=None if prometheus == "off" else _int(env, "AISP_PROMETHEUS_PORT"),
        prometheus_port_count=1,  # one daemon per container
        python_executable=sys.executable,
        extra_config={
            "execution.checkpointing.dir": (shared / "checkpoints").as_uri(),
            "execution.checkpointing.savepoint-dir": (shared / "savepoints").as_uri(),
        },
    )


def container_kafka_config(environ: Mapping[str, str] | None = None) -> KafkaBrokerConfig:
    """The broker settings of the Kafka container (KRaft, single node).

    Raises:
        ConfigError: A variable is not an integer, or the settings are invalid.
    """
    env = os.environ if environ is None else environ
    return KafkaBrokerConfig(
        state_dir=Path(_get(env, "AISP_STATE_DIR")),
        port=_int(env, "AISP_KAFKA_PORT"),
        controller_port=_int(env, "AISP_KAFKA_CONTROLLER_PORT"),
        heap_mb=_int(env, "AISP_KAFKA_HEAP_MB"),
        listen_host=_get(env, "AISP_BIND_HOST"),
        advertised_host=_get(env, "AISP_KAFKA_HOST"),
        partitions=_int(env, "AISP_KAFKA_PARTITIONS"),
    )


def configure_role(role: ImageRole | str, environ: Mapping[str, str] | None = None) -> Path:
    """Write the role's config files; start nothing.

    Returns:
        The Flink conf folder (``jobmanager``, ``taskmanager``, ``submit``) or the
        broker's ``server.properties`` (``kafka``).

    Raises:
        ConfigError: Unknown role or invalid variables.
        EnvironmentSetupError: PyFlink (or its Prometheus plugin) is missing.
    """
    if _role(role) is ImageRole.KAFKA:
        broker = KafkaBroker(container_kafka_config(environ))
        broker.write_config_files(console=True)
        return broker.properties_path
    return write_flink_conf_dir(container_flink_config(environ))


def submit_command(environ: Mapping[str, str] | None = None) -> list[str]:
    """argv of the job submitter: ``flink run -m <jobmanager>:<rest> ... -py $AISP_JOB $AISP_JOB_ARGS``.

    Raises:
        ConfigError: Invalid variables, or ``AISP_JOB_ARGS`` is not shell-quoted text.
    """
    env = os.environ if environ is None else environ
    config = container_flink_config(env)
    try:
        job_args = shlex.split(_get(env, "AISP_JOB_ARGS"))
    except ValueError as exc:
        raise ConfigError(f"AISP_JOB_ARGS is not shell-quoted text: {exc}") from exc
    py = config.python_executable
    return [
        str(pyflink_home() / "bin" / "flink"), "run", "-m", f"{config.jobmanager_host}:{config.rest_port}",
        "-pyexec", py, "-pyclientexec", py, "-py", _get(env, "AISP_JOB"), *job_args,
    ]  # fmt: skip


def wait_for_services(
    environ: Mapping[str, str] | None = None,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait until the broker answers and the JobManager lists ``AISP_EXPECT_TASKMANAGERS``.

    Raises:
        ServiceError: Not ready within ``AISP_WAIT_TIMEOUT_S`` (says which service).
    """
    env = os.environ if environ is None else environ
    config = container_flink_config(env)
    broker = f"{_get(env, 'AISP_KAFKA_HOST')}:{_get(env, 'AISP_KAFKA_PORT')}"
    bootstrap = env.get("AISP_KAFKA_BOOTSTRAP") or broker
    want = _int(env, "AISP_EXPECT_TASKMANAGERS")
    rest = f"http://{config.jobmanager_host}:{config.rest_port}"
    end = clock() + _int(env, "AISP_WAIT_TIMEOUT_S")
    checks = {
        f"Kafka at {bootstrap}": lambda: broker_answers(bootstrap, 2.0),
        f"{want} TaskManager(s) at {rest}": lambda: _taskmanagers(rest) >= want,
    }
    for what, ready in checks.items():
        while not ready():
            if clock() >= end:
                raise ServiceError(f"{what} not ready within {_get(env, 'AISP_WAIT_TIMEOUT_S')} s")
            sleep(2.0)


def _taskmanagers(rest_url: str) -> int:
    return int((flink_overview(rest_url) or {}).get("taskmanagers", 0))


def role_command(
    role: ImageRole | str, environ: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """Configure ``role`` and return the argv and environment to exec as the container's process.

    ``submit`` also waits for the services first (:func:`wait_for_services`).

    Raises:
        ConfigError: Unknown role or invalid variables.
        EnvironmentSetupError: PyFlink, Java or the broker jars are missing.
        ServiceError: ``submit``: the services did not come up.
    """
    chosen = _role(role)
    env = dict(os.environ if environ is None else environ)
    if chosen is ImageRole.KAFKA:
        return KafkaBroker(container_kafka_config(env)).foreground_command(), env
    config = container_flink_config(env)
    write_flink_conf_dir(config)
    if chosen is ImageRole.SUBMIT:
        wait_for_services(env)
        return submit_command(env), {**env, **flink_env(config)}
    script = pyflink_home() / "bin" / f"{chosen.value}.sh"
    return ["bash", str(script), "start-foreground"], {**env, **daemon_env(config)}


def add_container_commands(subparsers: Any) -> None:
    """Add ``container config|run ROLE`` (the image's entrypoint) to the ``aisp`` parser."""
    container = subparsers.add_parser(
        "container", help="roles of the pyflink-aisp image (docker/entrypoint.sh): config or run one"
    )
    actions = container.add_subparsers(dest="container_command", required=True)
    roles = [r.value for r in ImageRole]
    config = actions.add_parser("config", help="write the role's config from AISP_* variables; start nothing")
    config.add_argument("role", choices=roles)
    config.set_defaults(func=_run_config)
    run = actions.add_parser("run", help="configure the role, then exec its process in the foreground")
    run.add_argument("role", choices=roles)
    run.set_defaults(func=_run_role)


def _run_config(args: argparse.Namespace) -> int:
    try:
        path = configure_role(args.role)
    except AispError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.role}: wrote {path}")
    return 0


def _run_role(args: argparse.Namespace) -> int:
    try:
        argv, env = role_command(args.role)
    except AispError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.role}: exec {shlex.join(argv)}", flush=True)
    os.execvpe(argv[0], argv, env)  # replaces this process (the container's PID 1 child)
