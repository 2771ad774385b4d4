"""Table API / SQL sentiment functions on the worker's shared :class:`ModelRuntime`.

Two PyFlink scalar functions score a ``STRING`` column with the sentiment
model and return ``ROW<score DOUBLE, label STRING, model_sha256 STRING,
reason STRING, detail STRING>``:

* :class:`AsyncSentimentFunction`, an ``AsyncScalarFunction`` (PyFlink 2.3):
  each row's ``eval`` awaits :meth:`ModelRuntime.infer`, so the rows in flight
  (up to ``table.exec.async-scalar.max-concurrent-operations``) form batches;
* :class:`PandasSentimentFunction`, a vectorized (``func_type="pandas"``)
  ``ScalarFunction``: each Arrow batch (up to ``python.fn-execution.arrow.
  batch.size`` rows) goes to :meth:`ModelRuntime.infer_batch` at once (one
  tokenizer call; the batcher cuts the model batches).

Both acquire the model in ``open()`` (one model and one batcher per Python
worker, shared with every other operator of the worker that asks for the same
handler and batching) and release it in ``close()``.

Row outcomes (the same for both functions, so switching them changes nothing):

* text scored: ``(P(fresh), 'fresh'|'rotten', sha256, NULL, NULL)``;
* NULL text: all five fields NULL (SQL's null in, null out; PyFlink's pandas
  path cannot emit a NULL struct, only NULL fields, so the async one does the
  same). Test ``s.score IS NULL``, not ``s IS NULL``;
* inference failed for this row alone (the batcher bisects a failing batch):
  ``(NULL, NULL, sha256 or NULL, 'inference_error', '<type>: <message>')``:
  ``reason`` and ``detail`` are those of the pipeline's dead letters
  (:class:`~pyflink_aisp.pipeline.Reason`). Route ``s.reason IS NOT NULL`` to a
  dead-letter table: a bad row is data and never fails the job (PyFlink would
  retry, then fail, a raising ``eval``).

PyFlink 2.3.0 bug worked around here (FLINK-39532, apache/flink#28036): its
async scalar operator hands each row's arguments to ``eval`` *later*, on its
event loop, but the Cython input coder reuses one list for every decoded
row, so ``eval`` read the arguments of a later row (measured: 252 of 300
scores belonged to other rows). Importing this module (which the worker does
when it unpickles the function, before the operator binds
``process_element``) wraps ``AsyncScalarFunctionOperation.process_element``
to copy the row first; the copy is idempotent, so it stays harmless once
PyFlink ships the fix, and it fixes every async scalar function of the worker.

A non-``STRING`` argument is refused when the query is planned (the input
type is declared ``STRING``), not row by row: ``CAST`` it.

Configuration comes from Flink global job parameters (``pipeline.global-job-
parameters``), read in ``open()`` through the ``FunctionContext``: the
``aisp.*`` names of the options table (:data:`pyflink_aisp.pipeline.OPTIONS`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pyflink.common import Row
from pyflink.table import DataTypes
from pyflink.table.udf import AsyncScalarFunction, FunctionContext, ScalarFunction

from pyflink_aisp.affinity import WorkerAffinity, open_affinity
from pyflink_aisp.inference import FailureRateBreaker, Inferred, ModelRuntime
from pyflink_aisp.inference.metrics import Window, bind_breaker_metrics, register_window
from pyflink_aisp.outcome import MAX_DETAIL_CHARS, reason_of, sentiment_label
from pyflink_aisp.pipeline._config import InferenceOptions
from pyflink_aisp.pipeline._handlers import handler_for

__all__ = [
    "SENTIMENT_RESULT_TYPE",
    "AsyncSentimentFunction",
    "PandasSentimentFunction",
    "sentiment_label",
]

_log = logging.getLogger(__name__)

#: The result type of both functions.
SENTIMENT_RESULT_TYPE = DataTypes.ROW(
    [
        DataTypes.FIELD("score", DataTypes.DOUBLE()),
        DataTypes.FIELD("label", DataTypes.STRING()),
        DataTypes.FIELD("model_sha256", DataTypes.STRING()),
        DataTypes.FIELD("reason", DataTypes.STRING()),
        DataTypes.FIELD("detail", DataTypes.STRING()),
    ]
)

_STATS_INTERVAL_S = 0.1


def _snapshotting(process_element: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``process_element`` that gets a copy of its (possibly reused) input row list."""

    def wrapped(self: Any, value: Any) -> Any:
        return process_element(self, list(value) if isinstance(value, list) else value)

    wrapped._aisp_snapshots_inputs = True  # type: ignore[attr-defined]
    return wrapped


def _snapshot_async_scalar_inputs() -> None:
    """Make PyFlink's async scalar operator copy each input row before its ``eval``
    runs (the FLINK-39532 workaround described in the module docstring); idempotent."""
    try:
        from pyflink.fn_execution.table.async_function.operations import AsyncScalarFunctionOperation
    except ImportError:  # a PyFlink without the operator (or its worker modules)
        return
    if not getattr(AsyncScalarFunctionOperation.process_element, "_aisp_snapshots_inputs", False):
        AsyncScalarFunctionOperation.process_element = _snapshotting(
            AsyncScalarFunctionOperation.process_element
        )


