"""``aisp sql [FILE]``: Flink's SQL client against the local cluster, in one command.

PyFlink's ``bin/sql-client.sh`` needs, beside what the wheel ships, the SQL
gateway jar (found in ``FLINK_OPT_DIR``), the Kafka connector and flink-python
jars (``-j``), the Python of the UDF workers and of the client (``-pyexec``,
``-pyclientexec``: a venv with this package) and the cluster's ``FLINK_CONF_DIR``.
:func:`sql_client_command` puts these together: the gateway jar comes from the
jar cache (``connectors/flink-sql-gateway.pom.xml``, like the other jars) and
``FLINK_OPT_DIR`` points at ``<state_dir>/flink/sql-opt/``, a folder of links to
the wheel's ``opt/`` jars and the gateway jar, so nothing is written into
site-packages.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyflink_aisp.errors import ConfigError, EnvironmentSetupError
from pyflink_aisp.jars import JarKind, ensure_jars, flink_connector_jars
from pyflink_aisp.local import LocalStack, pyflink_home
from pyflink_aisp.pipeline import MODELS_ENV, load_registry

__all__ = ["SqlRun", "job_ids", "run_sql", "sql_client_command"]

_JOB_ID = re.compile(r"Job ID: ([0-9a-f]{32})")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _opt_dir(stack: LocalStack) -> Path:
    """``<state_dir>/flink/sql-opt``: links to the wheel's ``opt/*.jar`` and the gateway jar
    (links already right are left alone, so concurrent calls do not pull them away)."""
    folder = stack.flink_config().flink_dir / "sql-opt"
    folder.mkdir(parents=True, exist_ok=True)
    jars = {jar.name: jar for jar in [*sorted((pyflink_home() / "opt").glob("*.jar")),
                                      *ensure_jars(JarKind.SQL_GATEWAY)]}  # fmt: skip
    for link in folder.glob("*.jar"):
        if link.name not in jars:
            link.unlink(missing_ok=True)
    for name, jar in jars.items():
        link = folder / name
        if link.is_symlink() and link.resolve() == jar.resolve():
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(jar)
    return folder


def sql_client_command(
    stack: LocalStack, file: Path | None = None, *, python: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of ``sql-client.sh`` aimed at the stack's cluster.

    Args:
        stack: The local stack (its Flink cluster must run).
        file: A SQL script to run (``-f``); None for an interactive session.
        python: Python of the UDF workers and the client; default this interpreter.

    Returns:
        ``(argv, env)``.

    Raises:
        ConfigError: ``file`` is not a readable file.
        EnvironmentSetupError: The cluster does not run, or a jar cannot be resolved.
    """
    if file is not None and not (Path(file).is_file() and os.access(file, os.R_OK)):
        raise ConfigError(f"SQL file {file} is not a readable file")
    if not stack.status().flink.running:
        raise EnvironmentSetupError("the local Flink cluster is not running: start it with `aisp local up`")
    py = python or sys.executable
    env = stack.flink_env()
    env["FLINK_OPT_DIR"] = str(_opt_dir(stack))
    python_jar = next(iter(sorted(Path(env["FLINK_OPT_DIR"]).glob("flink-python-*.jar"))), None)
    if python_jar is None:
        raise EnvironmentSetupError(f"flink-python jar missing in {pyflink_home() / 'opt'}: "
                                    "reinstall apache-flink")  # fmt: skip
    argv = [str(pyflink_home() / "bin" / "sql-client.sh")]
    for jar in [*flink_connector_jars(), python_jar]:
        argv += ["-j", str(jar)]
    argv += ["-pyexec", py, "-pyclientexec", py]
    if file is not None:
        argv += ["-f", str(Path(file).absolute())]
    else:  # the session's history beside the cluster's logs, not in ~/.flink-sql-history
        argv += ["-hist", str(stack.flink_config().flink_dir / "sql-history")]
    return argv, env


def job_ids(output: str) -> list[str]:
    """The ids of the jobs the SQL client reports as submitted (``Job ID: <32 hex>``)."""
    return _JOB_ID.findall(output)


@dataclass(frozen=True, kw_only=True)
class SqlRun:
    """Result of :func:`run_sql`.

    Attributes:
        returncode: The SQL client's exit code.
        output: Its stdout and stderr (empty for an interactive session).
    """

    returncode: int
    output: str

    @property
    def job_ids(self) -> list[str]:
        """Ids of the jobs the client submitted, in order."""
        return job_ids(self.output)

    @property
    def ok(self) -> bool:
        """The client exited 0 and reported no ``[ERROR]`` (it exits 0 after a failed statement)."""
        return self.returncode == 0 and self.error is None

    @property
    def error(self) -> str | None:
        """The client's first ``[ERROR]`` and its reason, as one line; None if it reported none."""
        lines = _ANSI.sub("", self.output).splitlines()
        for i, line in enumerate(lines):
            if "[ERROR]" in line:
                reason = next((ln.strip() for ln in lines[i + 1:] if ln.strip()), "")
                return f"{line.split('[ERROR]', 1)[1].strip()} {reason}".strip()
        return None


def run_sql(stack: LocalStack, file: Path | None, *, extra_args: Sequence[str] = (),
            echo: bool = True, timeout_s: float | None = None,
            models: Path | None = None) -> SqlRun:  # fmt: skip
    """Run the SQL client: a script (output captured, echoed) or an interactive session.

    Args:
        stack: The local stack.
        file: The script; None: interactive (stdin/stdout of this process).
        extra_args: More ``sql-client.sh`` arguments (e.g. ``-D key=value``).
        echo: Print the client's output as it comes (script mode).
        timeout_s: Longest run of a script.
        models: A model registry file: read here first (a bad entry fails in one line before the
            client starts), then named by ``$AISP_MODELS`` for the client, which resolves
            ``pyflink_aisp.pipeline.registry.NAME`` functions from it.

    Raises:
        As :func:`sql_client_command`; ConfigError: the registry is refused.
    """
    argv, env = sql_client_command(stack, file)
    if models is not None:
        load_registry(models)
        env[MODELS_ENV] = str(Path(models).resolve())
    argv += list(extra_args)
    if file is None:
        return SqlRun(returncode=subprocess.call(argv, env=env), output="")
    lines = []
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL) as proc:  # fmt: skip
        for line in proc.stdout or ():
            lines.append(line)
            if echo:
                print(line, end="", flush=True)
        code = proc.wait(timeout=timeout_s)
    return SqlRun(returncode=code, output="".join(lines))
