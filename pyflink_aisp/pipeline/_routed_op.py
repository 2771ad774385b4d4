"""The Arrow operator of a route: one Arrow batch of raw Kafka records, several models.

:class:`RoutedInferenceFunction` is the ``Table.map`` pandas UDF of a job run with
``--models FILE --route NAME`` (:mod:`pyflink_aisp.pipeline._routes`): per Arrow batch it
decodes every record (dead letters with their reason, as the one-model operator), sends the
decoded records down the route (:func:`~pyflink_aisp.inference.routing.run_route`: each
model gets its records of the batch in one :meth:`~pyflink_aisp.inference.ModelRuntime.submit_batch`
call, all models' calls in flight together, each model its own batcher in the worker) and
renders each answer with the answering model's task::

    {"id", <kept fields>..., <the answering model's fields>..., "model_sha256",
     "scored_by": [{"model", "model_sha256", "confidence"?, "output"?}, ...]}

``scored_by`` lists every model that scored the record, in order (``confidence``: where a
cascade measured it; ``output``: the stage's own fields, with ``answer: join``). All routes
share the job's sources, sinks and checkpoints: one exactly-once boundary.

Metrics (operator group ``aisp``): ``recordsIn``, ``recordsOut``, ``deadLetters``,
``arrowBatches``, ``noRoute``, ``endToEndUs`` P50/P99/Max, the dead-letter watch's; per
model (group ``model.<name>.aisp``): ``records`` (answered), ``scored`` (scored, answering or
not), ``escalated`` (passed on by a cascade), and its runtime's, breaker's own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

from pyflink.table.udf import FunctionContext, ScalarFunction, udf

from pyflink_aisp.errors import (
    ConfigError,
    InferenceError,
    NoRouteError,
    OperatorNotOpenError,
    OversizedOutputError,
)
from pyflink_aisp.inference import Inferred
from pyflink_aisp.inference.metrics import Window, register_window
from pyflink_aisp.inference.routing import Routed, RouteNode, RouteRecord, RuleNode
from pyflink_aisp.inference.tasks import Task, check_kept_names
from pyflink_aisp.kafka import DEFAULT_MAPPING, DecodedRecord, FieldMapping, decode_record
from pyflink_aisp.outcome import (
    MIN_RECORD_BYTES,
    DeadLettered,
    Reason,
    reason_of,
    render_dead_letter,
    render_scored,
)
from pyflink_aisp.pipeline._arrow_op import SCORED_ROW_TYPE
from pyflink_aisp.pipeline._route_shell import SCORED_BY, RouteShell
from pyflink_aisp.pipeline._shell import WorkerSpec
from pyflink_aisp.pipeline._watch import DeadLetterWatch, DeadLetterWatchConfig

__all__ = ["RouteBranch", "RoutedInferenceFunction", "route_branches", "routed_inference_udf",
           "routing_mapping"]

_COUNTERS = ("recordsIn", "recordsOut", "deadLetters", "arrowBatches", "noRoute")


def routing_mapping(mapping: FieldMapping, fields: Sequence[str]) -> FieldMapping:
    """``mapping`` that also keeps the fields the rules read (JSON Pointers), for decoding.

    Raises:
        ConfigError: A rule reads a nested field while every field is kept (``'*'``), or two
            kept fields would share a name, or the values are raw text (no fields).
    """
    extra = [f for f in fields if f not in mapping.keep]
    if not extra:
        return mapping
    if mapping.keep_all:
        nested = [f for f in extra if f.count("/") > 1]
        if nested:
            raise ConfigError(f"the route's rules read nested fields {nested}, which --keep-fields '*' "
                              "does not decode: keep fields by name instead")
        return mapping
    return replace(mapping, keep=(*mapping.keep, *extra))


@dataclass(frozen=True)
class RouteBranch:
    """One rule's records of a rule route, scored by an operator of their own: the route's
    operators then hold back only their own records (a slow model's branch does not delay another
    branch's outputs; they share the source and its backpressure).

    Attributes:
        rules: The route's top rule node.
        index: The rule whose records this operator scores; ``len(rules.rules)``: the default's.
        letters: This operator writes the decode dead letters and the ``no_route`` ones (one
            operator of a route does).

    Raises:
        ConfigError: ``index`` is not a rule's, nor the default's of a route that has one.
    """

    rules: RuleNode
    index: int
    letters: bool = False

    def __post_init__(self) -> None:
        last = len(self.rules.rules) if self.rules.default is not None else len(self.rules.rules) - 1
        if not 0 <= self.index <= last:
            raise ConfigError(f"branch {self.index} is not a rule of the route (0..{last})")

    @property
    def target(self) -> RouteNode:
        """Where this branch's records go."""
        if self.index < len(self.rules.rules):
            return self.rules.rules[self.index].to
        assert self.rules.default is not None  # __post_init__
        return self.rules.default


def route_branches(rules: RuleNode) -> list[RouteBranch]:
    """One :class:`RouteBranch` per rule (and the default), the first writing the dead letters."""
    count = len(rules.rules) + (rules.default is not None)
    return [RouteBranch(rules, i, letters=i == 0) for i in range(count)]


class RoutedInferenceFunction(ScalarFunction):  # type: ignore[misc]
    """Decode, route, infer and render one Arrow batch of raw Kafka records.

    Args:
        node: The route.
        specs: Each model of the route by name: what its worker needs (its own batching,
            breaker, swap; affinity on at most one).
        tasks: Each model's task, by name.
        fields: The JSON Pointers the rules read.
        mapping: Where each record's text and id are, and the fields its output keeps.
        max_record_bytes: Most UTF-8 bytes of key + value a sink can write.
        dead_letters: When the dead-letter watch warns or fails the job.
        branch: Score only this branch's records (``node`` is its target); None: every record.

    Raises:
        ConfigError: A model of the route without a spec or task, ``max_record_bytes`` below
            :data:`~pyflink_aisp.outcome.MIN_RECORD_BYTES`, or a kept field named like an
            output field (a task's, or ``scored_by``).
    """

    def __init__(self, node: RouteNode, specs: Mapping[str, WorkerSpec], tasks: Mapping[str, Task], *,
                 fields: Sequence[str] = (), mapping: FieldMapping = DEFAULT_MAPPING,
                 max_record_bytes: int, dead_letters: DeadLetterWatchConfig | None = None,
                 branch: RouteBranch | None = None) -> None:
        if max_record_bytes < MIN_RECORD_BYTES:
            raise ConfigError(f"max_record_bytes must be >= {MIN_RECORD_BYTES}, got {max_record_bytes}")
        self._route = RouteShell(node, specs, tasks)
        for name in node.models:
            check_kept_names(mapping.kept_names, tasks[name])
        if SCORED_BY in mapping.kept_names:
            raise ConfigError(f"a kept field named {SCORED_BY} clashes with the route's output field")
        self._fields = tuple(fields)
        self._mapping = mapping
        self._decoding = routing_mapping(mapping, self._fields)
        self._dropped = frozenset(self._decoding.kept_names) - frozenset(mapping.kept_names)
        self._max_record_bytes = max_record_bytes
        self._dead_letters = dead_letters
        self._branch = branch
        self._init_state()

    def _init_state(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self.end_to_end = Window()
        self.watch = DeadLetterWatch(self._dead_letters)
        self._open = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("counts", "end_to_end", "watch", "_open"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    def open(self, function_context: FunctionContext) -> None:
        """Acquire every model of the route (each with its lease, breaker and metrics).

        Raises:
            ModelError: A model cannot be loaded (those taken are released).
            AffinityError: A lease could not be taken or applied.
        """
        self._init_state()
        self._route.open(function_context)
        self._bind_metrics(function_context)
        self._open = True

    def _bind_metrics(self, context: Any) -> None:
        try:
            group = context.get_metric_group().add_group("aisp")
        except RuntimeError:  # python.metric.enabled is false
            return
        for name in _COUNTERS:
            group.gauge(name, lambda name=name: self.counts[name])
        register_window(group, "endToEndUs", self.end_to_end)
        group.gauge("deadLetterAlarm", lambda: int(self.watch.alarm))
        group.gauge("deadLetterSharePercent", lambda: round(100 * self.watch.last_share))

    def eval(self, frame: Any) -> Any:
        """``(n, 4)`` DataFrame ``value, topic, partition, offset`` (``key`` fifth when the id is
        the Kafka key) → ``(n, 4)`` DataFrame ``key, value, dead, source``, in input order.

        Raises:
            CircuitOpenError: A model's circuit breaker tripped.
            DeadLetterRateError: The dead-letter share passed ``--max-dead-letter-rate``.
            OperatorNotOpenError: Called before ``open()``.
        """
        import pandas as pd

        if not self._open:
            raise OperatorNotOpenError("RoutedInferenceFunction.eval called before open()")
        start = time.perf_counter()
        raw = frame.iloc[:, 0].tolist()
        topics = frame.iloc[:, 1].tolist()
        partitions = [_coordinate(v) for v in frame.iloc[:, 2].tolist()]
        offsets = [_coordinate(v) for v in frame.iloc[:, 3].tolist()]
        keys = frame.iloc[:, 4].tolist() if self._mapping.id_from_key else repeat(None)
        decoded = list(map(decode_record, raw, topics, partitions, offsets, repeat(self._decoding), keys))
        good = [i for i, d in enumerate(decoded) if isinstance(d, DecodedRecord)]
        records = [self._route_record(d) for d in decoded if isinstance(d, DecodedRecord)]
        mine = [True] * len(decoded)  # the rows this operator writes (all but other branches' own)
        if self._branch is not None:
            good, records, answers = self._branch_answers(good, records, mine)
        else:
            answers = self._route.run(records)
        rows = [render_dead_letter(d, self._max_record_bytes) if isinstance(d, DeadLettered) else ("", "")
                for d in decoded]
        dead: list[bool | None] = [True if m else None for m in mine]
        letters = [d for d, m in zip(decoded, mine, strict=True) if isinstance(d, DeadLettered) and m]
        for i, answer in zip(good, answers, strict=True):
            record = decoded[i]
            assert isinstance(record, DecodedRecord)
            rows[i], letter = self._render(record, answer, raw[i], topics[i], partitions[i], offsets[i])
            dead[i] = letter is not None
            if letter is not None:
                letters.append(letter)
        written = sum(mine)
        self._count(written, written - len(letters), answers, start)
        self.watch.record(written, letters)
        sources = [f"{t}/{p}/{o}" for t, p, o in zip(topics, partitions, offsets, strict=True)]
        return pd.DataFrame({"key": [k for k, _ in rows], "value": [v for _, v in rows], "dead": dead,
                             "source": sources})

    def _branch_answers(self, good: list[int], records: list[RouteRecord], mine: list[bool]
                        ) -> tuple[list[int], list[RouteRecord], list[Routed]]:
        """This branch's records of the batch and their answers; ``mine`` is cleared for the rows
        other operators write (other branches' records; the decode and ``no_route`` dead letters
        unless this operator writes them)."""
        assert self._branch is not None
        branch = self._branch
        if not branch.letters:
            mine[:] = [False] * len(mine)
        taken: list[int] = []
        missed: list[int] = []
        for j, (row, record) in enumerate(zip(good, records, strict=True)):
            index = branch.rules.branch(record)
            if index == branch.index:
                taken.append(j)
            elif index == len(branch.rules.rules) and branch.rules.default is None and branch.letters:
                missed.append(j)
            else:
                mine[row] = False
                continue
            mine[row] = True
        answers = dict(zip(taken, self._route.run([records[j] for j in taken]), strict=True))
        for j in missed:
            answers[j] = Routed("", NoRouteError("no_route", "no rule takes the record and the route has "
                                                 "no default"))
        kept = sorted(answers)
        return [good[j] for j in kept], [records[j] for j in kept], [answers[j] for j in kept]

    def _route_record(self, record: DecodedRecord) -> RouteRecord:
        kept = dict(record.kept)
        fields = {pointer: kept.get(pointer.rsplit("/", 1)[-1]) for pointer in self._fields}
        return RouteRecord(record.model_input, record.text, fields)

    def _render(self, record: DecodedRecord, answer: Routed, raw: Any, topic: str, partition: int,
                offset: int) -> tuple[tuple[str, str], DeadLettered | None]:
        outcome: Inferred | BaseException = answer.outcome
        if isinstance(outcome, Inferred):
            try:
                kept = {k: v for k, v in record.kept if k not in self._dropped} or None
                return (record.id, self._render_answer(record.id, answer, outcome, kept)), None
            except (OversizedOutputError, InferenceError) as exc:
                outcome = exc
        letter = DeadLettered.of_error(outcome, id=record.id, topic=topic, partition=partition, offset=offset,
                                       value=None if raw is None else bytes(raw))
        return render_dead_letter(letter, self._max_record_bytes), letter

    def _render_answer(self, record_id: str, answer: Routed, outcome: Inferred,
                       kept: Mapping[str, Any] | None) -> str:
        task, rendered, scored_by = self._route.render(answer, outcome)
        if kept:
            kept = {k: v for k, v in kept.items() if k not in rendered}
        extra_names = [f.name for f in task.fields if f.extra]
        own = {k: v for k, v in rendered.items() if k not in extra_names}
        extra = {**{k: rendered[k] for k in extra_names}, SCORED_BY: scored_by}
        return render_scored(record_id, own, outcome.model_version, extra=extra, kept=kept,
                             max_record_bytes=self._max_record_bytes)

    def _count(self, n: int, scored: int, answers: Sequence[Routed], start: float) -> None:
        self.counts["recordsIn"] += n
        self.counts["recordsOut"] += scored
        self.counts["deadLetters"] += n - scored
        self.counts["arrowBatches"] += 1
        self.counts["noRoute"] += sum(1 for a in answers if isinstance(a.outcome, Exception)
                                      and reason_of(a.outcome) is Reason.NO_ROUTE)
        self.end_to_end.add((time.perf_counter() - start) * 1e6)

    def close(self) -> None:
        """Release every model of the route (and their leases)."""
        self._route.close()
        self._open = False


def _coordinate(value: Any) -> int:
    return -1 if value is None or value != value else int(value)


def routed_inference_udf(function: RoutedInferenceFunction) -> Any:
    """``function`` as a pandas UDF for ``Table.map`` (input: all columns of the table)."""
    return udf(function, result_type=SCORED_ROW_TYPE, func_type="pandas")
