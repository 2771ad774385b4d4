"""Routing and cascades: which of several models scores each record (PyFlink-free).

A route is a tree over named models (:class:`ModelNode`, :class:`RuleNode`,
:class:`CascadeNode`); :meth:`RouteNode.start` sends a batch of records down it:

* a :class:`RuleNode` sends each record to the first :class:`Rule` whose
  :class:`Condition` holds (equality, a regular expression, a numeric range or a length in
  tokens over one of the record's fields or its text), else to its default; a record with
  neither is a ``no_route`` dead letter (:class:`~pyflink_aisp.errors.NoRouteError`);
* a :class:`CascadeNode` lets its first stage score every record; a record whose confidence
  (:class:`Confidence`) is below the stage's threshold goes on to the next stage, and so on:
  the model cascade of FrugalGPT (Chen, Zaharia and Zou, "FrugalGPT", arXiv:2305.05176, 2023),
  here with a fixed confidence measure instead of a learned scorer.

Each node's subsets are submitted before any is waited on, and a cascade submits its next
stage as soon as its own stage is done (whatever its siblings under a rule do), so the models
of one batch compute at the same time, each in its own batcher (one per model and worker). The answer
of a record (:class:`Routed`) names the model that answered and every model that scored
it (its trail of :class:`Step`), with their versions and confidences.
"""

from __future__ import annotations

import abc
import enum
import math
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

import numpy as np

from pyflink_aisp.errors import ConfigError, InferenceError, NoRouteError
from pyflink_aisp.inference._runtime import Inferred
from pyflink_aisp.inference.tasks import Task

__all__ = [
    "Answer",
    "CascadeNode",
    "CascadeStage",
    "Condition",
    "Confidence",
    "ModelNode",
    "RouteNode",
    "RouteRecord",
    "Routed",
    "Rule",
    "RuleNode",
    "Step",
    "Submit",
    "confidence_of",
    "run_route",
]

#: ``(model name, model inputs) -> future of one outcome per input, in order``:
#: :meth:`ModelRuntime.submit_batch <pyflink_aisp.inference.ModelRuntime.submit_batch>` of that model.
Submit = Callable[[str, Sequence[Any]], "Future[list[Inferred | BaseException]]"]


class Confidence(enum.StrEnum):
    """How sure a model is of one prediction, from its class probabilities ``p`` (``(k,)``,
    normalised to sum 1): higher is surer, all in ``[0, 1]``.

    The three uncertainty measures of active learning (Settles, "Active Learning Literature
    Survey", University of Wisconsin-Madison CS TR 1648, 2009, section 3.1), as confidences.
    Scores that are not one distribution (the independent sigmoids of a multi-label head) are
    normalised to sum 1 first: the measures then compare the labels' relative scores, not
    calibrated probabilities (``[0.9, 0.9]`` has margin 0).
    """

    TOP = "top"  #: the top probability, ``max p``
    MARGIN = "margin"  #: the top probability less the second (1 with one class)
    ENTROPY = "entropy"  #: ``1 - H(p) / ln k`` (1: one class certain; 0: uniform)


def confidence_of(probabilities: Any, measure: Confidence) -> float:
    """The confidence of one prediction.

    Args:
        probabilities: ``(k,)`` non-negative scores, ``k >= 1`` (normalised here).
        measure: Which confidence.

    Raises:
        InferenceError: Not a ``(k,)`` vector of finite non-negative numbers with a positive sum.
    """
    try:
        p = np.asarray(probabilities, dtype=np.float64)
    except (TypeError, ValueError) as exc:  # not numbers, or ragged
        raise InferenceError(f"a cascade needs (k,) non-negative class probabilities, got {probabilities!r}"
                             ) from exc
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise InferenceError(f"a cascade needs (k,) non-negative class probabilities, got {p!r}")
    p = p / p.sum()
    if measure is Confidence.TOP:
        return float(p.max())
    if p.size == 1:
        return 1.0
    if measure is Confidence.MARGIN:
        top2 = np.sort(p)[-2:]
        return float(top2[1] - top2[0])
    nonzero = p[p > 0]
    return float(1.0 + (nonzero * np.log(nonzero)).sum() / math.log(p.size))


