"""ArrowInferenceFunction.eval driven directly with a DataFrame and a fake handler (no Flink cluster),
and the OperatorShell's life: lease, model, breaker, metrics, released in reverse order."""

from __future__ import annotations

import base64
import json
import os
import pickle
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pyflink_aisp.errors import (
    CircuitOpenError,
    ConfigError,
    DeadLetterRateError,
    ModelError,
    OperatorNotOpenError,
)
from pyflink_aisp.inference import BatchingConfig, BreakerConfig, ModelHandler, ModelRuntime
from pyflink_aisp.inference.tasks import OutputField, SqlType, Task
from pyflink_aisp.kafka import FieldMapping
from pyflink_aisp.outcome import MIN_RECORD_BYTES
from pyflink_aisp.pipeline._shell import OperatorShell, WorkerSpec
from pyflink_aisp.pipeline._watch import DeadLetterWatchConfig
from pyflink_aisp.pipeline.flink import ArrowInferenceFunction

SHA = "e" * 64
BATCHING = BatchingConfig(max_batch_size=8, max_wait_ms=1)


class EchoTask(Task):
    """A task the pipeline has never heard of: ``chars``, ``ratio``, ``echo``."""

    @property
    def fields(self) -> tuple[OutputField, ...]:
        return (OutputField(name="chars", sql_type=SqlType.BIGINT),
                OutputField(name="ratio", sql_type=SqlType.DOUBLE),
                OutputField(name="echo", sql_type=SqlType.STRING))

    def render(self, prediction: Any) -> dict[str, Any]:
        chars, ratio, echo = prediction
        return {"chars": chars, "ratio": ratio, "echo": echo}


class EchoHandler(ModelHandler[str, tuple[int, float, str], str]):
    """``(len, len / 100, text)`` per text; NaN for a text with "nan" in it."""

    def __init__(self, fail_load: bool = False) -> None:
        self.fail_load = fail_load

    def load_model(self) -> str:
        if self.fail_load:
            raise ModelError("no such model")
        return "echo"

    def model_version(self) -> str:
        return SHA

    def run_inference(self, batch: Sequence[str], model: str) -> list[tuple[int, float, str]]:
        return [(len(t), float("nan") if "nan" in t else len(t) / 100, t) for t in batch]

    def task(self, *, with_embedding: bool = False) -> EchoTask:
        return EchoTask()


class Group:
    def __init__(self) -> None:
        self.gauges: dict[str, Any] = {}

    def add_group(self, name: str) -> Group:
        assert name == "aisp"
        return self

    def gauge(self, name: str, read: Any) -> None:
        assert name not in self.gauges, f"gauge {name} registered twice"
        self.gauges[name] = read


class Context:
    """The part of PyFlink's FunctionContext the shell uses."""

    def __init__(self) -> None:
        self.group = Group()

    def get_metric_group(self) -> Group:
        return self.group

    def get_index_of_this_subtask(self) -> int:
        return 3


class Lease:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def bind_metrics(self, group: Group) -> None:
        group.gauge("affinityLeased", lambda: 1)

    def close(self) -> None:
        self.events.append(f"lease closed, runtimes left: {len(ModelRuntime._registry)}")


