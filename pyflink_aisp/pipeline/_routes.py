"""Routes of a model registry: several models in one job (``--models FILE --route NAME``).

A registry file may hold ``routes:`` beside its ``models:``; each route is a rule router or a
model cascade over the file's models (and its other routes)::

    routes:
      review_cascade:               # the sentiment model scores all; unsure records go to the LLM
        cascade:
          - model: sentiment
            confidence: margin      # top | margin | entropy (pyflink_aisp.inference.routing.Confidence)
            below: 0.3              # a record with a confidence below 0.3 goes on
          - model: label_llm        # the last stage: a model or a route
        answer: replace             # replace | join (the output also carries each stage's fields)
      by_kind:
        rules:                      # the first rule whose `when` holds takes the record
          - when: {field: /kind, equals: [question, request]}
            to: intent
          - when: {tokens-between: [0, 12], tokenizer: minilm/tokenizer.json}
            to: review_cascade      # a route may be a rule's target
        default: sentiment          # no default: a record no rule takes is a no_route dead letter

A ``when`` mapping's tests all hold for the rule to take a record: ``field`` (a JSON Pointer
into the record; absent: its text), ``equals`` (a value or a list of them), ``matches`` (a
regular expression, ``re.search``), ``between`` ``[low, high]`` (numbers, both included) and
``tokens-between`` ``[low, high]`` (the value's length in tokens of ``tokenizer``, a HF
``tokenizer.json``; relative paths are relative to the registry file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference.routing import (
    Answer,
    CascadeNode,
    CascadeStage,
    Condition,
    Confidence,
    ModelNode,
    RouteNode,
    Rule,
    RuleNode,
)
from pyflink_aisp.inference.tasks import Task
from pyflink_aisp.pipeline._registry import ModelRegistry, RegisteredModel, load_registry

__all__ = ["RoutePlan", "TokenCount", "describe_route", "route_plan"]

_WHEN_KEYS = {"field", "equals", "matches", "between", "tokens-between", "tokenizer"}
_STAGE_KEYS = {"model", "confidence", "below"}


class TokenCount:
    """Counts a text's tokens with a HF ``tokenizer.json`` (special tokens included; the file's
    padding and truncation settings off), loaded on first use: picklable into the job graph.

    Args:
        path: The ``tokenizer.json``.

    Raises:
        ConfigError: The file does not exist (at construction).
    """

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ConfigError(f"tokenizer {path} does not exist")
        self.path = path
        self._tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.path, self._tokenizer = state["path"], None

    def __call__(self, text: str) -> int:
        """The number of tokens of ``text``."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(self.path))
            tokenizer.no_padding()  # a file saved with padding or truncation would count its length
            tokenizer.no_truncation()
            self._tokenizer = tokenizer
        return len(self._tokenizer.encode(text).ids)


@dataclass(frozen=True)
class RoutePlan:
    """A route of a registry, ready to run.

    Attributes:
        name: The route's name.
        node: Its tree (:mod:`pyflink_aisp.inference.routing`).
        models: The models under it, by name, in first-use order.
        tasks: Each model's task (its output fields), by name.
        fields: The JSON Pointers the rules read, each once.
    """

    name: str
    node: RouteNode
    models: Mapping[str, RegisteredModel]
    tasks: Mapping[str, Task]
    fields: tuple[str, ...]