_snapshot_async_scalar_inputs()


def _metric_group(context: FunctionContext) -> Any:
    """The function's metric group, or None when ``python.metric.enabled`` is false."""
    try:
        return context.get_metric_group()
    except RuntimeError:  # PyFlink: "Metric has not been enabled"
        return None


def _job_parameters(context: FunctionContext) -> Callable[[str, str], str]:
    return context.get_job_parameter  # type: ignore[no-any-return]


class _SharedModel:
    """The part both functions share: config, runtime, per-operator metrics, stats file.

    Picklable before :meth:`open` (PyFlink ships the function to the worker).

    Metrics (operator metric group ``aisp``): per operator ``recordsIn``,
    ``recordsOut`` (rows scored), ``nullInputs``, ``deadLetters`` (rows with an
    a ``reason``), ``endToEndUs`` (P50/P99/Max: ``eval`` entry to its row built;
    for the pandas function per Arrow batch); per worker model, everything
    :meth:`ModelRuntime.bind_metrics` registers.
    """

    def __init__(self, defaults: InferenceOptions | None) -> None:
        self.defaults = defaults
        self.runtime: ModelRuntime | None = None
        self.breaker: FailureRateBreaker | None = None
        self.affinity: WorkerAffinity | None = None
        self.counts = {"recordsIn": 0, "recordsOut": 0, "nullInputs": 0, "deadLetters": 0}
        self.e2e_us = Window()
        self._stats_path: Path | None = None
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"defaults": self.defaults}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["defaults"])  # type: ignore[misc]

    def open(self, context: FunctionContext) -> None:
        config = InferenceOptions.from_job_parameters(_job_parameters(context), base=self.defaults)
        self.affinity = open_affinity(config.affinity(), context)  # before the model (and CUDA) starts
        self.runtime = ModelRuntime.acquire(handler_for(config), config.batching(), swap=config.swap())
        breaker = config.breaker()
        self.breaker = None if breaker is None else FailureRateBreaker(breaker)
        group = _metric_group(context)
        if group is not None:
            group = group.add_group("aisp")
            for name in self.counts:
                group.gauge(name, self._count_reader(name))
            register_window(group, "endToEndUs", self.e2e_us)
            self.runtime.bind_metrics(group)
            if self.breaker is not None:
                bind_breaker_metrics(group, self.breaker)
            if self.affinity is not None:
                self.affinity.bind_metrics(group)
        if config.stats_dir is not None:
            config.stats_dir.mkdir(parents=True, exist_ok=True)
            self._stats_path = config.stats_dir / f"aisp-stats-{os.getpid()}.json"
            self._stop.clear()
            self._writer = threading.Thread(target=self._write_loop, name="aisp-stats", daemon=True)
            self._writer.start()

    def _count_reader(self, name: str) -> Callable[[], int]:
        return lambda: self.counts[name]

    def version(self) -> str | None:
        """The version the runtime serves now (for rows that got no result)."""
        return None if self.runtime is None else self.runtime.model_version

    def close(self) -> None:
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=5)
            self._writer = None
        if self.runtime is not None:
            self._write_stats()
            self.runtime.release()
            self.runtime = None
        if self.affinity is not None:
            self.affinity.close()
            self.affinity = None

    def _write_loop(self) -> None:
        """Rewrite the stats file while its counts change: ``close()`` is not sure to
        finish before PyFlink stops the worker at the end of a job. Only this thread
        writes until ``close()`` has joined it."""
        last: object = None
        while not self._stop.wait(_STATS_INTERVAL_S):
            last = self._write_stats(last)

    def _write_stats(self, last: object = None) -> object:
        runtime, path = self.runtime, self._stats_path
        if runtime is None or path is None:
            return last
        stats = runtime.batcher.stats  # written by the batching thread: copy the dict first
        snapshot = {**asdict(replace(stats, sizes=dict(stats.sizes))), "model_sha256": runtime.model_version}
        if snapshot == last:
            return last
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps(snapshot), encoding="utf-8")
            os.replace(tmp, path)  # readers never see a half-written file
        except OSError:
            _log.exception("cannot write batcher stats to %s", path)
        return snapshot


def _scored(inferred: Inferred) -> tuple[float, str, str, None, None]:
    score = float(inferred.prediction[0])
    return score, sentiment_label(score), inferred.model_version, None, None


def _failed(error: BaseException, version: str | None) -> tuple[None, None, str | None, str, str]:
    return None, None, version, reason_of(error).value, f"{type(error).__name__}: {error}"[:MAX_DETAIL_CHARS]


_NULL = (None, None, None, None, None)
_COLUMNS = ["score", "label", "model_sha256", "reason", "detail"]


