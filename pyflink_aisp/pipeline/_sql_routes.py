"""Flink SQL functions of a registry's routes: several models, each row scored once.

A route ``NAME`` of the registry (``routes:``, :mod:`pyflink_aisp.pipeline._routes`) is a
function like a model (:mod:`pyflink_aisp.pipeline.registry`)::

    CREATE TEMPORARY SYSTEM FUNCTION by_kind AS 'pyflink_aisp.pipeline.registry.by_kind' LANGUAGE PYTHON;
    SELECT id, r.label, r.score, r.scored_by FROM (SELECT id, by_kind(`text`, kind) AS r FROM reviews);

It is vectorized (one call per Arrow batch): :class:`RoutedModelFunction` sends the batch's
rows down the route with a :class:`~pyflink_aisp.pipeline._route_shell.RouteShell` (each model
its own batcher in the worker; all models' calls in flight together), so each row is scored
by the models its route names and by no other. A ``CASE`` over two registered functions is
not that: Flink plans both calls for every row and picks one result after (docs/sql.md,
"Several models: routes and CASE").

Arguments: the text first (``STRING``; ``ARRAY<FLOAT>`` when every model of the route is a
``predict`` model), then one per JSON Pointer the rules read, in the order of
:attr:`RoutePlan.fields <pyflink_aisp.pipeline._routes.RoutePlan.fields>`: argument ``k + 2`` is
the value of ``fields[k]`` (it replaces the record's field; NULL is an absent field). Its type
comes from the conditions that read it (:func:`rule_field_types`).

Result: ``ROW<the models' fields..., model_sha256, scored_by, reason, detail>``
(:func:`route_result_fields`): each field once, in first-use order, filled by the model that
answered, NULL where another model answered; ``model_sha256`` of the answering model;
``scored_by`` the JSON array of every model that scored the row (``[{"model",
"model_sha256", "confidence"?, "output"?}, ...]``, as the Kafka job's outputs). A NULL text
gives NULL fields; a row that got no answer (``no_route``, a failed model call) has
``reason`` and ``detail`` and a NULL ``scored_by``, as the per-model functions.
Importing this module needs PyFlink.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyflink.table import DataTypes
from pyflink.table.udf import FunctionContext, ScalarFunction, udf

from pyflink_aisp.errors import ConfigError, InferenceError, OperatorNotOpenError
from pyflink_aisp.inference import Inferred
from pyflink_aisp.inference.metrics import Window, register_window
from pyflink_aisp.inference.routing import CascadeNode, Condition, Routed, RouteNode, RouteRecord, RuleNode
from pyflink_aisp.inference.tasks import OutputField, SqlType, Task
from pyflink_aisp.outcome import DeadLettered, Reason, reason_of
from pyflink_aisp.pipeline._registry import ModelTask
from pyflink_aisp.pipeline._route_shell import SCORED_BY, RouteShell
from pyflink_aisp.pipeline._routes import RoutePlan
from pyflink_aisp.pipeline._shell import WorkerSpec
from pyflink_aisp.pipeline._sql_functions import failure_columns, result_frame, row_type
from pyflink_aisp.pipeline._watch import DeadLetterWatch

__all__ = ["ROUTE_TRAILER", "RoutedModelFunction", "route_result_fields", "route_udf", "rule_field_types"]

#: The fields a route function's row adds after the models' fields.
ROUTE_TRAILER = ("model_sha256", SCORED_BY, "reason", "detail")

_COUNTERS = ("recordsIn", "recordsOut", "nullInputs", "deadLetters", "noRoute")
_ARG_TYPES = {SqlType.DOUBLE: DataTypes.DOUBLE, SqlType.BOOLEAN: DataTypes.BOOLEAN,
              SqlType.STRING: DataTypes.STRING}


def route_result_fields(models: Sequence[str], tasks: Mapping[str, Task]) -> tuple[OutputField, ...]:
    """The union of the models' output fields, each name once, in first-use order.

    Args:
        models: The route's models, in first-use order (:attr:`RouteNode.models`).
        tasks: Each model's task, by name.

    Raises:
        ConfigError: Two models declare one name with different SQL types.
    """
    seen: dict[str, tuple[str, OutputField]] = {}
    for model in models:
        for field in tasks[model].fields:
            first = seen.setdefault(field.name, (model, field))
            if first[1].sql_type is not field.sql_type:
                raise ConfigError(f"the route's models declare the output field {field.name!r} with two "
                                  f"types: {first[0]} {first[1].sql_type.value}, {model} "
                                  f"{field.sql_type.value}; a SQL row has one type per field")
    return tuple(field for _, field in seen.values())


def _conditions(node: RouteNode) -> Iterator[Condition]:
    """Every condition under ``node`` (rules of nested routes too)."""
    if isinstance(node, RuleNode):
        for rule in node.rules:
            yield rule.when
            yield from _conditions(rule.to)
        if node.default is not None:
            yield from _conditions(node.default)
    elif isinstance(node, CascadeNode):
        yield from _conditions(node.last)


def _reading(condition: Condition) -> set[SqlType]:
    """The SQL types a condition can hold for: a number for ``between`` or ``equals`` of numbers
    only, a boolean for ``equals`` of booleans only, a string otherwise (None in ``equals``
    matches NULL whatever the type)."""
    types = set()
    if condition.between is not None:
        types.add(SqlType.DOUBLE)
    if condition.matches is not None or condition.tokens_between is not None:
        types.add(SqlType.STRING)
    values = [v for v in condition.equals or () if v is not None]
    if values and all(isinstance(v, bool) for v in values):
        types.add(SqlType.BOOLEAN)
    elif values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        types.add(SqlType.DOUBLE)
    elif values:
        types.add(SqlType.STRING)
    return types


def rule_field_types(node: RouteNode, fields: Sequence[str]) -> tuple[SqlType, ...]:
    """The SQL type of each rule field's argument: ``DOUBLE`` when a ``between`` reads it or
    its ``equals`` values are all numbers, ``BOOLEAN`` when they are all booleans, else ``STRING``.

    Raises:
        ConfigError: Conditions read one field as two types (one of them could never hold).
    """
    readings: dict[str, set[SqlType]] = {f: set() for f in fields}
    for condition in _conditions(node):
        if condition.field in readings:
            readings[condition.field] |= _reading(condition)
    types = []
    for pointer in fields:
        found = readings[pointer]
        if len(found) > 1:
            read_as = " and ".join(sorted(t.value for t in found))
            raise ConfigError(f"the route's rules read {pointer} as {read_as}: its SQL argument has one "
                              "type, so some of them could never hold")
        types.append(found.pop() if found else SqlType.STRING)
    return tuple(types)


def _value(value: Any) -> Any:
    """A pandas cell as the rules see it: NULL (None, or NaN in a DOUBLE column) is None."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


