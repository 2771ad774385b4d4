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
  tokenizer call; the batcher cuts the model batches; with a pipelined model,
  ``pipeline_depth`` > 1, in slices submitted without waiting between them).

Both acquire the model in ``open()`` (one model and one batcher per Python
worker, shared with every other operator of the worker that asks for the same
handler and batching) and release it in ``close()``: the worker lifecycle of
:class:`~pyflink_aisp.pipeline._shell.OperatorShell`, like the Kafka operators.
Their row's fields before ``model_sha256`` are the declared fields of
:class:`~pyflink_aisp.inference.SentimentTask` (``score DOUBLE, label STRING``);
``open()`` refuses a handler (e.g. an encoder named by ``aisp.encoder.*``) whose
task declares other fields.

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

from pyflink_aisp.errors import ConfigError, InferenceError
from pyflink_aisp.inference import Inferred, ModelHandler, ModelRuntime
from pyflink_aisp.inference.tasks import OutputField, SentimentTask, SqlType, Task, render_fields
from pyflink_aisp.outcome import MAX_DETAIL_CHARS, DeadLettered, is_record_fault, reason_of, sentiment_label
from pyflink_aisp.pipeline._config import InferenceOptions
from pyflink_aisp.pipeline._handlers import handler_for
from pyflink_aisp.pipeline._shell import OperatorShell, WorkerSpec

__all__ = [
    "SENTIMENT_RESULT_TYPE",
    "AsyncModelFunction",
    "AsyncSentimentFunction",
    "PandasModelFunction",
    "PandasSentimentFunction",
    "failure_columns",
    "result_frame",
    "result_row_type",
    "row_type",
    "sentiment_label",
    "sql_data_type",
]

_log = logging.getLogger(__name__)

_DATA_TYPES: dict[SqlType, Callable[[], Any]] = {
    SqlType.STRING: DataTypes.STRING,
    SqlType.DOUBLE: DataTypes.DOUBLE,
    SqlType.BIGINT: DataTypes.BIGINT,
    SqlType.BOOLEAN: DataTypes.BOOLEAN,
    SqlType.ARRAY_FLOAT: lambda: DataTypes.ARRAY(DataTypes.FLOAT()),
    SqlType.ARRAY_DOUBLE: lambda: DataTypes.ARRAY(DataTypes.DOUBLE()),
    SqlType.ARRAY_STRING: lambda: DataTypes.ARRAY(DataTypes.STRING()),
}
#: The fields a function's row adds after the task's: who scored it, or why not.
_TRAILER = ("model_sha256", "reason", "detail")


def sql_data_type(field: OutputField) -> Any:
    """The PyFlink ``DataType`` of a declared output field."""
    return _DATA_TYPES[field.sql_type]()


def row_type(fields: Sequence[OutputField], trailer: Sequence[str] = _TRAILER) -> Any:
    """``ROW<fields..., trailer STRING...>``: a SQL function's result type (the trailer's
    fields are ``STRING``)."""
    return DataTypes.ROW([DataTypes.FIELD(f.name, sql_data_type(f)) for f in fields]
                         + [DataTypes.FIELD(name, DataTypes.STRING()) for name in trailer])


def result_row_type(task: Task) -> Any:
    """``ROW<task fields..., model_sha256 STRING, reason STRING, detail STRING>``: the
    result type of a SQL function serving ``task``."""
    return row_type(task.fields)


def failure_columns(error: BaseException) -> tuple[str, str]:
    """``(reason, detail)`` of a row that got no result: the dead letters' reason
    (:func:`~pyflink_aisp.outcome.reason_of`) and ``'<type>: <message>'``, cut to
    :data:`~pyflink_aisp.outcome.MAX_DETAIL_CHARS`."""
    return reason_of(error).value, f"{type(error).__name__}: {error}"[:MAX_DETAIL_CHARS]


