"""Settings of the local Flink standalone cluster: config, ``config.yaml``, env, ``flink run`` argv.

apache-flink from PyPI ships a full Flink distribution inside the ``pyflink``
package (``bin/``, ``conf/``, ``lib/``, ``opt/``). Its ``bin/config.sh`` takes
FLINK_HOME from the script's own folder, so the scripts run as they are; the
environment built here only points ``FLINK_CONF_DIR``, ``FLINK_LOG_DIR`` and
``FLINK_PID_DIR`` at ``<state_dir>/flink/{conf,log,pid}`` so nothing is written
into site-packages.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from pyflink_aisp.errors import ConfigError, EnvironmentSetupError

__all__ = [
    "PROMETHEUS_FACTORY",
    "FlinkClusterConfig",
    "cluster_env",
    "cluster_run_command",
    "daemon_env",
    "prometheus_settings",
    "pyflink_home",
    "render_flink_config",
    "write_flink_conf_dir",
    "write_flink_lib_dir",
]

IDENT = "aisp"  # FLINK_IDENT_STRING: names the daemons' pid and log files
MAX_TASKMANAGERS = 16  # one host: each TaskManager is a JVM of taskmanager_memory_mb
_PYTHON_ENV_VARS = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYFLINK_CLIENT_EXECUTABLE")
#: TaskManager metaspace (MiB) when its process has room (at least _BIG_METASPACE_FROM_MB).
_TASKMANAGER_METASPACE_MB = 768
_BIG_METASPACE_FROM_MB = 2560
#: Loaded by the TaskManager's class loader, not each job's (Flink docs, "Debugging Classloading":
#: ``classloader.parent-first-patterns.additional``): the packages of the flink-python jar that
#: are not ``org.apache.flink.`` (parent-first by default). See :func:`write_flink_lib_dir`.
PARENT_FIRST_PATTERNS = ("org.apache.beam.", "pemja.", "org.kohsuke.args4j.")
_HEARTBEAT_INTERVAL_MS = 2000  # see render_flink_config (Flink docs: "heartbeat.interval")
_STANDALONE_STARTUP_MS = 5000  # see render_flink_config ("resourcemanager.standalone.start-up-time")


def pyflink_home() -> Path:
    """The installed ``pyflink`` package folder (the Flink distribution: bin/, conf/, lib/).

    Raises:
        EnvironmentSetupError: If apache-flink is not installed or lacks ``bin/flink``.
    """
    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentSetupError("pyflink not importable: `pip install apache-flink==2.3.0`")
    home = Path(next(iter(spec.submodule_search_locations)))
    if not (home / "bin" / "flink").is_file():
        raise EnvironmentSetupError(f"{home}/bin/flink missing: reinstall apache-flink")
    return home


def _positive_int(name: str, value: object, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class FlinkClusterConfig:
    """Where and how the local Flink standalone cluster runs.

    Attributes:
        state_dir: Stack state folder; Flink uses ``<state_dir>/flink``.
        rest_port: REST API / web UI port (``rest.port``); jobs are submitted here.
        rpc_port: JobManager RPC port (``jobmanager.rpc.port``).
        task_slots: ``taskmanager.numberOfTaskSlots``.
        taskmanagers: TaskManager processes to start on this host (the ``workers``
            file lists ``localhost`` once per TaskManager); with more than one,
            ``taskmanager.load-balance.mode: slots`` spreads a job's slots over them.
        jobmanager_memory_mb: ``jobmanager.memory.process.size``, MiB.
        taskmanager_memory_mb: ``taskmanager.memory.process.size``, MiB.
        managed_memory_mb: ``taskmanager.memory.managed.size``, MiB. Python
            operators reserve their worker memory from managed memory (consumer
            weight PYTHON), shared by the slots; 512 MiB leaves 128 MiB per slot.
        python_executable: Python of the UDF workers and the job client
            (``python.executable``, ``python.client.executable``); default: this
            interpreter, so workers see the same venv.
        jobmanager_host: Address of the JobManager (``jobmanager.rpc.address``,
            ``rest.address``): ``localhost`` here, the JobManager's host name in a
            container network.
        taskmanager_host: Address a TaskManager announces (``taskmanager.host``).
        bind_host: Interface the daemons listen on (``*.bind-host``,
            ``rest.bind-address``): ``localhost`` here, ``0.0.0.0`` in a container.
        prometheus_port: First port of Flink's Prometheus metrics reporter
            (``metrics.reporter.prom.*``, PyFlink's ``plugins/metrics-prometheus``);
            None: no reporter.
        prometheus_port_count: Ports ``prometheus_port .. + count - 1`` form the
            reporter's range: each daemon on a host takes the first free one (2 on
            the local stack: JobManager, TaskManager; 1 in a container).
        isolated_python: Start the daemons without this client's Python: PATH
            without the venv's ``bin/``, no ``PYTHONPATH``/``VIRTUAL_ENV``/``PYTHONHOME``,
            and no ``python.executable`` in ``config.yaml``, as on a cluster whose
            TaskManagers have no project venv (jobs bring their own, ``aisp package``).
        extra_config: More ``config.yaml`` entries (flat keys), applied last.
        start_timeout_s: How long ``start`` waits for a registered TaskManager.
        stop_timeout_s: Grace period after SIGTERM before SIGKILL, seconds.

    Raises:
        ConfigError: Invalid port, memory sizes that cannot hold the managed
            memory, or non-positive values.
    """

    state_dir: Path
    rest_port: int = 8081
    rpc_port: int = 6123
    task_slots: int = 4
    taskmanagers: int = 1
    jobmanager_memory_mb: int = 1024
    taskmanager_memory_mb: int = 3072
    managed_memory_mb: int = 512
    python_executable: str = field(default_factory=lambda: sys.executable)
    jobmanager_host: str = "localhost"
    taskmanager_host: str = "localhost"
    bind_host: str = "localhost"
    prometheus_port: int | None = None
    prometheus_port_count: int = 2
    isolated_python: bool = False
    extra_config: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 90.0
    stop_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", Path(self.state_dir).expanduser().absolute())
        object.__setattr__(self, "extra_config", MappingProxyType(dict(self.extra_config)))
        for name in ("rest_port", "rpc_port"):
            _positive_int(name, getattr(self, name))
            if getattr(self, name) > 65535:
                raise ConfigError(f"{name} must be <= 65535, got {getattr(self, name)}")
        if self.rest_port == self.rpc_port:
            raise ConfigError(f"rest_port and rpc_port must differ (both {self.rest_port})")
        _positive_int("task_slots", self.task_slots)
        _positive_int("taskmanagers", self.taskmanagers)
        if self.taskmanagers > MAX_TASKMANAGERS:
            raise ConfigError(f"taskmanagers must be <= {MAX_TASKMANAGERS}, got {self.taskmanagers}")
        _positive_int("jobmanager_memory_mb", self.jobmanager_memory_mb, 768)
        _positive_int("taskmanager_memory_mb", self.taskmanager_memory_mb, 1024)
        _positive_int("managed_memory_mb", self.managed_memory_mb, 0)
        if self.managed_memory_mb > self.taskmanager_memory_mb // 2:
            raise ConfigError(
                f"managed_memory_mb ({self.managed_memory_mb}) must be at most half of "
                f"taskmanager_memory_mb ({self.taskmanager_memory_mb})"
            )
        if self.start_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise ConfigError("start_timeout_s and stop_timeout_s must be > 0")
        for name in ("jobmanager_host", "taskmanager_host", "bind_host"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or any(c.isspace() for c in value):
                raise ConfigError(f"{name} must be a host name without spaces, got {value!r}")
        self._check_prometheus()

    def _check_prometheus(self) -> None:
        _positive_int("prometheus_port_count", self.prometheus_port_count)
        if self.prometheus_port is None:
            return
        _positive_int("prometheus_port", self.prometheus_port)
        last = self.prometheus_port + self.prometheus_port_count - 1
        if last > 65535:
            raise ConfigError(f"prometheus ports {self.prometheus_port}..{last} must be <= 65535")
        clash = {self.rest_port, self.rpc_port} & set(range(self.prometheus_port, last + 1))
        if clash:
            raise ConfigError(
                f"prometheus ports {self.prometheus_port}..{last} overlap the REST/RPC port {min(clash)}"
            )

    @property
    def prometheus_ports(self) -> tuple[int, ...]:
        """The reporter's ports (empty without a reporter)."""
        if self.prometheus_port is None:
            return ()
        return tuple(range(self.prometheus_port, self.prometheus_port + self.prometheus_port_count))

    @property
    def flink_dir(self) -> Path:
        """``<state_dir>/flink``."""
        return self.state_dir / "flink"

    @property
    def conf_dir(self) -> Path:
        """``FLINK_CONF_DIR``: ``<state_dir>/flink/conf``."""
        return self.flink_dir / "conf"

    @property
    def lib_dir(self) -> Path:
        """``FLINK_LIB_DIR`` of the daemons: ``<state_dir>/flink/lib`` (see :func:`write_flink_lib_dir`)."""
        return self.flink_dir / "lib"

    @property
    def log_dir(self) -> Path:
        """``FLINK_LOG_DIR``: ``<state_dir>/flink/log``."""
        return self.flink_dir / "log"

    @property
    def pid_dir(self) -> Path:
        """``FLINK_PID_DIR``: ``<state_dir>/flink/pid``."""
        return self.flink_dir / "pid"

    @property
    def rest_url(self) -> str:
        """``http://localhost:<rest_port>``."""
        return f"http://localhost:{self.rest_port}"


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def render_flink_config(config: FlinkClusterConfig, base: Mapping[str, Any]) -> str:
    """The cluster's ``config.yaml``: PyFlink's shipped config with our overrides, flat keys.

    Args:
        config: Cluster settings.
        base: Parsed ``<pyflink>/conf/config.yaml`` (nested or flat).

    Returns:
        YAML text with one ``dotted.key: value`` per line.
    """
    flat = _flatten(base)
    checkpoints = (config.flink_dir / "checkpoints").as_uri()
    flat.update(
        {
            "jobmanager.rpc.address": config.jobmanager_host,
            "jobmanager.rpc.port": config.rpc_port,
            "jobmanager.bind-host": config.bind_host,
            "taskmanager.bind-host": config.bind_host,
            "taskmanager.host": config.taskmanager_host,
            "rest.address": config.jobmanager_host,
            "rest.bind-address": config.bind_host,
            "rest.port": config.rest_port,
            "taskmanager.numberOfTaskSlots": config.task_slots,
            "jobmanager.memory.process.size": f"{config.jobmanager_memory_mb}m",
            "taskmanager.memory.process.size": f"{config.taskmanager_memory_mb}m",
            "taskmanager.memory.managed.size": f"{config.managed_memory_mb}m",
            "parallelism.default": 1,
            "python.executable": config.python_executable,
            "python.client.executable": config.python_executable,
            "execution.checkpointing.dir": checkpoints,
            "execution.checkpointing.savepoint-dir": (config.flink_dir / "savepoints").as_uri(),
            "env.log.dir": str(config.log_dir),
            "env.pid.dir": str(config.pid_dir),
            # A TaskManager killed with -9 refuses the next heartbeat RPCs: after
            # heartbeat.rpc-failure-threshold (2) of them the JobManager restarts the job.
            # Flink's 10 s interval made that 15 s of a kill's ~25 s recovery here; 2 s cuts it
            # to ~4 s (heartbeat.timeout, for a hung TaskManager, stays 50 s).
            "heartbeat.interval": _HEARTBEAT_INTERVAL_MS,
            # A standalone ResourceManager waits for TaskManagers only during its start-up
            # period (default: slot.request.timeout, 5 min); after it, a slot request no
            # registered TaskManager can serve fails at once (NoResourceAvailableException), so
            # each restart while a lost TaskManager is replaced is one more failure. The local
            # stack is a long-running cluster from its first job on (the chaos bench and the
            # failure tests meet what users' clusters do).
            "resourcemanager.standalone.start-up-time": _STANDALONE_STARTUP_MS,
        }
    )
    flat.update(prometheus_settings(config))
    # the cluster's default restart strategy is the jobs' own (a SQL statement or a job that sets none
    # gets the same bounded exponential delay: decision record 5); imported here, as `aisp local`
    # commands need neither pandas nor the pipeline's options otherwise
    from pyflink_aisp.pipeline import restart_settings

    flat.update(restart_settings(None))
    if config.taskmanager_memory_mb >= _BIG_METASPACE_FROM_MB:
        # every PyFlink job loads the connector and flink-python classes in its own user-code
        # class loader, and not all of it is freed when the job ends: Flink's default 256 MiB
        # metaspace ran out on one TaskManager after a dozen jobs ("OutOfMemoryError: Metaspace",
        # the TaskManager shuts down and the next jobs get no slots)
        flat["taskmanager.memory.jvm-metaspace.size"] = f"{_TASKMANAGER_METASPACE_MB}m"
    # Beam's classes from the daemons' lib/ (write_flink_lib_dir), not from each job's copy
    flat["classloader.parent-first-patterns.additional"] = list(PARENT_FIRST_PATTERNS)
    if config.taskmanagers > 1:
        flat["taskmanager.load-balance.mode"] = "slots"
    if config.isolated_python:
        for key in ("python.executable", "python.client.executable"):
            flat.pop(key, None)
    flat.update(config.extra_config)
    header = "# Written by pyflink_aisp.local from pyflink/conf/config.yaml; rewritten on `up`.\n"
    return header + yaml.safe_dump(flat, sort_keys=False, default_flow_style=False, width=100000)


