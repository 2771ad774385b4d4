"""Routes of a registry (``routes:``) and the routed Arrow operator, driven with DataFrames and
small real handlers (no Flink cluster): each record scored by the model its route names, once."""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pyflink_aisp.errors import ConfigError
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
from pyflink_aisp.inference.tasks import ClassificationTask
from pyflink_aisp.kafka import FieldMapping
from pyflink_aisp.pipeline._routed_op import RoutedInferenceFunction
from pyflink_aisp.pipeline._routes import route_plan
from pyflink_aisp.pipeline._shell import WorkerSpec

ROOT = Path(__file__).resolve().parents[3]
BATCHING = BatchingConfig(max_batch_size=8, max_wait_ms=1)
LABELS = ("neg", "pos")


class VowelHandler(ModelHandler[str, list[float], str]):
    """P(pos) = the text's share of vowels among its letters (a real, checkable function);
    ``calls`` records each batch it ran."""

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
        return ClassificationTask(labels=LABELS)


def _vowels(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.5


class Group:
    def __init__(self, path: tuple[str, ...] = ()) -> None:
        self.path, self.gauges, self.children = path, {}, {}

    def add_group(self, *names: str) -> Group:
        return self.children.setdefault(names, Group(self.path + names))

    def gauge(self, name: str, read: Any) -> None:
        assert name not in self.gauges
        self.gauges[name] = read


class Context:
    def __init__(self) -> None:
        self.group = Group()

    def get_metric_group(self) -> Group:
        return self.group

    def get_task_name(self) -> str:
        return "map"

    def get_index_of_this_subtask(self) -> int:
        return 0


def _frame(records: list[dict[str, Any] | bytes]) -> pd.DataFrame:
    values = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in records]
    n = len(values)
    return pd.DataFrame({"value": values, "topic": ["in"] * n, "partition": [0] * n,
                         "offset": list(range(n))})


def _opened(node, handlers: dict[str, VowelHandler], **kwargs: Any) -> RoutedInferenceFunction:
    specs = {n: WorkerSpec.of(h, batching=BATCHING) for n, h in handlers.items()}
    tasks = {n: h.task() for n, h in handlers.items()}
    function = RoutedInferenceFunction(node, specs, tasks, max_record_bytes=100_000, **kwargs)
    function = pickle.loads(pickle.dumps(function))  # as the job graph carries it
    function.context = Context()  # type: ignore[attr-defined]
    function.open(function.context)
    return function


def _calls(function: RoutedInferenceFunction, model: str) -> list[str]:
    """The texts the worker's copy of the model's handler scored, in call order."""
    runtime = function._route.shells[model].runtime
    assert runtime is not None
    return [t for call in runtime.handler.calls for t in call]