def result_frame(rows: Sequence[tuple[Any, ...]], columns: Sequence[str],
                 fields: Sequence[OutputField]) -> Any:
    """A pandas function's result: ``(n, len(columns))`` DataFrame of ``rows`` (object columns;
    ``fields`` of type ``DOUBLE`` as float64, NULL as NaN, which PyFlink writes as NULL)."""
    import pandas as pd

    frame = pd.DataFrame(list(rows), columns=list(columns), dtype=object)
    for field in fields:
        if field.sql_type is SqlType.DOUBLE:
            frame[field.name] = frame[field.name].astype("float64")
    return frame


#: What the sentiment functions serve: the sentiment task without the embedding.
_TASK = SentimentTask()
#: The result type of both functions: ``ROW<score DOUBLE, label STRING, model_sha256, reason, detail>``.
SENTIMENT_RESULT_TYPE = result_row_type(_TASK)

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


def _job_parameters(context: FunctionContext) -> Callable[[str, str], str]:
    return context.get_job_parameter  # type: ignore[no-any-return]


class _SharedModel(OperatorShell):
    """The part both functions share: the worker lifecycle (:class:`OperatorShell`) with
    its config from the job parameters, and the stats file.

    Picklable before :meth:`open` (PyFlink ships the function to the worker): only
    ``defaults`` crosses.

    Metrics (operator metric group ``aisp``): per operator ``recordsIn``,
    ``recordsOut`` (rows scored), ``nullInputs``, ``deadLetters`` (rows with
    a ``reason``), ``deadLetterAlarm`` and ``deadLetterSharePercent`` (the dead-letter
    watch over the non-null rows, warning only), ``endToEndUs`` (P50/P99/Max: ``eval`` entry to its row built;
    for the pandas function per Arrow batch); per worker model, everything
    :meth:`ModelRuntime.bind_metrics` registers.
    """

    def __init__(self, defaults: InferenceOptions | None, task: Task = _TASK, *,
                 job_parameters: bool = True) -> None:
        super().__init__(counters=("recordsIn", "recordsOut", "nullInputs", "deadLetters"),
                         windows=("endToEndUs",))
        self.defaults = defaults
        self.task = task
        self.job_parameters = job_parameters
        self.rows = _Rows(task)
        self._stats_path: Path | None = None
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"defaults": self.defaults, "task": self.task, "job_parameters": self.job_parameters}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["defaults"], state.get("task", _TASK),  # type: ignore[misc]
                      job_parameters=state.get("job_parameters", True))

    @property
    def e2e_us(self) -> Any:
        """The ``endToEndUs`` window."""
        return self.windows["endToEndUs"]

    def open(self, context: Any, spec: WorkerSpec | None = None) -> ModelRuntime:
        """Read the job parameters, then lease, model, breaker and metrics; start the stats writer.

        Raises:
            ConfigError: A job parameter is invalid, or the handler's task declares other fields
                than the function's row.
            ModelError: The model cannot be loaded.
            OSError: The stats directory cannot be made (model and lease are released).
        """
        config = (InferenceOptions.from_job_parameters(_job_parameters(context), base=self.defaults)
                  if self.job_parameters else (self.defaults or InferenceOptions()))
        handler = handler_for(config)
        _check_task(handler, self.task)
        runtime = super().open(context, spec or WorkerSpec(
            handler=handler, batching=config.batching(), swap=config.swap(), breaker=config.breaker(),
            affinity=config.affinity()))
        if config.stats_dir is not None:
            try:
                config.stats_dir.mkdir(parents=True, exist_ok=True)
            except BaseException:  # a failed open releases what it took (OperatorShell.open)
                self.close()
                raise
            self._stats_path = config.stats_dir / f"aisp-stats-{os.getpid()}.json"
            self._stop.clear()
            self._writer = threading.Thread(target=self._write_loop, name="aisp-stats", daemon=True)
            self._writer.start()
        return runtime

    def close(self) -> None:
        """Stop the stats writer, write the stats once more, release model and lease."""
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=5)
            self._writer = None
        if self.runtime is not None:
            self._write_stats()
        super().close()

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


