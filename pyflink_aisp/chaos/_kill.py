"""Failure injection on the local stack: kill -9 the TaskManager (and its Python workers),
restart it, and measure when the job runs and commits output again.

Used by the e2e failure test and ``bench/chaos.py``. Recovery of one kill is
the time from the SIGKILL until (a) the job and all its vertices are
``RUNNING`` again and (b) a checkpoint triggered after the kill completed (the
exactly-once Kafka sink commits its transaction on checkpoint completion, so
committed output advances with it). Sources: Flink REST API ``/jobs/:jobid``
and ``/jobs/:jobid/checkpoints`` (Flink docs, "REST API").
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from pyflink_aisp.errors import ServiceError
from pyflink_aisp.local import FlinkCluster, LocalStack

__all__ = ["JobProgress", "job_progress", "job_restarts", "kill_taskmanager", "wait_recovered"]


@dataclass(frozen=True, kw_only=True)
class JobProgress:
    """One look at a job through the REST API.

    Attributes:
        state: The job state (``RUNNING``, ``RESTARTING``, ...); ``UNKNOWN`` when
            the REST API did not answer.
        all_running: Whether every vertex of the job is ``RUNNING``.
        completed_checkpoints: Count of completed checkpoints since submission.
        last_trigger_ms: Trigger time (epoch ms) of the latest completed checkpoint; 0 if none.
    """

    state: str
    all_running: bool
    completed_checkpoints: int
    last_trigger_ms: int


def _get_any(url: str, timeout_s: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _get(url: str, timeout_s: float) -> dict[str, Any]:
    body = _get_any(url, timeout_s)
    return body if isinstance(body, dict) else {}


def job_progress(rest_url: str, job_id: str, timeout_s: float = 2.0) -> JobProgress:
    """The state, vertex states and latest completed checkpoint of ``job_id``."""
    base = f"{rest_url.rstrip('/')}/jobs/{job_id}"
    job, checkpoints = _get(base, timeout_s), _get(f"{base}/checkpoints", timeout_s)
    vertices = job.get("vertices") or []
    latest = (checkpoints.get("latest") or {}).get("completed") or {}
    return JobProgress(
        state=str(job.get("state", "UNKNOWN")),
        all_running=bool(vertices) and all(v.get("status") == "RUNNING" for v in vertices),
        completed_checkpoints=int((checkpoints.get("counts") or {}).get("completed", 0)),
        last_trigger_ms=int(latest.get("trigger_timestamp", 0) or 0),
    )


def job_restarts(rest_url: str, job_id: str, timeout_s: float = 2.0) -> int | None:
    """The job's ``numRestarts`` (Flink job metric, REST ``/jobs/:jobid/metrics``); None when
    the REST API did not answer."""
    body = _get_any(f"{rest_url.rstrip('/')}/jobs/{job_id}/metrics?get=numRestarts", timeout_s)
    values = [m.get("value") for m in body if isinstance(m, dict) and m.get("id") == "numRestarts"] \
        if isinstance(body, list) else []
    try:
        return int(str(values[0])) if values else None
    except (TypeError, ValueError):
        return None


def kill_taskmanager(stack: LocalStack, *, with_workers: bool = True, busy_only: bool = False) -> list[int]:
    """SIGKILL the stack's TaskManager(s), and with ``with_workers`` their Python workers too.

    Without ``with_workers`` the workers are left running as orphans (what a
    crashed TaskManager leaves); :meth:`LocalStack.restart_taskmanager` and
    ``down`` reap them.

    Args:
        stack: The local stack.
        with_workers: Also SIGKILL the killed TaskManagers' Python workers.
        busy_only: Kill only the TaskManagers that run Python workers (a job's
            subtasks), so idle (standby) TaskManagers survive; all of them when
            none runs a worker.

    Returns:
        The pids killed (TaskManagers first).

    Raises:
        ServiceError: No TaskManager runs in the stack.
    """
    cluster = FlinkCluster(stack.flink_config())
    managers = [psutil.Process(pid) for pid in cluster.taskmanager_pids()]
    if not managers:
        raise ServiceError(f"no TaskManager runs from {stack.state_dir}: nothing to kill")
    owner = {pid: _ancestor(pid, {m.pid for m in managers}) for pid in stack.python_workers()}
    busy = {tm for tm in owner.values() if tm is not None}
    if busy_only and busy:
        managers = [m for m in managers if m.pid in busy]
    chosen = {m.pid for m in managers}
    workers = sorted(pid for pid, tm in owner.items() if tm in chosen) if with_workers else []
    victims = managers + [psutil.Process(pid) for pid in workers if psutil.pid_exists(pid)]
    killed = []
    for proc in victims:
        try:
            proc.send_signal(signal.SIGKILL)
            killed.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(managers, timeout=10.0)
    return killed


def _ancestor(pid: int, candidates: set[int]) -> int | None:
    """The first of ``candidates`` among the ancestors of ``pid`` (None: none, or ``pid`` is gone)."""
    try:
        return next((p.pid for p in psutil.Process(pid).parents() if p.pid in candidates), None)
    except psutil.NoSuchProcess:
        return None


def wait_recovered(
    rest_url: str,
    job_id: str,
    since_ms: int,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """Wait until ``job_id`` runs again and a checkpoint triggered after ``since_ms`` completed.

    Args:
        rest_url: The Flink REST URL.
        job_id: The job.
        since_ms: Epoch ms of the failure (e.g. the kill).
        timeout_s: How long to wait.
        clock: Epoch seconds (injected for tests).
        sleep: Sleep function.

    Returns:
        Epoch seconds when both held (polled every 0.25 s), or None on timeout.

    Raises:
        ServiceError: The job reached a terminal state (``FAILED``, ``CANCELED``,
            ``FINISHED``): its restart strategy gave up.
    """
    deadline = clock() + timeout_s
    while clock() < deadline:
        now = clock()
        progress = job_progress(rest_url, job_id)
        if progress.state in ("FAILED", "CANCELED", "FINISHED"):
            raise ServiceError(f"job {job_id} is {progress.state} after a failure at {since_ms} ms: "
                               "its restart strategy gave up (raise --restart-attempts)")
        if progress.state == "RUNNING" and progress.all_running and progress.last_trigger_ms > since_ms:
            return now
        sleep(0.25)
    return None
