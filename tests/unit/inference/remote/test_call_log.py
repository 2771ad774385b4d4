"""The remote handlers' call log, OpenAI and V2 (issue 22, replay-safe calls), against
httpx.MockTransport as the server and an in-memory topic shared by a worker and its "restarted"
successor (the real Kafka topic is in tests/integration/remote/test_call_log_kafka.py): a replayed
record's request is not sent again, its answer, invalid output or final failure comes back from the
log, and a record's deadline counts from its first attempt across restarts."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from pyflink_aisp.errors import ConfigError, InvalidModelOutputError, RemoteError, RemoteTimeoutError
from pyflink_aisp.inference.handlers.remote import (
    CallLog,
    CallLogConfig,
    OpenAIEmbeddingHandler,
    OpenAIGenerationHandler,
    OpenAIModel,
    RemoteSession,
    V2Model,
    V2PredictorHandler,
    call_key,
)
from pyflink_aisp.inference.handlers.remote._v2 import _plan
from pyflink_aisp.inference.tasks import PredictionTask
from pyflink_aisp.outcome import Reason, reason_of
from pyflink_aisp.pipeline import InferenceOptions
from pyflink_aisp.pipeline._handlers import remote_handler
from tests.unit.inference.remote.test_v2_handler import META as V2_META
from tests.unit.inference.remote.test_v2_handler import _server as v2_answer

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


class MemoryLog(CallLog):
    """A call log whose topic is a list that outlives the worker (as the Kafka topic does)."""

    def __init__(self, topic: list, scope: str) -> None:
        super().__init__(CallLogConfig(topic="calls", bootstrap_servers="memory:9092"), scope=scope)
        self.topic = topic
        self.flushes = 0

    def open(self) -> MemoryLog:
        for key, entry in self.topic:
            self._load(key.encode(), json.dumps(entry).encode())
        return self

    def put(self, entries) -> None:
        for key, entry in entries:
            self._entries[key] = entry
            self.topic.append((key, json.loads(json.dumps(entry, allow_nan=False))))

    def flush(self) -> None:
        self.flushes += 1


def _worker(handler, answer, topic: list) -> OpenAIModel:
    """A worker's model on the mock server with a log over ``topic`` (a fresh one: a restart)."""
    handler._checked = True
    log = MemoryLog(topic, handler.model_version()).open()
    return OpenAIModel(RemoteSession(handler.endpoint, transport=httpx.MockTransport(answer)), call_log=log)