#: Factory of Flink's Prometheus reporter (jar in ``plugins/metrics-prometheus``), from
#: https://nightlies.apache.org/flink/flink-docs-release-2.0/docs/deployment/metric_reporters/#prometheus
PROMETHEUS_FACTORY = "org.apache.flink.metrics.prometheus.PrometheusReporterFactory"


def prometheus_settings(config: FlinkClusterConfig) -> dict[str, str]:
    """``config.yaml`` entries of the Prometheus reporter ``prom`` ({} when it is off).

    Every daemon serves ``GET http://<host>:<port>/metrics`` (text exposition
    format) on the first free port of the range; user metric groups such as the
    operators' ``aisp`` group become part of the metric name
    (``flink_taskmanager_job_task_operator_aisp_recordsIn``).
    """
    ports = config.prometheus_ports
    if not ports:
        return {}
    port = str(ports[0]) if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"
    return {"metrics.reporter.prom.factory.class": PROMETHEUS_FACTORY, "metrics.reporter.prom.port": port}


def write_flink_conf_dir(config: FlinkClusterConfig) -> Path:
    """Write ``config.conf_dir``: PyFlink's ``conf/`` files plus our ``config.yaml``.

    Also creates the log and pid folders and the daemons' ``lib/`` (:func:`write_flink_lib_dir`).
    Used by the local cluster and by the container entrypoint (``docker/entrypoint.sh``), so both
    run the same config.

    Returns:
        The conf folder (``FLINK_CONF_DIR``).

    Raises:
        EnvironmentSetupError: PyFlink is missing, or the reporter is on and
            PyFlink's ``plugins/metrics-prometheus`` holds no jar.
    """
    source = pyflink_home() / "conf"
    if config.prometheus_port is not None:
        _require_prometheus_plugin()
    conf = config.conf_dir
    conf.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.name != "config.yaml":
            shutil.copy2(item, conf / item.name)
    base = yaml.safe_load((source / "config.yaml").read_text(encoding="utf-8")) or {}
    (conf / "config.yaml").write_text(render_flink_config(config, base), "utf-8")
    write_flink_lib_dir(config)
    (conf / "masters").write_text(f"{config.jobmanager_host}:{config.rest_port}\n", "utf-8")
    (conf / "workers").write_text(f"{config.taskmanager_host}\n" * config.taskmanagers, "utf-8")
    for folder in (config.log_dir, config.pid_dir):
        folder.mkdir(parents=True, exist_ok=True)
    return conf


