"""Flink SQL ``sentiment(text)``: batched model inference as a Python scalar function.

Register it in SQL (or with ``t_env.execute_sql``)::

    CREATE TEMPORARY SYSTEM FUNCTION sentiment
        AS 'pyflink_aisp.pipeline.sql.sentiment' LANGUAGE PYTHON;          -- async
    CREATE TEMPORARY SYSTEM FUNCTION sentiment_pandas
        AS 'pyflink_aisp.pipeline.sql.sentiment_pandas' LANGUAGE PYTHON;   -- Arrow batches

    SELECT id, s.score, s.label, s.model_sha256
    FROM (SELECT id, sentiment(`text`) AS s FROM reviews);

Both return ``ROW<score DOUBLE, label STRING, model_sha256 STRING, reason
STRING, detail STRING>`` (see :mod:`pyflink_aisp.pipeline._sql_functions` for
NULL and failed rows: route ``s.reason IS NOT NULL`` to a dead-letter table).
Select the fields, as above: PyFlink 2.3.0's ``TableResult.collect()`` in
Python fails (``EOFError``) on a nested ROW with a NULL field, i.e. on every
whole ``s`` (SQL sinks are fine).

The model, batching, p99 target and ORT threads come from the global job
parameters of the options table (the ``aisp.*`` names in
:data:`pyflink_aisp.pipeline.OPTIONS` and the docs' options page, docs/options.md), e.g.::

    SET 'pipeline.global-job-parameters' = '{"aisp.batch.max-size": "64", "aisp.latency-slo-ms": "150"}';

(a JSON object, which Flink parses as a YAML map.) The PyFlink settings that
decide whether those batches and targets are reachable are *not* job
parameters: :func:`pyflink_aisp.pipeline.flink_settings` derives them;
:func:`configure_table_env` sets them and the job parameters at once. The job
also needs ``python.executable`` / ``python.client.executable`` pointing at a
Python with this package. Importing this module needs PyFlink.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyflink.table import DataTypes
from pyflink.table.udf import udf

from pyflink_aisp.pipeline._config import InferenceOptions
from pyflink_aisp.pipeline._settings import flink_settings, format_job_parameters
from pyflink_aisp.pipeline._sql_functions import (
    SENTIMENT_RESULT_TYPE,
    AsyncSentimentFunction,
    PandasSentimentFunction,
    sentiment_label,
)

__all__ = [
    "SENTIMENT_RESULT_TYPE",
    "AsyncSentimentFunction",
    "PandasSentimentFunction",
    "configure_table_env",
    "sentiment",
    "sentiment_label",
    "sentiment_pandas",
    "sentiment_udf",
]


def sentiment_udf(defaults: InferenceOptions | None = None, *, vectorized: bool = False) -> Any:
    """A sentiment UDF for ``t_env.create_temporary_system_function(name, ...)``.

    Args:
        defaults: Options for the job parameters a job does not set (e.g. a model
            directory or batch size fixed in code); None: the table's defaults.
        vectorized: False: the ``AsyncScalarFunction`` (rows in flight batch
            together); True: the pandas function (one call per Arrow batch).

    Returns:
        A PyFlink scalar function ``STRING -> ROW<score DOUBLE, label STRING,
        model_sha256 STRING, reason STRING, detail STRING>``.
    """
    if vectorized:
        return udf(PandasSentimentFunction(defaults), input_types=[DataTypes.STRING()],
                   result_type=SENTIMENT_RESULT_TYPE, func_type="pandas")
    return udf(AsyncSentimentFunction(defaults), input_types=[DataTypes.STRING()],
               result_type=SENTIMENT_RESULT_TYPE)


#: ``'pyflink_aisp.pipeline.sql.sentiment'``: the async function, configured by job parameters.
sentiment = sentiment_udf()
#: ``'pyflink_aisp.pipeline.sql.sentiment_pandas'``: the pandas (Arrow-batched) function.
sentiment_pandas = sentiment_udf(vectorized=True)


def configure_table_env(
    t_env: Any, options: InferenceOptions, *, extra_job_parameters: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Set :func:`~pyflink_aisp.pipeline.flink_settings` and ``options`` as global
    job parameters on ``t_env``.

    ``pipeline.global-job-parameters`` is one map option: this *replaces* it,
    so pass the job's other parameters (e.g. ``aisp.tokenizer.*``) in
    ``extra_job_parameters``.

    Returns:
        Everything set (key → value), for logging.
    """
    params = {**(extra_job_parameters or {}), **options.job_parameters()}
    settings = {**flink_settings(options), "pipeline.global-job-parameters": format_job_parameters(params)}
    table_config = t_env.get_config()
    for key, value in settings.items():
        table_config.set(key, value)
    return settings
