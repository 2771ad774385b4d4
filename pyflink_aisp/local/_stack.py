"""The local dev stack: Kafka broker (+ optional Flink cluster) under one state folder.

``<state_dir>`` (default ``<aisp_home>/local``) holds ``kafka/``, ``flink/``,
``stack.json`` (the ports ``up`` used, so ``status`` reports the right addresses;
removed by ``down``) and ``.lock`` (serialises ``up``/``down`` across processes).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import ConfigError, EnvironmentSetupError, ServiceError
from pyflink_aisp.home import aisp_home
from pyflink_aisp.jars import flink_connector_jars
from pyflink_aisp.local._flink import FlinkCluster
from pyflink_aisp.local._flink_config import FlinkClusterConfig, cluster_env, cluster_run_command
from pyflink_aisp.local._kafka import KafkaBroker, KafkaBrokerConfig
from pyflink_aisp.local._procs import find_free_port
from pyflink_aisp.local._workers import orphaned_workers, python_workers, reap_processes

__all__ = [
    "ENV_VARS",
    "LocalStack",
    "LocalStackConfig",
    "ServiceStatus",
    "StackStatus",
    "default_state_dir",
    "flink_env",
    "flink_run_command",
]

#: Environment variables read by :meth:`LocalStackConfig.from_env`, by field.
ENV_VARS: Mapping[str, str] = {
    "state_dir": "AISP_LOCAL_DIR",
    "kafka_port": "AISP_KAFKA_PORT",
    "kafka_controller_port": "AISP_KAFKA_CONTROLLER_PORT",
    "flink_rest_port": "AISP_FLINK_REST_PORT",
    "flink_rpc_port": "AISP_FLINK_RPC_PORT",
    "prometheus_port": "AISP_PROMETHEUS_PORT",
    "flink_taskmanagers": "AISP_FLINK_TASKMANAGERS",
}
_PORT_FIELDS = ("kafka_port", "kafka_controller_port", "flink_rest_port", "flink_rpc_port")
_FLINK_FIELDS = ("flink_rest_port", "flink_rpc_port", "flink_taskmanagers")  # recorded with the ports
_RECORDED_FIELDS = (*_PORT_FIELDS, *_FLINK_FIELDS, "prometheus_port")
_RECORD = "stack.json"


def default_state_dir() -> Path:
    """``<aisp_home>/local``."""
    return aisp_home() / "local"


@dataclass(frozen=True, kw_only=True)
class LocalStackConfig:
    """Settings of the local stack.

    Attributes:
        state_dir: Folder for configs, data, logs and pid files of both services.
        kafka_port: Broker PLAINTEXT port on 127.0.0.1.
        kafka_controller_port: KRaft controller port on 127.0.0.1.
        kafka_heap_mb: Broker JVM heap, MiB.
        flink_rest_port: Flink REST/web UI port.
        flink_rpc_port: Flink JobManager RPC port.
        with_flink: Whether ``up`` also starts the Flink cluster.
        prometheus_port: First of two ports (JobManager, TaskManager: each takes the
            first free one) of Flink's Prometheus metrics reporter; None: off.
        flink_taskmanagers: TaskManagers of the Flink cluster (each a JVM of 3 GiB
            with 4 slots; a job of parallelism N spreads over them).
        flink_isolated_python: Start the Flink daemons without this Python's venv
            on PATH and without ``python.executable`` (see
            :class:`~pyflink_aisp.local.FlinkClusterConfig`): jobs must ship their
            Python environment (``aisp package``).

    Raises:
        ConfigError: Invalid or clashing ports, or an invalid service setting.
    """

    state_dir: Path = field(default_factory=default_state_dir)
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    kafka_heap_mb: int = 512
    flink_rest_port: int = 8081
    flink_rpc_port: int = 6123
    with_flink: bool = True
    prometheus_port: int | None = None
    flink_taskmanagers: int = 1
    flink_isolated_python: bool = False

    @classmethod
    def on_free_ports(cls, state_dir: Path, **settings: Any) -> LocalStackConfig:
        """A config in ``state_dir`` whose four ports are distinct free loopback ports now
        (tests, benchmarks, a second stack beside the default one).

        Args:
            state_dir: The stack's state folder.
            settings: Other fields (e.g. ``flink_taskmanagers=2``).

        Raises:
            ConfigError: As the constructor.
        """
        ports: set[int] = set()
        while len(ports) < len(_PORT_FIELDS):
            ports.add(find_free_port())
        chosen: dict[str, Any] = dict(zip(_PORT_FIELDS, sorted(ports), strict=True))
        return cls(state_dir=state_dir, **chosen, **settings)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", Path(self.state_dir).expanduser().absolute())
        ports = [getattr(self, name) for name in _PORT_FIELDS]
        if len(set(ports)) != len(ports):
            raise ConfigError(f"ports must all differ: {dict(zip(_PORT_FIELDS, ports, strict=True))}")
        self.kafka_config()  # validates the per-service fields
        flink = self.flink_config()
        taken = set(flink.prometheus_ports) & set(ports)
        if taken:
            ports_text = f"prometheus ports {flink.prometheus_ports}"
            raise ConfigError(f"{ports_text} overlap the stack's port {min(taken)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> LocalStackConfig:
        """Defaults, then ``AISP_*`` variables (see :data:`ENV_VARS`), then ``overrides``.

        Overrides whose value is None are ignored (handy for unset CLI options).

        Raises:
            ConfigError: A variable is not an int, or the result is invalid.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, var in ENV_VARS.items():
            raw = env.get(var)
            if raw:
                values[name] = Path(raw) if name == "state_dir" else _int_from_env(var, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def kafka_config(self) -> KafkaBrokerConfig:
        """The broker's settings."""
        return KafkaBrokerConfig(
            state_dir=self.state_dir,
            port=self.kafka_port,
            controller_port=self.kafka_controller_port,
            heap_mb=self.kafka_heap_mb,
        )

    def flink_config(self) -> FlinkClusterConfig:
        """The Flink cluster's settings."""
        return FlinkClusterConfig(
            state_dir=self.state_dir, rest_port=self.flink_rest_port, rpc_port=self.flink_rpc_port,
            taskmanagers=self.flink_taskmanagers, isolated_python=self.flink_isolated_python,
            prometheus_port=self.prometheus_port, prometheus_port_count=1 + _count(self.flink_taskmanagers),
        )  # fmt: skip


def _count(value: Any) -> int:
    """``value`` if it is a real int (not bool), else 1: FlinkClusterConfig then refuses the bad value."""
    return value if type(value) is int and value > 0 else 1


def _corrupt_record(path: Path, why: str) -> ServiceError:
    return ServiceError(
        f"{path} is corrupt ({why}); it records the ports of the last `aisp local up`: run "
        "`aisp local down` (stops what runs from this folder and removes the file) or delete it"
    )


def _int_from_env(var: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r} is not an integer") from exc


@dataclass(frozen=True, kw_only=True)
class ServiceStatus:
    """One service of the stack.

    Attributes:
        name: ``"kafka"`` or ``"flink"``.
        running: Whether the service's process(es) are alive.
        ready: Whether it answers (Kafka metadata / Flink /overview with a TaskManager).
        pids: Live pids (Flink: JobManager, TaskManager).
        address: Kafka bootstrap servers or Flink REST URL.
    """

    name: str
    running: bool
    ready: bool
    pids: tuple[int, ...]
    address: str

    def line(self) -> str:
        """``kafka: running pid 1234 bootstrap 127.0.0.1:9092`` or ``flink: stopped``."""
        if not self.running:
            return f"{self.name}: stopped"
        word = "pid" if len(self.pids) == 1 else "pids"
        what = "bootstrap" if self.name == "kafka" else "rest"
        state = "running" if self.ready else "running (not answering)"
        return f"{self.name}: {state} {word} {','.join(map(str, self.pids))} {what} {self.address}"


@dataclass(frozen=True, kw_only=True)
class StackStatus:
    """What runs in one state folder."""

    state_dir: Path
    kafka: ServiceStatus
    flink: ServiceStatus
    prometheus_urls: tuple[str, ...] = ()

    @property
    def bootstrap_servers(self) -> str | None:
        """Kafka ``bootstrap.servers`` when the broker runs, else None."""
        return self.kafka.address if self.kafka.running else None

    @property
    def rest_url(self) -> str | None:
        """Flink REST URL when the cluster runs, else None."""
        return self.flink.address if self.flink.running else None

    def lines(self) -> list[str]:
        """Human-readable status, one line per service."""
        lines = [self.kafka.line(), self.flink.line()]
        if self.flink.running and self.prometheus_urls:
            lines.append(f"metrics: prometheus {' '.join(self.prometheus_urls)} (JobManager, TaskManager)")
        return lines


class LocalStack:
    """Brings the local Kafka broker (and Flink cluster) up and down.

    ``up`` is idempotent: services whose recorded pid is alive and answering are
    left alone (a Flink cluster whose TaskManager died gets a new TaskManager; its
    JobManager and jobs stay). ``down`` signals only this folder's processes: pids
    that ``up`` recorded in ``state_dir``, or where the pid files are gone,
    processes running the service with this folder's config in their command line.
    ``up``/``down`` hold a file lock on ``<state_dir>/.lock``, so concurrent
    callers (several test processes) serialise.

    Args:
        config: Stack settings; default :meth:`LocalStackConfig.from_env`.
    """

    def __init__(self, config: LocalStackConfig | None = None) -> None:
        self.config = config if config is not None else LocalStackConfig.from_env()

    @property
    def state_dir(self) -> Path:
        """The stack's state folder."""
        return self.config.state_dir

    def up(self) -> StackStatus:
        """Start Kafka (and Flink when ``with_flink``) unless running; wait until they answer.

        With Flink, the Flink Kafka connector is resolved into the jar cache first
        (:func:`~pyflink_aisp.local.flink_connector_jars`), where jobs find it
        (:func:`pyflink_aisp.pipeline.connector_jars`).

        Returns:
            The status after start-up.

        The ports and Java are checked for every service to be started before
        any starts, so a failed check leaves nothing half-started.

        Raises:
            EnvironmentSetupError: A port is taken by another process (the message
                names its pid), the stack already runs here on other ports, or
                Java / Maven / jars are missing.
            ServiceError: A service did not come up (message carries its log tail),
                or ``stack.json`` is corrupt.
        """
        with self._locked():
            recorded = self._recorded()
            self._check_same_ports(recorded)
            broker = KafkaBroker(self.config.kafka_config())
            cluster = FlinkCluster(self.config.flink_config()) if self.config.with_flink else None
            broker.preflight()
            if cluster is not None:
                cluster.preflight()
                flink_connector_jars()  # the jar cache the jobs find the Kafka connector in
            self._record(recorded)
            broker.start()
            if cluster is not None:
                self._reap_orphaned_workers(cluster)
                cluster.start()
            return self._status(self._recorded(), ready_timeout_s=10.0)

    def down(self) -> StackStatus:
        """Stop Flink, then Kafka, then remove ``stack.json`` (even a corrupt one); idempotent.

        Only this state folder's processes are signalled: the pids recorded in
        its pid files or, where those are gone, processes whose command line runs
        the service with this folder's config (see :class:`KafkaBroker`,
        :class:`FlinkCluster`).

        Returns:
            The status afterwards (both stopped).
        """
        with self._locked():
            cluster = FlinkCluster(self.config.flink_config())
            cluster.stop()
            self._reap_orphaned_workers(cluster)  # workers of TaskManagers killed earlier
            KafkaBroker(self.config.kafka_config()).stop()
            (self.state_dir / _RECORD).unlink(missing_ok=True)
            return self._status({})

    def restart_taskmanager(self) -> StackStatus:
        """Start the TaskManagers that are gone (of ``flink_taskmanagers``) for the running JobManager.

        Reaps the Python workers that dead TaskManagers left behind first, then
        starts the missing TaskManagers (``bin/taskmanager.sh start``; the live ones
        keep running) and waits until they register; the JobManager and its jobs
        stay (a job restarts on free slots by its restart strategy: a standby
        TaskManager's at once). A no-op when all TaskManagers run.

        Returns:
            The status afterwards.

        Raises:
            ServiceError: The Flink cluster is not running here, or the TaskManager
                did not register within the start timeout (message has the log tail).
        """
        with self._locked():
            cluster = FlinkCluster(self.flink_config())
            if not cluster.pids():
                raise ServiceError(
                    f"no Flink cluster runs from {self.state_dir}: start it with `aisp local up`"
                )
            self._reap_orphaned_workers(cluster)
            cluster.start()
            return self._status(self._recorded())

    def restart_broker(self) -> StackStatus:
        """Stop the Kafka broker (SIGTERM) and start it again on the same data; waits until it answers.

        Returns:
            The status afterwards.

        Raises:
            ServiceError: The broker did not come back (message carries its log tail).
        """
        with self._locked():
            broker = KafkaBroker(self._effective(self._recorded()).kafka_config())
            broker.stop()
            broker.start()
            return self._status(self._recorded())

    def python_workers(self) -> list[int]:
        """Pids of the PyFlink Python workers of this stack's cluster (see ``_workers``)."""
        return [p.pid for p in python_workers(self.flink_config().conf_dir)]

    def orphaned_workers(self) -> list[int]:
        """Pids of this cluster's Python workers that no live TaskManager of it started."""
        cluster = FlinkCluster(self.flink_config())
        return [p.pid for p in orphaned_workers(cluster.config.conf_dir, cluster.taskmanager_pids())]

    def _reap_orphaned_workers(self, cluster: FlinkCluster) -> list[int]:
        orphans = orphaned_workers(cluster.config.conf_dir, cluster.taskmanager_pids())
        return reap_processes(orphans) if orphans else []

    def status(self) -> StackStatus:
        """What runs now, with the addresses recorded by the last ``up``.

        Raises:
            ServiceError: ``stack.json`` is corrupt (the message says to run
                ``aisp local down`` or delete it).
        """
        return self._status(self._recorded())

    def flink_config(self) -> FlinkClusterConfig:
        """The Flink settings in effect: this config with the ports of the last ``up``."""
        return self._effective(self._recorded()).flink_config()

    def flink_env(self) -> dict[str, str]:
        """Environment for ``bin/flink`` aimed at this stack's cluster."""
        return FlinkCluster(self.flink_config()).env()

    def flink_run_command(
        self, job_py: str | os.PathLike[str], *args: str, module: bool = False
    ) -> list[str]:
        """argv of ``flink run -py job_py args...`` (``-pym`` with ``module``) for this stack's
        cluster (run with :meth:`flink_env`)."""
        return FlinkCluster(self.flink_config()).run_command(job_py, *args, module=module)

    def _effective(self, recorded: Mapping[str, int]) -> LocalStackConfig:
        changes: dict[str, Any] = dict(recorded)
        if "flink_rest_port" in recorded and "prometheus_port" not in recorded:
            changes["prometheus_port"] = None  # the recorded cluster runs without the reporter
        return replace(self.config, **changes) if changes else self.config

    def _status(self, recorded: Mapping[str, int], ready_timeout_s: float = 2.0) -> StackStatus:
        """The services' state; ``ready_timeout_s`` bounds each readiness call (a JobManager
        busy restarting a job on a loaded machine may take seconds to answer)."""
        config = self._effective(recorded)
        broker = KafkaBroker(config.kafka_config())
        cluster = FlinkCluster(config.flink_config())
        kafka_pid = broker.pid()
        flink_pids = cluster.pids()
        kafka = ServiceStatus(
            name="kafka",
            running=kafka_pid is not None,
            ready=kafka_pid is not None and broker.is_ready(ready_timeout_s),
            pids=() if kafka_pid is None else (kafka_pid,),
            address=config.kafka_config().bootstrap_servers,
        )
        flink = ServiceStatus(
            name="flink",
            running=bool(flink_pids),
            ready=bool(flink_pids) and cluster.is_ready(ready_timeout_s),
            pids=tuple(flink_pids),
            address=config.flink_config().rest_url,
        )
        urls = tuple(f"http://localhost:{port}/metrics" for port in config.flink_config().prometheus_ports)
        return StackStatus(state_dir=self.state_dir, kafka=kafka, flink=flink, prometheus_urls=urls)

    def _check_same_ports(self, recorded: Mapping[str, int]) -> None:
        """Refuse to 'start' a service that already runs here on other ports (or TaskManagers)."""
        old = self._effective(recorded)
        checks: list[tuple[str, bool, tuple[str, ...]]] = [
            ("kafka", KafkaBroker(old.kafka_config()).pid() is not None,
             ("kafka_port", "kafka_controller_port")),
        ]  # fmt: skip
        if self.config.with_flink:
            running = bool(FlinkCluster(old.flink_config()).pids())
            checks.append(("flink", running, (*_FLINK_FIELDS, "prometheus_port")))
        for name, running, fields in checks:
            changed = [f for f in fields if getattr(old, f) != getattr(self.config, f)]
            if running and changed:
                now = ", ".join(f"{f}={getattr(old, f)}" for f in changed)
                asked = ", ".join(f"{f}={getattr(self.config, f)}" for f in changed)
                raise EnvironmentSetupError(
                    f"{name} already runs from {self.state_dir} with {now} (asked for {asked}); "
                    "stop it first with `aisp local down` to change them"
                )

    def _recorded(self) -> dict[str, int]:
        """The ports of the last ``up`` from ``stack.json`` ({} when there is none).

        Raises:
            ServiceError: The file cannot be read, is not JSON, or a port in it is
                not an int.
        """
        path = self.state_dir / _RECORD
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise _corrupt_record(path, str(exc)) from exc
        if not isinstance(data, dict):
            raise _corrupt_record(path, f"a JSON {type(data).__name__}, not an object")
        bad = {
            k: v
            for k, v in data.items()
            if k in _RECORDED_FIELDS and k != "flink_taskmanagers"
            and (type(v) is not int or not 0 < v < 65536)
        }
        if bad:
            raise _corrupt_record(path, f"ports that are not ints in 1..65535: {bad}")
        taskmanagers = data.get("flink_taskmanagers", 1)
        if type(taskmanagers) is not int or taskmanagers < 1:
            raise _corrupt_record(path, f"flink_taskmanagers is not an int >= 1: {taskmanagers!r}")
        return {k: v for k, v in data.items() if k in _RECORDED_FIELDS}

    def _record(self, recorded: Mapping[str, int]) -> None:
        ports = asdict(self.config)
        new = dict(recorded)
        new.update({k: ports[k] for k in ("kafka_port", "kafka_controller_port")})
        if self.config.with_flink or "flink_rest_port" not in new:
            new.update({k: ports[k] for k in _FLINK_FIELDS})
            new.pop("prometheus_port", None)
            if self.config.prometheus_port is not None:
                new["prometheus_port"] = self.config.prometheus_port
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / (_RECORD + ".tmp")
        tmp.write_text(json.dumps(new, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.state_dir / _RECORD)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def flink_env(config: FlinkClusterConfig | None = None) -> dict[str, str]:
    """Environment for PyFlink's ``bin/`` scripts (``flink``, ``start-cluster.sh``, ...).

    Args:
        config: Cluster settings; default: the local stack's (``AISP_*`` variables,
            ports of the last ``aisp local up``).

    Returns:
        A copy of ``os.environ`` with FLINK_HOME/CONF/LOG/PID dirs and
        ``FLINK_IDENT_STRING`` set for this cluster.
    """
    return cluster_env(config or LocalStack().flink_config())


def flink_run_command(
    job_py: str | os.PathLike[str], *args: str, config: FlinkClusterConfig | None = None, module: bool = False
) -> list[str]:
    """argv for ``flink run -py job.py args...`` against the local cluster (run it with
    ``env=flink_env(config)``).

    Args:
        job_py: The PyFlink job script.
        args: Arguments passed on to the job.
        config: Cluster settings; default: as :func:`flink_env`.
        module: ``job_py`` is a module name (``flink run -pym``).
    """
    return cluster_run_command(job_py, *args, config=config or LocalStack().flink_config(), module=module)