def _check_task(handler: ModelHandler[Any, Any, Any], task: Task) -> None:
    """Refuse a handler whose task's fields are not the function's row fields.

    Raises:
        ConfigError: Other fields, or no task declared.
    """
    fields = handler.task().fields
    if fields != task.fields:
        hint = ": use a sentiment model (not aisp.encoder.*)" if task == _TASK else ""
        raise ConfigError(f"the SQL function returns {[f.name for f in task.fields]}, but "
                          f"{type(handler).__name__} declares {[f.name for f in fields]}{hint}")


class _Rows:
    """How one task's outcomes become the function's rows: the task's fields, then
    ``model_sha256, reason, detail``."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.columns = [*(f.name for f in task.fields), *_TRAILER]
        self.null = (None,) * len(self.columns)

    def scored(self, inferred: Inferred) -> tuple[Any, ...]:
        """The row of a scored input (:class:`~pyflink_aisp.errors.InferenceError` when the
        task cannot render its prediction)."""
        rendered = render_fields(self.task, inferred.prediction)
        return (*(rendered[f.name] for f in self.task.fields), inferred.model_version, None, None)

    def failed(self, error: BaseException, version: str | None) -> tuple[Any, ...]:
        return (*(None,) * len(self.task.fields), version, *failure_columns(error))

    def of(self, outcome: Inferred | BaseException, version: str | None
           ) -> tuple[tuple[Any, ...], BaseException | None]:
        """``(row, None)`` of a scored input, or ``(failed row, error)``."""
        if not isinstance(outcome, BaseException):
            try:
                return self.scored(outcome), None
            except InferenceError as exc:
                outcome = exc
        return self.failed(outcome, version), outcome

    def frame(self, rows: list[tuple[Any, ...]]) -> Any:
        """The pandas function's result (:func:`result_frame`)."""
        return result_frame(rows, self.columns, self.task.fields)


class AsyncModelFunction(AsyncScalarFunction):  # type: ignore[misc]
    """``f(x) -> ROW<task fields..., model_sha256, reason, detail>``, async, for any task.

    Every row in flight awaits the worker's shared batcher, so rows of one
    operator (and of other operators of the worker) share model calls. Batches
    are bounded by ``table.exec.async-scalar.max-concurrent-operations`` (rows
    in flight per operator; default 10) and by the bundle: PyFlink waits for
    all in-flight rows at each bundle end. Use
    :func:`pyflink_aisp.pipeline.flink_settings` (applied by
    :func:`pyflink_aisp.pipeline.sql.configure_table_env`).

    Args:
        defaults: Config for the job parameters that are not set.
        task: The task whose fields the row has (the handler's must declare the same).
        job_parameters: Read the ``aisp.*`` job parameters over ``defaults`` (False: a
            model of the registry, configured by its entry alone).
    """

    def __init__(self, defaults: InferenceOptions | None = None, task: Task = _TASK, *,
                 job_parameters: bool = True) -> None:
        self._shared = _SharedModel(defaults, task, job_parameters=job_parameters)

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
        runtime = shared.require(f"{type(self).__name__}.eval")
        start = time.perf_counter()
        shared.counts["recordsIn"] += 1
        if text is None:
            shared.counts["nullInputs"] += 1
            return Row(*shared.rows.null)
        try:
            outcome: Inferred | BaseException = await runtime.infer(text)
        except Exception as exc:
            outcome = exc
        values, error = shared.rows.of(outcome, shared.version())
        shared.counts["deadLetters" if error is not None else "recordsOut"] += 1
        shared.judge(error)  # CircuitOpenError fails the job: Flink restarts it
        shared.watch_outcomes(1, () if error is None else (DeadLettered.of_error(error),))
        shared.e2e_us.add((time.perf_counter() - start) * 1e6)
        return Row(*values)

    def close(self) -> None:
        """Release the worker's model (freed when its last user closes)."""
        self._shared.close()