class _Builder:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.where = str(registry.path)
        self.tasks: dict[str, Task] = {}
        self.fields: dict[str, None] = {}

    def task(self, model: str) -> Task:
        if model not in self.tasks:
            self.tasks[model] = self.registry.get(model).handler().task()
        return self.tasks[model]

    def target(self, name: Any, seen: Sequence[str], what: str) -> RouteNode:
        name = str(name)
        if name in self.registry.models:
            self.task(name)
            return ModelNode(name)
        if name in self.registry.routes:
            if name in seen:
                raise ConfigError(f"{self.where}: route {seen[0]}: routes {' -> '.join([*seen, name])} "
                                  "form a cycle")
            return self.route(name, [*seen, name])
        raise ConfigError(f"{self.where}: route {seen[-1]}: {what} {name!r} is neither a model nor a route "
                          f"of the file (models {sorted(self.registry.models)}, routes "
                          f"{sorted(self.registry.routes)})")

    def route(self, name: str, seen: Sequence[str]) -> RouteNode:
        entry = self.registry.routes[name]
        unknown = sorted(set(entry) - {"rules", "default", "cascade", "answer"})
        if unknown or ("rules" in entry) == ("cascade" in entry):
            raise ConfigError(f"{self.where}: route {name}: give either 'rules' (and 'default') or "
                              f"'cascade' (and 'answer'){f'; unknown key(s) {unknown}' if unknown else ''}")
        try:
            return self.rules(name, entry, seen) if "rules" in entry else self.cascade(name, entry, seen)
        except ConfigError as exc:
            if str(exc).startswith(self.where):
                raise
            raise ConfigError(f"{self.where}: route {name}: {exc}") from None

    def rules(self, name: str, entry: Mapping[str, Any], seen: Sequence[str]) -> RouteNode:
        if "answer" in entry:
            raise ConfigError("'answer' is a cascade's key")
        listed = entry["rules"] or []
        if not isinstance(listed, list) or any(not isinstance(r, dict) or set(r) != {"when", "to"}
                                               for r in listed):
            raise ConfigError("rules must be a list of {when: {...}, to: NAME}")
        rules = tuple(Rule(self.condition(r["when"]), self.target(r["to"], seen, "rule target"))
                      for r in listed)
        default = entry.get("default")
        return RuleNode(rules, None if default is None else self.target(default, seen, "default"))

    def condition(self, when: Any) -> Condition:
        if not isinstance(when, dict) or set(when) - _WHEN_KEYS:
            raise ConfigError(f"when must be a mapping of {sorted(_WHEN_KEYS)}, got {when!r}")
        field = when.get("field")
        if field is not None:
            if not isinstance(field, str) or not field.startswith("/"):
                raise ConfigError(f"field must be a JSON Pointer (/name), got {field!r}")
            self.fields[field] = None
        equals = when.get("equals")
        count = None
        if "tokenizer" in when:
            found = Path(os.path.expanduser(str(when["tokenizer"])))
            count = TokenCount(found if found.is_absolute() else self.registry.path.resolve().parent / found)
        elif "tokens-between" in when:
            raise ConfigError("tokens-between needs 'tokenizer' (a tokenizer.json)")
        return Condition(field=field, matches=when.get("matches"), count_tokens=count,
                         equals=None if "equals" not in when else tuple(equals if isinstance(equals, list)
                                                                         else [equals]),
                         between=_pair(when.get("between")), tokens_between=_pair(when.get("tokens-between")))

    def cascade(self, name: str, entry: Mapping[str, Any], seen: Sequence[str]) -> RouteNode:
        listed = entry["cascade"]
        if not isinstance(listed, list) or len(listed) < 2 or any(not isinstance(s, dict) for s in listed):
            raise ConfigError("cascade must be a list of at least two stages, each {model: NAME, ...}")
        stages = []
        for stage in listed[:-1]:
            if set(stage) - _STAGE_KEYS or "model" not in stage:
                raise ConfigError(f"a stage takes {sorted(_STAGE_KEYS)} ('model' required), got {stage!r}")
            model = str(stage["model"])
            if model not in self.registry.models:
                raise ConfigError(f"stage {model!r} must be a model of the file (its confidence comes from "
                                  "its class probabilities); a route may only be the last stage")
            try:
                measure = Confidence(str(stage.get("confidence", Confidence.TOP.value)))
            except ValueError:
                raise ConfigError(f"stage {model}: confidence must be one of "
                                  f"{', '.join(c.value for c in Confidence)}") from None
            below = stage.get("below", 0.5)
            if isinstance(below, bool) or not isinstance(below, int | float):
                raise ConfigError(f"stage {model}: below must be a number in [0, 1], got {below!r}")
            stages.append(CascadeStage(model=model, task=self.task(model), measure=measure,
                                       below=float(below)))
        last = listed[-1]
        if set(last) != {"model"}:
            raise ConfigError(f"the last stage takes only 'model' (it passes nothing on), got {last!r}")
        try:
            answer = Answer(str(entry.get("answer", Answer.REPLACE.value)))
        except ValueError:
            raise ConfigError(f"answer must be one of {', '.join(a.value for a in Answer)}") from None
        return CascadeNode(tuple(stages), self.target(last["model"], seen, "last stage"), answer)


def _pair(value: Any) -> tuple[Any, Any] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigError(f"a range is [low, high], got {value!r}")
    return value[0], value[1]


def route_plan(registry: ModelRegistry | Path | str, name: str) -> RoutePlan:
    """The route ``name`` of a registry, with its models' handlers' tasks.

    Raises:
        ConfigError: No such route, a bad key or value, a target that is neither a model nor a
            route, a cycle of routes, a stage model without class probabilities (one line naming
            the file and the route).
        ModelError: A model's files are not a model of its task.
    """
    if not isinstance(registry, ModelRegistry):
        registry = load_registry(registry)
    if name not in registry.routes:
        raise ConfigError(f"{registry.path} names no route {name!r}; it has {sorted(registry.routes)}")
    builder = _Builder(registry)
    node = builder.route(name, [name])
    models = {m: registry.get(m) for m in node.models}
    return RoutePlan(name, node, models, {m: builder.tasks[m] for m in models}, tuple(builder.fields))


def _condition_text(condition: Condition) -> str:
    where = condition.field or "text"
    tests = [f"equals {list(condition.equals)}" if condition.equals is not None else "",
             f"matches {condition.matches!r}" if condition.matches is not None else "",
             f"between {list(condition.between)}" if condition.between is not None else "",
             "" if condition.tokens_between is None else f"tokens-between {list(condition.tokens_between)}"]
    return f"{where} " + " and ".join(t for t in tests if t)


def describe_route(node: RouteNode) -> str:
    """One line: where a route sends records (e.g. ``cascade sentiment (margin < 0.3) -> label_llm``)."""
    if isinstance(node, ModelNode):
        return node.name
    if isinstance(node, RuleNode):
        rules = [f"{_condition_text(r.when)} -> {describe_route(r.to)}" for r in node.rules]
        default = "no_route dead letter" if node.default is None else describe_route(node.default)
        return "rules [" + "; ".join([*rules, f"else -> {default}"]) + "]"
    assert isinstance(node, CascadeNode)
    stages = [f"{s.model} ({s.measure.value} < {s.below:g})" for s in node.stages]
    return f"cascade {' -> '.join([*stages, describe_route(node.last)])}, answer {node.answer.value}"
