"""ONNX Runtime's own profiler on a model's session, for a bounded number of runs.

ONNX Runtime writes one Chrome-trace JSON event per kernel of each ``session.run``
(``SessionOptions.enable_profiling``; ``profile_file_prefix``) and the file when
``InferenceSession.end_profiling()`` is called. On the CPU each kernel's
``args.thread_scheduling_stats.main_thread`` holds the intra-op thread pool's
accounting for it (ONNX Runtime's ``ThreadPoolProfiler``, ``threadpool.h``):
``Distribution`` (handing out work), ``Run`` (the calling thread's own share) and
``Wait`` (waiting for the helper threads to finish theirs), in microseconds. ``Wait``
is the time a parallel kernel spends on its slowest helper thread: what a helper
preempted by another process's thread (a JVM's, on a small machine) costs the model.

:class:`OrtProfiling` says where and for how many runs; :class:`ProfiledRuns` counts a
session's runs and ends its profiling after them, so a long job writes a bounded file (one event per
kernel per run).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import ConfigError, ModelError

__all__ = ["OrtProfiling", "ProfiledRuns"]


@dataclass(frozen=True, kw_only=True)
class OrtProfiling:
    """Profile a session's first ``runs`` runs into ``directory``.

    Attributes:
        directory: Where each session writes ``aisp-ort-<pid>_<date-time>.json`` (made if missing).
        runs: Runs profiled (>= 1); the session's profiling ends after the last of them.

    Raises:
        ConfigError: ``runs`` < 1.
    """

    directory: Path
    runs: int = 500

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ConfigError(f"profiled runs must be >= 1, got {self.runs}")

    def file_prefix(self) -> str:
        """``SessionOptions.profile_file_prefix`` of this process's session (ORT appends the time).

        Raises:
            ModelError: The directory cannot be made.
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModelError(f"cannot create the ONNX Runtime profile directory {self.directory}: "
                             f"{exc}") from exc
        return str(self.directory / f"aisp-ort-{os.getpid()}")


class ProfiledRuns:
    """Counts the runs of a profiling session and ends its profiling after ``runs`` of them.

    Thread-safe: concurrent ``session.run`` calls (a run pool) may call :meth:`ran`.

    Args:
        session: An ``onnxruntime.InferenceSession`` opened with profiling enabled.
        runs: Runs to profile.
    """

    def __init__(self, session: Any, runs: int) -> None:
        self._session = session
        self._left = runs
        self._lock = threading.Lock()
        self.path: str | None = None

    def ran(self) -> None:
        """One run done; the last profiled one ends the profiling and sets :attr:`path`."""
        with self._lock:
            if self._left <= 0:
                return
            self._left -= 1
            if self._left == 0:
                self.path = self._session.end_profiling()

    def close(self) -> None:
        """End the profiling now if runs are left (the file then holds the runs so far)."""
        with self._lock:
            if self._left > 0:
                self._left = 0
                self.path = self._session.end_profiling()
