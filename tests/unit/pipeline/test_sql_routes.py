"""The SQL function of a registry's route (pyflink_aisp.pipeline.registry.ROUTE), its eval driven with
pandas Series and small real handlers (no Flink cluster): each row scored once, by its route's
model; the models' fields in one row (NULL where another model answered); typed arguments."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cloudpickle
import pandas as pd
import pytest

from pyflink_aisp.errors import ConfigError, OperatorNotOpenError
from pyflink_aisp.inference import BatchingConfig, ModelHandler
from pyflink_aisp.inference.routing import (
    CascadeNode,
    CascadeStage,
    Condition,
    Confidence,
    ModelNode,
    Rule,
    RuleNode,
)
from pyflink_aisp.inference.tasks import ClassificationTask, OutputField, SqlType, Task
from pyflink_aisp.pipeline import InferenceOptions, ModelTask, RegisteredModel
from pyflink_aisp.pipeline._routes import RoutePlan
from pyflink_aisp.pipeline._shell import WorkerSpec
from pyflink_aisp.pipeline._sql_routes import (
    RoutedModelFunction,
    route_result_fields,
    route_udf,
    rule_field_types,
)

ROOT = Path(__file__).resolve().parents[3]
BATCHING = BatchingConfig(max_batch_size=8, max_wait_ms=1)


def _vowels(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.5


class VowelHandler(ModelHandler[str, list[float], str]):
    """``[P(neg), P(pos)]`` with P(pos) the text's share of vowels; ``calls``: each batch it ran."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.calls: list[list[str]] = []

    def load_model(self) -> str:
        return "vowels"

    def model_version(self) -> str:
        return self.version

    def run_inference(self, batch: Sequence[str], model: str) -> list[list[float]]:
        self.calls.append(list(batch))
        return [[1 - _vowels(t), _vowels(t)] for t in batch]

    def task(self, *, with_embedding: bool = False) -> ClassificationTask:
        return ClassificationTask(labels=("neg", "pos"))


class LengthTask(Task):
    """``score`` DOUBLE (shared with the classifier, same type), ``chars`` BIGINT (its own)."""

    score_type = SqlType.DOUBLE

    @property
    def fields(self) -> tuple[OutputField, ...]:
        return (OutputField(name="score", sql_type=self.score_type),
                OutputField(name="chars", sql_type=SqlType.BIGINT))

    def render(self, prediction: int) -> dict[str, Any]:
        return {"score": prediction / 100, "chars": prediction}


class TextScoreTask(LengthTask):
    score_type = SqlType.STRING


class LengthHandler(VowelHandler):
    """The text's length in characters."""

    def run_inference(self, batch: Sequence[str], model: str) -> list[int]:  # type: ignore[override]
        self.calls.append(list(batch))
        return [len(t) for t in batch]

    def task(self, *, with_embedding: bool = False) -> LengthTask:  # type: ignore[override]
        return LengthTask()


class _Group:
    def add_group(self, *names: str) -> _Group:
        return self

    def gauge(self, name: str, read: Any) -> None:
        pass


class _Context:
    def get_metric_group(self) -> _Group:
        return _Group()

    def get_task_name(self) -> str:
        return "calc"

    def get_index_of_this_subtask(self) -> int:
        return 0


def _opened(node, handlers: dict[str, VowelHandler], fields: Sequence[str] = ()) -> RoutedModelFunction:
    specs = {n: WorkerSpec.of(h, batching=BATCHING) for n, h in handlers.items()}
    function = RoutedModelFunction(node, specs, {n: h.task() for n, h in handlers.items()}, fields=fields)
    function = cloudpickle.loads(cloudpickle.dumps(function))  # as the job graph carries it
    function.open(_Context())
    return function


def _calls(function: RoutedModelFunction, model: str) -> list[str]:
    """The texts the worker's copy of the model's handler scored, in call order."""
    runtime = function._route.shells[model].runtime
    assert runtime is not None
    return [t for call in runtime.handler.calls for t in call]


def _cell(value: Any) -> Any:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _cell(v) for k, v in row.items()} for row in frame.to_dict("records")]


A, B = "a" * 64, "b" * 64
TEXTS = ["aeiou ai", "rhythm dry", "banana split", None, "queue", "hello"]
KINDS = ["long", "short", "long", "short", "short", None]