def write_flink_lib_dir(config: FlinkClusterConfig) -> Path:
    """Write ``config.lib_dir``: links to PyFlink's ``lib/*.jar`` and ``opt/flink-python-*.jar``.

    The daemons start with it as ``FLINK_LIB_DIR`` (:func:`daemon_env`), so the flink-python
    jar (Beam's portability runner and its vendored gRPC/Netty) is on the TaskManager's own
    class path and, with ``org.apache.beam.`` parent-first (:data:`PARENT_FIRST_PATTERNS`),
    loaded once per process instead of once per job. Loaded per job (the client ships the jar
    with every ``flink run -py``), its classes are not freed when the job ends (FLINK-15338,
    apache/beam#25510): a full test run's jobs exhausted the TaskManager's direct memory
    (``OutOfMemoryError: Cannot reserve ... bytes of direct buffer memory``) and the Python
    workers could no longer start. The memory kept per job, each way, is decision record 5
    (``bench/taskmanager_memory.py``).

    Returns:
        The folder (recreated on every call).

    Raises:
        EnvironmentSetupError: PyFlink's ``opt/`` holds no (or several) flink-python jars.
    """
    home = pyflink_home()
    python_jars = sorted((home / "opt").glob("flink-python-*.jar"))
    if len(python_jars) != 1:
        raise EnvironmentSetupError(
            f"{home}/opt holds {len(python_jars)} flink-python jars (need exactly one): "
            "reinstall apache-flink"
        )
    lib = config.lib_dir
    shutil.rmtree(lib, ignore_errors=True)
    lib.mkdir(parents=True)
    for jar in [*sorted((home / "lib").glob("*.jar")), *python_jars]:
        (lib / jar.name).symlink_to(jar)
    return lib


