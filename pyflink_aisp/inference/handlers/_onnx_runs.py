"""Concurrent ``session.run`` calls on one ONNX Runtime session (the CPU provider).

A CPU model batch of a few records runs poorly on several intra-op threads: each
parallel operator waits for its slowest thread (a thread descheduled by the JVMs
sharing the cores stalls the whole run) and small operators hardly split. Running
``k`` model batches at once, each ``session.run`` on a thread of its own with fewer
intra-op threads (e.g. ``k = 2`` runs of 1 thread on 2 cores), keeps every core busy
without that synchronisation. :class:`RunPool` owns those threads; a handler's
``launch_prepared`` hands it a batch and ``collect_prepared`` waits for the result,
so the batcher's pipelined path (``pipeline_depth = k``) keeps ``k`` batches in flight.

Source: ``InferenceSession::Run`` is thread-safe, several threads may call it at once on
one session (ONNX Runtime, microsoft/onnxruntime#19301, which keeps that guarantee for the
TensorRT provider); with ``intra_op_num_threads = 1`` each run computes on its calling thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import psutil

from pyflink_aisp.errors import ConfigError

__all__ = ["MAX_CONCURRENT_RUNS", "RunFuture", "RunPool", "run_threads"]

#: Most concurrent runs accepted (each holds its own padded inputs and activations).
MAX_CONCURRENT_RUNS = 8


def run_threads(runs: int, physical_cores: int | None = None) -> int | None:
    """Intra-op threads for each of ``runs`` concurrent ``session.run`` calls on one host.

    ONNX Runtime's own default is one intra-op thread per physical core for one session run at a
    time; ``runs`` runs at once share those cores: ``physical_cores // runs``, at least 1.

    Args:
        runs: Concurrent runs (>= 1).
        physical_cores: The host's physical cores; None: counted here (``psutil.cpu_count(logical=False)``,
            else ``os.cpu_count()``).

    Returns:
        None for one run (ORT's default stands), else the threads per run.

    Raises:
        ConfigError: ``runs`` < 1.
    """
    if runs < 1:
        raise ConfigError(f"runs must be >= 1, got {runs}")
    if runs == 1:
        return None
    cores = physical_cores or psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, cores // runs)


T = TypeVar("T")


class RunFuture(Future[T]):
    """A future of one run that also times it: :attr:`compute_s` is the seconds the call
    itself took on its thread (None until it finished), so a batcher can charge a batch
    its own compute and not the time it waited for a free thread or for an earlier
    batch's collect."""

    def __init__(self) -> None:
        super().__init__()
        self.compute_s: float | None = None

    def run(self, call: Callable[..., T], *args: Any) -> None:
        """Call ``call(*args)`` now and settle this future with its result or exception."""
        if not self.set_running_or_notify_cancel():
            return
        start = time.perf_counter()
        try:
            result = call(*args)
        except Exception as exc:
            self.compute_s = time.perf_counter() - start
            self.set_exception(exc)
        else:
            self.compute_s = time.perf_counter() - start
            self.set_result(result)


class RunPool:
    """``runs`` threads that call the model; :meth:`launch` returns a future.

    Args:
        runs: Model batches computing at once (1..:data:`MAX_CONCURRENT_RUNS`); 1 makes no
            thread: :meth:`launch` computes on the caller's thread.

    Raises:
        ConfigError: ``runs`` out of range.
    """

    def __init__(self, runs: int) -> None:
        if not 1 <= runs <= MAX_CONCURRENT_RUNS:
            raise ConfigError(f"concurrent runs must be in 1..{MAX_CONCURRENT_RUNS}, got {runs}")
        self.runs = runs
        self._executor = (ThreadPoolExecutor(runs, thread_name_prefix="aisp-ort-run")
                          if runs > 1 else None)

    def launch(self, call: Callable[..., T], *args: Any) -> RunFuture[T]:
        """``call(*args)`` on a pool thread (on this thread with one run).

        Returns:
            A :class:`RunFuture` of its result; an exception ``call`` raised is raised by
            ``result()``.

        Raises:
            RuntimeError: The pool is closed.
        """
        done: RunFuture[T] = RunFuture()
        if self._executor is not None:
            self._executor.submit(done.run, call, *args)
        else:
            done.run(call, *args)
        return done

    def close(self) -> None:
        """Wait for the runs in flight and stop the threads (idempotent)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