def test_each_row_is_scored_once_by_its_routes_model_with_the_fields_of_both_models() -> None:
    node = RuleNode((Rule(Condition(field="/kind", equals=("short",)), ModelNode("b")),), ModelNode("a"))
    function = _opened(node, {"a": VowelHandler(A), "b": LengthHandler(B)}, ("/kind",))
    frame = function.eval(pd.Series(TEXTS), pd.Series(KINDS))
    # the NULL text is no model's; the NULL kind is no "short": the default's
    assert _calls(function, "a") == ["aeiou ai", "banana split", "hello"]
    assert _calls(function, "b") == ["rhythm dry", "queue"]
    assert function.counts == {"recordsIn": 6, "recordsOut": 5, "nullInputs": 1, "deadLetters": 0,
                               "noRoute": 0}
    function.close()
    # b's fields first: the route's models in first-use order (its rules' targets, then the default)
    assert list(frame.columns) == ["score", "chars", "label", "model_sha256", "scored_by", "reason", "detail"]
    assert str(frame["score"].dtype) == "float64"
    rows = _rows(frame)
    for text, kind, row in zip(TEXTS, KINDS, rows, strict=True):
        if text is None:
            assert set(row.values()) == {None}  # null in, null out
        elif kind == "short":
            assert row == {"label": None, "score": len(text) / 100, "chars": len(text), "model_sha256": B,
                           "scored_by": json.dumps([{"model": "b", "model_sha256": B}]), "reason": None,
                           "detail": None}
        else:
            p = _vowels(text)
            assert row == {"label": "pos" if p > 0.5 else "neg", "score": pytest.approx(max(p, 1 - p)),
                           "chars": None, "model_sha256": A,
                           "scored_by": json.dumps([{"model": "a", "model_sha256": A}]), "reason": None,
                           "detail": None}


def test_a_row_no_rule_takes_is_a_no_route_row() -> None:
    node = RuleNode((Rule(Condition(field="/n", between=(0, 10)), ModelNode("a")),))
    function = _opened(node, {"a": VowelHandler(A)}, ("/n",))
    frame = function.eval(pd.Series(["queue", "sky", "fig"]), pd.Series([3.0, 11.0, float("nan")]))
    assert _calls(function, "a") == ["queue"]
    assert function.counts["noRoute"] == 2 and function.counts["deadLetters"] == 2
    function.close()
    rows = _rows(frame)
    assert rows[0]["model_sha256"] == A and rows[0]["reason"] is None
    for row in rows[1:]:  # 11 is out of range; NULL (NaN in a DOUBLE column) is no number
        assert row["reason"] == "no_route" and row["detail"].startswith("NoRouteError: ")
        assert [row[k] for k in ("label", "score", "model_sha256", "scored_by")] == [None] * 4


def test_a_cascade_row_names_every_model_that_scored_it() -> None:
    stage = CascadeStage(model="a", task=VowelHandler(A).task(), measure=Confidence.MARGIN, below=0.5)
    function = _opened(CascadeNode((stage,), ModelNode("b")), {"a": VowelHandler(A), "b": LengthHandler(B)})
    texts = ["aeiou ai", "banana split", "rhythm dry"]
    rows = _rows(function.eval(pd.Series(texts)))
    margins = [abs(2 * _vowels(t) - 1) for t in texts]
    assert _calls(function, "a") == texts
    unsure = [t for t, m in zip(texts, margins, strict=True) if m < 0.5]
    assert _calls(function, "b") == unsure == ["banana split"]
    function.close()
    for text, margin, row in zip(texts, margins, rows, strict=True):
        trail = json.loads(row["scored_by"])
        assert trail[0] == {"model": "a", "model_sha256": A, "confidence": pytest.approx(margin)}
        if margin < 0.5:
            assert [s["model"] for s in trail] == ["a", "b"]
            assert (row["model_sha256"], row["chars"], row["label"]) == (B, len(text), None)
        else:
            assert len(trail) == 1 and row["model_sha256"] == A and row["chars"] is None


def test_eval_before_open_is_refused() -> None:
    function = RoutedModelFunction(ModelNode("a"), {"a": WorkerSpec.of(VowelHandler(A), batching=BATCHING)},
                                   {"a": VowelHandler(A).task()})
    with pytest.raises(OperatorNotOpenError, match="before open"):
        function.eval(pd.Series(["x"]))


def test_one_field_name_with_two_types_is_refused() -> None:
    tasks = {"a": ClassificationTask(labels=("neg", "pos")), "c": TextScoreTask()}
    with pytest.raises(ConfigError, match=r"'score' with two types: a DOUBLE, c STRING"):
        route_result_fields(("a", "c"), tasks)
    fields = route_result_fields(("a", "b"), {"a": tasks["a"], "b": LengthTask()})
    assert [(f.name, f.sql_type.value) for f in fields] == [("label", "STRING"), ("score", "DOUBLE"),
                                                            ("chars", "BIGINT")]


def _rules(*conditions: Condition) -> RuleNode:
    return RuleNode(tuple(Rule(c, ModelNode("a")) for c in conditions))


