"""Flink standalone cluster (one JobManager, N TaskManagers) from PyFlink's own ``bin/``.

The scripts run with the environment of :func:`flink_env` (conf, log and pid
dirs under ``<state_dir>/flink``, see ``_flink_config``). The daemons record
their pids in ``flink-aisp-{standalonesession,taskexecutor}.pid``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import EnvironmentSetupError, ServiceError
from pyflink_aisp.jars import require_tools
from pyflink_aisp.local._flink_config import (
    IDENT,
    FlinkClusterConfig,
    cluster_env,
    cluster_run_command,
    daemon_env,
    pyflink_home,
    write_flink_conf_dir,
)
from pyflink_aisp.local._procs import (
    args_adjacent,
    find_pids,
    is_alive,
    pid_matches,
    port_is_free,
    port_taken_error,
    read_pid_file,
    remove_pid_file,
    tail_text,
    terminate,
    wait_until,
    write_pid_file,
)

__all__ = ["FlinkCluster", "flink_overview"]

_log = logging.getLogger(__name__)
_DAEMONS = ("standalonesession", "taskexecutor")
_JM, _TM = _DAEMONS
_ENTRYPOINTS = {  # main classes of the daemons (find them by command line when pid files are gone)
    _JM: "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint",
    _TM: "org.apache.flink.runtime.taskexecutor.TaskManagerRunner",
}
_REST_HINT = "choose another with `aisp local up --flink-rest-port N` or AISP_FLINK_REST_PORT=N"
_RPC_HINT = "choose another with FlinkClusterConfig(rpc_port=N) or AISP_FLINK_RPC_PORT=N"


def _daemon_matcher(main_class: str, conf_dir: str) -> Callable[[list[str]], bool]:
    def match(args: list[str]) -> bool:
        return main_class in args and args_adjacent(args, "--configDir", conf_dir)

    return match


def _rest_get(rest_url: str, path: str, timeout_s: float) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{rest_url}{path}", timeout=timeout_s) as resp:
            body = json.loads(resp.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def flink_overview(rest_url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """``GET <rest_url>/overview`` as a dict, or None if the cluster does not answer."""
    return _rest_get(rest_url, "/overview", timeout_s)


class FlinkCluster:
    """Starts, checks and stops the local Flink standalone cluster of one state folder.

    Only pids recorded by Flink's daemon scripts in ``<state_dir>/flink/pid`` are
    signalled, and only while their command line names this cluster's conf dir;
    for a daemon whose pid file is gone (state folder deleted under a running
    cluster), a process running its entrypoint class with ``--configDir
    <state_dir>/flink/conf`` counts as this cluster's (status shows it, ``stop``
    stops it, ``start`` restarts the cluster).
    Not thread-safe; :class:`LocalStack` serialises calls with a file lock.

    Args:
        config: Cluster settings.
    """

    def __init__(self, config: FlinkClusterConfig) -> None:
        self.config = config

    def env(self) -> dict[str, str]:
        """Environment for PyFlink's ``bin/`` scripts aimed at this cluster."""
        return cluster_env(self.config)

    def run_command(self, job_py: str | os.PathLike[str], *args: str, module: bool = False) -> list[str]:
        """argv of ``flink run -py`` (``-pym`` with ``module``) for this cluster (run it with :meth:`env`)."""
        return cluster_run_command(job_py, *args, config=self.config, module=module)

    def pid_files(self) -> list[Path]:
        """The daemon pid files (JobManager, TaskManager)."""
        return [self.config.pid_dir / f"flink-{IDENT}-{daemon}.pid" for daemon in _DAEMONS]

    def pids(self) -> list[int]:
        """Live pids of this cluster's daemons (JobManager first); see the class doc."""
        return [pid for pids in self._daemon_pids().values() for pid in pids]

    def taskmanager_pids(self) -> list[int]:
        """Live pids of this cluster's TaskManager(s); see the class doc."""
        return self._daemon_pids()[_TM]

    def _daemon_pids(self) -> dict[str, list[int]]:
        conf = str(self.config.conf_dir)
        found = {}
        for daemon, path in zip(_DAEMONS, self.pid_files(), strict=True):
            if path.exists():
                found[daemon] = [pid for pid in read_pid_file(path) if pid_matches(pid, conf)]
            else:
                found[daemon] = find_pids(_daemon_matcher(_ENTRYPOINTS[daemon], conf))
        return found

    def _orphaned(self, daemons: Mapping[str, list[int]]) -> bool:
        """Whether a daemon runs without its pid file."""
        return any(daemons[d] and not p.exists() for d, p in zip(_DAEMONS, self.pid_files(), strict=True))

    def overview(self, timeout_s: float = 2.0) -> dict[str, Any] | None:
        """The cluster's ``/overview`` (taskmanagers, slots, jobs) or None."""
        return flink_overview(self.config.rest_url, timeout_s)

    def is_ready(self, timeout_s: float = 2.0) -> bool:
        """Whether the REST API answers and a TaskManager with slots is registered."""
        overview = self.overview(timeout_s)
        return (
            overview is not None
            and int(overview.get("taskmanagers", 0)) >= self.config.taskmanagers
            and int(overview.get("slots-total", 0)) >= self.config.taskmanagers
        )

    def start(self) -> list[int]:
        """Start the cluster unless it already runs; wait for a registered TaskManager.

        When only TaskManagers died and the JobManager still answers, just the
        missing TaskManagers are started (``bin/taskmanager.sh start``), so the
        JobManager keeps its jobs. Any other half-running cluster (or one running
        without its pid files) is stopped and started afresh.

        Returns:
            The daemon pids (JobManager, TaskManager).

        Raises:
            EnvironmentSetupError: A port is taken by another process, or Java is missing.
            ServiceError: ``start-cluster.sh`` failed or no TaskManager registered
                within the timeout (the message carries the log tails).
        """
        self.preflight()
        daemons = self._daemon_pids()
        jm, tm = daemons[_JM], daemons[_TM]
        if jm and len(tm) >= self.config.taskmanagers and not self._orphaned(daemons):
            self._wait_ready(jm + tm)
            return jm + tm
        if jm and len(tm) < self.config.taskmanagers and not self._orphaned(daemons) and (
                self._jobmanager_answers(jm[0])):
            return self._start_taskmanagers(jm[0], tm)
        if jm or tm:
            _log.warning("Flink cluster only partly running or without pid files (pids %s); "
                         "restarting", jm + tm)  # fmt: skip
            self.stop()
        for path in self.pid_files():
            remove_pid_file(path)
        self._check_ports_free()
        self._write_conf()
        self._run_script("start-cluster.sh")
        return self._wait_daemons_up()

    def preflight(self) -> None:
        """Check what :meth:`start` needs before anything starts: free REST/RPC ports
        when no JobManager runs here, then Java when a daemon must be started.

        Raises:
            EnvironmentSetupError: Java is missing (neither ``JAVA_HOME`` nor ``java``
                on PATH), or a port is taken (the message names the pids holding it).
        """
        daemons = self._daemon_pids()
        if all(daemons.values()) and not self._orphaned(daemons):
            return
        if not daemons[_JM]:
            self._check_ports_free()
        self._check_java()

    def _jobmanager_answers(self, pid: int) -> bool:
        """Whether the JobManager ``pid`` answers REST calls (waits up to 15 s for it)."""
        timeout_s = min(15.0, self.config.start_timeout_s)
        wait_until(lambda: not is_alive(pid) or self.overview(1.0) is not None, timeout_s, 0.5)
        return is_alive(pid) and self.overview(1.0) is not None

    def _start_taskmanagers(self, jm_pid: int, alive: list[int]) -> list[int]:
        """Start the TaskManagers missing beside the running JobManager and the live ones
        (``alive``); wait until as many new ones registered."""
        missing = self.config.taskmanagers - len(alive)
        _log.warning("%d of %d Flink TaskManager(s) gone, JobManager pid %d still runs: starting "
                     "%d", missing, self.config.taskmanagers, jm_pid, missing)  # fmt: skip
        before = self._taskmanager_ids()
        pid_file = self.pid_files()[1]
        if alive:
            write_pid_file(pid_file, alive)  # taskmanager.sh appends the new pid to the live ones
        else:
            remove_pid_file(pid_file)
        if not (self.config.conf_dir / "config.yaml").is_file():
            self._write_conf()  # keep the config the JobManager started with, unless it is gone
        for folder in (self.config.log_dir, self.config.pid_dir):
            folder.mkdir(parents=True, exist_ok=True)
        for _ in range(missing):
            self._run_script("taskmanager.sh", "start")
        return self._wait_daemons_up(
            lambda: len(self._taskmanager_ids() - before) >= missing and self.is_ready(2.0))

    def _taskmanager_ids(self) -> set[str]:
        """Resource ids of the TaskManagers the JobManager lists (a dead one stays
        listed until its heartbeat times out)."""
        body = _rest_get(self.config.rest_url, "/taskmanagers", 2.0) or {}
        managers = body.get("taskmanagers")
        if not isinstance(managers, list):
            return set()
        return {str(tm.get("id")) for tm in managers if isinstance(tm, dict)}

    def _wait_daemons_up(self, ready: Callable[[], bool] | None = None) -> list[int]:
        # a just-forked daemon may not have exec'ed java yet: poll its command line (30 s)
        expected = 1 + self.config.taskmanagers
        running: list[int] = []

        def all_up() -> bool:  # one sample decides: a second read may catch a pid inside execve()
            running[:] = self.pids()
            return len(running) >= expected

        if not wait_until(all_up, 30.0, 0.1):
            raise ServiceError(f"Flink daemons did not stay up (pids {running})\n{self._log_tail()}")
        self._wait_ready(running, ready)
        return running

    def stop(self) -> bool:
        """Stop the recorded daemons (SIGTERM, then SIGKILL after the grace period).

        Returns:
            True when something was running.
        """
        running = list(reversed(self.pids()))  # TaskManager first
        if running:
            killed = terminate(running, self.config.stop_timeout_s)
            if killed:
                _log.warning("Flink pids %s ignored SIGTERM; killed", killed)
        for path in self.pid_files():
            remove_pid_file(path)
        return bool(running)

    def _check_ports_free(self) -> None:
        for port, hint in ((self.config.rest_port, _REST_HINT), (self.config.rpc_port, _RPC_HINT)):
            if not port_is_free(port):
                raise port_taken_error(port, f"a Flink cluster started from {self.config.state_dir}", hint)

    def _check_java(self) -> None:
        """Find Java as Flink's ``bin/config.sh`` does: ``env.java.home``, JAVA_HOME, PATH."""
        home = self.config.extra_config.get("env.java.home") or os.environ.get("JAVA_HOME")
        if not home:
            require_tools("java")
        elif not os.access(Path(home) / "bin" / "java", os.X_OK):
            raise EnvironmentSetupError(
                f"{home}/bin/java not found (JAVA_HOME or env.java.home); the Flink cluster needs "
                "Java 17: point JAVA_HOME at a JDK 17, or unset it to use `java` on PATH"
            )

    def _write_conf(self) -> None:
        write_flink_conf_dir(self.config)

    def _run_script(self, name: str, *args: str) -> None:
        script = pyflink_home() / "bin" / name
        try:
            proc = subprocess.run(
                ["bash", str(script), *args], env=daemon_env(self.config), capture_output=True, text=True,
                timeout=120, check=False, start_new_session=True,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise ServiceError(f"{name} did not return within 120 s") from exc
        if proc.returncode != 0:
            raise ServiceError(
                f"{name} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
            )

    def _wait_ready(self, pids: list[int], ready: Callable[[], bool] | None = None) -> None:
        """Wait until ``ready`` (default: :meth:`is_ready`) holds while all ``pids`` live."""
        timeout_s = self.config.start_timeout_s
        check = ready or (lambda: self.is_ready(1.0))
        done = wait_until(lambda: not all(is_alive(p) for p in pids) or check(), timeout_s, 0.5)
        if done and all(is_alive(p) for p in pids):
            return
        reason = "a daemon exited" if done else f"no TaskManager registered in {timeout_s:.0f} s"
        raise ServiceError(
            f"Flink cluster at {self.config.rest_url} failed to start ({reason}; pids {pids}); "
            f"stop leftovers with `aisp local down`\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        parts = []
        for path in sorted(self.config.log_dir.glob(f"flink-{IDENT}-*")):
            if path.suffix in (".log", ".out"):
                parts.append(f"--- {path} ---\n{tail_text(path, 12)}")
        return "\n".join(parts)
