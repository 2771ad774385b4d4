"""Flink SQL ``sentiment(text)``: batched model inference as a Python scalar function.

Register it in SQL (or with ``t_env.execute_sql``)::

    CREATE TEMPORARY SYSTEM FUNCTION sentiment
        AS 'pyflink_aisp.inference.sql.sentiment' LANGUAGE PYTHON;          -- async
    CREATE TEMPORARY SYSTEM FUNCTION sentiment_pandas
        AS 'pyflink_aisp.inference.sql.sentiment_pandas' LANGUAGE PYTHON;   -- Arrow batches

    SELECT id, s.score, s.label, s.model_sha256
    FROM (SELECT id, sentiment(`text`) AS s FROM reviews);

Both return ``ROW<score DOUBLE, label STRING, model_sha256 STRING, error STRING>``
(see :mod:`pyflink_aisp.inference._table` for NULL and failed rows: route
``s.error IS NOT NULL`` to a dead-letter table). Select the fields, as above:
PyFlink 2.3.0's ``TableResult.collect()`` in Python fails (``EOFError``) on a
nested ROW with a NULL field, i.e. on every whole ``s`` (SQL sinks are fine).

The model, batching, p99 target and ORT threads come from global job
parameters (``aisp.model.dir``, ``aisp.batch.max-size``,
``aisp.batch.max-wait-ms``, ``aisp.batch.max-idle-ms``,
``aisp.batch.max-tokens``, ``aisp.batch.length-buckets``,
``aisp.latency-slo-ms``, ``aisp.onnx.intra-op-threads``,
``aisp.model.pointer``, ``aisp.model.poll-interval-s``, ``aisp.stats.dir``;
see :class:`TableInferenceConfig`), e.g.::

    SET 'pipeline.global-job-parameters' = '{"aisp.batch.max-size": "64", "aisp.latency-slo-ms": "150"}';

(a JSON object, which Flink parses as a YAML map; the legacy ``k:v,k:v``
form works for values without ``,`` ``:`` or quotes.)

The PyFlink/Flink settings that decide whether those batches and targets are
reachable are *not* job parameters: :func:`python_worker_settings` derives
them from the batching config; :func:`configure_table_env` sets them and the
job parameters at once. This module is the public face of the SQL functions
(as :mod:`pyflink_aisp.tokenize.sql` is of ``tokenize``): it re-exports
:class:`TableInferenceConfig`, the function classes and the parameter names.
The job also needs ``python.executable`` / ``python.client.executable``
pointing at a Python with this package. Importing this module needs PyFlink.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyflink.table import DataTypes
from pyflink.table.udf import udf

from pyflink_aisp.inference._queue import BatchingConfig
from pyflink_aisp.inference._table import (
    BATCH_LENGTH_BUCKETS_PARAM,
    BATCH_MAX_IDLE_PARAM,
    BATCH_MAX_SIZE_PARAM,
    BATCH_MAX_TOKENS_PARAM,
    BATCH_MAX_WAIT_PARAM,
    INTRA_OP_THREADS_PARAM,
    LATENCY_SLO_PARAM,
    MODEL_DIR_ENV,
    MODEL_DIR_PARAM,
    MODEL_POINTER_PARAM,
    MODEL_POLL_INTERVAL_PARAM,
    SENTIMENT_RESULT_TYPE,
    STATS_DIR_PARAM,
    TABLE_BATCHING,
    AsyncSentimentFunction,
    PandasSentimentFunction,
    TableInferenceConfig,
    sentiment_label,
)

__all__ = [
    "BATCH_LENGTH_BUCKETS_PARAM",
    "BATCH_MAX_IDLE_PARAM",
    "BATCH_MAX_SIZE_PARAM",
    "BATCH_MAX_TOKENS_PARAM",
    "BATCH_MAX_WAIT_PARAM",
    "DEFAULT_LATENCY_BUDGET_MS",
    "INTRA_OP_THREADS_PARAM",
    "LATENCY_SLO_PARAM",
    "MODEL_DIR_ENV",
    "MODEL_DIR_PARAM",
    "MODEL_POINTER_PARAM",
    "MODEL_POLL_INTERVAL_PARAM",
    "SENTIMENT_RESULT_TYPE",
    "STATS_DIR_PARAM",
    "TABLE_BATCHING",
    "AsyncSentimentFunction",
    "PandasSentimentFunction",
    "TableInferenceConfig",
    "async_scalar_settings",
    "configure_table_env",
    "format_job_parameters",
    "python_worker_settings",
    "sentiment",
    "sentiment_label",
    "sentiment_pandas",
    "sentiment_udf",
]

#: The end-to-end latency the settings aim at when the batching config has no
#: ``latency_slo_ms``, in ms (a quarter of it gives the 50 ms bundle time the
#: DataStream job uses by default).
DEFAULT_LATENCY_BUDGET_MS = 200.0

#: PyFlink's default ``python.fn-execution.bundle.size`` (1000 in 2.3.0; read from
#: ``PythonOptions.MAX_BUNDLE_SIZE``).
_FLINK_DEFAULT_BUNDLE_SIZE = 1000
#: Per-row timeout of the async function: a stalled model fails the job only after this.
_ASYNC_TIMEOUT_MS = 600_000


def sentiment_udf(defaults: TableInferenceConfig | None = None, *, vectorized: bool = False) -> Any:
    """A sentiment UDF for ``t_env.create_temporary_system_function(name, ...)``.

    Args:
        defaults: Config for the job parameters a job does not set (e.g. a model
            directory or batch size fixed in code); None: the built-in defaults.
        vectorized: False: the ``AsyncScalarFunction`` (rows in flight batch
            together); True: the pandas function (one call per Arrow batch).

    Returns:
        A PyFlink scalar function ``STRING -> ROW<score DOUBLE, label STRING,
        model_sha256 STRING, error STRING>``.
    """
    if vectorized:
        return udf(
            PandasSentimentFunction(defaults),
            input_types=[DataTypes.STRING()],
            result_type=SENTIMENT_RESULT_TYPE,
            func_type="pandas",
        )
    return udf(
        AsyncSentimentFunction(defaults), input_types=[DataTypes.STRING()], result_type=SENTIMENT_RESULT_TYPE
    )


#: ``'pyflink_aisp.inference.sql.sentiment'``: the async function, configured by job parameters.
sentiment = sentiment_udf()
#: ``'pyflink_aisp.inference.sql.sentiment_pandas'``: the pandas (Arrow-batched) function.
sentiment_pandas = sentiment_udf(vectorized=True)


def async_scalar_settings(batching: BatchingConfig) -> dict[str, str]:
    """The ``table.exec.async-scalar.*`` options for :data:`sentiment` (Flink 2.3.0 names).

    * ``max-concurrent-operations`` = 2 x ``max_batch_size``: PyFlink's async
      scalar operator keeps at most this many rows in flight per operator
      (its Python-side queue capacity; ``process_element`` blocks when full,
      which backpressures the source). A batch can never exceed it: with the
      default of 10 the largest batch measured here was 10. Twice the batch
      size lets the next batch fill while the model computes the current one;
      more would only lengthen the queue (Little's law) without more
      throughput. (``buffer-capacity`` is its deprecated alias in 2.3.0: not set.)
    * ``timeout`` = 10 min: a row not answered by then raises ``TimeoutError``
      in PyFlink and fails the job. Rows wait behind at most two batches, so
      only a stalled model reaches it; a slow one backpressures instead.
    * ``retry-strategy`` = ``NO_RETRY``: :data:`sentiment` never raises for a
      row (failures become ``error`` rows), so a retry (default FIXED_DELAY,
      3 attempts) could only re-run a timeout or a bug, tripling the time to
      report it.
    """
    return {
        "table.exec.async-scalar.max-concurrent-operations": str(2 * batching.max_batch_size),
        "table.exec.async-scalar.timeout": f"{_ASYNC_TIMEOUT_MS} ms",
        "table.exec.async-scalar.retry-strategy": "NO_RETRY",
    }


def python_worker_settings(batching: BatchingConfig) -> dict[str, str]:
    """PyFlink settings that let the SQL functions form full batches within the latency target.

    The target is ``batching.latency_slo_ms``, else :data:`DEFAULT_LATENCY_BUDGET_MS`.
    Returns :func:`async_scalar_settings` plus:

    * ``python.fn-execution.bundle.time`` = 50 ms without a target, else the
      target / 15 within [5, 50] ms, as the DataStream job. Results leave the
      Python worker when a bundle finishes, and the async operator waits for all
      its rows in flight at each bundle end, so a row can wait up to a bundle
      time on top of batch wait, queueing and compute; the default (1000 ms)
      alone puts p99 near a second. Measured on the job (2 cores, 124 rows/s):
      p99 457 ms at 50 ms bundles, 287 ms at 10 ms, 254 ms at 5 ms, for about
      10 % less maximum throughput at 5-10 ms.
    * ``python.fn-execution.arrow.batch.size`` = ``max_batch_size``: the pandas
      function is called once per Arrow batch, so this is its largest model
      batch; a larger one would only be split again by the batcher after
      waiting longer to fill.
    * ``python.fn-execution.bundle.size`` = max(1000, 8 x ``max_batch_size``):
      at least 4x the rows in flight of the async operator, so the drain at a
      bundle end (model idle until the next rows arrive) comes once per several
      batches, and never below the Arrow batch size (PyFlink caps the Arrow
      batch at the bundle size). The time limit above still bounds latency.

    Args:
        batching: The functions' batching config (the one their job parameters give).

    Returns:
        Flink configuration keys → values, for ``t_env.get_config().set(k, v)``
        or SQL ``SET 'k' = 'v'``.
    """
    budget_ms = batching.latency_slo_ms if batching.latency_slo_ms is not None else DEFAULT_LATENCY_BUDGET_MS
    return {
        "python.fn-execution.bundle.time": str(
            50 if batching.latency_slo_ms is None else max(5, min(50, int(budget_ms / 15)))),
        "python.fn-execution.bundle.size": str(max(_FLINK_DEFAULT_BUNDLE_SIZE, 8 * batching.max_batch_size)),
        "python.fn-execution.arrow.batch.size": str(batching.max_batch_size),
        **async_scalar_settings(batching),
    }


def format_job_parameters(params: Mapping[str, str]) -> str:
    """``params`` as a ``pipeline.global-job-parameters`` value.

    A JSON object, which Flink 2.x parses as a YAML flow map: any path, ``,``,
    ``:``, quote or empty value survives. (The legacy ``k:v,k:v`` form splits
    twice with two quoting levels and refuses empty values.)
    """
    return json.dumps(dict(params))


def configure_table_env(
    t_env: Any, config: TableInferenceConfig, *, extra_job_parameters: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Set :func:`python_worker_settings` and ``config`` as global job parameters on ``t_env``.

    ``pipeline.global-job-parameters`` is one map option: this *replaces* it,
    so pass the job's other parameters (e.g. ``aisp.tokenizer.*``) in
    ``extra_job_parameters``.

    Args:
        t_env: A PyFlink ``TableEnvironment``.
        config: What the functions load and how they batch.
        extra_job_parameters: Other global job parameters of the job.

    Returns:
        Everything set (key → value), for logging.
    """
    params = {**(extra_job_parameters or {}), **config.job_parameters()}
    settings = {
        **python_worker_settings(config.batching),
        "pipeline.global-job-parameters": format_job_parameters(params),
    }
    table_config = t_env.get_config()
    for key, value in settings.items():
        table_config.set(key, value)
    return settings