def _require_prometheus_plugin() -> None:
    plugin = pyflink_home() / "plugins" / "metrics-prometheus"
    if not any(plugin.glob("flink-metrics-prometheus-*.jar")):
        raise EnvironmentSetupError(
            f"{plugin}/flink-metrics-prometheus-*.jar missing: the Prometheus reporter ships with "
            "apache-flink's plugins; reinstall apache-flink==2.3.0 or run without a Prometheus port"
        )


def cluster_env(config: FlinkClusterConfig) -> dict[str, str]:
    """Environment for PyFlink's ``bin/`` scripts (``flink``, ``start-cluster.sh``, ...).

    Args:
        config: Cluster settings (:func:`pyflink_aisp.local.flink_env` defaults them
            to the local stack's).

    Returns:
        A copy of ``os.environ`` with FLINK_HOME/CONF/LOG/PID dirs and
        ``FLINK_IDENT_STRING`` set for this cluster.
    """
    home = pyflink_home()
    env = dict(os.environ)
    env.update(
        {
            "FLINK_HOME": str(home),
            "FLINK_LIB_DIR": str(home / "lib"),
            "FLINK_OPT_DIR": str(home / "opt"),
            "FLINK_PLUGINS_DIR": str(home / "plugins"),
            "FLINK_CONF_DIR": str(config.conf_dir),
            "FLINK_LOG_DIR": str(config.log_dir),
            "FLINK_PID_DIR": str(config.pid_dir),
            "FLINK_IDENT_STRING": IDENT,
            "PYFLINK_CLIENT_EXECUTABLE": config.python_executable,
        }
    )
    return env


