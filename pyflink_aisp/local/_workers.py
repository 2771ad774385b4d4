"""PyFlink Python workers of the local cluster: find them, tell orphans apart, reap them.

A TaskManager starts one Python worker per Python operator chain (process mode):
``bash pyflink-udf-runner.sh`` → ``python -m pyflink.fn_execution.beam.beam_boot``
(piped into ``tee``) → the Beam SDK harness. A TaskManager killed with SIGKILL
never stops them: they are re-parented to init and keep their memory (~590 MB
each with the sentiment model; on a GPU host, their GPU memory) until killed.

The marker that ties a worker to one local cluster: the workers inherit the
TaskManager's environment, where ``FLINK_CONF_DIR`` is the cluster's own
``<state_dir>/flink/conf`` (set by :func:`~pyflink_aisp.local.flink_env` for
the daemons). A worker counts as this cluster's when its command line names
the PyFlink worker entry points *and* its ``FLINK_CONF_DIR`` is this conf dir
(read with psutil ``Process.environ()``); it is an orphan when no live
TaskManager of the cluster is among its ancestors.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from pathlib import Path

import psutil

__all__ = ["WORKER_MARKERS", "orphaned_workers", "python_workers", "reap_processes"]

_log = logging.getLogger(__name__)

#: Substrings of a PyFlink Python worker's command line (the boot script, the
#: Beam boot and SDK harness modules of ``pyflink.fn_execution``).
WORKER_MARKERS: tuple[str, ...] = ("pyflink-udf-runner.sh", "pyflink.fn_execution")


def _is_worker(proc: psutil.Process, conf_dir: str) -> bool:
    try:
        args = " ".join(proc.cmdline())
        if not any(marker in args for marker in WORKER_MARKERS):
            return False
        return proc.environ().get("FLINK_CONF_DIR") == conf_dir
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def python_workers(conf_dir: Path) -> list[psutil.Process]:
    """The live PyFlink Python worker processes of the cluster configured in ``conf_dir``.

    Args:
        conf_dir: The cluster's ``FLINK_CONF_DIR`` (``<state_dir>/flink/conf``).

    Returns:
        The processes by pid: boot scripts, Beam boot and SDK harness processes,
        whether their TaskManager lives or not. Only processes whose environment
        this user may read are seen (one's own).
    """
    wanted = str(conf_dir)
    found = [p for p in psutil.process_iter() if _is_worker(p, wanted)]
    return sorted(found, key=lambda p: p.pid)


def _descends_from(proc: psutil.Process, ancestors: Collection[int]) -> bool:
    try:
        return any(parent.pid in ancestors for parent in proc.parents())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def orphaned_workers(conf_dir: Path, taskmanager_pids: Collection[int]) -> list[psutil.Process]:
    """The cluster's Python workers that no live TaskManager of it started.

    Args:
        conf_dir: The cluster's ``FLINK_CONF_DIR``.
        taskmanager_pids: Pids of the cluster's live TaskManagers (empty: every
            worker is an orphan).

    Returns:
        The workers without one of ``taskmanager_pids`` among their ancestors.
    """
    live = set(taskmanager_pids)
    return [p for p in python_workers(conf_dir) if not _descends_from(p, live)]


def reap_processes(procs: Iterable[psutil.Process], grace_s: float = 5.0) -> list[int]:
    """Stop processes: SIGTERM, wait up to ``grace_s``, then SIGKILL the rest.

    psutil checks each process's create time before signalling, so a pid reused
    since ``procs`` was listed is not signalled.

    Args:
        procs: The processes (e.g. from :func:`orphaned_workers`).
        grace_s: Seconds between SIGTERM and SIGKILL.

    Returns:
        The pids that were running and are now stopped, sorted.
    """
    live = []
    for proc in procs:
        try:
            proc.terminate()
            live.append(proc)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    _, alive = psutil.wait_procs(live, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    if alive:
        _log.warning("Python workers %s ignored SIGTERM for %.0f s; killed", [p.pid for p in alive], grace_s)
        psutil.wait_procs(alive, timeout=5.0)
    return sorted(p.pid for p in live)
