"""The PyFlink settings derived from the options: bundles, Arrow batches, async scalar
concurrency, checkpoint timeout and restart strategy (:func:`flink_settings`); thread mode for the
per-record operator (:func:`thread_mode_settings`), how many of its subtasks share one
interpreter (:func:`cluster_pipeline_depth`), and the JIT of the JVM a local run starts
(:func:`start_gateway`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.pipeline._config import InferenceOptions, PipelineOptions, option
from pyflink_aisp.pipeline._options import JvmJit, RestartStrategy, Runner

__all__ = ["BUNDLE_ARROW_BATCHES", "C1_ONLY", "RESTART_BACKOFF_MULTIPLIER", "RESTART_JITTER",
           "cluster_pipeline_depth", "flink_settings", "format_job_parameters", "gateway_jvm_args",
           "restart_settings", "start_gateway", "thread_mode_settings", "worker_settings"]

#: PyFlink's default ``python.fn-execution.bundle.size`` (1000 in 2.3.0).
_FLINK_DEFAULT_BUNDLE_SIZE = 1000
#: Arrow batches per bundle (see :func:`flink_settings`): a bundle end makes the Python worker wait
#: for the JVM, so a bundle of several batches lets the next one arrive during compute.
BUNDLE_ARROW_BATCHES = 4
#: Growth of the exponential-delay wait per failure: doubling (binary exponential backoff)
#: reaches a replacement TaskManager's start in log2(start / first wait) restarts.
RESTART_BACKOFF_MULTIPLIER = 2.0
#: Share of the wait drawn at random either side (Flink's default jitter-factor, 0.1).
RESTART_JITTER = 0.1
#: HotSpot's flag for C1 only (the product flag ``TieredStopAtLevel``, HotSpot's
#: ``compiler_globals.hpp``; level 1 is C1 without profiling).
C1_ONLY = "-XX:TieredStopAtLevel=1"
#: Per-row timeout of PyFlink's async scalar operator: a stalled model fails the job only after it.
_ASYNC_TIMEOUT_MS = 600_000


def flink_settings(options: InferenceOptions) -> dict[str, str]:
    """PyFlink settings that let the operators form their batches within the latency target.

    A job's :class:`PipelineOptions` give all of them; a SQL job's
    :class:`InferenceOptions` give the worker settings, with the job options' default
    checkpoint timeout and restart strategy.

    * ``python.fn-execution.bundle.time`` = :attr:`InferenceOptions.effective_bundle_time_ms`
      (results leave the Python worker when a bundle ends);
    * ``python.fn-execution.arrow.batch.size`` = ``arrow_batch_size``: one
      pandas call per Arrow batch; the batcher cuts it into model batches of
      ``max_batch_size`` sorted by length, so a larger Arrow batch pads less;
    * ``python.fn-execution.bundle.size`` = max(1000, :data:`BUNDLE_ARROW_BATCHES` x
      ``arrow_batch_size``, 8 x ``max_batch_size``): PyFlink caps the Arrow batch at
      the bundle size, and at each bundle end the JVM waits for every result in
      flight before it sends more, so the Python worker idles until the next batch
      arrives; four batches, not more, since each checkpoint barrier also waits for the
      bundle in flight (decision record 1, ``docs/decisions/0001-bundle-time-and-size.md``);
    * ``table.exec.async-scalar.max-concurrent-operations`` = 2 x
      ``max_batch_size``: rows in flight cap the SQL async function's batch (its
      default of 10 capped it at 10 here); twice lets the next batch fill
      during compute; ``timeout`` 10 min (a slow model backpressures instead of
      failing the job); ``retry-strategy`` ``NO_RETRY`` (the function never raises
      for a row);
    * ``execution.buffer-timeout.interval`` =
      ``buffer_timeout_ms`` where it is set, else 0 for a job whose sinks run in tasks of
      their own (``effective_separate_sinks``: each result crosses the exchange at once),
      else Flink's 100 ms stays (not derived from the latency target: decision record 7,
      ``docs/decisions/0007-latency-settings.md``);
    * ``execution.checkpointing.timeout`` = ``checkpoint_timeout_ms``;
    * ``restart-strategy.*``: :func:`restart_settings`, a bounded number of restarts
      (Flink's default with checkpoints restarts without end, so a record that fails
      the job every time would be replayed forever); ``none`` for ``restart_attempts`` = 0.

    Returns:
        Flink configuration key → value (``t_env.get_config().set`` or SQL ``SET``).
    """
    job = options if isinstance(options, PipelineOptions) else None
    buffer_timeout = options.buffer_timeout_ms
    if buffer_timeout is None and job is not None and job.effective_separate_sinks:
        buffer_timeout = 0
    return {**restart_settings(job),
        "execution.checkpointing.timeout": f"{_job_value(job, 'checkpoint_timeout_ms')} ms",
        **({} if buffer_timeout is None else {"execution.buffer-timeout.interval": f"{buffer_timeout} ms"}),
        **worker_settings(options)}


def worker_settings(options: InferenceOptions) -> dict[str, str]:
    """The Python-worker part of :func:`flink_settings`: bundles, Arrow batches, async scalar
    concurrency."""
    size = options.max_batch_size
    return {
        "python.fn-execution.bundle.time": str(options.effective_bundle_time_ms),
        "python.fn-execution.bundle.size": str(min(2**31 - 1, max(
            _FLINK_DEFAULT_BUNDLE_SIZE, BUNDLE_ARROW_BATCHES * options.arrow_batch_size, 8 * size))),
        "python.fn-execution.arrow.batch.size": str(options.arrow_batch_size),
        "table.exec.async-scalar.max-concurrent-operations": str(min(2**31 - 1, 2 * size)),
        "table.exec.async-scalar.timeout": f"{_ASYNC_TIMEOUT_MS} ms",
        "table.exec.async-scalar.retry-strategy": "NO_RETRY",
    }


def _job_value(job: PipelineOptions | None, name: str) -> Any:
    return getattr(job, name) if job is not None else option(name).default


def restart_settings(job: PipelineOptions | None) -> dict[str, str]:
    """The restart strategy of :func:`flink_settings` (Flink docs, "Task Failure Recovery":
    ``restart-strategy.exponential-delay.*`` / ``restart-strategy.failure-rate.*``), of a
    job's options or (None) of the defaults.

    exponential-delay: the first wait ``restart_delay_s``, doubled on each failure
    (multiplier :data:`RESTART_BACKOFF_MULTIPLIER`) up to ``restart_max_delay_s``, with
    Flink's default jitter of 10 %; ``restart_attempts`` restarts before the job stays
    FAILED, both counts reset by a run of ``restart_interval_s`` without failure
    (``attempts-before-reset-backoff``, FLINK-32895). With the defaults (5 s, 60 s, 10) the
    restarts come 5, 15, 35, 75, 135 s after a failure that repeats (jitter aside), and a job
    that fails every time waits 5 + 10 + 20 + 40 + 6 x 60 = 435 s in all before it stays
    FAILED. Decision record 5 has the measured reason
    (``docs/decisions/0005-restart-and-recovery.md``).
    """
    attempts = _job_value(job, "restart_attempts")
    if attempts == 0:
        return {"restart-strategy.type": "none"}
    strategy = RestartStrategy(_job_value(job, "restart_strategy"))
    interval, delay = _job_value(job, "restart_interval_s"), _job_value(job, "restart_delay_s")
    if strategy is RestartStrategy.FAILURE_RATE:
        return {
            "restart-strategy.type": "failure-rate",
            "restart-strategy.failure-rate.max-failures-per-interval": str(attempts),
            "restart-strategy.failure-rate.failure-rate-interval": f"{interval} s",
            "restart-strategy.failure-rate.delay": f"{delay} s",
        }
    prefix = "restart-strategy.exponential-delay."
    return {
        "restart-strategy.type": "exponential-delay",
        prefix + "initial-backoff": f"{delay} s",
        prefix + "max-backoff": f"{_job_value(job, 'restart_max_delay_s')} s",
        prefix + "backoff-multiplier": str(RESTART_BACKOFF_MULTIPLIER),
        prefix + "jitter-factor": str(RESTART_JITTER),
        prefix + "reset-backoff-threshold": f"{interval} s",
        prefix + "attempts-before-reset-backoff": str(attempts),
    }


def format_job_parameters(params: Mapping[str, str]) -> str:
    """``params`` as a ``pipeline.global-job-parameters`` value: a JSON object,
    which Flink 2.x parses as a YAML flow map (any path, ``,``, ``:`` or quote
    survives; the legacy ``k:v,k:v`` form splits them)."""
    return json.dumps(dict(params))


def thread_mode_settings(python: str, config: dict[str, str]) -> dict[str, str]:
    """``python.execution-mode: thread`` and, unless ``config`` names one, ``python.pythonpath``:
    the site-packages of the workers' Python ``python``.

    In thread mode the TaskManager's JVM embeds the interpreter through PEMJA, which imports
    ``pemja`` and the job's packages from the interpreter's base installation, not from a
    virtual environment's site-packages, unless they are on ``python.pythonpath``. A Python
    shipped in an archive (``python.archives``) is not run here: its paths are the user's to
    give (``-pypath`` or ``-D python.pythonpath=...``).

    Raises:
        ConfigError: ``python`` cannot be run to ask for its site-packages.
    """
    settings = {"python.execution-mode": "thread"}
    if config.get("python.pythonpath") or not os.path.isabs(python):
        return settings
    ask = "import json, site; print(json.dumps(site.getsitepackages()))"
    try:
        done = subprocess.run([python, "-c", ask], capture_output=True, text=True, timeout=60, check=True)
        paths = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise ConfigError(f"--operator record: could not ask the workers' Python {python} for its "
                          f"site-packages ({exc}); give them with -D python.pythonpath=...") from exc
    return {**settings, "python.pythonpath": os.pathsep.join(paths)}


#: ``execution.target`` values of a MiniCluster: its TaskManagers all run in the client's JVM.
_IN_PROCESS_TARGETS = frozenset({"", "local"})


def cluster_pipeline_depth(options: PipelineOptions, get: Callable[[str, str], str]) -> PipelineOptions:
    """``options`` with ``pipeline_depth`` capped at the subtasks that share an interpreter.

    In thread mode the record operator's subtasks in one TaskManager share its interpreter and
    model, so the derived depth (:attr:`PipelineOptions.concurrent_runs`) is the parallelism. A
    TaskManager holds at most ``taskmanager.numberOfTaskSlots`` of them (one subtask of an
    operator per slot), so on a cluster (``execution.target`` other than ``local``: ``flink run``
    against a standalone, YARN or Kubernetes cluster, each TaskManager a process of its own) the
    depth becomes min(parallelism, slots): each run then gets the host's cores / that many
    intra-op threads instead of a share for subtasks that run elsewhere. A MiniCluster (local)
    runs every subtask in one JVM: no cap there. ``options`` unchanged for another operator, a
    ``--pipeline-depth`` given, or a slot count that is not a positive int.

    Args:
        options: The job's options.
        get: ``(key, default) -> value`` of the effective Flink configuration (e.g.
            ``TableConfig.get``, which falls back to the root configuration: ``flink run``'s
            options and the cluster's config.yaml).
    """
    if options.operator is not Runner.RECORD or options.pipeline_depth is not None:
        return options
    if get("execution.target", "local").strip().lower() in _IN_PROCESS_TARGETS:
        return options
    try:
        slots = int(get("taskmanager.numberOfTaskSlots", ""))
    except ValueError:
        return options
    if slots < 1 or slots >= options.concurrent_runs:
        return options
    return replace(options, pipeline_depth=slots)


def gateway_jvm_args(options: PipelineOptions) -> list[str]:
    """The JVM arguments of ``--jvm-jit`` (:attr:`PipelineOptions.effective_jvm_jit`) for the
    JVM that a local run starts: ``[C1_ONLY]`` for C1 only, else none (HotSpot's tiered default)."""
    return [C1_ONLY] if options.effective_jvm_jit is JvmJit.C1 else []


def _gateway_running() -> bool:
    """Whether this process already has PyFlink's gateway JVM: one it started, or the one that
    ``flink run`` started and named in ``PYFLINK_GATEWAY_PORT``."""
    from pyflink import java_gateway

    return java_gateway._gateway is not None or "PYFLINK_GATEWAY_PORT" in os.environ


def start_gateway(options: PipelineOptions) -> None:
    """Start PyFlink's gateway JVM (a local run's MiniCluster runs in it) with the arguments of
    :func:`gateway_jvm_args` appended to ``JVM_ARGS``, which PyFlink's launcher reads; the
    process's ``JVM_ARGS`` is restored afterwards, so later subprocesses do not inherit them.

    Where this process has the JVM already (``flink run``, or an earlier job in the same
    process), nothing is started and a derived ``--jvm-jit`` is left to that JVM.

    Raises:
        ConfigError: ``--jvm-jit`` was given but the JVM already runs (under ``flink run`` the
            TaskManagers' JIT is the cluster's ``env.java.opts.taskmanager``).
    """
    if _gateway_running():
        if options.jvm_jit is not None:
            raise ConfigError(f"--jvm-jit {options.jvm_jit}: this job runs in a JVM already started "
                              "(flink run: the TaskManagers' JIT is the cluster's; set "
                              f"env.java.opts.taskmanager: {C1_ONLY} in its config.yaml for C1 only)")
        return
    from pyflink.java_gateway import get_gateway

    before = os.environ.get("JVM_ARGS")
    args = gateway_jvm_args(options)
    if args:
        os.environ["JVM_ARGS"] = " ".join([*(before.split() if before else []), *args])
    try:
        get_gateway()
    finally:
        if before is None:
            os.environ.pop("JVM_ARGS", None)
        else:
            os.environ["JVM_ARGS"] = before
