"""Single-node Apache Kafka broker in KRaft mode (broker + controller), loopback only.

Layout under ``<state_dir>/kafka/``: ``server.properties``, ``log4j2.properties``,
``data/`` (log.dirs, formatted once by ``kafka.tools.StorageTool``), ``logs/``
(server.log and the process's stdout), ``kafka.pid``.
The broker settings follow Kafka's own ``config/server.properties`` for KRaft,
with replication factors of 1 for the internal topics (a single node).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import ConfigError, ServiceError
from pyflink_aisp.jars import JarKind, ensure_jars, require_tools
from pyflink_aisp.local._procs import (
    LOOPBACK,
    args_adjacent,
    find_pids,
    is_alive,
    launch_detached,
    pid_matches,
    port_is_free,
    port_is_open,
    port_taken_error,
    read_pid_file,
    remove_pid_file,
    tail_text,
    terminate,
    wait_until,
    write_pid_file,
)

__all__ = [
    "KafkaBroker",
    "KafkaBrokerConfig",
    "broker_answers",
    "render_kafka_log4j2",
    "render_server_properties",
]

_log = logging.getLogger(__name__)
_PORT_HINT = "choose another with `aisp local up --kafka-port N` or AISP_KAFKA_PORT=N"
_CPORT_HINT = "choose another with `--controller-port N` or AISP_KAFKA_CONTROLLER_PORT=N"


def _check_port(name: str, port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ConfigError(f"{name} must be an int in 1..65535, got {port!r}")


@dataclass(frozen=True, kw_only=True)
class KafkaBrokerConfig:
    """Where and how the local broker runs.

    Attributes:
        state_dir: Stack state folder; the broker uses ``<state_dir>/kafka``.
        port: PLAINTEXT listener on 127.0.0.1 (clients connect here).
        controller_port: KRaft CONTROLLER listener on 127.0.0.1.
        heap_mb: JVM heap (``-Xmx``), MiB.
        listen_host: Interface both listeners bind (``127.0.0.1`` here, ``0.0.0.0``
            in a container).
        advertised_host: Host name clients and the KRaft quorum reach the broker
            at (``127.0.0.1`` here, the service name, e.g. ``kafka``, in a container).
        partitions: ``num.partitions`` of topics the broker creates by default.
        start_timeout_s: How long ``start`` waits for a metadata answer, seconds.
        stop_timeout_s: Grace period after SIGTERM before SIGKILL, seconds.

    Raises:
        ConfigError: A port outside 1..65535, equal ports, heap under 128 MiB or
            a non-positive timeout.
    """

    state_dir: Path
    port: int = 9092
    controller_port: int = 9093
    heap_mb: int = 512
    listen_host: str = LOOPBACK
    advertised_host: str = LOOPBACK
    partitions: int = 1
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", Path(self.state_dir).expanduser().absolute())
        _check_port("port", self.port)
        _check_port("controller_port", self.controller_port)
        if self.port == self.controller_port:
            raise ConfigError(f"port and controller_port must differ (both {self.port})")
        if not isinstance(self.heap_mb, int) or self.heap_mb < 128:
            raise ConfigError(f"heap_mb must be an int >= 128, got {self.heap_mb!r}")
        if self.start_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise ConfigError("start_timeout_s and stop_timeout_s must be > 0")
        for name in ("listen_host", "advertised_host"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or any(c.isspace() or c in ",:" for c in value):
                raise ConfigError(f"{name} must be a host name or IPv4 address, got {value!r}")
        if not isinstance(self.partitions, int) or isinstance(self.partitions, bool) or self.partitions < 1:
            raise ConfigError(f"partitions must be an int >= 1, got {self.partitions!r}")

    @property
    def kafka_dir(self) -> Path:
        """``<state_dir>/kafka``."""
        return self.state_dir / "kafka"

    @property
    def bootstrap_servers(self) -> str:
        """``<advertised_host>:<port>`` for ``bootstrap.servers`` (``127.0.0.1:9092`` here)."""
        return f"{self.advertised_host}:{self.port}"


def render_server_properties(config: KafkaBrokerConfig) -> str:
    """The broker's ``server.properties`` text (KRaft combined mode, single node)."""
    listen, advertised = config.listen_host, config.advertised_host
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{advertised}:{config.controller_port}",
        "listeners": f"PLAINTEXT://{listen}:{config.port},CONTROLLER://{listen}:{config.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{advertised}:{config.port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(config.kafka_dir / "data"),
        "num.partitions": str(config.partitions),
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        # the packaged job's transactions last up to 1 h by default (--transaction-timeout-ms)
        "transaction.max.timeout.ms": "7200000",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
    }
    lines = ["# Written by pyflink_aisp.local; rewritten on every `aisp local up`."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def render_kafka_log4j2(log_dir: Path, *, console: bool = False) -> str:
    """A Log4j 2 properties config: ``<log_dir>/server.log``, 3 x 50 MB rolling.

    Args:
        log_dir: Folder of ``server.log``.
        console: Log to stdout instead (a container's broker: ``docker logs``).
    """
    if console:
        appender = [
            "appender.file.type = Console",
            "appender.file.name = FILE",
            "appender.file.target = SYSTEM_OUT",
        ]
        return "\n".join(["status = warn", "name = aisp-kafka", *appender, *_log4j2_tail(rolling=False)])
    log_file = log_dir / "server.log"
    return "\n".join(
        [
            "status = warn",
            "name = aisp-kafka",
            "appender.file.type = RollingFile",
            "appender.file.name = FILE",
            f"appender.file.fileName = {log_file}",
            f"appender.file.filePattern = {log_file}.%i",
            *_log4j2_tail(rolling=True),
        ]
    )


def _log4j2_tail(*, rolling: bool) -> list[str]:
    lines = ["appender.file.layout.type = PatternLayout", "appender.file.layout.pattern = [%d] %p %m (%c)%n"]
    if rolling:
        lines += [
            "appender.file.policies.type = Policies",
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy",
            "appender.file.policies.size.size = 50MB",
            "appender.file.strategy.type = DefaultRolloverStrategy",
            "appender.file.strategy.max = 3",
        ]
    return [
        *lines,
        "rootLogger.level = INFO",
        "rootLogger.appenderRef.file.ref = FILE",
        "logger.kafka.name = kafka",
        "logger.kafka.level = INFO",
        "logger.request.name = kafka.request.logger",
        "logger.request.level = WARN",
        "",
    ]


def broker_answers(bootstrap_servers: str, timeout_s: float = 2.0) -> bool:
    """Whether a broker at ``bootstrap_servers`` answers a metadata request.

    Uses ``confluent_kafka.admin.AdminClient.list_topics``; librdkafka's own
    connection-refused chatter goes to this module's logger at DEBUG.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    settings: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": _log, "log_level": 0}
    client = AdminClient(settings)
    try:
        metadata = client.list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return bool(metadata.brokers)


class KafkaBroker:
    """Starts, checks and stops the local broker of one state folder.

    Only the pid recorded in ``kafka.pid`` is signalled, and only while its
    command line still names this broker's ``server.properties``; when
    ``kafka.pid`` is gone (state folder deleted under a running broker), a process
    whose command line ends in ``kafka.Kafka <state_dir>/kafka/server.properties``
    counts as this broker (status shows it, ``stop`` stops it, ``start`` restarts it).
    Not thread-safe; :class:`LocalStack` serialises calls with a file lock.

    Args:
        config: Broker settings.
        jars: Returns the broker classpath jars (default: the Maven jar cache).
    """

    def __init__(
        self,
        config: KafkaBrokerConfig,
        *,
        jars: Callable[[], Sequence[Path]] = lambda: ensure_jars(JarKind.KAFKA_BROKER),
    ) -> None:
        self.config = config
        self._jars = jars

    @property
    def properties_path(self) -> Path:
        """``<state_dir>/kafka/server.properties``."""
        return self.config.kafka_dir / "server.properties"

    @property
    def pid_path(self) -> Path:
        """``<state_dir>/kafka/kafka.pid``."""
        return self.config.kafka_dir / "kafka.pid"

    @property
    def log_dir(self) -> Path:
        """``<state_dir>/kafka/logs`` (server.log, stdout.log)."""
        return self.config.kafka_dir / "logs"

    def pid(self) -> int | None:
        """The broker's pid if it runs, else None.

        The recorded pid if that process is alive and is this broker; without a
        pid file, a live ``kafka.Kafka <properties_path>`` process (see the class doc).
        """
        if not self.pid_path.exists():
            orphans = find_pids(lambda args: args_adjacent(args, "kafka.Kafka", str(self.properties_path)))
            return orphans[0] if orphans else None
        for pid in read_pid_file(self.pid_path):
            if pid_matches(pid, str(self.properties_path)):
                return pid
        return None

    def is_ready(self, timeout_s: float = 2.0) -> bool:
        """Whether the broker port is open and answers a metadata request."""
        return port_is_open(self.config.port) and broker_answers(self.config.bootstrap_servers, timeout_s)

    def start(self) -> int:
        """Start the broker unless it already runs; wait until it answers.

        Returns:
            The broker's pid (the running one when already up).

        Raises:
            EnvironmentSetupError: A port is taken by another process, or Java /
                Maven / the jars are missing.
            ServiceError: The broker exited or did not answer within the timeout
                (the message carries the log tail).
        """
        pid = self.pid()
        if pid is not None and not self.pid_path.exists():
            _log.warning("Kafka broker pid %d runs without its pid file %s (state folder removed?); "
                         "restarting it", pid, self.pid_path)  # fmt: skip
            self.stop()
            pid = None
            ports = (self.config.port, self.config.controller_port)  # freed just after the exit
            wait_until(lambda: all(port_is_free(p) for p in ports), 15.0, 0.1)
        if pid is not None:
            self._wait_ready(pid)
            return pid
        remove_pid_file(self.pid_path)
        self.preflight()
        java = require_tools("java")["java"]
        classpath = ":".join(str(jar) for jar in self._jars())
        self.write_config_files()
        self._format_storage(java, classpath)
        pid = launch_detached(
            self._command(java, classpath),
            log_path=self.log_dir / "stdout.log",
            cwd=self.config.kafka_dir,
        )
        write_pid_file(self.pid_path, [pid])
        self._wait_ready(pid)
        return pid

    def foreground_command(self) -> list[str]:
        """Prepare the broker to run in the foreground (a container's main process).

        Writes ``server.properties`` and a console log config, formats the storage
        on first use (like :meth:`start`) and returns the broker's argv; the caller
        execs it (``docker/entrypoint.sh kafka``). Nothing is started or recorded.

        Raises:
            EnvironmentSetupError: Java or the broker jars are missing.
            ServiceError: Kafka's StorageTool failed.
        """
        java = require_tools("java")["java"]
        classpath = ":".join(str(jar) for jar in self._jars())
        self.write_config_files(console=True)
        self._format_storage(java, classpath)
        return self._command(java, classpath)

    def preflight(self) -> None:
        """Check what :meth:`start` needs before anything starts: free ports (unless
        the broker already runs here), then Java.

        Raises:
            EnvironmentSetupError: ``java`` is not on PATH, or a port is taken
                (the message names the pids holding it).
        """
        pid = self.pid()
        if pid is not None and self.pid_path.exists():
            return  # runs: start() leaves it alone
        if pid is None:  # (an orphan found without pid file holds the ports until stopped)
            self._check_ports_free()
        require_tools("java")

    def stop(self) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL after the grace period).

        Returns:
            True when a running broker was stopped, False when none ran.
        """
        pid = self.pid()
        if pid is not None and terminate([pid], self.config.stop_timeout_s):
            _log.warning(
                "Kafka broker pid %d ignored SIGTERM for %.0f s; killed", pid, self.config.stop_timeout_s
            )
        remove_pid_file(self.pid_path)
        return pid is not None

    def _check_ports_free(self) -> None:
        for port, hint in ((self.config.port, _PORT_HINT), (self.config.controller_port, _CPORT_HINT)):
            if not port_is_free(port):
                raise port_taken_error(port, f"a broker started from {self.config.state_dir}", hint)

    def write_config_files(self, *, console: bool = False) -> None:
        """Write ``server.properties`` and ``log4j2.properties`` (``console``: log to stdout)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.properties_path.write_text(render_server_properties(self.config), encoding="utf-8")
        (self.config.kafka_dir / "log4j2.properties").write_text(
            render_kafka_log4j2(self.log_dir, console=console), encoding="utf-8"
        )

    def _jvm_args(self) -> list[str]:
        return [
            f"-Dlog4j2.configurationFile={self.config.kafka_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_dir}",
            "-Djava.awt.headless=true",
        ]

    def _command(self, java: str, classpath: str) -> list[str]:
        return [
            java, f"-Xmx{self.config.heap_mb}m", f"-Xms{min(self.config.heap_mb, 256)}m",
            "-XX:+UseG1GC", *self._jvm_args(), "-cp", classpath,
            "kafka.Kafka", str(self.properties_path),
        ]  # fmt: skip

    def _format_storage(self, java: str, classpath: str) -> None:
        """Format ``log.dirs`` once (KRaft needs a cluster id before first start)."""
        if (self.config.kafka_dir / "data" / "meta.properties").is_file():
            return
        tool = [java, *self._jvm_args(), "-cp", classpath, "kafka.tools.StorageTool"]
        cluster_id = self._run_tool([*tool, "random-uuid"]).strip().splitlines()[-1]
        self._run_tool([*tool, "format", "-t", cluster_id, "-c", str(self.properties_path)])

    def _run_tool(self, cmd: list[str]) -> str:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ServiceError(f"Kafka StorageTool timed out: {' '.join(cmd[-4:])}") from exc
        if proc.returncode != 0:
            raise ServiceError(
                f"Kafka StorageTool failed (exit {proc.returncode}): {' '.join(cmd[-4:])}\n"
                f"{(proc.stdout + proc.stderr)[-3000:]}"
            )
        return proc.stdout

    def _wait_ready(self, pid: int) -> None:
        timeout_s = self.config.start_timeout_s
        if wait_until(lambda: not is_alive(pid) or self.is_ready(1.0), timeout_s, 0.25):
            if is_alive(pid):
                return
            remove_pid_file(self.pid_path)
            raise ServiceError(f"Kafka broker (pid {pid}) exited during start-up\n{self._log_tail()}")
        raise ServiceError(
            f"Kafka broker (pid {pid}) did not answer on {self.config.bootstrap_servers} "
            f"within {timeout_s:.0f} s; stop it with `aisp local down`\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        out = tail_text(self.log_dir / "stdout.log", 15)
        server = tail_text(self.log_dir / "server.log", 25)
        return f"--- {self.log_dir}/stdout.log ---\n{out}\n--- server.log ---\n{server}"
