"""Case (e) of the inference benchmark: ``jobs/review_sentiment.py`` as a subprocess.

The job runs in STREAMING mode on a MiniCluster inside its own Python process
(``python jobs/review_sentiment.py --mode streaming ...``), exactly-once Kafka
sink, checkpoints every ``checkpoint_interval_ms``. The subprocess gets its own
process group (session), so stopping it ends the JVM and the Python workers
it started and nothing else: SIGTERM to the group, SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JOB", "JobSettings", "StreamingJob", "command_line", "job_flags"]

JOB = Path(__file__).resolve().parent.parent / "jobs" / "review_sentiment.py"


def job_flags() -> str:
    """The job's ``--help`` text (to check which flags this version has)."""
    proc = subprocess.run([sys.executable, str(JOB), "--help"], capture_output=True, text=True, timeout=120)
    return proc.stdout


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """Flags the benchmark passes to the job.

    Attributes:
        bootstrap: ``--bootstrap-servers``.
        model_dir: ``--model-dir`` (the same assets as the other cases).
        intra_op_threads: ``--intra-op-threads``.
        checkpoint_interval_ms: ``--checkpoint-interval-ms``.
        latency_slo_ms: ``--latency-slo-ms``, or None for the job's fixed knobs.
        extra: More flags, passed as given.
    """

    bootstrap: str
    model_dir: Path
    intra_op_threads: int
    checkpoint_interval_ms: int
    latency_slo_ms: float | None = None
    extra: tuple[str, ...] = ()

    def args(self, input_topic: str, output_topic: str) -> list[str]:
        """The job's command-line arguments for one run."""
        args = ["--mode", "streaming", "--bootstrap-servers", self.bootstrap,
                "--input-topic", input_topic, "--output-topic", output_topic,
                "--model-dir", str(self.model_dir), "--intra-op-threads", str(self.intra_op_threads),
                "--checkpoint-interval-ms", str(self.checkpoint_interval_ms), *self.extra]
        if self.latency_slo_ms is not None:
            args += ["--latency-slo-ms", f"{self.latency_slo_ms:g}"]
        return args


class StreamingJob:
    """One run of the job; use as a context manager (stops it on exit).

    Args:
        settings: Flags.
        input_topic: Topic the job reads.
        output_topic: Topic the job writes (its DLQ is ``<output_topic>.dlq``).
        log_path: Where the job's stdout and stderr go.

    Attributes:
        started_s: Wall clock (``time.time()``) just before the process started.
        stop_s: How long :meth:`stop` took, seconds.
    """

    def __init__(self, settings: JobSettings, input_topic: str, output_topic: str, log_path: Path) -> None:
        self._cmd = [sys.executable, str(JOB), *settings.args(input_topic, output_topic)]
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0
        self.stop_s = 0.0

    def __enter__(self) -> StreamingJob:
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self._log_path.open("wb")
        self.started_s = time.time()
        env = {k: v for k, v in os.environ.items() if k != "PYFLINK_GATEWAY_DISABLED"}
        self._proc = subprocess.Popen(self._cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      cwd=JOB.parent.parent, env=env)
        log.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        """Raise when the job process has exited (with the tail of its log).

        Raises:
            RuntimeError: the process ended.
        """
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"the job exited with {self._proc.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the job's log."""
        text = self._log_path.read_text(errors="replace") if self._log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        """End the job's process group: SIGTERM, then SIGKILL after ``grace_s``."""
        if self._proc is None:
            return
        pgid = self._proc.pid  # start_new_session: the group id is the child's pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
        self._proc.wait(timeout=30)
        self._proc = None
        self.stop_s = time.monotonic() - deadline + grace_s


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    """Whether a non-zombie process is in group ``pgid`` (``killpg(0)`` also counts zombies)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def command_line(settings: JobSettings, topics: Sequence[str]) -> str:
    """The job's command line, for the report (the model folder as ``<model-dir>``)."""
    args = settings.args(topics[0], topics[1])
    shown = ["<model-dir>" if a == str(settings.model_dir) else a for a in args]
    return "python jobs/review_sentiment.py " + " ".join(shown)