class AsyncSentimentFunction(AsyncScalarFunction):  # type: ignore[misc]
    """``sentiment(text STRING) -> ROW<score, label, model_sha256, reason, detail>``, async.

    Every row in flight awaits the worker's shared batcher, so rows of one
    operator (and of other operators of the worker) share model calls. Batches
    are bounded by ``table.exec.async-scalar.max-concurrent-operations`` (rows
    in flight per operator; default 10) and by the bundle: PyFlink waits for
    all in-flight rows at each bundle end. Use
    :func:`pyflink_aisp.pipeline.flink_settings` (applied by
    :func:`pyflink_aisp.pipeline.sql.configure_table_env`).

    Args:
        defaults: Config for the job parameters that are not set.
    """

    def __init__(self, defaults: InferenceOptions | None = None) -> None:
        self._shared = _SharedModel(defaults)

    def open(self, function_context: FunctionContext) -> None:
        """Read the job parameters and acquire the worker's model.

        Raises:
            ConfigError: A job parameter is invalid.
            ModelError: The model cannot be loaded.
        """
        self._shared.open(function_context)

    async def eval(self, text: Any) -> Row:
        """One row's outcome (see the module docstring); never raises for a row."""
        shared = self._shared
        if shared.runtime is None:
            raise RuntimeError("AsyncSentimentFunction.eval called before open()")
        start = time.perf_counter()
        shared.counts["recordsIn"] += 1
        if text is None:
            shared.counts["nullInputs"] += 1
            return Row(*_NULL)
        try:
            values: tuple[Any, ...] = _scored(await shared.runtime.infer(text))
            shared.counts["recordsOut"] += 1
            error: BaseException | None = None
        except Exception as exc:
            values = _failed(exc, shared.version())
            shared.counts["deadLetters"] += 1
            error = exc
        if shared.breaker is not None:  # CircuitOpenError fails the job: Flink restarts it
            shared.breaker.record(error is not None, error)
        shared.e2e_us.add((time.perf_counter() - start) * 1e6)
        return Row(*values)

    def close(self) -> None:
        """Release the worker's model (freed when its last user closes)."""
        self._shared.close()


class PandasSentimentFunction(ScalarFunction):  # type: ignore[misc]
    """``sentiment_pandas(text STRING) -> ROW<...>``, vectorized over Arrow batches.

    ``eval`` receives a ``(n,)`` pandas Series of ``str``/None (n ≤
    ``python.fn-execution.arrow.batch.size``) and hands its texts to the
    worker's shared batcher in one call (which splits them by
    ``max_batch_size`` and the token budget, and may merge them with records of
    other operators); returns an ``(n, 4)`` DataFrame.

    Args:
        defaults: Config for the job parameters that are not set.
    """

    def __init__(self, defaults: InferenceOptions | None = None) -> None:
        self._shared = _SharedModel(defaults)

    def open(self, function_context: FunctionContext) -> None:
        """As :meth:`AsyncSentimentFunction.open`."""
        self._shared.open(function_context)

    def eval(self, texts: Any) -> Any:
        """``(n,)`` Series of texts → ``(n, 5)`` DataFrame ``score, label, model_sha256, reason, detail``."""
        import pandas as pd

        shared = self._shared
        if shared.runtime is None:
            raise RuntimeError("PandasSentimentFunction.eval called before open()")
        start = time.perf_counter()
        values = texts.tolist()
        rows: list[tuple[Any, ...]] = [_NULL] * len(values)
        positions = [i for i, v in enumerate(values) if v is not None]
        outcomes = _infer_many(shared.runtime, [values[i] for i in positions])
        for i, outcome in zip(positions, outcomes, strict=True):
            rows[i] = (
                _failed(outcome, shared.version()) if isinstance(outcome, BaseException) else _scored(outcome)
            )
        failed = sum(isinstance(o, BaseException) for o in outcomes)
        shared.counts["recordsIn"] += len(values)
        shared.counts["nullInputs"] += len(values) - len(positions)
        shared.counts["recordsOut"] += len(positions) - failed
        shared.counts["deadLetters"] += failed
        shared.e2e_us.add((time.perf_counter() - start) * 1e6)
        if shared.breaker is not None:  # CircuitOpenError fails the job: Flink restarts it
            last = next((o for o in reversed(outcomes) if isinstance(o, BaseException)), None)
            shared.breaker.record_many(failed, len(outcomes), last)
        frame = pd.DataFrame(rows, columns=_COLUMNS, dtype=object)
        frame["score"] = frame["score"].astype("float64")
        return frame

    def close(self) -> None:
        """As :meth:`AsyncSentimentFunction.close`."""
        self._shared.close()


def _infer_many(runtime: ModelRuntime, texts: Sequence[str]) -> list[Inferred | BaseException]:
    """``runtime.infer_batch``; a failure of the call itself fails each row, not the job."""
    if not texts:
        return []
    try:
        return list(runtime.infer_batch(texts))
    except Exception as exc:
        return [exc] * len(texts)