@dataclass(frozen=True)
class RouteRecord:
    """One record as a route sees it.

    Attributes:
        model_input: What a model gets (the decoded record's ``model_input``).
        text: The record's text (``""`` for a record of features).
        fields: JSON Pointer → value of the fields the rules read (None where absent).
    """

    model_input: Any
    text: str = ""
    fields: Mapping[str, Any] = dc_field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """One model's part in a record's answer.

    Attributes:
        model: The model's name.
        outcome: Its result (prediction and version).
        confidence: Its confidence, where a cascade measured one, else None.
        joined: A stage of a cascade whose answer joins the stages' outputs
            (:attr:`Answer.JOIN`): the record's output carries this step's own fields too.
    """

    model: str
    outcome: Inferred
    confidence: float | None = None
    joined: bool = False


@dataclass(frozen=True)
class Routed:
    """A record's answer through a route.

    Attributes:
        model: The name of the model that answered (or failed); ``""`` when no rule took it.
        outcome: Its result, or the record's error (a failed model call, ``no_route``).
        trail: Every model that scored the record before the answer, in order (the answering
            model last when it answered).
    """

    model: str
    outcome: Inferred | BaseException
    trail: tuple[Step, ...] = ()


class _Pending(abc.ABC):
    """Answers being computed for a batch of records; :meth:`result` waits for them."""

    @abc.abstractmethod
    def waiting(self) -> list[Future[Any]]:
        """Advance as far as done calls allow (submitting the next calls) without blocking; the
        calls still needed before :meth:`answers`, empty when it is ready."""

    @abc.abstractmethod
    def answers(self) -> list[Routed]:
        """One answer per record, in order; only once :meth:`waiting` is empty."""

    def result(self) -> list[Routed]:
        """One answer per record, in order (blocks until every call is done)."""
        while pending := self.waiting():
            wait(pending, return_when=FIRST_COMPLETED)
        return self.answers()


class RouteNode(abc.ABC):
    """A node of a route: sends records to models."""

    @property
    @abc.abstractmethod
    def models(self) -> tuple[str, ...]:
        """The names of the models under this node, each once, in first-use order."""

    @abc.abstractmethod
    def start(self, records: Sequence[RouteRecord], submit: Submit) -> _Pending:
        """Submit the records' first model calls; the answers come from ``.result()``."""


@dataclass(frozen=True)
class _Done(_Pending):
    done: list[Routed]

    def waiting(self) -> list[Future[Any]]:
        return []

    def answers(self) -> list[Routed]:
        return self.done


@dataclass(frozen=True, eq=False)
class _Called(_Pending):
    model: str
    future: Future[list[Inferred | BaseException]]
    n: int

    def waiting(self) -> list[Future[Any]]:
        return [] if self.future.done() else [self.future]

    def answers(self) -> list[Routed]:
        try:
            outcomes: Sequence[Inferred | BaseException] = self.future.result()
        except Exception as exc:  # the whole call failed: each record gets the error
            outcomes = [exc] * self.n
        if len(outcomes) != self.n:  # a runtime that broke its contract: no record gets another's answer
            error = InferenceError(f"model {self.model} returned {len(outcomes)} outcomes for "
                                   f"{self.n} records")
            outcomes = [error] * self.n
        return [Routed(self.model, o, (Step(self.model, o),) if isinstance(o, Inferred) else ())
                for o in outcomes]


@dataclass(frozen=True)
class ModelNode(RouteNode):
    """One model scores the records.

    Attributes:
        name: The model's name.
    """

    name: str

    @property
    def models(self) -> tuple[str, ...]:
        return (self.name,)

    def start(self, records: Sequence[RouteRecord], submit: Submit) -> _Pending:
        if not records:
            return _Done([])
        return _Called(self.name, submit(self.name, [r.model_input for r in records]), len(records))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _same(value: Any, wanted: Any) -> bool:
    """JSON equality: equal numbers (``1 == 1.0``; a bool is no number), else equal values of one type."""
    number = _number(value)
    if number is not None and _number(wanted) is not None:
        return number == _number(wanted)
    return type(value) is type(wanted) and bool(value == wanted)


