"""One Python worker's life for an inference operator, shared by every operator and SQL function.

Every Python operator that scores records (the Arrow map
:class:`~pyflink_aisp.pipeline.flink.ArrowInferenceFunction`, the async
:class:`~pyflink_aisp.pipeline.flink.BatchedInferenceFunction`, the SQL
functions of :mod:`pyflink_aisp.pipeline.sql`) lives the same way, owned by an
:class:`OperatorShell`:

``open(context)``, in this order
    1. the GPU affinity lease (:func:`~pyflink_aisp.affinity.open_affinity`, before
       CUDA starts in the model load);
    2. the worker's shared model (:meth:`ModelRuntime.acquire
       <pyflink_aisp.inference.ModelRuntime.acquire>` under the handler's
       :func:`~pyflink_aisp.inference.handler_key`, taken where the handler was built),
       then, with a lease, the device the model actually runs on checked against the
       lease's (:func:`~pyflink_aisp.affinity.check_lease_device`: a model on another GPU,
       because CUDA started in the process before the lease applied, is refused);
    3. the circuit breaker (:class:`~pyflink_aisp.inference.FailureRateBreaker`) and the
       dead-letter watch (:class:`~pyflink_aisp.pipeline._watch.DeadLetterWatch`);
    4. the metrics (operator group ``aisp``): the operator's counters as gauges,
       its windows as P50/P99/Max gauges, ``deadLetterAlarm`` (0/1) and
       ``deadLetterSharePercent`` (the watch's last judged window), then the runtime's,
       the breaker's and the lease's own; none when ``python.metric.enabled`` is false.

``close()``
    releases in reverse order: the model (freed when the worker's last user
    closes), then the lease. A failed open releases what it took.

Pickling: only config crosses the job graph (the :class:`WorkerSpec` and the
names of the counters and windows); the runtime, breaker, lease, counts and
windows are rebuilt in ``open``.

PyFlink-free: a context is anything with ``get_task_name``, ``get_index_of_this_subtask``
(for a lease) and ``get_metric_group`` (Table API) or ``get_metrics_group`` (DataStream).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyflink_aisp.affinity import AffinitySettings, WorkerAffinity, check_lease_device, open_affinity
from pyflink_aisp.errors import ConfigError, OperatorNotOpenError
from pyflink_aisp.inference import (
    BatchingConfig,
    BreakerConfig,
    FailureRateBreaker,
    ModelHandler,
    ModelRuntime,
    ModelSwapConfig,
    handler_key,
)
from pyflink_aisp.inference.metrics import Window, bind_breaker_metrics, register_window
from pyflink_aisp.outcome import DeadLettered, is_record_fault
from pyflink_aisp.pipeline._watch import DeadLetterWatch, DeadLetterWatchConfig

__all__ = ["LeaseOpener", "OperatorShell", "WorkerSpec"]

#: ``(settings, context) -> lease or None``: :func:`~pyflink_aisp.affinity.open_affinity` by default.
LeaseOpener = Callable[[AffinitySettings | None, Any], WorkerAffinity | None]


@dataclass(frozen=True, kw_only=True, eq=False)
class WorkerSpec:
    """What an operator's worker needs to score records; pickled into the job graph.

    Attributes:
        handler: Loads the model (once per worker, shared by its operators).
        batching: Batch size, wait, token budget, buckets, optional p99 target.
        swap: Hot-swap pointer to poll; None: never swap.
        breaker: Circuit breaker over inference failures; None: never trips.
        affinity: GPU affinity lease taken before the model loads; None: none.
        dead_letters: When the dead-letter watch warns or fails the job (None: the
            defaults of :class:`~pyflink_aisp.pipeline._watch.DeadLetterWatchConfig`).
        key: The handler's :func:`~pyflink_aisp.inference.handler_key`; use
            :meth:`of`, which takes it where the handler is built (a handler sent by
            value has another key after unpickling). Empty: computed in ``open``.
    """

    handler: ModelHandler[Any, Any, Any]
    batching: BatchingConfig
    swap: ModelSwapConfig | None = None
    breaker: BreakerConfig | None = None
    affinity: AffinitySettings | None = None
    dead_letters: DeadLetterWatchConfig | None = None
    key: str = ""

    @classmethod
    def of(cls, handler: ModelHandler[Any, Any, Any], *, batching: BatchingConfig,
           swap: ModelSwapConfig | None = None, breaker: BreakerConfig | None = None,
           affinity: AffinitySettings | None = None,
           dead_letters: DeadLetterWatchConfig | None = None) -> WorkerSpec:
        """The spec, with the handler's key taken here (call it on the job's client)."""
        return cls(handler=handler, batching=batching, swap=swap, breaker=breaker, affinity=affinity,
                   dead_letters=dead_letters, key=handler_key(handler))


def _metric_group(context: Any) -> Any:
    """The context's ``aisp`` metric group, or None when ``python.metric.enabled`` is false.

    A Table API ``FunctionContext`` has ``get_metric_group``, a DataStream
    ``RuntimeContext`` ``get_metrics_group``.
    """
    getter = getattr(context, "get_metric_group", None) or context.get_metrics_group
    try:
        return getter().add_group("aisp")
    except RuntimeError:  # PyFlink: "Metric has not been enabled"
        return None


class OperatorShell:
    """The worker lifecycle of one operator (see the module docstring).

    Args:
        spec: What to acquire; None: passed to :meth:`open` instead (the SQL
            functions read it from the job parameters there).
        counters: Names of the operator's counters (gauges, reset in ``open``).
        windows: Names of its windows (P50/P99/Max gauges, e.g. ``endToEndUs``).
        open_lease: Takes the affinity lease (inject a fake in unit tests).

    Attributes:
        counts: Counter name → value; the operator adds to them.
        windows: Window name → :class:`~pyflink_aisp.inference.metrics.Window`.
        runtime: The worker's model after ``open``, else None.
        breaker: The circuit breaker after ``open``, None when not configured.
        watch: The dead-letter watch (rebuilt in ``open``).
        affinity: The lease after ``open``, None when not configured.

    Thread-safety: ``open``/``close`` on the operator's thread; the counts are
    written by the operator's thread alone.
    """

    def __init__(self, spec: WorkerSpec | None = None, *, counters: Sequence[str],
                 windows: Sequence[str] = (), open_lease: LeaseOpener = open_affinity) -> None:
        self.spec = spec
        self._counter_names = tuple(counters)
        self._window_names = tuple(windows)
        self._open_lease = open_lease
        self.counts: dict[str, int] = dict.fromkeys(self._counter_names, 0)
        self.windows: dict[str, Window] = {name: Window() for name in self._window_names}
        self.runtime: ModelRuntime | None = None
        self.breaker: FailureRateBreaker | None = None
        self.watch = DeadLetterWatch()
        self.affinity: WorkerAffinity | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "counters": self._counter_names, "windows": self._window_names,
                "open_lease": self._open_lease}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        OperatorShell.__init__(self, state["spec"], counters=state["counters"], windows=state["windows"],
                               open_lease=state["open_lease"])

    def open(self, context: Any, spec: WorkerSpec | None = None) -> ModelRuntime:
        """Lease, model, breaker, metrics (in that order); returns the runtime.

        Args:
            context: The operator's ``FunctionContext`` / ``RuntimeContext``.
            spec: Replaces the spec given at construction.

        Raises:
            ConfigError: No spec.
            AffinityError: ``affinity`` is set and no lease could be taken or applied, or the
                model runs on another device than the lease's (what was taken is released).
            ModelError: The model cannot be loaded.
        """
        spec = spec or self.spec
        if spec is None:
            raise ConfigError("OperatorShell.open needs a WorkerSpec")
        self.spec = spec
        self.counts = dict.fromkeys(self._counter_names, 0)
        self.windows = {name: Window() for name in self._window_names}
        self.affinity = self._open_lease(spec.affinity, context)  # before the model (and CUDA) starts
        try:
            runtime = self.runtime = ModelRuntime.acquire(spec.handler, spec.batching, swap=spec.swap,
                                                          key=spec.key or None)
            device_uuid = runtime.device_uuid()  # None: a model on the CPU holds no device
            if self.affinity is not None and device_uuid is not None:  # the lease's device, or refused
                check_lease_device(self.affinity.lease, device_uuid)
            self.breaker = None if spec.breaker is None else FailureRateBreaker(spec.breaker)
            self.watch = DeadLetterWatch(spec.dead_letters)
            self._bind_metrics(_metric_group(context))
        except BaseException:  # release what was taken: Flink need not call close() after a failed open
            self.close()
            raise
        freeze_heap()
        return runtime

    def _bind_metrics(self, group: Any) -> None:
        if group is None:
            return
        for name in self._counter_names:
            group.gauge(name, self._count_reader(name))
        for name, window in self.windows.items():
            register_window(group, name, window)
        group.gauge("deadLetterAlarm", lambda: int(self.watch.alarm))
        group.gauge("deadLetterSharePercent", lambda: round(100 * self.watch.last_share))
        assert self.runtime is not None
        self.runtime.bind_metrics(group)
        if self.breaker is not None:
            bind_breaker_metrics(group, self.breaker)
        if self.affinity is not None:
            self.affinity.bind_metrics(group)

    def _count_reader(self, name: str) -> Callable[[], int]:
        return lambda: self.counts[name]

    def require(self, what: str) -> ModelRuntime:
        """The runtime, for ``what`` (the caller's name in the error).

        Raises:
            OperatorNotOpenError: ``open`` has not run.
        """
        if self.runtime is None:
            raise OperatorNotOpenError(f"{what} called before open()")
        return self.runtime

    def version(self) -> str | None:
        """The model version the runtime serves now (for records that got no result)."""
        return None if self.runtime is None else self.runtime.model_version

    def judge(self, error: BaseException | None) -> None:
        """Count one inference outcome in the breaker (a record's own fault,
        :func:`~pyflink_aisp.outcome.is_record_fault`, counts as a success: the model answered).

        Raises:
            CircuitOpenError: The breaker opened: the job fails over (never a dead letter).
        """
        if self.breaker is not None:
            self.breaker.record(error is not None and not is_record_fault(error), error)

    def judge_many(self, failed: int, total: int, last: BaseException | None) -> None:
        """Count ``total`` inference outcomes, ``failed`` of them failures (``last``: one of them).

        Raises:
            CircuitOpenError: The breaker opened.
        """
        if self.breaker is not None:
            self.breaker.record_many(failed, total, last)

    def watch_outcomes(self, total: int, letters: Sequence[DeadLettered]) -> None:
        """Count ``total`` outcomes in the dead-letter watch, ``letters`` the dead letters among them.

        Raises:
            DeadLetterRateError: The window's dead-letter share is above ``--max-dead-letter-rate``.
        """
        self.watch.record(total, letters)

    def close(self) -> None:
        """Release the model, then the lease (the reverse of ``open``); idempotent."""
        if self.runtime is not None:
            self.runtime.release()
            self.runtime = None
        if self.affinity is not None:
            self.affinity.close()
            self.affinity = None


def freeze_heap() -> None:
    """Collect, then move every object alive now (the model, its tokenizer, the imported modules) to
    the cyclic garbage collector's permanent generation (:func:`gc.freeze`, Python 3.7+).

    A full (generation 2) collection scans every tracked object and holds the interpreter meanwhile;
    once the model is loaded those are mostly the model's and the modules', which live as long as
    the worker. Frozen, they are left out of every later collection, so a full collection scans only
    what the records allocate: no pause between a record and its output for the model's heap (in
    thread mode the pause would stall the TaskManager's task thread). Reference counting still frees
    frozen objects; only a cycle among them is never collected (a swapped-out model's, at most).
    Decision record 7 (``docs/decisions/0007-latency-settings.md``) has the measurements.
    """
    gc.collect()
    gc.freeze()