def _outputs(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [json.loads(v) for v in frame["value"]]


TEXTS = ["aeiou ai", "rhythm dry", "banana split", "queue", "hello"]


def test_rules_send_each_record_to_its_model_once_and_keep_the_order() -> None:
    a, b = VowelHandler("a" * 64), VowelHandler("b" * 64)
    node = RuleNode((Rule(Condition(field="/kind", equals=("short",)), ModelNode("b")),), ModelNode("a"))
    function = _opened(node, {"a": a, "b": b}, fields=("/kind",), mapping=FieldMapping(keep=("/lang",)))
    records = [{"id": f"r{i}", "text": t, "kind": "short" if i % 2 else "long", "lang": "en"}
               for i, t in enumerate(TEXTS)]
    out = function.eval(_frame([*records, b"{not json"]))
    assert _calls(function, "a") == [TEXTS[0], TEXTS[2], TEXTS[4]]
    assert _calls(function, "b") == [TEXTS[1], TEXTS[3]]
    function.close()
    assert list(out["dead"]) == [False] * 5 + [True]
    docs = _outputs(out[:5])
    for i, (record, doc) in enumerate(zip(records, docs, strict=True)):
        model = "b" if i % 2 else "a"
        assert list(doc) == ["id", "lang", "label", "score", "model_sha256", "scored_by"]  # kind: not kept
        assert doc["score"] == pytest.approx(max(_vowels(record["text"]), 1 - _vowels(record["text"])))
        assert doc["model_sha256"] == model * 64
        assert doc["scored_by"] == [{"model": model, "model_sha256": model * 64}]
    assert json.loads(out["value"][5])["reason"] == "invalid_json"


def test_a_record_no_rule_takes_is_a_no_route_dead_letter() -> None:
    a = VowelHandler("a" * 64)
    node = RuleNode((Rule(Condition(matches="^q"), ModelNode("a")),))
    function = _opened(node, {"a": a})
    out = function.eval(_frame([{"id": "1", "text": "queue"}, {"id": "2", "text": "sky"}]))
    assert list(out["dead"]) == [False, True]
    letter = json.loads(out["value"][1])
    assert letter["reason"] == "no_route" and letter["id"] == "2"
    assert function.counts["noRoute"] == 1 and function.counts["recordsOut"] == 1
    assert _calls(function, "a") == ["queue"]
    function.close()


def test_a_cascade_escalates_only_unsure_records_and_names_both_models() -> None:
    a, b = VowelHandler("a" * 64), VowelHandler("b" * 64)
    stage = CascadeStage(model="a", task=a.task(), measure=Confidence.MARGIN, below=0.5)
    function = _opened(CascadeNode((stage,), ModelNode("b")), {"a": a, "b": b})
    out = _outputs(function.eval(_frame([{"id": str(i), "text": t} for i, t in enumerate(TEXTS)])))
    margins = [abs(2 * _vowels(t) - 1) for t in TEXTS]
    unsure = [t for t, m in zip(TEXTS, margins, strict=True) if m < 0.5]
    assert 0 < len(unsure) < len(TEXTS)  # the texts exercise both paths
    assert _calls(function, "b") == unsure
    for margin, doc in zip(margins, out, strict=True):
        first = {"model": "a", "model_sha256": "a" * 64, "confidence": pytest.approx(margin)}
        if margin < 0.5:
            assert doc["scored_by"] == [first, {"model": "b", "model_sha256": "b" * 64}]
            assert doc["model_sha256"] == "b" * 64
        else:
            assert doc["scored_by"] == [first] and doc["model_sha256"] == "a" * 64
    shells = function._route.shells
    assert shells["a"].counts == {"records": len(TEXTS) - len(unsure), "scored": len(TEXTS),
                                  "escalated": len(unsure)}
    assert shells["b"].counts == {"records": len(unsure), "scored": len(unsure), "escalated": 0}
    calls = shells["b"].windows["callUs"]
    assert calls.percentile(100) > 0 and calls.percentile(50) <= calls.percentile(100)
    model_b = function.context.group.children[("model", "b")].children[("aisp",)]
    assert {"records", "scored", "escalated", "callUsP99", "computeUsP99"} <= set(model_b.gauges)
    assert model_b.gauges["escalated"]() == 0 and model_b.gauges["records"]() == len(unsure)
    assert {"recordsIn", "noRoute", "endToEndUsP99"} <= set(function.context.group.children[("aisp",)].gauges)
    function.close()


def test_a_kept_field_named_scored_by_is_refused() -> None:
    a = VowelHandler("a" * 64)
    with pytest.raises(ConfigError, match="scored_by"):
        RoutedInferenceFunction(ModelNode("a"), {"a": WorkerSpec.of(a, batching=BATCHING)}, {"a": a.task()},
                                mapping=FieldMapping(keep=("/scored_by",)), max_record_bytes=100_000)


@pytest.fixture
def lexicon_registry(tmp_path: Path) -> Path:
    sys.path.insert(0, str(ROOT / "jobs" / "examples"))
    try:
        import lexicon_handler
    finally:
        sys.path.pop(0)
    from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews

    train, _ = split_reviews(load_rotten_tomatoes())
    sha = lexicon_handler.train_lexicon(train[:2000]).save(tmp_path / "lex.json")
    args = json.dumps({"path": str(tmp_path / "lex.json"), "sha256": sha})
    (tmp_path / "tok.json").write_text("{}")
    text = f"""
models:
  lex_a: {{task: handler, class: "lexicon_handler:LexiconSentimentHandler", args: {args}}}
  lex_b: {{task: handler, class: "lexicon_handler:LexiconSentimentHandler", args: {args}, max-batch-size: 4}}
routes:
  unsure:
    cascade: [{{model: lex_a, confidence: entropy, below: 0.2}}, {{model: lex_b}}]
    answer: join
  by_kind:
    rules:
      - {{when: {{field: /meta/kind, equals: [a, b], matches: "^[ab]$"}}, to: lex_a}}
      - {{when: {{between: [0, 3]}}, to: unsure}}
    default: unsure
  loop_a: {{rules: [{{when: {{equals: x}}, to: loop_b}}]}}
  loop_b: {{rules: [{{when: {{equals: x}}, to: loop_a}}]}}
"""
    (tmp_path / "models.yaml").write_text(text)
    sys.path.insert(0, str(ROOT / "jobs" / "examples"))
    yield tmp_path / "models.yaml"
    sys.path.remove(str(ROOT / "jobs" / "examples"))


def test_route_plans_of_a_registry(lexicon_registry: Path) -> None:
    plan = route_plan(lexicon_registry, "by_kind")
    assert list(plan.models) == ["lex_a", "lex_b"] and plan.fields == ("/meta/kind",)
    assert isinstance(plan.node, RuleNode) and isinstance(plan.node.default, CascadeNode)
    cascade = route_plan(lexicon_registry, "unsure").node
    assert isinstance(cascade, CascadeNode) and cascade.stages[0].measure is Confidence.ENTROPY
    assert cascade.stages[0].below == 0.2 and cascade.answer.value == "join"
    assert plan.models["lex_b"].options.max_batch_size == 4  # each model keeps its own options
    from pyflink_aisp.pipeline import describe_route

    assert describe_route(plan.node) == (
        "rules [/meta/kind equals ['a', 'b'] and matches '^[ab]$' -> lex_a; text between [0, 3] -> cascade "
        "lex_a (entropy < 0.2) -> lex_b, answer join; else -> cascade lex_a (entropy < 0.2) -> lex_b, "
        "answer join]")
    with pytest.raises(ConfigError, match="loop_a -> loop_b -> loop_a"):
        route_plan(lexicon_registry, "loop_a")
    with pytest.raises(ConfigError, match="names no route 'nope'"):
        route_plan(lexicon_registry, "nope")


@pytest.mark.parametrize(("route", "message"), [
    ("{cascade: [{model: lex_a}]}", "at least two stages"),
    ("{cascade: [{model: unsure2}, {model: lex_b}]}", "must be a model of the file"),
    ("{cascade: [{model: lex_a, confidence: vibes}, {model: lex_b}]}", "confidence must be one of"),
    ("{cascade: [{model: lex_a, below: 2}, {model: lex_b}]}", r"below must be in \[0, 1\]"),
    ("{cascade: [{model: lex_a}, {model: nowhere}]}", "neither a model nor a route"),
    ("{rules: [{when: {tokens-between: [1, 2]}, to: lex_a}]}", "needs 'tokenizer'"),
    ("{rules: [{when: {field: kind, equals: a}, to: lex_a}]}", "JSON Pointer"),
    ("{rules: [{when: {matches: '('}, to: lex_a}]}", "not a regular expression"),
    ("{rules: [{when: {}, to: lex_a}]}", "needs a test"),
    ("{rules: [], cascade: []}", "either 'rules'"),
])
def test_bad_routes_are_refused_in_one_line(lexicon_registry: Path, route: str, message: str) -> None:
    text = lexicon_registry.read_text().replace("  loop_a:", f"  unsure2: {route}\n  loop_a:")
    lexicon_registry.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        route_plan(lexicon_registry, "unsure2")
    assert str(error.value).startswith(f"{lexicon_registry}: route unsure2: ")


def test_per_rule_operators_write_each_record_once_between_them() -> None:
    """--route-operators per-rule: each branch's operator scores its own records; the first also
    writes the dead letters (decode, no_route); the rows an operator does not write have dead NULL
    (the sinks' filters drop them)."""
    from pyflink_aisp.pipeline._routed_op import RouteBranch, route_branches

    a, b = VowelHandler("a" * 64), VowelHandler("b" * 64)
    rules = RuleNode((Rule(Condition(field="/kind", equals=("short",)), ModelNode("b")),
                      Rule(Condition(field="/kind", equals=("long",)), ModelNode("a"))))
    branches = route_branches(rules)
    assert [(x.index, x.letters, x.target) for x in branches] == [(0, True, ModelNode("b")),
                                                                    (1, False, ModelNode("a"))]
    with pytest.raises(ConfigError, match="not a rule of the route"):
        RouteBranch(rules, 2)
    records = [{"id": f"r{i}", "text": t, "kind": ("short", "long", "other")[i % 3]}
               for i, t in enumerate(TEXTS)]
    frame = _frame([*records, b"\xff"])
    outs = []
    for branch, handlers in zip(branches, ({"b": b}, {"a": a}), strict=True):
        function = _opened(branch.target, handlers, fields=("/kind",), branch=branch)
        outs.append(function.eval(frame))
        assert _calls(function, next(iter(handlers))) == [
            r["text"] for r in records if r["kind"] == ("short" if branch.index == 0 else "long")]
        function.close()
    written = [[d for d in out["dead"]] for out in outs]
    for row in range(len(records) + 1):
        writers = [i for i, column in enumerate(written) if column[row] is not None]
        assert len(writers) == 1, (row, written)  # exactly one operator writes each record
    first = outs[0]
    letters = {json.loads(v)["reason"] for v, d in zip(first["value"], first["dead"], strict=True) if d}
    assert letters == {"no_route", "invalid_utf8"}
    scored = [json.loads(v) for out in outs for v, d in zip(out["value"], out["dead"], strict=True)
              if d is False]
    assert sorted(d["id"] for d in scored) == sorted(r["id"] for r in records if r["kind"] != "other")


def test_token_count_ignores_the_files_padding_and_truncation(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pyflink_aisp.pipeline._routes import TokenCount

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "good": 2, "film": 3}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.enable_padding(pad_id=1, pad_token="[PAD]", length=16)
    tokenizer.enable_truncation(max_length=4)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    count = pickle.loads(pickle.dumps(TokenCount(tmp_path / "tokenizer.json")))
    assert [count("good film"), count("good " * 7), count("")] == [2, 7, 0]
    with pytest.raises(ConfigError, match="does not exist"):
        TokenCount(tmp_path / "nope.json")