class LeaseOpener:
    """Stands in for open_affinity: records the call, hands out a Lease."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def __call__(self, settings: Any, context: Any) -> Lease:
        self.events.append(f"lease taken, runtimes: {len(ModelRuntime._registry)}")
        return Lease(self.events)


def _frame(values: list[bytes | None], topic: str = "reviews") -> pd.DataFrame:
    n = len(values)
    return pd.DataFrame({"value": values, "topic": [topic] * n, "partition": [0] * n,
                         "offset": list(range(100, 100 + n))})


def _record(rid: str, text: str) -> bytes:
    return json.dumps({"id": rid, "text": text}).encode()


@pytest.fixture
def opener() -> LeaseOpener:
    return LeaseOpener()


def _opened(opener: LeaseOpener, **kwargs: Any) -> tuple[ArrowInferenceFunction, Context]:
    function = ArrowInferenceFunction(EchoHandler(), batching=BATCHING, open_lease=opener, **kwargs)
    context = Context()
    function.open(context)
    return function, context


def test_eval_renders_good_rows_with_the_handlers_own_fields_and_dead_letters_the_rest(opener) -> None:
    function, context = _opened(opener, max_record_bytes=MIN_RECORD_BYTES)
    big = "x" * MIN_RECORD_BYTES
    values = [_record("a", "hello"), b"{not json", _record("n", "a nan"), None, _record("big", big),
              _record("b", "")]
    try:
        out = function.eval(_frame(values))
        gauges = {name: read() for name, read in context.group.gauges.items()}
    finally:
        function.close()
    assert list(out.columns) == ["key", "value", "dead", "source"]
    assert out["dead"].tolist() == [False, True, True, True, True, False]
    assert out["source"].tolist() == [f"reviews/0/{o}" for o in range(100, 106)]
    assert out["key"].tolist()[0::5] == ["a", "b"]
    assert json.loads(out["value"][0]) == {"id": "a", "chars": 5, "ratio": 0.05, "echo": "hello",
                                           "model_sha256": SHA}
    assert list(json.loads(out["value"][0])) == ["id", "chars", "ratio", "echo", "model_sha256"]
    assert json.loads(out["value"][5]) == {"id": "b", "chars": 0, "ratio": 0.0, "echo": "",
                                           "model_sha256": SHA}
    letters = [json.loads(v) for v in out["value"][1:5]]
    assert [d["reason"] for d in letters] == ["invalid_json", "inference_error", "null_value",
                                              "oversized_output"]
    assert [d["id"] for d in letters] == [None, "n", None, "big"]
    assert [d["offset"] for d in letters] == [101, 102, 103, 104]
    assert base64.b64decode(letters[0]["value_base64"]) == b"{not json"
    assert "not finite" in letters[1]["detail"]
    assert out["key"][1] == "reviews/0/101" and out["key"][4] == "big"
    sizes = [len(k.encode()) + len(v) for k, v in zip(out["key"], out["value"], strict=True)]
    assert max(sizes) <= MIN_RECORD_BYTES
    assert (gauges["recordsIn"], gauges["recordsOut"], gauges["deadLetters"], gauges["arrowBatches"]) == (
        6, 2, 4, 1)
    assert gauges["arrowBatchSizeMax"] == 6 and gauges["affinityLeased"] == 1


def test_open_takes_the_lease_before_the_model_and_close_releases_the_model_first(opener) -> None:
    function, _ = _opened(opener)
    assert opener.events == ["lease taken, runtimes: 0"]
    assert len(ModelRuntime._registry) == 1
    function.close()
    assert opener.events == ["lease taken, runtimes: 0", "lease closed, runtimes left: 0"]
    function.close()  # idempotent
    assert len(opener.events) == 2 and not ModelRuntime._registry


def test_a_model_that_cannot_load_gives_the_lease_back(opener) -> None:
    spec = WorkerSpec.of(EchoHandler(fail_load=True), batching=BATCHING)
    shell = OperatorShell(spec, counters=("recordsIn",), open_lease=opener)
    with pytest.raises(ModelError, match="no such model"):
        shell.open(Context())
    assert opener.events == ["lease taken, runtimes: 0", "lease closed, runtimes left: 0"]
    assert shell.runtime is None and shell.affinity is None


def test_only_config_crosses_the_job_graph_and_open_rebuilds_the_rest(opener) -> None:
    function, _ = _opened(opener)
    try:
        function.eval(_frame([_record("a", "x")]))
        copy = pickle.loads(pickle.dumps(function))
    finally:
        function.close()
    shell = copy._shell
    assert (shell.runtime, shell.breaker, shell.affinity) == (None, None, None)
    assert shell.counts == {"recordsIn": 0, "recordsOut": 0, "deadLetters": 0, "arrowBatches": 0}
    assert shell.spec.key == function._shell.spec.key  # taken on the client, not re-derived
    with pytest.raises(OperatorNotOpenError, match="before open"):
        copy.eval(_frame([_record("a", "x")]))
    copy.open(Context())
    try:
        assert json.loads(copy.eval(_frame([_record("a", "xy")]))["value"][0])["chars"] == 2
    finally:
        copy.close()


def test_inference_errors_trip_the_breaker_and_decode_errors_do_not(opener) -> None:
    breaker = BreakerConfig(max_failure_rate=0.5, window_records=4, min_records=4)
    function, _ = _opened(opener, breaker=breaker)
    try:
        out = function.eval(_frame([b"bad", b"bad", b"bad", _record("a", "ok"), _record("b", "fine")]))
        assert out["dead"].tolist() == [True, True, True, False, False]
        with pytest.raises(CircuitOpenError):
            function.eval(_frame([_record(f"n{i}", "nan") for i in range(4)]))
    finally:
        function.close()


def test_a_handler_without_a_task_is_refused_when_the_operator_is_built() -> None:
    class Bare(ModelHandler[str, float, None]):
        def load_model(self) -> None:
            return None

        def run_inference(self, batch: Sequence[str], model: None) -> list[float]:
            return [0.0] * len(batch)

    with pytest.raises(ConfigError, match="Bare declares no output fields"):
        ArrowInferenceFunction(Bare(), batching=BATCHING)


class NumpyEchoTask(EchoTask):
    """Renders ``chars`` as a numpy integer: a task that breaks the plain-values contract."""

    def render(self, prediction: Any) -> dict[str, Any]:
        import numpy as np

        return {**super().render(prediction), "chars": np.int64(prediction[0])}


class NumpyEchoHandler(EchoHandler):
    def task(self, *, with_embedding: bool = False) -> NumpyEchoTask:
        return NumpyEchoTask()


def test_a_task_that_renders_numpy_values_dead_letters_its_records_instead_of_failing_the_batch(
        opener) -> None:
    function = ArrowInferenceFunction(NumpyEchoHandler(), batching=BATCHING, open_lease=opener)
    function.open(Context())
    try:
        out = function.eval(_frame([_record("a", "hello")]))
    finally:
        function.close()
    assert out["dead"].tolist() == [True]
    letter = json.loads(out["value"][0])
    assert letter["reason"] == "inference_error" and "not JSON-able" in letter["detail"]


class RefusingGroup(Group):
    def gauge(self, name: str, read: Any) -> None:
        raise ValueError(f"gauge {name} refused")


def test_an_open_that_fails_after_the_model_loaded_gives_model_and_lease_back(opener) -> None:
    """A failure in the breaker or the metrics (after lease and model) releases both, as a
    failed model load does: Flink need not call close() after a failed open()."""
    context = Context()
    context.group = RefusingGroup()
    shell = OperatorShell(WorkerSpec.of(EchoHandler(), batching=BATCHING), counters=("recordsIn",),
                          open_lease=opener)
    with pytest.raises(ValueError, match="gauge recordsIn refused"):
        shell.open(context)
    assert opener.events == ["lease taken, runtimes: 0", "lease closed, runtimes left: 0"]
    assert shell.runtime is None and shell.affinity is None and not ModelRuntime._registry


def test_a_topic_of_another_shape_raises_the_alarm_in_its_first_batch_and_fails_past_the_limit(
        opener, caplog) -> None:
    foreign = [json.dumps({"review_id": f"r{i}", "body": "fine"}).encode() for i in range(120)]
    function, context = _opened(opener)
    try:
        with caplog.at_level("WARNING", logger="pyflink_aisp.dead_letters"):
            assert function.eval(_frame(foreign))["dead"].all()
        gauges = {name: read() for name, read in context.group.gauges.items()}
    finally:
        function.close()
    assert (gauges["deadLetterAlarm"], gauges["deadLetterSharePercent"]) == (1, 100)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "120 as missing_text (no 'text' field; the object's fields: 'body', 'review_id')" in line

    watch = DeadLetterWatchConfig(warn_share=0.5, max_share=0.5, window=200, min_records=100)
    strict, _ = _opened(opener, dead_letters=watch)
    try:
        ok = [_record(f"g{i}", "good") for i in range(60)]
        strict.eval(_frame(ok + foreign[:50]))  # 50 dead: at most 140 of the window's 200, nothing raised
        with pytest.raises(DeadLetterRateError, match=r"^61 % of the last 180 records .* 110 as missing"):
            strict.eval(_frame(foreign[:60] + ok[:10]))  # 110 dead: above half of 200 whatever follows
    finally:
        strict.close()


def test_a_mapped_record_keeps_its_fields_after_the_id_and_a_clash_with_the_task_is_refused(opener) -> None:
    mapping = FieldMapping(text="/body", id="/review_id", keep=("/lang",))
    function, _ = _opened(opener, mapping=mapping)
    values = [json.dumps({"review_id": "r1", "body": "hello", "lang": "en"}).encode(),
              json.dumps({"review_id": "r2", "text": "no body"}).encode()]
    try:
        out = function.eval(_frame(values))
    finally:
        function.close()
    assert out["dead"].tolist() == [False, True] and out["key"][0] == "r1"
    assert json.loads(out["value"][0]) == {"id": "r1", "lang": "en", "chars": 5, "ratio": 0.05,
                                           "echo": "hello", "model_sha256": SHA}
    detail = json.loads(out["value"][1])["detail"]
    assert detail == "no value at /body; the object's fields: 'review_id', 'text'"
    with pytest.raises(ConfigError, match=r"kept fields \['chars'\] would overwrite the task's output"):
        ArrowInferenceFunction(EchoHandler(), batching=BATCHING, mapping=FieldMapping(keep=("/meta/chars",)))


def test_the_latency_trace_writes_one_line_per_arrow_batch_with_ordered_times_and_the_scored_ids(
        opener, tmp_path: Path) -> None:
    trace_dir = tmp_path / "trace"
    function = ArrowInferenceFunction(EchoHandler(), batching=BATCHING, open_lease=opener,
                                      latency_trace=trace_dir)
    function = pickle.loads(pickle.dumps(function))  # as the job graph ships it: no file yet
    assert not trace_dir.exists()
    before_ms = time.time() * 1000.0
    function.open(Context())
    try:
        function.eval(_frame([_record("a", "hello"), b"{not json", _record("b", "world")]))
        function.eval(_frame([_record("c", "again")]))
    finally:
        function.close()
    after_ms = time.time() * 1000.0
    files = list(trace_dir.iterdir())
    assert [f.name for f in files] == [f"aisp-latency-{os.getpid()}-3.jsonl"]
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [line["ids"] for line in lines] == [["a", "b"], ["c"]]
    for line in lines:
        times = [line["enter_ms"], line["decoded_ms"], line["inferred_ms"], line["exit_ms"]]
        assert before_ms <= times[0] and times == sorted(times) and times[-1] <= after_ms
    assert lines[0]["exit_ms"] <= lines[1]["enter_ms"]
    # closed: a late write is a no-op, the file keeps its two lines
    function._trace.write(1.0, 2.0, 3.0, 4.0, ["late"])
    assert len(files[0].read_text().splitlines()) == 2


class PairEchoHandler(EchoHandler):
    """Echoes ``text + " | " + text_pair`` of each pair."""

    accepts_text_pairs = True

    def run_inference(self, batch: Sequence[Any], model: str) -> list[tuple[int, float, str]]:
        return super().run_inference([f"{a} | {b}" for a, b in batch], model)


def test_a_second_text_reaches_a_pair_handler_and_a_one_text_handler_is_refused_at_start_up(opener) -> None:
    mapping = FieldMapping(text="/query", text_pair="/passage")
    with pytest.raises(ConfigError, match="--text-pair-field /passage: EchoHandler takes one text per"):
        ArrowInferenceFunction(EchoHandler(), batching=BATCHING, mapping=mapping)
    function = ArrowInferenceFunction(PairEchoHandler(), batching=BATCHING, open_lease=opener,
                                      mapping=mapping)
    function.open(Context())
    values = [json.dumps({"id": "p1", "query": "good?", "passage": "a fine film"}).encode(),
              json.dumps({"id": "p2", "query": "no passage"}).encode()]
    try:
        out = function.eval(_frame(values))
    finally:
        function.close()
    assert out["dead"].tolist() == [False, True]
    assert json.loads(out["value"][0])["echo"] == "good? | a fine film"
    assert json.loads(out["value"][1])["reason"] == "missing_text"


class FieldEchoHandler(EchoHandler):
    """Echoes ``product: text`` of each record's prompt fields."""

    prompt_fields = ("product",)

    def run_inference(self, batch: Sequence[Any], model: str) -> list[tuple[int, float, str]]:
        return super().run_inference([f"{x['product']}: {x['text']}" for x in batch], model)


