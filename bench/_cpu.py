"""CPU seconds per process role and thread name, sampled in a thread (``colocation_bench.py``,
``latency_bench.py``).

Thread names come from ``/proc/<pid>/task/<tid>/comm`` (psutil gives thread CPU times, not names),
so this is Linux-only; digits at a name's end are dropped, so ``C2 CompilerThre0`` and ``...1`` are
one group (HotSpot's JIT compiler threads).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

__all__ = ["JIT_THREADS", "SAMPLER_ROLE", "Sampler", "cpu_snapshot", "jit_series", "jit_share",
           "split_sampler"]

#: HotSpot's JIT compiler threads, by their grouped name.
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


def _role(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if "java" in cmd and "kafka" in cmd.lower() and "flink" not in cmd.lower():
        return "broker JVM"
    if "java" in cmd:
        return "Flink JVM"
    with contextlib.suppress(psutil.Error):
        parent = proc.parent()
        if "python" in cmd and parent is not None and parent.name() == "java":
            return "Python worker"  # started by the TaskManager (MiniCluster: the job client's JVM)
    if "review_sentiment.py" in cmd:
        return "job client + Python worker"  # a local (MiniCluster) job runs its UDFs in loopback mode
    if proc.pid == os.getpid():
        return "bench"
    return "other"


def _thread_name(pid: int, tid: int) -> str:
    try:
        name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"
    return re.sub(r"[-_ ]?\d+$", "", name) or name  # "C2 CompilerThre0" -> one group per kind


#: The role of the :class:`Sampler`'s own thread (a thread of the bench's process, split out of ``bench``).
SAMPLER_ROLE = "sampler"


def cpu_snapshot(roles: dict[tuple[int, float], str] | None = None,
                 names: dict[tuple[int, int], str] | None = None) -> dict[tuple[str, str], float]:
    """CPU seconds (user + system) per (process role, thread name), all processes.

    ``roles`` (by pid and start time) and ``names`` (by pid and thread id), when given, cache what
    ``/proc`` said before, so a sampler reads each process's command line and each thread's name once.
    """
    roles = {} if roles is None else roles
    names = {} if names is None else names
    out: dict[tuple[str, str], float] = defaultdict(float)
    for proc in psutil.process_iter():
        try:
            key = (proc.pid, proc.create_time())
            role = roles.get(key) or roles.setdefault(key, _role(proc))
            for t in proc.threads():
                name = names.get((proc.pid, t.id)) or names.setdefault((proc.pid, t.id),
                                                                       _thread_name(proc.pid, t.id))
                out[(role, name)] += t.user_time + t.system_time
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def split_sampler(snapshot: dict[tuple[str, str], float], thread_name: str,
                  sampler_s: float) -> dict[tuple[str, str], float]:
    """``snapshot`` with the sampler thread's ``sampler_s`` CPU seconds moved from the ``bench`` role's
    ``thread_name`` group (its ``/proc`` name, shared with the bench's other threads of that name) to
    ``(SAMPLER_ROLE, "sampler")``; the total stays the same, and no group goes below zero."""
    out = dict(snapshot)
    key = ("bench", thread_name)
    moved = min(sampler_s, out.get(key, 0.0))
    out[key] = out.get(key, 0.0) - moved
    out[(SAMPLER_ROLE, "sampler")] = moved
    return out


class Sampler:
    """Snapshots every ``period_s`` in a thread; :meth:`between` diffs the two nearest a window.

    The sampler's own CPU (its thread's ``time.thread_time``) is moved out of the ``bench`` role into
    :data:`SAMPLER_ROLE`, so a report can tell the measurement's cost from the bench's other work.
    """

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.samples: list[tuple[float, dict[tuple[str, str], float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        roles: dict[tuple[int, float], str] = {}
        names: dict[tuple[int, int], str] = {}
        own = (os.getpid(), threading.get_native_id())
        while not self._stop.is_set():
            snap = cpu_snapshot(roles, names)
            self.samples.append((time.time(), split_sampler(snap, names.get(own, "?"), time.thread_time())))
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start_s: float, end_s: float) -> tuple[float, dict[tuple[str, str], float]]:
        """Wall seconds and CPU seconds per key between the first sample at or after ``start_s``
        and the last at or before ``end_s``."""
        inside = [s for s in self.samples if start_s <= s[0] <= end_s]
        if len(inside) < 2:
            return 0.0, {}
        (t0, a), (t1, b) = inside[0], inside[-1]
        return t1 - t0, {k: b[k] - a.get(k, 0.0) for k in b if b[k] - a.get(k, 0.0) > 0.005}


def jit_share(cpu_s: dict[tuple[str, str], float], wall_s: float) -> dict[str, float]:
    """Cores busy in each JVM role's JIT compiler threads (``Sampler.between``'s output)."""
    out: dict[str, float] = defaultdict(float)
    for (role, thread), sec in cpu_s.items():
        if thread in JIT_THREADS and wall_s > 0:
            out[role] += sec / wall_s
    return dict(out)


def jit_series(samples: list[tuple[float, dict[tuple[str, str], float]]]) -> list[list[Any]]:
    """``Sampler.samples`` cut down to what a JIT hunt needs, for JSON: one ``[time_s, {key: seconds}]``
    per sample, cumulative CPU seconds, keys ``"<role>|JIT"`` (its compiler threads) and ``"<role>"``
    (all its threads)."""
    out: list[list[Any]] = []
    for t, snap in samples:
        row: dict[str, float] = defaultdict(float)
        for (role, thread), sec in snap.items():
            row[role] += sec
            if thread in JIT_THREADS:
                row[f"{role}|JIT"] += sec
        out.append([t, dict(row)])
    return out