@dataclass(frozen=True, kw_only=True)
class Condition:
    """When a rule takes a record; every given test must hold.

    Attributes:
        field: JSON Pointer of the record's field the tests read; None: the record's text.
        equals: The value is one of these (JSON scalars; ``None`` matches an absent field).
        matches: A regular expression found in the value (``re.search``; strings only).
        between: ``(low, high)``: a number with ``low <= value <= high``.
        tokens_between: ``(low, high)``: a string of ``low..high`` tokens, both included, as
            ``count_tokens`` counts them.
        count_tokens: Counts a string's tokens (e.g. HF ``tokenizers``' ``len(encode(s).ids)``);
            required with ``tokens_between``.

    Raises:
        ConfigError: No test, a regular expression that does not compile, a range with
            ``low > high``, or ``tokens_between`` without ``count_tokens``.
    """

    field: str | None = None
    equals: tuple[Any, ...] | None = None
    matches: str | None = None
    between: tuple[float, float] | None = None
    tokens_between: tuple[int, int] | None = None
    count_tokens: Callable[[str], int] | None = dc_field(default=None, compare=False)

    def __post_init__(self) -> None:
        tests = (self.equals, self.matches, self.between, self.tokens_between)
        if all(t is None for t in tests):
            raise ConfigError("a rule's condition needs a test: equals, matches, between or tokens-between")
        if self.matches is not None:
            try:
                re.compile(self.matches)
            except re.error as exc:
                raise ConfigError(f"matches {self.matches!r} is not a regular expression: {exc}") from None
        for name in ("between", "tokens_between"):
            pair = getattr(self, name)
            if pair is not None and (len(pair) != 2 or any(_number(v) is None for v in pair)
                                     or pair[0] > pair[1]):
                raise ConfigError(f"{name.replace('_', '-')} takes [low, high] numbers with low <= high, "
                                  f"got {pair!r}")
        if self.tokens_between is not None and self.count_tokens is None:
            raise ConfigError("tokens-between needs a tokenizer to count tokens with")

    def holds(self, record: RouteRecord) -> bool:
        """Whether every test holds for the record (a field of the wrong type fails its test)."""
        value = record.text if self.field is None else record.fields.get(self.field)
        if self.equals is not None and not any(_same(value, v) for v in self.equals):
            return False
        if self.matches is not None and not (isinstance(value, str) and re.search(self.matches, value)):
            return False
        if self.between is not None:
            number = _number(value)
            if number is None or not self.between[0] <= number <= self.between[1]:
                return False
        if self.tokens_between is not None:
            assert self.count_tokens is not None  # __post_init__
            if not isinstance(value, str):
                return False
            tokens = self.count_tokens(value)
            if not self.tokens_between[0] <= tokens <= self.tokens_between[1]:
                return False
        return True


@dataclass(frozen=True)
class Rule:
    """Records for which ``when`` holds go to ``to``.

    Attributes:
        when: The condition.
        to: The node they go to (a model, or another route).
    """

    when: Condition
    to: RouteNode


def _models(nodes: Sequence[RouteNode]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for node in nodes for name in node.models))


@dataclass(frozen=True, eq=False)
class _Gathered(_Pending):
    n: int
    parts: list[tuple[list[int], _Pending]]

    def waiting(self) -> list[Future[Any]]:
        return [f for _, pending in self.parts for f in pending.waiting()]

    def answers(self) -> list[Routed]:
        out: list[Routed] = [Routed("", NoRouteError("no_route", "no rule takes the record and the route "
                                                     "has no default"))] * self.n
        for rows, pending in self.parts:
            for row, answer in zip(rows, pending.answers(), strict=True):
                out[row] = answer
        return out


@dataclass(frozen=True)
class RuleNode(RouteNode):
    """Each record goes to the first rule whose condition holds, else to ``default``.

    Attributes:
        rules: In order; the first that holds takes the record.
        default: Where the others go; None: they are ``no_route`` dead letters.
    """

    rules: tuple[Rule, ...]
    default: RouteNode | None = None

    def __post_init__(self) -> None:
        if not self.rules and self.default is None:
            raise ConfigError("a rule route needs at least one rule or a default")

    @property
    def models(self) -> tuple[str, ...]:
        return _models([r.to for r in self.rules] + ([self.default] if self.default else []))

    def branch(self, record: RouteRecord) -> int:
        """The index of the rule that takes the record; ``len(rules)``: the default's."""
        for i, rule in enumerate(self.rules):
            if rule.when.holds(record):
                return i
        return len(self.rules)

    def start(self, records: Sequence[RouteRecord], submit: Submit) -> _Pending:
        targets = [r.to for r in self.rules] + [self.default]
        rows: list[list[int]] = [[] for _ in targets]
        for i, record in enumerate(records):
            rows[self.branch(record)].append(i)
        parts = [(taken, target.start([records[i] for i in taken], submit))
                 for taken, target in zip(rows, targets, strict=True) if taken and target is not None]
        return _Gathered(len(records), parts)


class Answer(enum.StrEnum):
    """What a cascade's output holds of the stages before the one that answered."""

    REPLACE = "replace"  #: the answering stage's fields; earlier stages only in the trail (model, version)
    JOIN = "join"  #: the trail also carries each earlier stage's own fields


