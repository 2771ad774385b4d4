"""Deploying jobs to Flink clusters that lack the project venv: ``aisp package``, ``aisp sql``.

:func:`build_package` writes a folder with the job's Python environment archive
(``flink run -pyarch``), the connector jar, the model and the entry point, and
:meth:`JobPackage.run_command` gives the exact ``flink run`` argv.
:func:`sql_client_command` runs Flink's SQL client against the local cluster
with the jars and Python settings a SQL job with the project's functions needs.
"""

from pyflink_aisp.deploy._env import ENV_ARCHIVE_TARGET, EnvArchive, base_python, ensure_env_archive, env_key
from pyflink_aisp.deploy._package import JobPackage, build_package, default_package_dir
from pyflink_aisp.deploy._sql import SqlRun, job_ids, run_sql, sql_client_command

__all__ = [
    "ENV_ARCHIVE_TARGET",
    "EnvArchive",
    "JobPackage",
    "SqlRun",
    "base_python",
    "build_package",
    "default_package_dir",
    "ensure_env_archive",
    "env_key",
    "job_ids",
    "run_sql",
    "sql_client_command",
]
