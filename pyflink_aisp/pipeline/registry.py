"""Flink SQL functions of the model registry: one per named model, registered without Python.

With a registry file (:mod:`pyflink_aisp.pipeline._registry`) named by ``$AISP_MODELS``
(``aisp sql --models FILE`` sets it for the SQL client), each model ``NAME`` is a function::

    CREATE TEMPORARY SYSTEM FUNCTION intent AS 'pyflink_aisp.pipeline.registry.intent' LANGUAGE PYTHON;
    CREATE TEMPORARY SYSTEM FUNCTION intent_head
        AS 'pyflink_aisp.pipeline.registry.intent_head_pandas' LANGUAGE PYTHON;  -- Arrow batches

    SELECT id, i.label, i.score FROM (SELECT id, intent(`text`) AS i FROM tickets);

``NAME`` is the async function (rows in flight batch together), ``NAME_pandas`` the
vectorized one (one call per Arrow batch). The argument is ``STRING`` for text models and
``ARRAY<FLOAT>`` for ``predict``; the result is ``ROW<task fields..., model_sha256 STRING,
reason STRING, detail STRING>``: ``classify`` ``label STRING, score DOUBLE`` (with
``top-k`` also ``top_labels ARRAY<STRING>, top_scores ARRAY<DOUBLE>``), ``embed``
``embedding ARRAY<FLOAT>``, ``predict`` one field per graph output, ``sentiment`` ``score
DOUBLE, label STRING``, a handler its own. Null in, null fields out; a failed row has
``reason`` and ``detail`` (route ``f.reason IS NOT NULL`` to a dead-letter table), as for
:mod:`pyflink_aisp.pipeline.sql`.

Each function is configured by its registry entry alone (model, device, batching), not by
the ``aisp.*`` job parameters; it is resolved when the SQL client plans the statement (the
registry is read there, the model's task read from its files) and ships to the workers with
its options, so the workers need the model files at the same paths, not the registry.
Several functions of one job each have their own model and batcher in a Python worker.

Each route ``NAME`` of the file (``routes:``, :mod:`pyflink_aisp.pipeline._routes`) is a function
too, vectorized (``NAME_pandas`` names the same one): ``NAME(text, field values...)`` scores each
row with the models its route names, and no other, and returns the union of their fields with
``model_sha256, scored_by, reason, detail`` (:mod:`pyflink_aisp.pipeline._sql_routes`; a
``CASE`` over two model functions calls both for every row: docs/sql.md)::

    CREATE TEMPORARY SYSTEM FUNCTION by_kind AS 'pyflink_aisp.pipeline.registry.by_kind' LANGUAGE PYTHON;
    SELECT id, r.label, r.scored_by FROM (SELECT id, by_kind(`text`, kind) AS r FROM tickets);

Importing this module needs PyFlink.
"""

from __future__ import annotations

from typing import Any

from pyflink.table import DataTypes
from pyflink.table.udf import udf

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.pipeline._registry import ModelTask, RegisteredModel, registry_from_env
from pyflink_aisp.pipeline._routes import route_plan
from pyflink_aisp.pipeline._sql_functions import AsyncModelFunction, PandasModelFunction, result_row_type
from pyflink_aisp.pipeline._sql_routes import route_udf

__all__ = ["model_udf", "route_udf"]

_PANDAS = "_pandas"


def model_udf(model: RegisteredModel, *, vectorized: bool = False) -> Any:
    """The SQL function of one registered model.

    Args:
        model: The registry entry.
        vectorized: False: the async function; True: the pandas (Arrow-batched) one.

    Returns:
        A PyFlink scalar function ``STRING`` (``ARRAY<FLOAT>`` for ``predict``) ``->
        ROW<task fields..., model_sha256, reason, detail>``.

    Raises:
        ModelError: The model's files do not declare its task's fields (read here, on the client).
        ConfigError: A handler class that cannot be built.
    """
    task = model.handler().task()
    arg = DataTypes.ARRAY(DataTypes.FLOAT()) if model.task is ModelTask.PREDICT else DataTypes.STRING()
    if vectorized:
        return udf(PandasModelFunction(model.options, task, job_parameters=False), input_types=[arg],
                   result_type=result_row_type(task), func_type="pandas")
    return udf(AsyncModelFunction(model.options, task, job_parameters=False), input_types=[arg],
               result_type=result_row_type(task))


def __getattr__(name: str) -> Any:
    """``NAME`` / ``NAME_pandas``: the function of the registry's model or route ``NAME`` (PEP 562).

    Raises:
        AttributeError: No such model or route in ``$AISP_MODELS`` (or no registry), or a route
            refused (:func:`~pyflink_aisp.pipeline._sql_routes.route_udf`): Flink reports it when
            the ``CREATE FUNCTION`` statement is planned.
        ModelError: A model's files are not a model of its task.
    """
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        registry = registry_from_env()
        route = name[: -len(_PANDAS)] if name.endswith(_PANDAS) and name not in registry.routes else name
        if route in registry.routes:
            return route_udf(route_plan(registry, route))
        if name not in registry.models and name.endswith(_PANDAS):
            return model_udf(registry.get(name[: -len(_PANDAS)]), vectorized=True)
        return model_udf(registry.get(name))
    except ConfigError as exc:
        raise AttributeError(f"pyflink_aisp.pipeline.registry.{name}: {exc}") from exc