class PandasModelFunction(ScalarFunction):  # type: ignore[misc]
    """``f_pandas(x) -> ROW<task fields..., model_sha256, reason, detail>``, vectorized over
    Arrow batches, for any task.

    ``eval`` receives a ``(n,)`` pandas Series of ``str``/None (n ≤
    ``python.fn-execution.arrow.batch.size``) and hands its texts to the
    worker's shared batcher in one call (which splits them by
    ``max_batch_size`` and the token budget, and may merge them with records of
    other operators); returns an ``(n, 4)`` DataFrame.

    Args:
        defaults: As :class:`AsyncModelFunction`.
        task: As :class:`AsyncModelFunction`.
        job_parameters: As :class:`AsyncModelFunction`.
    """

    def __init__(self, defaults: InferenceOptions | None = None, task: Task = _TASK, *,
                 job_parameters: bool = True) -> None:
        self._shared = _SharedModel(defaults, task, job_parameters=job_parameters)

    def open(self, function_context: FunctionContext) -> None:
        """As :meth:`AsyncModelFunction.open`."""
        self._shared.open(function_context)

    def eval(self, texts: Any) -> Any:
        """``(n,)`` Series of inputs → ``(n, fields + 3)`` DataFrame (for the sentiment task
        ``score, label, model_sha256, reason, detail``)."""
        shared = self._shared
        runtime = shared.require(f"{type(self).__name__}.eval")
        start = time.perf_counter()
        values = texts.tolist()
        rows: list[tuple[Any, ...]] = [shared.rows.null] * len(values)
        positions = [i for i, v in enumerate(values) if v is not None]
        outcomes = _infer_many(runtime, [values[i] for i in positions])
        errors = []
        for i, outcome in zip(positions, outcomes, strict=True):
            rows[i], error = shared.rows.of(outcome, shared.version())
            if error is not None:
                errors.append(error)
        shared.counts["recordsIn"] += len(values)
        shared.counts["nullInputs"] += len(values) - len(positions)
        shared.counts["recordsOut"] += len(positions) - len(errors)
        shared.counts["deadLetters"] += len(errors)
        shared.e2e_us.add((time.perf_counter() - start) * 1e6)
        # CircuitOpenError fails the job: Flink restarts it
        failures = [e for e in errors if not is_record_fault(e)]
        shared.judge_many(len(failures), len(outcomes), failures[-1] if failures else None)
        shared.watch_outcomes(len(positions), [DeadLettered.of_error(e) for e in errors])
        return shared.rows.frame(rows)

    def close(self) -> None:
        """As :meth:`AsyncModelFunction.close`."""
        self._shared.close()


class AsyncSentimentFunction(AsyncModelFunction):
    """``sentiment(text STRING) -> ROW<score, label, model_sha256, reason, detail>``, async
    (:class:`AsyncModelFunction` of :class:`~pyflink_aisp.inference.SentimentTask`).

    Args:
        defaults: Config for the job parameters that are not set.
    """

    def __init__(self, defaults: InferenceOptions | None = None) -> None:
        super().__init__(defaults)


class PandasSentimentFunction(PandasModelFunction):
    """``sentiment_pandas(text STRING) -> ROW<...>``, vectorized over Arrow batches
    (:class:`PandasModelFunction` of :class:`~pyflink_aisp.inference.SentimentTask`).

    Args:
        defaults: Config for the job parameters that are not set.
    """

    def __init__(self, defaults: InferenceOptions | None = None) -> None:
        super().__init__(defaults)


def _infer_many(runtime: ModelRuntime, texts: Sequence[str]) -> list[Inferred | BaseException]:
    """``runtime.infer_batch``; a failure of the call itself fails each row, not the job."""
    if not texts:
        return []
    try:
        return list(runtime.infer_batch(texts))
    except Exception as exc:
        return [exc] * len(texts)