def _chat(requests: list, content=lambda prompt: '{"label": "positive"}', status=200):
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body["messages"][-1]["content"])
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "down"}})
        return httpx.Response(200, json={
            "choices": [{"index": 0, "message": {"content": content(body["messages"][-1]["content"])},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
    return answer


def test_a_restarted_worker_answers_replayed_records_from_the_log_and_sends_only_new_ones():
    topic: list = []
    handler = OpenAIGenerationHandler(url="http://s", model="smollm2", json_schema=SCHEMA,
                                      prompt_template="Review: {text}")
    first_requests: list = []
    first = _worker(handler, _chat(first_requests, content=lambda p: json.dumps({"label": p[-1]})), topic)
    try:
        before = handler.run_inference(["a", "b", "c"], first)
    finally:
        first.session.close()
    assert first_requests == ["Review: a", "Review: b", "Review: c"]
    assert [e["kind"] for _, e in topic] == ["started"] * 3 + ["ok"] * 3
    requests: list = []
    second = _worker(handler, _chat(requests, content=lambda p: json.dumps({"label": p[-1].upper()})), topic)
    try:
        after = handler.run_inference(["a", "b", "c", "d"], second)
        assert requests == ["Review: d"], "only the record the log does not hold"
        assert after[:3] == before and after[3]["label"] == "D"
        assert handler.metrics(second)["remoteCallLogHits"]() == 3
        assert handler.metrics(second)["remoteCallLogSize"]() == 4
        assert second.prompt_tokens == 7, "replayed answers are not counted (or paid) again"
    finally:
        second.session.close()


def test_invalid_output_and_final_failures_come_back_without_a_request():
    topic: list = []
    handler = OpenAIGenerationHandler(url="http://s", model="m", json_schema=SCHEMA, deadline_s=0.3,
                                      request_timeout_s=0.1)
    first = _worker(handler, _chat([], content=lambda p: "not json"), topic)
    try:
        (invalid,) = handler.run_inference(["x"], first)
    finally:
        first.session.close()
    down = _worker(handler, _chat([], status=500), topic)
    try:
        (failed,) = handler.run_inference(["y"], down)
    finally:
        down.session.close()
    assert isinstance(invalid, InvalidModelOutputError) and isinstance(failed, RemoteError)
    requests: list = []
    restarted = _worker(handler, _chat(requests), topic)
    try:
        again = handler.run_inference(["x", "y"], restarted)
    finally:
        restarted.session.close()
    assert requests == [], "the retry budget of both was spent before the restart"
    assert reason_of(again[0]) is Reason.INVALID_MODEL_OUTPUT and str(again[0]) == str(invalid)
    assert reason_of(again[1]) is reason_of(failed) and again[1].status == failed.status
    assert "from the call log" in str(again[1])


def test_a_records_deadline_counts_from_its_first_attempt_across_restarts():
    handler = OpenAIGenerationHandler(url="http://s", model="m", deadline_s=5.0, request_timeout_s=5.0)
    key = call_key(handler.model_version(), handler._request(["late"]))
    topic = [(key, {"kind": "started", "at": time.time() - 60}),
             (call_key(handler.model_version(), handler._request(["recent"])),
              {"kind": "started", "at": time.time() - 1})]
    requests: list = []
    model = _worker(handler, _chat(requests, content=lambda p: "ok"), topic)
    try:
        late, recent = handler.run_inference(["late", "recent"], model)
    finally:
        model.session.close()
    assert isinstance(late, RemoteTimeoutError) and "since its first attempt" in str(late)
    assert reason_of(late) is Reason.REMOTE_TIMEOUT
    assert requests == ["recent"] and recent["completion"] == "ok"
    assert topic[-2][1]["kind"] == "failed" and topic[-2][1]["timeout"] is True


def test_embeddings_come_back_from_the_log_bit_for_bit():
    topic: list = []
    handler = OpenAIEmbeddingHandler(url="http://s", model="e", rows_per_request=8)

    def answer(request: httpx.Request) -> httpx.Response:
        texts = json.loads(request.content)["input"]
        calls.append(texts)
        data = [{"index": i, "embedding": [1 / (3 + len(t)), -2e-8, 12345.678]} for i, t in enumerate(texts)]
        return httpx.Response(200, json={"data": data})

    calls: list = []
    first = _worker(handler, answer, topic)
    try:
        before = handler.run_inference(["a", "bb"], first)
    finally:
        first.session.close()
    second = _worker(handler, answer, topic)
    try:
        after = handler.run_inference(["a", "bb"], second)
    finally:
        second.session.close()
    assert calls == [["a", "bb"]]
    for b, a in zip(before, after, strict=True):
        assert a.dtype == np.float32 and a.tobytes() == b.tobytes()


def test_keys_cover_the_model_and_every_request_parameter():
    base = OpenAIGenerationHandler(url="http://s", model="m", max_tokens=8)
    key = call_key(base.model_version(), base._request(["t"]))
    others = [OpenAIGenerationHandler(url="http://s", model="m2", max_tokens=8),
              OpenAIGenerationHandler(url="http://s", model="m", max_tokens=9),
              OpenAIGenerationHandler(url="http://s", model="m", max_tokens=8, temperature=0.5),
              OpenAIGenerationHandler(url="http://s", model="m", max_tokens=8, prompt_template="Q: {text}"),
              OpenAIGenerationHandler(url="http://s", model="m", max_tokens=8, system_prompt="Be brief.")]
    assert len({key, *(call_key(h.model_version(), h._request(["t"])) for h in others)}) == 6
    assert key == call_key(base.model_version(), base._request(["t"]))
    moved = OpenAIGenerationHandler(url="http://elsewhere", model="m", max_tokens=8)
    assert call_key(moved.model_version(), moved._request(["t"])) == key, "the same model on another URL"
    # a log keeps only its own model's entries
    log = MemoryLog([(key, {"kind": "ok", "at": 0, "result": {}}),
                     (call_key("openai:m2", {}), {"kind": "ok", "at": 0, "result": {}})], "openai:m").open()
    assert log.size == 1


@pytest.mark.parametrize("topic", ["", "a b", "x" * 250, "calls/1"])
def test_bad_topic_names_are_refused(topic):
    with pytest.raises(ConfigError, match="a Kafka topic name"):
        CallLogConfig(topic=topic, bootstrap_servers="k:9092")


def test_the_job_names_its_brokers_for_the_log_and_a_sql_entry_names_its_own(tmp_path):
    from pyflink_aisp.pipeline import InferenceOptions, options_from_args
    from pyflink_aisp.pipeline._handlers import handler_for

    chat = ["--remote-url", "http://llm:8080", "--remote-api", "openai-chat", "--remote-model", "smollm2",
            "--remote-call-log", "judged-calls"]
    job = handler_for(options_from_args(["--input-topic", "in", "--output-topic", "out",
                                         "--bootstrap-servers", "kafka:9092", *chat]))
    assert job.call_log == CallLogConfig(topic="judged-calls", bootstrap_servers="kafka:9092")
    entry = InferenceOptions(remote_url="http://llm:8080", remote_api="openai-chat", remote_model="smollm2",
                             remote_call_log="judged-calls")
    with pytest.raises(ConfigError, match="needs --remote-call-log-servers"):
        handler_for(entry)
    named = InferenceOptions(remote_url="http://llm:8080", remote_api="openai-chat", remote_model="smollm2",
                             remote_call_log="judged-calls", remote_call_log_servers="k1:9092,k2:9092")
    assert handler_for(named).call_log.bootstrap_servers == "k1:9092,k2:9092"


def test_each_answer_is_logged_as_it_arrives_not_at_the_batchs_end():
    """A fast answer is in the log while a slow request of the same batch is still out (a kill then
    loses only the slow one)."""
    import asyncio

    topic: list = []
    handler = OpenAIGenerationHandler(url="http://s", model="m")

    async def answer(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["messages"][-1]["content"]
        if prompt == "slow":
            while not any(e["kind"] == "ok" for _, e in topic):
                await asyncio.sleep(0.01)
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": prompt.upper()},
                                                      "finish_reason": "stop"}]})

    model = _worker(handler, answer, topic)
    try:
        out = handler.run_inference(["slow", "fast"], model)
    finally:
        model.session.close()
    assert [r["completion"] for r in out] == ["SLOW", "FAST"]
    done = [(k, e) for k, e in topic if e["kind"] == "ok"]
    fast = call_key(handler.model_version(), handler._request(["fast"]))
    assert [k for k, _ in done] == [fast, call_key(handler.model_version(), handler._request(["slow"]))]


# -- the V2 handler (Open Inference Protocol): rows of tensors, one key per row ------------------
# its mock server (label = first feature > 5, probabilities from it, variable = the row's sum) and
# metadata are the V2 handler tests'


def _v2_worker(handler: V2PredictorHandler, answer, topic: list) -> V2Model:
    log = MemoryLog(topic, handler.model_version()).open()
    return V2Model(RemoteSession(handler.endpoint, transport=httpx.MockTransport(answer)),
                   _plan("risk", V2_META), call_log=log)


def _rows_sent(requests: list) -> list:
    return [row for body in requests for row in np.reshape(body["inputs"][0]["data"],
                                                           body["inputs"][0]["shape"]).tolist()]


def test_a_restarted_v2_worker_sends_only_the_rows_the_log_does_not_hold_and_answers_alike():
    topic: list = []
    handler = V2PredictorHandler(url="http://s", model="risk", rows_per_request=2)
    x = [np.array([i, 10 - i, 1], dtype=np.float32) for i in range(5)]
    requests: list = []
    first = _v2_worker(handler, v2_answer(requests), topic)
    try:
        before = handler.run_inference(x[:3], first)
    finally:
        handler.release_model(first)
    assert _rows_sent(requests) == [[0, 10, 1], [1, 9, 1], [2, 8, 1]]
    assert sorted(e["kind"] for _, e in topic) == ["ok"] * 3 + ["started"] * 3
    requests.clear()
    second = _v2_worker(handler, v2_answer(requests), topic)
    try:
        after = handler.run_inference(x, second)
        assert _rows_sent(requests) == [[3, 7, 1], [4, 6, 1]], "only the rows the log does not hold"
        assert handler.metrics(second)["remoteCallLogHits"]() == 3
    finally:
        handler.release_model(second)
    task = PredictionTask(outputs=tuple(f for _, f in _plan("risk", V2_META).outputs))
    assert [task.render(p) for p in after[:3]] == [task.render(p) for p in before], "the same output records"
    assert after[0]["probabilities"].dtype == np.float32 and after[0]["label"].dtype == np.int64
    assert [task.render(p)["variable"] for p in after] == [11.0] * 5


def test_a_v2_row_that_failed_for_good_comes_back_as_its_error_without_a_request():
    topic: list = []
    handler = V2PredictorHandler(url="http://s", model="risk", rows_per_request=1)
    x = [np.array([1, 1, 1], dtype=np.float32), np.array([99, 0, 0], dtype=np.float32)]
    requests: list = []
    refuse = v2_answer(requests, fail_when=lambda m: bool((m[:, 0] == 99).any()))
    first = _v2_worker(handler, refuse, topic)
    try:
        ok, failed = handler.run_inference(x, first)
    finally:
        handler.release_model(first)
    assert isinstance(failed, RemoteError) and failed.status == 400 and int(ok["label"]) == 0
    requests.clear()
    second = _v2_worker(handler, v2_answer(requests), topic)  # the server would answer it now
    try:
        again = handler.run_inference(x, second)
    finally:
        handler.release_model(second)
    assert requests == [], "both rows come from the log"
    assert isinstance(again[1], RemoteError) and again[1].status == 400
    assert "from the call log" in str(again[1])
    assert reason_of(again[1]) is reason_of(failed)
    np.testing.assert_array_equal(again[0]["probabilities"], ok["probabilities"])


def test_the_v2_keys_cover_the_model_version_and_each_rows_data():
    plan = _plan("risk", V2_META)
    topic: list = []
    for handler in (V2PredictorHandler(url="http://s", model="risk"),
                    V2PredictorHandler(url="http://s", model="risk", version="2")):
        model = V2Model(RemoteSession(handler.endpoint, transport=httpx.MockTransport(v2_answer([]))),
                        plan, call_log=MemoryLog(topic, handler.model_version()).open())
        try:
            handler.run_inference([np.array([1, 2, v], dtype=np.float32) for v in (3, 4)], model)
        finally:
            handler.release_model(model)
    assert len({key for key, _ in topic}) == 4, "two versions x two rows"


def test_a_v2_job_with_a_call_log_gets_one_on_its_brokers():
    options = InferenceOptions(remote_url="http://s", remote_model="risk", remote_call_log="calls",
                               remote_call_log_servers="k:9092")
    handler = remote_handler(options)
    assert isinstance(handler, V2PredictorHandler)
    assert handler.call_log == CallLogConfig(topic="calls", bootstrap_servers="k:9092")
