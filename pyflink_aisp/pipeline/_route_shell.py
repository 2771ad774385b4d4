"""One Python worker's life for an operator that runs a route: one model shell per model.

A :class:`RouteShell` holds an :class:`~pyflink_aisp.pipeline._shell.OperatorShell` per model
of a route (each acquires its model, batcher, breaker and metrics, under the metric group
``model.<name>``), sends a batch down the route (:func:`~pyflink_aisp.inference.routing.run_route`,
every model's records in one :meth:`~pyflink_aisp.inference.ModelRuntime.submit_batch` call),
counts each model's part and feeds its breaker, and renders an answer's fields and its
``scored_by`` list. Used by the Kafka job's routed operator
(:mod:`~pyflink_aisp.pipeline._routed_op`) and by the registry's route SQL functions.

Per-model metrics (group ``model.<name>.aisp``): ``records`` (answered), ``scored`` (scored,
answering or not), ``escalated`` (passed on by a cascade), ``callUs`` P50/P99/Max (each call of
the model with its records of an Arrow batch, submit to answer, µs), and the model's runtime and
breaker's (batch sizes, queue wait, compute; a remote model's requests, tokens and cost).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import Inferred
from pyflink_aisp.inference.routing import Routed, RouteNode, RouteRecord, run_route
from pyflink_aisp.inference.tasks import Task, render_fields
from pyflink_aisp.outcome import Reason, reason_of
from pyflink_aisp.pipeline._shell import OperatorShell, WorkerSpec

__all__ = ["SCORED_BY", "RouteShell"]

#: The output field that lists the models that scored a record.
SCORED_BY = "scored_by"

_MODEL_COUNTERS = ("records", "scored", "escalated")
_MODEL_FAILURES = frozenset({Reason.INFERENCE_ERROR, Reason.REMOTE_ERROR, Reason.REMOTE_TIMEOUT,
                             Reason.INVALID_MODEL_OUTPUT})


class _ModelContext:
    """A function context whose metric group is ``model.<name>`` of the operator's."""

    def __init__(self, context: Any, name: str) -> None:
        self._context, self._name = context, name

    def get_task_name(self) -> str:
        return str(self._context.get_task_name())

    def get_index_of_this_subtask(self) -> int:
        return int(self._context.get_index_of_this_subtask())

    def get_metric_group(self) -> Any:
        return self._context.get_metric_group().add_group("model", self._name)


class RouteShell:
    """The models of a route in one worker.

    Args:
        node: The route.
        specs: Each model's worker spec, by name.
        tasks: Each model's task, by name.

    Raises:
        ConfigError: A model of the route without a spec or task, or a task with a field named
            ``scored_by``.

    Thread-safety: ``open``/``close``/``run`` on the operator's thread.
    """

    def __init__(self, node: RouteNode, specs: Mapping[str, WorkerSpec], tasks: Mapping[str, Task]) -> None:
        missing = sorted(set(node.models) - set(specs) | set(node.models) - set(tasks))
        if missing:
            raise ConfigError(f"the route's models {missing} have no worker spec or task")
        for name in node.models:
            if SCORED_BY in {f.name for f in tasks[name].fields}:
                raise ConfigError(f"model {name}: an output field named {SCORED_BY} clashes with the route's")
        self.node = node
        self.tasks = {name: tasks[name] for name in node.models}
        self.shells = {name: OperatorShell(specs[name], counters=_MODEL_COUNTERS, windows=("callUs",))
                       for name in node.models}

    def open(self, context: Any) -> None:
        """Acquire every model (in route order); on failure release those taken.

        Raises:
            ModelError: A model cannot be loaded.
            AffinityError: A lease could not be taken or applied.
        """
        try:
            for name, shell in self.shells.items():
                shell.open(_ModelContext(context, name))
        except BaseException:
            self.close()
            raise

    def _submit(self, model: str, inputs: Sequence[Any]) -> Future[list[Inferred | BaseException]]:
        shell = self.shells[model]
        start = time.perf_counter()
        future = shell.require("route").submit_batch(list(inputs))
        window = shell.windows["callUs"]
        future.add_done_callback(lambda _: window.add((time.perf_counter() - start) * 1e6))
        return future

    def run(self, records: Sequence[RouteRecord]) -> list[Routed]:
        """Every record's answer (in order), counted per model and judged by each model's breaker.

        Raises:
            OperatorNotOpenError: Called before ``open()``.
            CircuitOpenError: A model's circuit breaker tripped.
        """
        answers = run_route(self.node, records, self._submit) if records else []
        self._count(answers)
        self._judge(answers)
        return answers

    def render(self, answer: Routed, outcome: Inferred
               ) -> tuple[Task, Mapping[str, Any], list[dict[str, Any]]]:
        """The answering model's task, its rendered fields and the ``scored_by`` list:
        ``{"model", "model_sha256", "confidence"?, "output"?}`` per model that scored the record.

        Raises:
            InferenceError: A task cannot render its prediction.
        """
        task = self.tasks[answer.model]
        scored_by = []
        for step in answer.trail:
            entry: dict[str, Any] = {"model": step.model, "model_sha256": step.outcome.model_version}
            if step.confidence is not None:
                entry["confidence"] = step.confidence
            if step.joined:
                entry["output"] = dict(render_fields(self.tasks[step.model], step.outcome.prediction))
            scored_by.append(entry)
        return task, render_fields(task, outcome.prediction), scored_by

    def _count(self, answers: Sequence[Routed]) -> None:
        for answer in answers:
            if answer.model in self.shells and isinstance(answer.outcome, Inferred):
                self.shells[answer.model].counts["records"] += 1
            for step in answer.trail:
                counts = self.shells[step.model].counts
                counts["scored"] += 1
                counts["escalated"] += step.model != answer.model

    def _judge(self, answers: Sequence[Routed]) -> None:
        """Count each model's outcomes in its breaker: a model failure is one of the model's
        reasons (``inference_error``, ``remote_*``, ``invalid_model_output``)."""
        totals: Counter[str] = Counter()
        failed: Counter[str] = Counter()
        last: dict[str, BaseException] = {}
        for answer in answers:
            for step in answer.trail:
                totals[step.model] += step.model != answer.model  # passed on: its call succeeded
            if answer.model not in self.shells:
                continue
            totals[answer.model] += 1
            if isinstance(answer.outcome, BaseException) and reason_of(answer.outcome) in _MODEL_FAILURES:
                failed[answer.model] += 1
                last[answer.model] = answer.outcome
        for name, total in totals.items():
            self.shells[name].judge_many(failed[name], total, last.get(name))

    def close(self) -> None:
        """Release every model (and its lease); idempotent."""
        for shell in self.shells.values():
            shell.close()