def test_each_rule_fields_argument_type_comes_from_the_conditions_that_read_it() -> None:
    node = RuleNode((
        Rule(Condition(field="/n", between=(0, 1)), ModelNode("a")),
        Rule(Condition(field="/lang", equals=("en", "de")), ModelNode("a")),
        Rule(Condition(field="/stars", equals=(4, 5.0, None)), ModelNode("a")),
        Rule(Condition(field="/flag", equals=(True,)), ModelNode("a")),
    ), _rules(Condition(field="/title", matches="^Re:"), Condition(field="/n", equals=(7,))))
    fields = ("/n", "/lang", "/stars", "/flag", "/title", "/unused")
    assert [t.value for t in rule_field_types(node, fields)] == ["DOUBLE", "STRING", "DOUBLE", "BOOLEAN",
                                                                 "STRING", "STRING"]
    clash = _rules(Condition(field="/n", between=(0, 1)), Condition(field="/n", matches="x"))
    with pytest.raises(ConfigError, match=r"read /n as DOUBLE and STRING"):
        rule_field_types(clash, ("/n",))


def test_a_route_of_predict_and_text_models_is_refused_before_any_model_loads() -> None:
    models = {"head": RegisteredModel(name="head", task=ModelTask.PREDICT, options=InferenceOptions()),
              "lex": RegisteredModel(name="lex", task=ModelTask.HANDLER, options=InferenceOptions())}
    plan = RoutePlan("mixed", RuleNode((), ModelNode("head")), models, {}, ())
    with pytest.raises(ConfigError, match=r"route mixed: its predict models \['head'\] take ARRAY<FLOAT>"):
        route_udf(plan)


@pytest.fixture
def registry_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two lexicon models (jobs/examples/lexicon_handler.py) and routes over them, in $AISP_MODELS."""
    monkeypatch.syspath_prepend(str(ROOT / "jobs" / "examples"))
    import lexicon_handler

    lexicon = lexicon_handler.Lexicon(prior=0.0, weights={"good": 2.0, "bad": -2.0, "fun": 1.0})
    sha = lexicon.save(tmp_path / "lex.json")
    args = json.dumps({"path": str(tmp_path / "lex.json"), "sha256": sha})
    (tmp_path / "models.yaml").write_text(f"""
models:
  lex_a: {{task: handler, class: "lexicon_handler:LexiconSentimentHandler", args: {args}}}
  lex_b: {{task: handler, class: "lexicon_handler:LexiconSentimentHandler", args: {args}, max-batch-size: 4}}
routes:
  by_kind:
    rules:
      - {{when: {{field: /kind, equals: short}}, to: lex_b}}
      - {{when: {{field: /stars, between: [4, 5]}}, to: lex_a}}
    default: unsure
  unsure:
    cascade: [{{model: lex_a, confidence: margin, below: 0.5}}, {{model: lex_b}}]
""")
    monkeypatch.setenv("AISP_MODELS", str(tmp_path / "models.yaml"))
    return lexicon, sha


def test_a_registry_route_is_a_typed_pandas_function(registry_file) -> None:
    from pyflink_aisp.pipeline import registry

    for name in ("by_kind", "by_kind_pandas"):
        function = getattr(registry, name)
        assert function._func_type == "pandas"
        assert [repr(t) for t in function._input_types] == ["VarCharType(2147483647, true)"] * 2 + [
            "DoubleType(true)"]  # text, /kind, /stars
        result = function._result_type
        assert result.names == ["label", "score", "known_words", "model_sha256", "scored_by", "reason",
                                "detail"]
        assert [repr(f.data_type) for f in result.fields][:3] == [
            "VarCharType(2147483647, true)", "DoubleType(true)", "BigIntType(true)"]
    with pytest.raises(AttributeError, match="names no model 'nope'"):
        registry.nope  # noqa: B018


def test_a_registry_route_scores_each_row_with_its_model(registry_file) -> None:
    from pyflink_aisp.pipeline import registry

    lexicon, sha = registry_file
    function = cloudpickle.loads(cloudpickle.dumps(registry.by_kind._func))
    function.open(_Context())
    texts = ["good fun", "bad", "good", "a film"]
    try:
        frame = function.eval(pd.Series(texts), pd.Series(["short", None, "long", "long"]),
                              pd.Series([1.0, 5.0, float("nan"), 2.0]))
        shells = function._route.shells
        assert shells["lex_b"].runtime.batching.max_batch_size == 4  # the entry's own options
        counts = {name: dict(shell.counts) for name, shell in shells.items()}
    finally:
        function.close()
    rows = _rows(frame)
    models = [["lex_b"], ["lex_a"], ["lex_a"], ["lex_a", "lex_b"]]  # "a film": margin 0, passed on
    for text, want, row in zip(texts, models, rows, strict=True):
        assert [s["model"] for s in json.loads(row["scored_by"])] == want
        assert row["score"] == pytest.approx(lexicon.score(text), abs=1e-12)
        assert row["known_words"] == lexicon.known_words(text) and row["model_sha256"] == sha
    assert counts["lex_a"] == {"records": 2, "scored": 3, "escalated": 1}
    assert counts["lex_b"] == {"records": 2, "scored": 2, "escalated": 0}
