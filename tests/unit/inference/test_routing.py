"""Routing and cascades (inference/routing.py) and the tasks' class probabilities, with fake models."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError, InferenceError, NoRouteError
from pyflink_aisp.inference._runtime import Inferred
from pyflink_aisp.inference.routing import (
    Answer,
    CascadeNode,
    CascadeStage,
    Condition,
    Confidence,
    ModelNode,
    Routed,
    RouteRecord,
    Rule,
    RuleNode,
    Step,
    confidence_of,
    run_route,
)
from pyflink_aisp.inference.tasks import (
    ClassificationTask,
    GenerationTask,
    OutputField,
    PredictionTask,
    SentimentTask,
    SqlType,
)
from pyflink_aisp.outcome import Reason, reason_of

CLASSES = ClassificationTask(labels=("neg", "pos"))


def sharpen(x: float) -> list[float]:
    y = max(0.0, min(1.0, 2 * x - 0.5))
    return [1 - y, y]


#: model name -> prediction of one input (x: P(pos) as model a sees it)
CASCADE_MODELS: dict[str, Callable[[Any], Any]] = {
    "a": lambda x: [1 - x, x],
    "b": sharpen,
    "c": lambda x: [0.0, 1.0] if x >= 0.5 else [1.0, 0.0],
}


class FakeModels:
    """A fake ``Submit``: each model is a function of one input; a raising one fails that record."""

    def __init__(self, fns: dict[str, Callable[[Any], Any]], *, broken: frozenset[str] = frozenset()) -> None:
        self.fns, self.broken = fns, broken
        self.calls: list[tuple[str, list[Any]]] = []

    def outcome(self, name: str, x: Any) -> Inferred | BaseException:
        try:
            return Inferred(self.fns[name](x), f"sha-{name}")
        except Exception as exc:  # this record fails
            return exc

    def __call__(self, name: str, inputs: Sequence[Any]) -> Future[list[Inferred | BaseException]]:
        self.calls.append((name, list(inputs)))
        future: Future[list[Inferred | BaseException]] = Future()
        if name in self.broken:
            future.set_exception(InferenceError(f"{name} is down"))
        else:
            future.set_result([self.outcome(name, x) for x in inputs])
        return future

    def inputs_of(self, name: str) -> list[list[Any]]:
        return [inputs for called, inputs in self.calls if called == name]


def records(*xs: Any) -> list[RouteRecord]:
    return [RouteRecord(model_input=x) for x in xs]


# --- confidence ---------------------------------------------------------------------------------

def test_confidence_of_a_hand_computed_vector() -> None:
    p = [0.7, 0.2, 0.1]
    entropy = -sum(q * math.log(q) for q in p)
    assert confidence_of(p, Confidence.TOP) == pytest.approx(0.7)
    assert confidence_of(p, Confidence.MARGIN) == pytest.approx(0.5)
    assert confidence_of(p, Confidence.ENTROPY) == pytest.approx(1 - entropy / math.log(3))
    assert confidence_of(p, Confidence.ENTROPY) == pytest.approx(0.27015, abs=1e-5)


@pytest.mark.parametrize("measure", list(Confidence))
def test_confidence_of_uniform_and_one_hot(measure: Confidence) -> None:
    uniform = confidence_of([0.25] * 4, measure)
    assert uniform == pytest.approx(0.25 if measure is Confidence.TOP else 0.0, abs=1e-12)
    assert confidence_of([0.0, 1.0, 0.0], measure) == pytest.approx(1.0)
    assert confidence_of([3.0], measure) == pytest.approx(1.0)


@pytest.mark.parametrize("measure", list(Confidence))
def test_confidence_of_normalises(measure: Confidence) -> None:
    assert confidence_of([7, 2, 1], measure) == pytest.approx(confidence_of([0.7, 0.2, 0.1], measure))
    assert confidence_of(np.array([2.0, 6.0], np.float32), Confidence.TOP) == pytest.approx(0.75)


@pytest.mark.parametrize("bad", [[0.5, float("nan")], [0.5, float("inf")], [1.2, -0.2], [],
                                 [[0.5, 0.5]], [0.0, 0.0], 0.7, None])
def test_confidence_of_refuses_what_is_no_probability_vector(bad: Any) -> None:
    with pytest.raises(InferenceError):
        confidence_of(bad, Confidence.TOP)


def test_confidence_of_non_numbers_raise_its_documented_error() -> None:
    with pytest.raises(InferenceError):
        confidence_of(["pos", "neg"], Confidence.TOP)


# --- conditions ---------------------------------------------------------------------------------

def rec(text: str = "", **fields: Any) -> RouteRecord:
    return RouteRecord(model_input=text, text=text, fields={f"/{k}": v for k, v in fields.items()})


def test_equals_strings_and_numbers() -> None:
    lang = Condition(field="/lang", equals=("en", "de"))
    got = [lang.holds(rec(lang=v)) for v in ("en", "de", "fr", "EN", None)]
    assert got == [True, True, False, False, False]
    three = Condition(field="/n", equals=(3,))
    assert [three.holds(rec(n=v)) for v in (3, 3.0, 3.5, "3")] == [True, True, False, False]
    assert Condition(field="/n", equals=(2.5,)).holds(rec(n=2.5))


def test_equals_keeps_bools_apart_and_none_matches_an_absent_field() -> None:
    assert not Condition(field="/f", equals=(1,)).holds(rec(f=True))
    assert not Condition(field="/f", equals=(True,)).holds(rec(f=1))
    assert not Condition(field="/f", equals=(0,)).holds(rec(f=False))
    assert Condition(field="/f", equals=(True,)).holds(rec(f=True))
    absent = Condition(field="/tier", equals=(None,))
    assert absent.holds(rec()) and not absent.holds(rec(tier="gold"))


def test_matches_searches_strings_only() -> None:
    cond = Condition(field="/sku", matches=r"\d{3}")
    assert cond.holds(rec(sku="ab-123-x"))  # re.search: anywhere in the string
    assert not cond.holds(rec(sku="ab-12"))
    assert not cond.holds(rec(sku=123))
    assert not cond.holds(rec())


def test_between_is_inclusive_and_numeric() -> None:
    cond = Condition(field="/age", between=(18, 65))
    got = [cond.holds(rec(age=v)) for v in (17.999, 18, 40.5, 65, 65.001, "40", True, None)]
    assert got == [False, True, True, True, False, False, False, False]


def test_tokens_between_counts_with_the_given_function() -> None:
    counted: list[str] = []

    def words(s: str) -> int:
        counted.append(s)
        return len(s.split())

    short = Condition(tokens_between=(1, 3), count_tokens=words)
    assert [short.holds(rec(t)) for t in ("one", "one two three", "one two three four", "")] == \
        [True, True, False, False]
    assert counted == ["one", "one two three", "one two three four", ""]
    assert not Condition(field="/n", tokens_between=(0, 9), count_tokens=words).holds(rec(n=3))


def test_tests_are_anded_and_field_none_reads_the_text() -> None:
    cond = Condition(matches=r"^urgent", tokens_between=(1, 2), count_tokens=lambda s: len(s.split()))
    assert cond.holds(rec("urgent fix", subject="ignored"))
    assert not cond.holds(rec("urgent fix now"))  # three tokens
    assert not cond.holds(rec("fix urgent"))  # the regex fails
    both = Condition(field="/lang", equals=("en",), matches="^e")
    assert both.holds(rec(lang="en")) and not both.holds(rec(lang="de"))


@pytest.mark.parametrize("kwargs", [
    {"field": "/x"}, {"matches": "(unclosed"}, {"between": (5, 1)}, {"between": ("a", 1)},
    {"tokens_between": (3, 1), "count_tokens": len}, {"tokens_between": (1, 3)}])
def test_bad_conditions_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Condition(**kwargs)


# --- rule routes --------------------------------------------------------------------------------

def tag(name: str) -> Callable[[Any], Any]:
    return lambda x: f"{name}({x})"


RULES = RuleNode(
    rules=(Rule(Condition(field="/lang", equals=("en",)), ModelNode("english")),
           Rule(Condition(matches="^q:"), ModelNode("questions"))),
    default=ModelNode("other"),
)


def test_first_matching_rule_wins_and_outputs_keep_input_order() -> None:
    models = FakeModels({n: tag(n) for n in ("english", "questions", "other")})
    batch = [rec("q: en?", lang="en"), rec("hello", lang="fr"), rec("q: why", lang="de"),
             rec("hi", lang="en")]
    out = run_route(RULES, batch, models)
    assert [r.model for r in out] == ["english", "other", "questions", "english"]
    assert [r.outcome.prediction for r in out if isinstance(r.outcome, Inferred)] == \
        ["english(q: en?)", "other(hello)", "questions(q: why)", "english(hi)"]
    assert out[1] == Routed("other", Inferred("other(hello)", "sha-other"),
                            (Step("other", Inferred("other(hello)", "sha-other")),))


def test_each_model_is_called_once_with_exactly_its_records() -> None:
    models = FakeModels({n: tag(n) for n in ("english", "questions", "other")})
    batch = [rec(f"t{i}", lang="en" if i % 3 == 0 else "fr") for i in range(7)]
    run_route(RULES, batch, models)
    assert sorted(name for name, _ in models.calls) == ["english", "other"]
    assert models.inputs_of("english") == [["t0", "t3", "t6"]]
    assert models.inputs_of("other") == [["t1", "t2", "t4", "t5"]]
    assert run_route(RULES, [], models) == [] and len(models.calls) == 2


def test_records_no_rule_takes_are_no_route_dead_letters() -> None:
    node = RuleNode(rules=(Rule(Condition(field="/lang", equals=("en",)), ModelNode("english")),))
    models = FakeModels({"english": tag("english")})
    out = run_route(node, [rec("a", lang="fr"), rec("b", lang="en"), rec("c")], models)
    assert [r.model for r in out] == ["", "english", ""]
    for lost in (out[0], out[2]):
        assert isinstance(lost.outcome, NoRouteError) and lost.trail == ()
        assert reason_of(lost.outcome) is Reason.NO_ROUTE
    assert models.inputs_of("english") == [["b"]]


def test_route_models_and_config() -> None:
    cascade = CascadeNode(stages=(CascadeStage(model="a", task=CLASSES),), last=ModelNode("b"))
    node = RuleNode(rules=(Rule(Condition(equals=("x",)), cascade),
                           Rule(Condition(equals=("y",)), ModelNode("c")),
                           Rule(Condition(equals=("z",)), ModelNode("a"))), default=ModelNode("d"))
    assert node.models == ("a", "b", "c", "d")
    assert cascade.models == ("a", "b") and ModelNode("m").models == ("m",)
    with pytest.raises(ConfigError):
        RuleNode(rules=())
    with pytest.raises(ConfigError):
        CascadeNode(stages=(), last=ModelNode("b"))


def test_a_rule_can_lead_to_a_cascade() -> None:
    node = RuleNode(rules=(Rule(Condition(field="/lang", equals=("en",)),
                                CascadeNode(stages=(CascadeStage(model="a", task=CLASSES, below=0.75),),
                                            last=ModelNode("c"))),),
                    default=ModelNode("b"))
    models = FakeModels(CASCADE_MODELS)
    batch = [RouteRecord(model_input=x, fields={"/lang": lang})
             for x, lang in ((0.9, "en"), (0.6, "en"), (0.6, "fr"))]
    out = run_route(node, batch, models)
    assert [r.model for r in out] == ["a", "c", "b"]
    assert [s.model for s in out[1].trail] == ["a", "c"]
    assert out[1].trail[0].confidence == pytest.approx(0.6) and out[1].trail[1].confidence is None
    assert out[1].outcome == Inferred([0.0, 1.0], "sha-c")
    assert models.inputs_of("a") == [[0.9, 0.6]] and models.inputs_of("c") == [[0.6]]
    assert models.inputs_of("b") == [[0.6]]


def test_all_branches_are_submitted_before_any_is_waited_on() -> None:
    both = threading.Event()
    submitted: list[str] = []

    def submit(name: str, inputs: Sequence[Any]) -> Future[list[Inferred | BaseException]]:
        submitted.append(name)
        if len(submitted) == 2:
            both.set()
        future: Future[list[Inferred | BaseException]] = Future()

        def resolve() -> None:  # resolves only once the other model was submitted too
            if both.wait(timeout=2.0):
                future.set_result([Inferred(f"{name}({x})", "v") for x in inputs])
            else:
                future.set_exception(TimeoutError(f"{name} was waited on before the other was submitted"))

        threading.Thread(target=resolve, daemon=True).start()
        return future

    node = RuleNode(rules=(Rule(Condition(equals=("x",)), ModelNode("a")),), default=ModelNode("b"))
    out = run_route(node, [rec("x"), rec("y")], submit)
    assert [r.outcome for r in out] == [Inferred("a(x)", "v"), Inferred("b(y)", "v")]
    assert sorted(submitted) == ["a", "b"]


def test_sibling_cascades_escalate_without_waiting_for_each_other() -> None:
    """Two cascades under one rule node: the second's last stage is submitted while the first's
    last stage is still running (it finishes only once both were submitted)."""
    submitted: list[str] = []
    held: dict[str, Future[list[Inferred | BaseException]]] = {}
    both_last = threading.Event()

    def submit(name: str, inputs: Sequence[Any]) -> Future[list[Inferred | BaseException]]:
        submitted.append(name)
        future: Future[list[Inferred | BaseException]] = Future()
        result = [Inferred(CASCADE_MODELS["a"](x) if name.startswith("a") else [0.0, 1.0], f"sha-{name}")
                  for x in inputs]
        if name.startswith("a"):  # first stages answer at once
            future.set_result(result)
            return future
        held[name] = future
        if len(held) == 2:
            both_last.set()

        def resolve() -> None:
            if both_last.wait(timeout=2.0):
                future.set_result(result)
            else:
                future.set_exception(TimeoutError(f"{name}: the other cascade's last stage never came"))

        threading.Thread(target=resolve, daemon=True).start()
        return future

    def cascade(first: str, last: str) -> CascadeNode:
        return CascadeNode(stages=(CascadeStage(model=first, task=CLASSES, below=0.75),),
                           last=ModelNode(last))

    node = RuleNode(rules=(Rule(Condition(equals=("x",)), cascade("a1", "b1")),),
                    default=cascade("a2", "b2"))
    batch = [RouteRecord(model_input=0.6, text="x"), RouteRecord(model_input=0.6, text="y")]
    out = run_route(node, batch, submit)
    assert [r.model for r in out] == ["b1", "b2"]
    assert [[s.model for s in r.trail] for r in out] == [["a1", "b1"], ["a2", "b2"]]
    assert sorted(held) == ["b1", "b2"] and submitted[:2] == ["a1", "a2"]


@pytest.mark.parametrize("count", [0, 1, 3])
def test_a_call_with_the_wrong_number_of_outcomes_fails_its_records(count: int) -> None:
    def submit(name: str, inputs: Sequence[Any]) -> Future[list[Inferred | BaseException]]:
        future: Future[list[Inferred | BaseException]] = Future()
        future.set_result([Inferred(f"{name}", "v")] * count)
        return future

    out = run_route(ModelNode("m"), [rec("a"), rec("b")], submit)
    for answer in out:
        assert isinstance(answer.outcome, InferenceError) and answer.trail == ()
        assert f"returned {count} outcomes for 2 records" in str(answer.outcome)


# --- cascades -----------------------------------------------------------------------------------

XS = [0.9, 0.55, 0.2, 0.5, 0.7]  # model a's TOP confidence: 0.9, 0.55, 0.8, 0.5, 0.7


def two_stage(below: float = 0.75, measure: Confidence = Confidence.TOP) -> CascadeNode:
    return CascadeNode(stages=(CascadeStage(model="a", task=CLASSES, measure=measure, below=below),),
                       last=ModelNode("b"))


def test_cascade_escalates_the_unsure_to_the_last_model() -> None:
    models = FakeModels(CASCADE_MODELS)
    out = run_route(two_stage(), records(*XS), models)
    assert [r.model for r in out] == ["a", "b", "a", "b", "b"]
    assert models.inputs_of("a") == [XS]
    assert models.inputs_of("b") == [[0.55, 0.5, 0.7]]  # the sure ones never reach b
    sure = Inferred([1 - 0.9, 0.9], "sha-a")
    assert (out[0].outcome, [(s.model, s.outcome) for s in out[0].trail]) == (sure, [("a", sure)])
    assert out[0].trail[0].confidence == pytest.approx(0.9)
    unsure = out[4]
    assert unsure.outcome == Inferred(sharpen(0.7), "sha-b")
    assert [(s.model, s.outcome.model_version) for s in unsure.trail] == [("a", "sha-a"), ("b", "sha-b")]
    assert unsure.trail[0].outcome.prediction == [1 - 0.7, 0.7]
    assert unsure.trail[0].confidence == pytest.approx(0.7) and unsure.trail[1].confidence is None


def test_cascade_threshold_is_strict_and_uses_the_measure() -> None:
    models = FakeModels(CASCADE_MODELS)
    out = run_route(two_stage(below=0.7), records(0.7, 0.69), models)
    assert [r.model for r in out] == ["a", "b"]  # 0.7 is not below 0.7
    models = FakeModels(CASCADE_MODELS)
    out = run_route(two_stage(below=0.5, measure=Confidence.MARGIN), records(0.9, 0.7, 0.6), models)
    assert [r.trail[0].confidence for r in out] == pytest.approx([0.8, 0.4, 0.2])
    assert models.inputs_of("b") == [[0.7, 0.6]]


def test_three_stage_cascade() -> None:
    node = CascadeNode(stages=(CascadeStage(model="a", task=CLASSES, below=0.75),
                               CascadeStage(model="b", task=CLASSES, below=0.7)), last=ModelNode("c"))
    models = FakeModels(CASCADE_MODELS)
    out = run_route(node, records(*XS), models)
    # b sharpens 0.55 -> 0.6, 0.5 -> 0.5, 0.7 -> 0.9: only the first two go on to c
    assert [r.model for r in out] == ["a", "c", "a", "c", "b"]
    assert [n for n, _ in models.calls] == ["a", "b", "c"]
    assert models.inputs_of("b") == [[0.55, 0.5, 0.7]] and models.inputs_of("c") == [[0.55, 0.5]]
    assert [(s.model, s.confidence) for s in out[1].trail] == \
        [("a", pytest.approx(0.55)), ("b", pytest.approx(0.6)), ("c", None)]
    assert out[1].outcome == Inferred([0.0, 1.0], "sha-c")
    assert [(s.model, s.confidence) for s in out[4].trail] == \
        [("a", pytest.approx(0.7)), ("b", pytest.approx(0.9))]
    assert out[4].outcome == Inferred(sharpen(0.7), "sha-b")


def test_join_marks_the_stages_steps() -> None:
    join = CascadeNode(stages=two_stage().stages, last=ModelNode("b"), answer=Answer.JOIN)
    for node, joined in ((two_stage(), False), (join, True)):
        out = run_route(node, records(0.6, 0.9), FakeModels(CASCADE_MODELS))
        assert [[s.joined for s in r.trail] for r in out] == [[joined, False], [joined]]


def test_a_failed_record_stays_failed_and_is_not_escalated() -> None:
    def a(x: float) -> list[float]:
        if x < 0:
            raise ValueError(f"cannot score {x}")
        return [1 - x, x]

    models = FakeModels({**CASCADE_MODELS, "a": a})
    out = run_route(two_stage(), records(0.6, -1.0, 0.9), models)
    assert out[1].model == "a" and isinstance(out[1].outcome, ValueError) and out[1].trail == ()
    assert [r.model for r in out] == ["b", "a", "a"]
    assert models.inputs_of("b") == [[0.6]]


def test_a_failure_in_a_later_stage_keeps_the_earlier_steps() -> None:
    models = FakeModels(CASCADE_MODELS, broken=frozenset({"b"}))
    out = run_route(two_stage(), records(0.6, 0.9), models)
    assert out[0].model == "b" and isinstance(out[0].outcome, InferenceError)
    assert [s.model for s in out[0].trail] == ["a"]
    assert out[1].outcome == Inferred([1 - 0.9, 0.9], "sha-a")


def test_bad_probabilities_become_an_inference_error() -> None:
    models = FakeModels({**CASCADE_MODELS, "a": lambda x: [float("nan"), 1.0] if x == 0.3 else [1 - x, x]})
    out = run_route(two_stage(), records(0.3, 0.6), models)
    assert out[0].model == "a" and isinstance(out[0].outcome, InferenceError)
    assert reason_of(out[0].outcome) is Reason.INFERENCE_ERROR
    assert "a" in str(out[0].outcome) and "confidence" in str(out[0].outcome)
    assert models.inputs_of("b") == [[0.6]]  # the bad one is not escalated


def test_a_whole_failed_call_fails_every_record() -> None:
    models = FakeModels(CASCADE_MODELS, broken=frozenset({"a"}))
    out = run_route(two_stage(), records(0.6, 0.9, 0.1), models)
    assert [r.model for r in out] == ["a"] * 3
    assert all(isinstance(r.outcome, InferenceError) and "a is down" in str(r.outcome) for r in out)
    assert models.inputs_of("b") == []


def test_an_empty_batch_calls_no_model() -> None:
    models = FakeModels(CASCADE_MODELS)
    assert run_route(two_stage(), [], models) == []
    assert run_route(ModelNode("a"), [], models) == []
    assert models.calls == []


def test_a_sentiment_stage_reads_its_score() -> None:
    stage = CascadeStage(model="s", task=SentimentTask(), below=0.8)
    node = CascadeNode(stages=(stage,), last=ModelNode("b"))
    models = FakeModels({"s": lambda x: (x, np.zeros(3, np.float32)), "b": sharpen})
    out = run_route(node, records(0.95, 0.1, 0.3), models)
    assert [r.model for r in out] == ["s", "s", "b"]
    assert [r.trail[0].confidence for r in out] == pytest.approx([0.95, 0.9, 0.7])


@pytest.mark.parametrize("task", [GenerationTask(),
                                  PredictionTask(outputs=(OutputField(name="y", sql_type=SqlType.DOUBLE),))])
def test_a_stage_needs_a_task_with_probabilities(task: Any) -> None:
    with pytest.raises(ConfigError, match="probabilities"):
        CascadeStage(model="m", task=task)


@pytest.mark.parametrize("below", [-0.01, 1.01, float("nan"), True])
def test_a_stage_threshold_is_in_the_unit_interval(below: Any) -> None:
    with pytest.raises(ConfigError):
        CascadeStage(model="m", task=CLASSES, below=below)
    assert CascadeStage(model="m", task=CLASSES, below=0.0).below == 0.0
    assert CascadeStage(model="m", task=CLASSES, below=1).below == 1


# --- tasks' class probabilities -----------------------------------------------------------------

def test_sentiment_and_classification_probabilities() -> None:
    sentiment, classes = SentimentTask(), ClassificationTask(labels=("a", "b", "c"))
    assert sentiment.has_probabilities and classes.has_probabilities
    got = sentiment.probabilities((np.float32(0.8), np.zeros(4, np.float32)))
    assert got.dtype == np.float64 and got.tolist() == pytest.approx([0.2, 0.8])
    got = classes.probabilities(np.array([0.1, 0.6, 0.3], np.float32))
    assert got.dtype == np.float64 and got.tolist() == pytest.approx([0.1, 0.6, 0.3])


@pytest.mark.parametrize("sql_type", [SqlType.ARRAY_FLOAT, SqlType.ARRAY_DOUBLE])
def test_prediction_probabilities_come_from_the_probabilities_output(sql_type: SqlType) -> None:
    task = PredictionTask(outputs=(OutputField(name="label", sql_type=SqlType.BIGINT),
                                   OutputField(name="probabilities", sql_type=sql_type)))
    assert task.has_probabilities
    got = task.probabilities({"label": np.int64(1), "probabilities": np.array([0.25, 0.75], np.float32)})
    assert got.dtype == np.float64 and got.tolist() == [0.25, 0.75]


@pytest.mark.parametrize("outputs", [
    (OutputField(name="y", sql_type=SqlType.DOUBLE),),
    (OutputField(name="probabilities", sql_type=SqlType.STRING),),
])
def test_prediction_without_probabilities(outputs: tuple[OutputField, ...]) -> None:
    task = PredictionTask(outputs=outputs)
    assert not task.has_probabilities
    with pytest.raises(InferenceError):
        task.probabilities({"y": 1.0, "probabilities": "x"})


def test_generation_has_no_probabilities() -> None:
    assert not GenerationTask().has_probabilities
    with pytest.raises(InferenceError):
        GenerationTask().probabilities({"completion": "hi"})
