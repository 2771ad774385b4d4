"""Where a slow record waited before the operator (``latency_bench.py``): behind a busy worker or
with the worker idle (:func:`wait_split`), and across which of the job JVM's safepoint pauses
(``--jvm-log-dir``).

The JVM logs with JDK unified logging, ``-Xlog:gc,safepoint:file=...:timemillis,uptimemillis``
(JEP 158). A safepoint line is written when the safepoint ends and reads::

    [1796533422588ms][556ms] Safepoint "G1CollectForAllocation", Time since last: ... ns,
    Reaching safepoint: 180150 ns, At safepoint: 4607020 ns, Total: 4787170 ns

so a pause spans ``[stamp - Total, stamp]`` in epoch ms. Every Java thread stands still for it (the
task thread included, once it comes back from Python); a thread in native code (ONNX Runtime
under PEMJA) runs on until it returns to Java.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Pause", "pause_summary", "read_pause_dir", "read_pauses", "wait_split"]

_SAFEPOINT = re.compile(r'^\[(\d+)ms\]\[\d+ms\] Safepoint "([^"]+)".*?Total: (\d+) ns')


@dataclass(frozen=True)
class Pause:
    """One safepoint: ``start_ms`` / ``end_ms`` in epoch ms, ``name`` the VM operation."""

    start_ms: float
    end_ms: float
    name: str

    @property
    def ms(self) -> float:
        return self.end_ms - self.start_ms


def read_pauses(lines: Iterable[str]) -> list[Pause]:
    """The safepoints of a unified-logging file's lines (other lines are skipped), by start."""
    pauses = []
    for line in lines:
        m = _SAFEPOINT.match(line)
        if m:
            end = float(m.group(1))
            pauses.append(Pause(end - int(m.group(3)) / 1e6, end, m.group(2)))
    return sorted(pauses, key=lambda p: p.start_ms)


def read_pause_dir(directory: Path) -> list[Pause]:
    """Every ``jvm-*.log`` of ``directory``, merged."""
    pauses: list[Pause] = []
    for path in sorted(directory.glob("jvm-*.log")):
        pauses += read_pauses(path.read_text(encoding="utf-8", errors="replace").splitlines())
    return sorted(pauses, key=lambda p: p.start_ms)


def pause_summary(pauses: Sequence[Pause], t_in_ms: np.ndarray, waits_ms: np.ndarray,
                  totals_ms: np.ndarray, *, min_pause_ms: float = 5.0) -> dict[str, float]:
    """The pauses within the measured records' span, and how many of the slowest 1 % of records
    (by ``totals_ms``) waited (``[t_in, t_in + wait]``) across a pause of at least ``min_pause_ms``.

    Args:
        pauses: :func:`read_pauses`' output.
        t_in_ms: Each record's input broker time, epoch ms (shape ``(n,)``).
        waits_ms: Each record's Kafka-to-worker time, ms (shape ``(n,)``).
        totals_ms: Each record's end-to-end time, ms (shape ``(n,)``).
        min_pause_ms: Shorter pauses are not counted as a cause.

    Returns:
        ``pauses``, ``pause_ms_total``, ``pause_ms_max`` within the span; ``slow_records`` (the
        slowest 1 %, at least one) and ``slow_records_in_pause``.
    """
    if t_in_ms.size == 0:
        return {"pauses": 0, "pause_ms_total": 0.0, "pause_ms_max": 0.0, "slow_records": 0,
                "slow_records_in_pause": 0}
    lo, hi = float(t_in_ms.min()), float((t_in_ms + totals_ms).max())
    inside = [p for p in pauses if p.end_ms >= lo and p.start_ms <= hi]
    long = [p for p in inside if p.ms >= min_pause_ms]
    n_slow = max(1, round(t_in_ms.size * 0.01))
    slow = np.argsort(-totals_ms, kind="stable")[:n_slow]
    hit = sum(1 for i in slow if any(p.end_ms >= t_in_ms[i] and p.start_ms <= t_in_ms[i] + waits_ms[i]
                                     for p in long))
    return {"pauses": len(inside), "pause_ms_total": float(sum(p.ms for p in inside)),
            "pause_ms_max": float(max((p.ms for p in inside), default=0.0)), "slow_records": n_slow,
            "slow_records_in_pause": hit}


def _one_worker(t_in: np.ndarray, waits: np.ndarray,
                work: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """One worker's records: (queued ms, stalled ms, busy share) as in :func:`wait_split`."""
    enter = t_in + waits
    order = np.argsort(enter, kind="stable")
    t_in, enter, work, waits = t_in[order], enter[order], work[order], waits[order]
    # one call per distinct entry: the records of a batch share it, and its work counts once
    first = np.r_[True, np.diff(enter) > 0]
    calls_enter, calls_exit = enter[first], enter[first] + work[first]
    busy_until = np.maximum.accumulate(calls_exit)
    # the worker's previous call's exit, for each record's call
    call_of = np.cumsum(first) - 1
    prev_exit = np.r_[-np.inf, busy_until[:-1]][call_of]
    queued = np.clip(np.minimum(prev_exit, enter) - t_in, 0.0, None)
    span = float(calls_exit.max() - calls_enter.min())
    busy = float(np.sum(calls_exit - calls_enter))
    return queued, waits - queued, busy / span if span > 0 else float("nan")


def wait_split(t_in_ms: np.ndarray, waits_ms: np.ndarray, work_ms: np.ndarray,
               workers: np.ndarray | None = None) -> dict[str, float]:
    """Split each record's Kafka-to-worker wait into the part behind a busy worker (queueing) and
    the part while the worker stood idle (a stall before the operator: fetch, scheduling, a pause).

    The worker is the operator's thread: a record (or the batch that held it) occupies it from its
    entry (``t_in + wait``) for ``work`` ms (decode, inference, render). A record that arrived while
    an earlier one was still being worked on queued until that one left; the rest of its wait, with
    nothing in the worker, is stall. With several workers (one per subtask) each record is split
    against its own worker's calls.

    Args:
        t_in_ms: Each record's input broker time, epoch ms (shape ``(n,)``).
        waits_ms: Each record's Kafka-to-worker time, ms (shape ``(n,)``).
        work_ms: The worker's time on the record's call (decode + inference + render), ms.
        workers: Each record's worker (shape ``(n,)``, any labels); None: one worker.

    Returns:
        ``busy_share`` (a worker's busy time over the span of its entries, the mean over the
        workers with at least two records), ``queued_p99_ms`` and ``stalled_p99_ms`` over all records.
    """
    labels = np.zeros(t_in_ms.shape, dtype=np.int64) if workers is None else np.asarray(workers)
    groups = [labels == w for w in np.unique(labels)]
    groups = [g for g in groups if int(g.sum()) >= 2]
    if not groups:
        return {"busy_share": float("nan"), "queued_p99_ms": float("nan"), "stalled_p99_ms": float("nan")}
    parts = [_one_worker(t_in_ms[g], waits_ms[g], work_ms[g]) for g in groups]
    queued = np.concatenate([p[0] for p in parts])
    stalled = np.concatenate([p[1] for p in parts])
    return {"busy_share": float(np.mean([p[2] for p in parts])),
            "queued_p99_ms": float(np.percentile(queued, 99)),
            "stalled_p99_ms": float(np.percentile(stalled, 99))}