@dataclass(frozen=True)
class CascadeStage:
    """A stage of a cascade that may pass records on.

    Attributes:
        model: The stage's model.
        task: The model's task (its :meth:`~pyflink_aisp.inference.tasks.Task.probabilities`
            give the confidence).
        measure: Which confidence.
        below: Records with a confidence below this go on to the next stage.

    Raises:
        ConfigError: A task without class probabilities, or ``below`` outside ``[0, 1]``.
    """

    model: str
    task: Task
    measure: Confidence = Confidence.TOP
    below: float = 0.5

    def __post_init__(self) -> None:
        if not self.task.has_probabilities:
            raise ConfigError(f"cascade stage {self.model}: its task ({type(self.task).__name__}) gives no "
                              "class probabilities, so no confidence: it can only be the last stage")
        if _number(self.below) is None or not 0.0 <= self.below <= 1.0:
            raise ConfigError(f"cascade stage {self.model}: below must be in [0, 1], got {self.below!r}")


@dataclass(eq=False)
class _Cascading(_Pending):
    """A cascade's batch: ``current`` holds the calls of phase ``phase`` (0: the first stage's
    model on every record; k: the node after stage k-1 on the records it passed on, ``rows``)."""

    node: CascadeNode
    records: Sequence[RouteRecord]
    current: _Pending
    submit: Submit
    phase: int = 0
    rows: list[int] = dc_field(default_factory=list)
    done: list[Routed] = dc_field(default_factory=list)
    finished: bool = False

    def waiting(self) -> list[Future[Any]]:
        while not self.finished:
            pending = self.current.waiting()
            if pending:
                return pending
            self._advance()
        return []

    def answers(self) -> list[Routed]:
        return self.done

    def _advance(self) -> None:
        """Take the current phase's answers; submit the next stage's records (or finish)."""
        got = self.current.answers()
        if self.phase == 0:
            self.done, self.rows = list(got), list(range(len(got)))
        else:
            for row, answer in zip(self.rows, got, strict=True):
                self.done[row] = Routed(answer.model, answer.outcome, self.done[row].trail + answer.trail)
        if self.phase == len(self.node.stages):
            self.finished = True
            return
        stage = self.node.stages[self.phase]
        onward: list[int] = []
        for row in self.rows:
            answer = self.done[row]
            if not isinstance(answer.outcome, Inferred):
                continue
            try:
                probabilities = stage.task.probabilities(answer.outcome.prediction)
                score = confidence_of(probabilities, stage.measure)
            except Exception as exc:  # the prediction is not of its task's shape
                error = InferenceError(f"cascade stage {stage.model}: no confidence: "
                                       f"{type(exc).__name__}: {exc}")
                self.done[row] = Routed(stage.model, error, answer.trail)
                continue
            joined = self.node.answer is Answer.JOIN
            trail = (*answer.trail[:-1], Step(stage.model, answer.outcome, score, joined))
            self.done[row] = Routed(answer.model, answer.outcome, trail)
            if score < stage.below:
                onward.append(row)
        self.current = self.node.after()[self.phase].start([self.records[i] for i in onward], self.submit)
        self.rows, self.phase = onward, self.phase + 1


@dataclass(frozen=True)
class CascadeNode(RouteNode):
    """A model cascade: each stage scores what the stage before passed on; ``last`` takes what
    the last stage passes on.

    Attributes:
        stages: The stages that may pass records on (at least one), first to last.
        last: The final node (a model, or another route).
        answer: What the output holds of the stages before the answering one.
    """

    stages: tuple[CascadeStage, ...]
    last: RouteNode
    answer: Answer = Answer.REPLACE

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("a cascade needs at least two models: a stage and a last one")

    @property
    def models(self) -> tuple[str, ...]:
        return _models([ModelNode(s.model) for s in self.stages] + [self.last])

    def after(self) -> list[RouteNode]:
        """The node after each stage (the next stage's model, then ``last``)."""
        return [ModelNode(s.model) for s in self.stages[1:]] + [self.last]

    def start(self, records: Sequence[RouteRecord], submit: Submit) -> _Pending:
        if not records:
            return _Done([])
        return _Cascading(self, records, ModelNode(self.stages[0].model).start(records, submit), submit)


def run_route(node: RouteNode, records: Sequence[RouteRecord], submit: Submit) -> list[Routed]:
    """Every record's answer through ``node``, in order (blocking).

    Args:
        node: The route.
        records: The batch.
        submit: Queues a model call (one per model and node visit, with all its records).

    Returns:
        One :class:`Routed` per record; never raises for a record (a failed call is its
        records' outcome).
    """
    return node.start(records, submit).result()