class RoutedModelFunction(ScalarFunction):  # type: ignore[misc]
    """``route(text, field values...) -> ROW<fields..., model_sha256, scored_by, reason, detail>``,
    vectorized over Arrow batches (see the module docstring).

    Args:
        node: The route.
        specs: Each model's worker spec, by name (a lease on at most one).
        tasks: Each model's task, by name.
        fields: The JSON Pointers the rules read: one argument each, after the text, in order.

    Raises:
        ConfigError: A model without a spec or task, a task field named ``scored_by``, or two
            models declaring one field name with different types.

    Metrics (operator group ``aisp``): ``recordsIn``, ``recordsOut``, ``nullInputs``,
    ``deadLetters``, ``noRoute``, ``endToEndUs`` (per Arrow batch), ``deadLetterAlarm`` and
    ``deadLetterSharePercent`` (warning only); per model (group ``model.<name>.aisp``) those of
    :class:`~pyflink_aisp.pipeline._route_shell.RouteShell`.
    """

    def __init__(self, node: RouteNode, specs: Mapping[str, WorkerSpec], tasks: Mapping[str, Task], *,
                 fields: Sequence[str] = ()) -> None:
        self._route = RouteShell(node, specs, tasks)
        self._fields = tuple(fields)
        self.result_fields = route_result_fields(node.models, tasks)
        self._init_state()

    def _init_state(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self.end_to_end = Window()
        self.watch = DeadLetterWatch()
        self._open = False

    def __getstate__(self) -> dict[str, Any]:
        return {"route": self._route, "fields": self._fields, "result_fields": self.result_fields}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self._route, self._fields = state["route"], state["fields"]
        self.result_fields = state["result_fields"]
        self._init_state()

    @property
    def columns(self) -> tuple[str, ...]:
        """The result row's field names."""
        return (*(f.name for f in self.result_fields), *ROUTE_TRAILER)

    def open(self, function_context: FunctionContext) -> None:
        """Acquire every model of the route (each with its batcher, breaker and metrics).

        Raises:
            ModelError: A model cannot be loaded (those taken are released).
            AffinityError: A lease could not be taken or applied.
        """
        self._init_state()
        self._route.open(function_context)
        try:
            group = function_context.get_metric_group().add_group("aisp")
        except RuntimeError:  # python.metric.enabled is false
            group = None
        if group is not None:
            for name in _COUNTERS:
                group.gauge(name, lambda name=name: self.counts[name])
            register_window(group, "endToEndUs", self.end_to_end)
            group.gauge("deadLetterAlarm", lambda: int(self.watch.alarm))
            group.gauge("deadLetterSharePercent", lambda: round(100 * self.watch.last_share))
        self._open = True

    def eval(self, texts: Any, *values: Any) -> Any:
        """``(n,)`` Series of texts and one ``(n,)`` Series per rule field → ``(n, fields + 4)``
        DataFrame, in input order.

        Raises:
            CircuitOpenError: A model's circuit breaker tripped (Flink restarts the job).
            OperatorNotOpenError: Called before ``open()``.
        """
        if not self._open:
            raise OperatorNotOpenError("RoutedModelFunction.eval called before open()")
        start = time.perf_counter()
        inputs = texts.tolist()
        read = [[_value(v) for v in column.tolist()] for column in values]  # one list per rule field
        present = [i for i, x in enumerate(inputs) if x is not None]
        records = [RouteRecord(inputs[i], inputs[i] if isinstance(inputs[i], str) else "",
                               {p: column[i] for p, column in zip(self._fields, read, strict=True)})
                   for i in present]
        answers = self._route.run(records)
        rows: list[tuple[Any, ...]] = [(None,) * len(self.columns)] * len(inputs)
        errors: list[BaseException] = []
        for i, answer in zip(present, answers, strict=True):
            rows[i], error = self._row(answer)
            if error is not None:
                errors.append(error)
        self.counts["recordsIn"] += len(inputs)
        self.counts["nullInputs"] += len(inputs) - len(present)
        self.counts["recordsOut"] += len(present) - len(errors)
        self.counts["deadLetters"] += len(errors)
        self.counts["noRoute"] += sum(reason_of(e) is Reason.NO_ROUTE for e in errors)
        self.watch.record(len(present), [DeadLettered.of_error(e) for e in errors])
        self.end_to_end.add((time.perf_counter() - start) * 1e6)
        return result_frame(rows, self.columns, self.result_fields)

    def _row(self, answer: Routed) -> tuple[tuple[Any, ...], BaseException | None]:
        """``(row, None)`` of an answered row, or ``(failed row, error)``."""
        outcome: Inferred | BaseException = answer.outcome
        if isinstance(outcome, Inferred):
            try:
                _, rendered, scored_by = self._route.render(answer, outcome)
                trail = json.dumps(scored_by, allow_nan=False)
            except (InferenceError, TypeError, ValueError) as exc:  # not JSON-able: the model's fault
                outcome = exc if isinstance(exc, InferenceError) else InferenceError(
                    f"scored_by is not JSON: {type(exc).__name__}: {exc}")
            else:
                own = [rendered.get(f.name) for f in self.result_fields]
                return (*own, outcome.model_version, trail, None, None), None
        shell = self._route.shells.get(answer.model)
        version = None if shell is None else shell.version()
        blank = (None,) * len(self.result_fields)
        return (*blank, version, None, *failure_columns(outcome)), outcome

    def close(self) -> None:
        """Release every model of the route (and their leases)."""
        self._route.close()
        self._open = False


def _text_type(plan: RoutePlan) -> Any:
    """``STRING``, or ``ARRAY<FLOAT>`` when every model is a ``predict`` model.

    Raises:
        ConfigError: Some are ``predict`` models and some not (one argument feeds them all).
    """
    numeric = {name: model.task is ModelTask.PREDICT for name, model in plan.models.items()}
    if all(numeric.values()):
        return DataTypes.ARRAY(DataTypes.FLOAT())
    if any(numeric.values()):
        predict = sorted(n for n, v in numeric.items() if v)
        raise ConfigError(f"route {plan.name}: its predict models {predict} take ARRAY<FLOAT>, the others "
                          "text: one SQL argument cannot feed both")
    return DataTypes.STRING()


def route_udf(plan: RoutePlan) -> Any:
    """The SQL function of a registry's route: a pandas scalar function ``(STRING | ARRAY<FLOAT>,
    rule field values...) -> ROW<fields..., model_sha256, scored_by, reason, detail>``.

    Each model is configured by its registry entry (batching, swap, breaker, ``gpu-affinity``);
    the worker spec's handler key is taken here, on the client.

    Raises:
        ConfigError: Mixed predict and text models, rules that read one field as two types,
            two models' fields of one name and two types, or more than one model with
            ``gpu-affinity`` (a worker takes one lease).
        ModelError: A model's files are not a model of its task.
    """
    text = _text_type(plan)
    try:
        fields = route_result_fields(plan.node.models, plan.tasks)
        arguments = [text, *(_ARG_TYPES[t]() for t in rule_field_types(plan.node, plan.fields))]
    except ConfigError as exc:
        raise ConfigError(f"route {plan.name}: {exc}") from None
    leased = [name for name, model in plan.models.items() if model.options.affinity() is not None]
    if len(leased) > 1:
        raise ConfigError(f"route {plan.name}: models {leased} each ask for a GPU lease (gpu-affinity); "
                          "the route's models share one worker: set it on one model")
    specs = {name: WorkerSpec.of(model.handler(), batching=o.batching(), swap=o.swap(), breaker=o.breaker(),
                                 affinity=o.affinity())
             for name, model in plan.models.items() for o in [model.options]}
    function = RoutedModelFunction(plan.node, specs, plan.tasks, fields=plan.fields)
    return udf(function, input_types=arguments, result_type=row_type(fields, ROUTE_TRAILER),
               func_type="pandas")
