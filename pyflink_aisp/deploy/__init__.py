"""Deploying jobs: ``aisp package``, ``aisp sql``, and the production image's container roles.

:func:`build_package` writes a folder with the job's Python environment archive
(``flink run -pyarch``), the connector jar, the model and the entry point, and
:meth:`JobPackage.run_command` gives the exact ``flink run`` argv.
:func:`sql_client_command` runs Flink's SQL client against the local cluster
with the jars and Python settings a SQL job with the project's functions needs.
:func:`role_command` / :func:`configure_role` run one role of ``docker/Dockerfile``'s
image (``aisp container run ROLE``): broker, JobManager, TaskManager, submitter.
"""

from pyflink_aisp.deploy._cli import add_deploy_commands
from pyflink_aisp.deploy._container import (
    ImageRole,
    add_container_commands,
    configure_role,
    container_flink_config,
    container_kafka_config,
    role_command,
    submit_command,
    wait_for_services,
)
from pyflink_aisp.deploy._env import ENV_ARCHIVE_TARGET, EnvArchive, base_python, ensure_env_archive, env_key
from pyflink_aisp.deploy._package import JobPackage, build_package, default_package_dir
from pyflink_aisp.deploy._sql import SqlRun, job_ids, run_sql, sql_client_command

__all__ = [
    "ENV_ARCHIVE_TARGET",
    "EnvArchive",
    "ImageRole",
    "JobPackage",
    "SqlRun",
    "add_container_commands",
    "add_deploy_commands",
    "base_python",
    "build_package",
    "configure_role",
    "container_flink_config",
    "container_kafka_config",
    "default_package_dir",
    "ensure_env_archive",
    "env_key",
    "job_ids",
    "role_command",
    "run_sql",
    "sql_client_command",
    "submit_command",
    "wait_for_services",
]
