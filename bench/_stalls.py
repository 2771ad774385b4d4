"""Where a slow record waited before the operator (``latency_bench.py``): behind a busy worker or
with the worker idle (:func:`wait_split`), across which of the job JVM's safepoint pauses
(``--jvm-log-dir``), and during which of the job's checkpoints (:func:`checkpoint_summary`, from
the CheckpointCoordinator's log lines).

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

__all__ = ["Checkpoint", "Pause", "checkpoint_summary", "pause_summary", "read_checkpoints", "read_pause_dir",
           "read_pauses", "wait_split"]

_SAFEPOINT = re.compile(r'^\[(\d+)ms\]\[\d+ms\] Safepoint "([^"]+)".*?Total: (\d+) ns')
# Flink's CheckpointCoordinator: "Triggering checkpoint 3 (type=...) @ 1796596470620 for job <id>." and
# "Completed checkpoint 3 for job <id> (3855 bytes, checkpointDuration=144 ms, finalizationTime=11 ms)."
_TRIGGERED = re.compile(r"Triggering checkpoint (\d+) .*?@ (\d+) for job (\w+)")
_COMPLETED = re.compile(r"Completed checkpoint (\d+) for job (\w+) .*?checkpointDuration=(\d+) ms")


@dataclass(frozen=True)
class Checkpoint:
    """One completed checkpoint: from its trigger (``start_ms``, epoch ms) for ``duration_ms`` (the
    coordinator's ``checkpointDuration``: barriers sent to every acknowledgement in)."""

    start_ms: float
    duration_ms: float

    @property
    def end_ms(self) -> float:
        return self.start_ms + self.duration_ms


def read_checkpoints(lines: Iterable[str]) -> list[Checkpoint]:
    """The completed checkpoints of a Flink log's lines (of its last job, if it holds several), by start."""
    started: dict[tuple[str, str], float] = {}
    done: dict[str, list[Checkpoint]] = {}
    last_job = ""
    for line in lines:
        if m := _TRIGGERED.search(line):
            started[(m.group(3), m.group(1))] = float(m.group(2))
            last_job = m.group(3)
        elif (m := _COMPLETED.search(line)) and (m.group(2), m.group(1)) in started:
            done.setdefault(m.group(2), []).append(
                Checkpoint(started[(m.group(2), m.group(1))], float(m.group(3))))
    return sorted(done.get(last_job, []), key=lambda c: c.start_ms)


def checkpoint_summary(checkpoints: Sequence[Checkpoint], t_in_ms: np.ndarray, totals_ms: np.ndarray,
                       *, after_ms: float = 250.0) -> dict[str, float]:
    """How many records lived (``[t_in, t_in + total]``) through a checkpoint or the ``after_ms``
    that follow it (the sink's commit runs on its completion): the slowest 1 % against all of them.

    Args:
        checkpoints: :func:`read_checkpoints`' output.
        t_in_ms: Each record's input broker time, epoch ms (shape ``(n,)``).
        totals_ms: Each record's end-to-end time, ms (shape ``(n,)``).
        after_ms: How long after a checkpoint's end a record still counts as meeting it.

    Returns:
        ``checkpoints`` within the span, ``duration_ms_max``, ``slow_records`` (the slowest 1 %, at
        least one), ``slow_records_at_checkpoint``, and ``share_at_checkpoint``: the share of all
        measured records that met one (the rate a slow record would show by chance).
    """
    if t_in_ms.size == 0:
        return {"checkpoints": 0, "duration_ms_max": 0.0, "slow_records": 0,
                "slow_records_at_checkpoint": 0, "share_at_checkpoint": float("nan")}
    lo, hi = float(t_in_ms.min()), float((t_in_ms + totals_ms).max())
    inside = [c for c in checkpoints if c.end_ms + after_ms >= lo and c.start_ms <= hi]
    met = np.zeros(t_in_ms.size, dtype=bool)
    for c in inside:
        met |= (t_in_ms <= c.end_ms + after_ms) & (t_in_ms + totals_ms >= c.start_ms)
    n_slow = max(1, round(t_in_ms.size * 0.01))
    slow = np.argsort(-totals_ms, kind="stable")[:n_slow]
    return {"checkpoints": len(inside), "duration_ms_max": float(max((c.duration_ms for c in inside),
                                                                     default=0.0)),
            "slow_records": n_slow, "slow_records_at_checkpoint": int(met[slow].sum()),
            "share_at_checkpoint": float(met.mean())}


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