def test_prompt_fields_reach_a_handler_that_takes_them_and_others_are_refused_at_start_up(opener) -> None:
    mapping = FieldMapping(text="/body", prompt_fields=("/meta/product",))
    with pytest.raises(ConfigError, match=r"fill the placeholders \['product'\], but EchoHandler takes none"):
        ArrowInferenceFunction(EchoHandler(), batching=BATCHING, mapping=mapping)
    with pytest.raises(ConfigError, match=r"but FieldEchoHandler takes \['product'\]"):
        ArrowInferenceFunction(FieldEchoHandler(), batching=BATCHING, mapping=FieldMapping(text="/body"))
    function = ArrowInferenceFunction(FieldEchoHandler(), batching=BATCHING, open_lease=opener,
                                      mapping=mapping)
    function.open(Context())
    values = [json.dumps({"id": "a", "body": "leaks", "meta": {"product": "kettle"}}).encode(),
              json.dumps({"id": "b", "body": "no product"}).encode()]
    try:
        out = function.eval(_frame(values))
    finally:
        function.close()
    assert out["dead"].tolist() == [False, True]
    assert json.loads(out["value"][0])["echo"] == "kettle: leaks"
    letter = json.loads(out["value"][1])
    assert letter["reason"] == "missing_text" and "/meta/product" in letter["detail"]
