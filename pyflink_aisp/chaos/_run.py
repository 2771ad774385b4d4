"""A chaos run: the streaming review job on the local stack under TaskManager kills and broker restarts.

The run ingests real reviews in chunks, one chunk before each failure, so the
job always has input in flight when it is hit. TaskManager kills alternate
between killing the TaskManager with its Python workers and the TaskManager
alone (its workers become orphans, which the TaskManager restart must reap).
Afterwards a ``read_committed`` consumer reads the output: every input id
exactly once is the exactly-once promise of the Kafka source + transactional sink.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyflink_aisp.chaos._kill import job_restarts, kill_taskmanager, wait_recovered
from pyflink_aisp.errors import ConfigError, ServiceError
from pyflink_aisp.local import LocalStack, wait_until

__all__ = ["FailureEvent", "FailurePlan", "FailureResult", "run_chaos"]

_ORPHAN_GRACE_S = 30.0  # after the cancel: a worker still there then was left behind


@dataclass(frozen=True, kw_only=True)
class FailurePlan:
    """What a chaos run does.

    Attributes:
        records: Real reviews ingested (the first ``records`` of the data set).
        taskmanager_kills: SIGKILLs of the TaskManager, each followed by a restart.
        broker_restarts: Kafka broker stop/start cycles, spread among the kills.
        checkpoint_interval_ms: The job's checkpoint interval.
        pause_s: Seconds the job scores a fresh chunk before the next failure.
        recovery_timeout_s: Longest wait for the job to recover from one failure.
        drain_timeout_s: Longest wait for the last outputs after the last failure.
        down_s: Seconds a killed TaskManager stays down before it is restarted (a
            replacement pod's or node's start; the TaskManager JVM's own start comes on top).
        restart_options: The job's restart options (``--restart-*`` flags); None: a
            budget no run can spend (the run measures recovery), ``()``: the job's defaults.

    Raises:
        ConfigError: A count or time is out of range.
    """

    records: int = 2000
    taskmanager_kills: int = 3
    broker_restarts: int = 1
    checkpoint_interval_ms: int = 1000
    pause_s: float = 3.0
    recovery_timeout_s: float = 180.0
    drain_timeout_s: float = 300.0
    down_s: float = 0.0
    restart_options: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        events = self.taskmanager_kills + self.broker_restarts
        if self.taskmanager_kills < 0 or self.broker_restarts < 0 or events < 1:
            raise ConfigError(f"need at least one failure, got {self.taskmanager_kills} kills, "
                              f"{self.broker_restarts} broker restarts")
        if self.records < events + 1:
            raise ConfigError(f"records must be > the {events} failures (one chunk each), got {self.records}")
        if self.checkpoint_interval_ms < 100 or min(self.pause_s, self.recovery_timeout_s) <= 0:
            raise ConfigError("checkpoint_interval_ms must be >= 100 and the times positive")
        if self.down_s < 0:
            raise ConfigError(f"down_s must be >= 0, got {self.down_s}")

    def schedule(self) -> list[str]:
        """The failures in order: ``"tm+workers"``, ``"tm"`` (workers left) or ``"broker"``."""
        kinds = ["tm+workers" if i % 2 == 0 else "tm" for i in range(self.taskmanager_kills)]
        for j in range(self.broker_restarts):  # spread evenly, never first
            at = (j + 1) * self.taskmanager_kills // (self.broker_restarts + 1) + j
            kinds.insert(at, "broker")
        return kinds


@dataclass(frozen=True, kw_only=True)
class FailureEvent:
    """One failure and the recovery from it.

    Attributes:
        kind: ``"tm+workers"``, ``"tm"`` or ``"broker"``.
        killed_pids: Pids SIGKILLed (TaskManager, workers); empty for a broker restart.
        orphans_before_restart: Python workers of the stack with no live TaskManager
            right before the restart (> 0 after a ``"tm"`` kill of a scoring job).
        orphans_after_restart: The same count after the restart (the reaper's result).
        recovery_s: Failure → job RUNNING and a later checkpoint completed; None on timeout.
        restarts: The job's ``numRestarts`` (Flink job metric) once it recovered; None when unknown.
        at: Epoch seconds of the failure (the kill or the broker's stop).
    """

    kind: str
    killed_pids: tuple[int, ...]
    orphans_before_restart: int
    orphans_after_restart: int
    recovery_s: float | None
    restarts: int | None = None
    at: float = 0.0


@dataclass(frozen=True, kw_only=True)
class FailureResult:
    """The outcome: ids in and out, DLQ count, orphans, per-failure events."""

    job_id: str
    input_ids: tuple[str, ...]
    output_counts: Counter[str]
    dlq_count: int
    events: tuple[FailureEvent, ...]
    orphans_at_end: int
    wall_s: float
    topics: tuple[str, str, str] = field(default=("", "", ""))

    @property
    def lost(self) -> list[str]:
        """Input ids with no output."""
        return sorted(set(self.input_ids) - set(self.output_counts))

    @property
    def duplicates(self) -> int:
        """Outputs beyond the first per id."""
        return sum(n - 1 for n in self.output_counts.values() if n > 1)


def _submit(stack: LocalStack, job_py: Path, args: list[str], log: Path) -> str:
    cmd = stack.flink_run_command(str(job_py), *args)
    cmd.insert(cmd.index("run") + 1, "-d")
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=300)
    log.write_text(proc.stdout + proc.stderr)
    match = re.search(r"JobID ([0-9a-f]{32})", proc.stdout)
    if proc.returncode != 0 or match is None:
        raise ServiceError(f"flink run failed (exit {proc.returncode}); see {log}: {proc.stderr[-500:]}")
    return match.group(1)


def _fail(stack: LocalStack, kind: str, rest: str, job_id: str, plan: FailurePlan) -> FailureEvent:
    started = time.time()
    killed: list[int] = []
    orphans_before = 0
    if kind == "broker":
        stack.restart_broker()
    else:
        killed = kill_taskmanager(stack, with_workers=kind == "tm+workers", busy_only=True)
        orphans_before = len(stack.orphaned_workers())
        time.sleep(plan.down_s)
        stack.restart_taskmanager()
    orphans_after = len(stack.orphaned_workers())
    recovered = wait_recovered(rest, job_id, int(started * 1000), plan.recovery_timeout_s)
    return FailureEvent(kind=kind, killed_pids=tuple(killed), orphans_before_restart=orphans_before,
                      orphans_after_restart=orphans_after,
                      recovery_s=None if recovered is None else recovered - started,
                      restarts=job_restarts(rest, job_id), at=started)


def run_chaos(
    stack: LocalStack,
    plan: FailurePlan,
    *,
    job_py: Path,
    model_dir: Path | None,
    work_dir: Path,
    on_event: Callable[[int, FailureEvent], None] | None = None,
    model_args: Sequence[str] = (),
) -> FailureResult:
    """Run ``plan`` against the running ``stack`` (Kafka + Flink) and read the outcome.

    Args:
        stack: A running local stack with Flink.
        plan: The failures.
        job_py: ``jobs/review_sentiment.py``.
        model_dir: The sentiment model assets folder; None: the model is named by ``model_args``.
        model_args: More job flags (e.g. a ``--remote-url`` model's), after the topics.
        work_dir: Folder for the ``flink run`` log.
        on_event: Called after each failure (index, event), e.g. to print progress.

    Returns:
        The result; the job is cancelled and its topics kept.

    Raises:
        ServiceError: The job could not be submitted, or it failed for good.
    """
    from pyflink_aisp.datasets import load_rotten_tomatoes
    from pyflink_aisp.kafka import create_topics, ingest_records, read_topic

    started = time.monotonic()
    status = stack.status()
    bootstrap, rest = str(status.bootstrap_servers), str(status.rest_url)
    run = uuid.uuid4().hex[:8]
    t_in, t_out, t_dlq = (f"chaos-{run}-{s}" for s in ("in", "out", "dlq"))
    create_topics(bootstrap, [t_in, t_out, t_dlq])
    records = [{"id": r.id, "text": r.text} for r in load_rotten_tomatoes()[: plan.records]]
    kinds = plan.schedule()
    chunk = -(-len(records) // (len(kinds) + 1))
    ingest_records(bootstrap, t_in, records[:chunk], progress=False)
    args = ["--bootstrap-servers", bootstrap, "--input-topic", t_in, "--output-topic", t_out,
            "--dlq-topic", t_dlq, *(() if model_dir is None else ("--model-dir", str(model_dir))),
            "--job-name", f"chaos-{run}", "--checkpoint-interval-ms", str(plan.checkpoint_interval_ms),
            *model_args]
    if plan.restart_options is None:  # fmt: skip
        args += ["--restart-attempts", "1000", "--restart-interval-s", "3600",
                 "--restart-delay-s", "1", "--restart-max-delay-s", "1"]
    else:
        args += list(plan.restart_options)
    submitted = time.time()
    job_id = _submit(stack, job_py, args, work_dir / f"chaos-{run}-submit.log")
    try:
        if wait_recovered(rest, job_id, int(submitted * 1000), plan.recovery_timeout_s) is None:
            raise ServiceError(f"job {job_id} completed no checkpoint within {plan.recovery_timeout_s:.0f} s")
        events = []
        for i, kind in enumerate(kinds):
            ingest_records(bootstrap, t_in, records[(i + 1) * chunk : (i + 2) * chunk], progress=False)
            time.sleep(plan.pause_s)
            events.append(_fail(stack, kind, rest, job_id, plan))
            if on_event is not None:
                on_event(i, events[-1])
        out = read_topic(bootstrap, t_out, min_count=len(records), timeout_s=plan.drain_timeout_s, quiet_s=10)
        dlq = read_topic(bootstrap, t_dlq, timeout_s=10, quiet_s=3)
    finally:
        subprocess.run([stack.flink_run_command("x")[0], "cancel", job_id], env=stack.flink_env(),
                       capture_output=True, timeout=120)
    counts = Counter(str(json.loads(m.value() or b"{}").get("id")) for m in out)
    # a cancelled job's worker outlives its killed boot script by ~2 s, then exits by itself
    wait_until(lambda: not stack.orphaned_workers(), _ORPHAN_GRACE_S, 0.5)
    return FailureResult(job_id=job_id, input_ids=tuple(str(r["id"]) for r in records), output_counts=counts,
                       dlq_count=len(dlq), events=tuple(events), orphans_at_end=len(stack.orphaned_workers()),
                       wall_s=time.monotonic() - started, topics=(t_in, t_out, t_dlq))