def daemon_env(config: FlinkClusterConfig) -> dict[str, str]:
    """Environment the cluster's daemons start with: :func:`cluster_env`, ``FLINK_LIB_DIR`` set
    to ``config.lib_dir`` once :func:`write_flink_lib_dir` wrote it, and with
    ``isolated_python`` without any trace of this client's Python environment.

    Isolated: ``PYTHONPATH``, ``PYTHONHOME``, ``VIRTUAL_ENV`` and
    ``PYFLINK_CLIENT_EXECUTABLE`` are removed, and PATH loses every entry inside
    this interpreter's ``sys.prefix`` (the venv's ``bin/``) or holding
    ``python_executable``, so a Python worker finds no project packages unless its
    job ships them (``flink run -pyarch``).
    """
    env = cluster_env(config)
    if config.lib_dir.is_dir():
        env["FLINK_LIB_DIR"] = str(config.lib_dir)
    if not config.isolated_python:
        return env
    for name in _PYTHON_ENV_VARS:
        env.pop(name, None)
    prefix = Path(sys.prefix).absolute()
    banned = {Path(config.python_executable).parent.absolute(), Path(sys.executable).parent.absolute()}
    entries = [Path(entry).absolute() for entry in env.get("PATH", "").split(os.pathsep) if entry]
    kept = [str(p) for p in entries if p not in banned and not p.is_relative_to(prefix)]
    env["PATH"] = os.pathsep.join(kept)
    return env


def cluster_run_command(
    job_py: str | os.PathLike[str], *args: str, config: FlinkClusterConfig, module: bool = False
) -> list[str]:
    """argv for ``flink run -py job.py args...`` (``-pym module`` with ``module``) against the
    cluster of ``config``.

    Run it with ``env=cluster_env(config)``.

    Args:
        job_py: The PyFlink job script, or with ``module`` the job's module name
            (e.g. ``pyflink_aisp.jobs.review_sentiment``: the job ships in the package).
        args: Arguments passed on to the job.
        config: Cluster settings (:func:`pyflink_aisp.local.flink_run_command` defaults
            them to the local stack's).
        module: ``job_py`` is a module of the client's Python (``flink run -pym``).
    """
    py = config.python_executable
    entry = ["-pym", str(job_py)] if module else ["-py", os.fspath(job_py)]
    return [
        str(pyflink_home() / "bin" / "flink"), "run", "-m", f"localhost:{config.rest_port}",
        "-pyexec", py, "-pyclientexec", py, *entry, *args,
    ]  # fmt: skip
