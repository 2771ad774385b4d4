"""The OpenAI-compatible handlers' requests and answers (httpx.MockTransport as the server; the
real llama.cpp server is in tests/integration/remote): texts per request, usage, structured
output parsed or dead-lettered, refused multi-record requests split once."""

import json

import httpx
import pytest

from pyflink_aisp.errors import ConfigError, InvalidModelOutputError, RemoteError
from pyflink_aisp.inference import BatchingConfig, ModelRuntime
from pyflink_aisp.inference.handlers.remote import (
    OpenAIEmbeddingHandler,
    OpenAIGenerationHandler,
    OpenAIModel,
    RemoteSession,
    schema_fields,
)
from pyflink_aisp.inference.tasks import SqlType, render_fields
from pyflink_aisp.outcome import Reason, reason_of

SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": ["positive", "negative"]},
                                           "confidence": {"type": "number"}},
          "required": ["label", "confidence"]}


def _model(handler, answer) -> OpenAIModel:
    handler._checked = True  # the mock server stands in for the health check too
    return OpenAIModel(RemoteSession(handler.endpoint, transport=httpx.MockTransport(answer)))


def _embedder(requests, refuse=lambda texts: False):
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        texts = body["input"]
        if refuse(texts):
            return httpx.Response(400, json={"error": {"message": "input is too long for the context"}})
        data = [{"index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(texts)]
        return httpx.Response(200, json={"data": data[::-1], "usage": {"prompt_tokens": 3 * len(texts)}})
    return answer


def test_embeddings_go_several_texts_per_request_and_come_back_in_order() -> None:
    requests: list = []
    handler = OpenAIEmbeddingHandler(url="http://s", model="minilm", rows_per_request=3)
    model = _model(handler, _embedder(requests))
    try:
        texts = ["a", "bb", "ccc", "dddd", "eeeee"]
        out = handler.run_inference(texts, model)
        assert [v.tolist() for v in out] == [[float(len(t)), 1.0] for t in texts]  # by index, not order
        assert [r["input"] for r in requests] == [texts[:3], texts[3:]]
        assert requests[0]["model"] == "minilm" and requests[0]["encoding_format"] == "float"
        assert model.prompt_tokens == 15 and handler.metrics(model)["remotePromptTokens"]() == 15
        assert render_fields(handler.task(), out[0]) == {"embedding": [1.0, 1.0]}
    finally:
        model.session.close()


def test_a_refused_multi_text_request_is_split_once_so_only_the_bad_text_fails() -> None:
    requests: list = []
    handler = OpenAIEmbeddingHandler(url="http://s", model="m", rows_per_request=4)
    model = _model(handler, _embedder(requests, refuse=lambda texts: any(len(t) > 10 for t in texts)))
    try:
        out = handler.run_inference(["ok", "x" * 20, "fine"], model)
        assert [v.tolist() for v in out[::2]] == [[2.0, 1.0], [4.0, 1.0]]
        assert isinstance(out[1], RemoteError) and out[1].status == 400 and "too long" in str(out[1])
        assert [r["input"] for r in requests] == [["ok", "x" * 20, "fine"], ["ok"], ["x" * 20], ["fine"]]
    finally:
        model.session.close()


def _chat(requests, content=lambda prompt: "fine"):
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        prompt = body["messages"][-1]["content"]
        return httpx.Response(200, json={
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content(prompt)},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": 2, "total_tokens": len(prompt) + 2}})
    return answer


def test_chat_sends_one_record_per_request_with_the_template_system_prompt_and_sampling() -> None:
    requests: list = []
    handler = OpenAIGenerationHandler(url="http://s", model="smollm2", max_tokens=5, seed=42,
                                      prompt_template="Review: {text}\nLabel:",
                                      system_prompt="Answer with one word.")
    model = _model(handler, _chat(requests, content=lambda p: p.upper()))
    try:
        out = handler.run_inference(["great film", "dull"], model)
        assert out == [
            {"completion": "REVIEW: GREAT FILM\nLABEL:", "finish_reason": "stop", "prompt_tokens": 25,
             "completion_tokens": 2},
            {"completion": "REVIEW: DULL\nLABEL:", "finish_reason": "stop", "prompt_tokens": 19,
             "completion_tokens": 2}]
        assert len(requests) == 2 and requests[0]["messages"] == [
            {"role": "system", "content": "Answer with one word."},
            {"role": "user", "content": "Review: great film\nLabel:"}]
        assert (requests[0]["max_tokens"], requests[0]["temperature"], requests[0]["seed"]) == (5, 0.0, 42)
        assert "response_format" not in requests[0]
        assert (model.prompt_tokens, model.completion_tokens) == (44, 4)
    finally:
        model.session.close()


def test_structured_output_is_parsed_into_fields_and_what_does_not_fit_is_invalid_model_output() -> None:
    answers = {"a": '{"label": "positive", "confidence": 0.9}', "b": "positive, surely",
               "c": '{"label": "negative"}', "d": '{"label": "negative", "confidence": "high"}',
               "e": '["positive"]'}
    requests: list = []
    handler = OpenAIGenerationHandler(url="http://s", model="m", json_schema=SCHEMA)
    model = _model(handler, _chat(requests, content=lambda p: answers[p]))
    try:
        out = handler.run_inference(list(answers), model)
    finally:
        model.session.close()
    task = handler.task()
    assert [f.name for f in task.fields] == ["completion", "finish_reason", "prompt_tokens",
                                             "completion_tokens", "label", "confidence"]
    assert render_fields(task, out[0]) == {"completion": answers["a"], "finish_reason": "stop",
                                           "prompt_tokens": 1, "completion_tokens": 2,
                                           "label": "positive", "confidence": 0.9}
    assert all(isinstance(e, InvalidModelOutputError) and reason_of(e) is Reason.INVALID_MODEL_OUTPUT
               for e in out[1:])
    assert "not JSON" in str(out[1]) and "required field 'confidence'" in str(out[2])
    assert "'high', not DOUBLE" in str(out[3]) and "not an object" in str(out[4])
    assert requests[0]["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": SCHEMA, "strict": True}}


def test_completions_batch_prompts_and_give_no_per_record_usage_for_a_shared_request() -> None:
    requests: list = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        choices = [{"index": i, "text": f" <{p}>", "finish_reason": "length"}
                   for i, p in enumerate(body["prompt"])]
        usage = {"prompt_tokens": 10, "completion_tokens": 4}
        return httpx.Response(200, json={"choices": choices, "usage": usage})

    handler = OpenAIGenerationHandler(url="http://s", model="m", api="completions", rows_per_request=2,
                                      prompt_template="Q: {text} | {text_pair}")
    model = _model(handler, answer)
    try:
        out = handler.run_inference([("a", "b"), ("c", "d"), ("e", "f")], model)
    finally:
        model.session.close()
    assert [r["prompt"] for r in requests] == [["Q: a | b", "Q: c | d"], ["Q: e | f"]]
    assert [o["completion"] for o in out] == [" <Q: a | b>", " <Q: c | d>", " <Q: e | f>"]
    assert [(o["prompt_tokens"], o["completion_tokens"]) for o in out] == [(None, None)] * 2 + [(10, 4)]
    assert out[0]["finish_reason"] == "length" and model.prompt_tokens == 20


def test_an_answer_with_the_wrong_number_of_choices_fails_its_records() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}]})

    handler = OpenAIGenerationHandler(url="http://s", model="m", api="completions", rows_per_request=4)
    model = _model(handler, answer)
    try:
        out = handler.run_inference(["a", "b"], model)
    finally:
        model.session.close()
    assert all(isinstance(e, RemoteError) and "1 choices for 2 records" in str(e) for e in out)


def test_the_runtime_dead_letters_only_the_records_that_failed() -> None:
    handler = OpenAIGenerationHandler(url="http://s", model="m", json_schema=SCHEMA)
    answers = {"good": '{"label": "positive", "confidence": 1}', "bad": "no json"}
    requests: list = []
    handler.load_model = lambda: _model(handler, _chat(requests, content=lambda p: answers[p]))  # type: ignore[method-assign]
    runtime = ModelRuntime(handler, BatchingConfig(max_batch_size=8, max_wait_ms=1), None)
    try:
        outcomes = runtime.infer_batch(["good", "bad", "good"])
    finally:
        runtime.release()
    assert [type(o).__name__ for o in outcomes] == ["Inferred", "InvalidModelOutputError", "Inferred"]
    assert outcomes[0].prediction["confidence"] == 1 and outcomes[0].model_version == "openai:m"
    assert len(requests) == 3  # nothing sent twice


def test_the_health_check_names_the_models_the_server_lists() -> None:
    handler = OpenAIEmbeddingHandler(url="http://127.0.0.1:9", model="minilm", deadline_s=0.5,
                                     request_timeout_s=0.2)
    with pytest.raises(RemoteError, match="unreachable"):
        handler.check()


@pytest.mark.parametrize(("schema", "fields"), [
    (SCHEMA, [("label", SqlType.STRING), ("confidence", SqlType.DOUBLE)]),
    ({"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"},
                                       "tags": {"type": "array", "items": {"type": "string"}},
                                       "xs": {"type": "array", "items": {"type": "number"}}}},
     [("n", SqlType.BIGINT), ("ok", SqlType.BOOLEAN), ("tags", SqlType.ARRAY_STRING),
      ("xs", SqlType.ARRAY_DOUBLE)]),
])
def test_schema_properties_become_typed_fields(schema, fields) -> None:
    assert [(f.name, f.sql_type) for f in schema_fields(schema)] == fields


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "array"}, "JSON object schema with properties"),
    ({"type": "object", "properties": {"x": {"type": "object"}}}, "property 'x'"),
    ({"type": "object", "properties": {"Bad Name": {"type": "string"}}}, "must match"),
    ({"type": "object", "properties": {"completion": {"type": "string"}}}, "must not repeat or be named"),
])
def test_schemas_no_field_can_hold_are_refused(schema, message) -> None:
    with pytest.raises(ConfigError, match=message):
        OpenAIGenerationHandler(url="http://s", model="m", json_schema=schema).task()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"api": "responses"}, "'chat' or 'completions'"),
    ({"prompt_template": "Classify:"}, "must hold {text}"),
    ({"api": "completions", "system_prompt": "be brief"}, "need api 'chat'"),
    ({"api": "completions", "json_schema": SCHEMA}, "need api 'chat'"),
    ({"max_tokens": 0}, "max_tokens >= 1"),
    ({"temperature": 3.0}, "temperature <= 2"),
])
def test_bad_generation_settings_are_refused(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        OpenAIGenerationHandler(url="http://s", model="m", **kwargs)


def test_embedding_answers_that_are_not_finite_vectors_fail_their_records() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": []}]})

    handler = OpenAIEmbeddingHandler(url="http://s", model="m")
    model = _model(handler, answer)
    try:
        [out] = handler.run_inference(["a"], model)
    finally:
        model.session.close()
    assert isinstance(out, RemoteError) and "not a finite vector" in str(out)


def test_prompt_fields_fill_their_placeholders_in_one_pass_and_other_braces_stay() -> None:
    requests: list = []
    handler = OpenAIGenerationHandler(url="http://s", model="m", prompt_fields=("product", "stars"),
                                      prompt_template='{"task": "label"} {product} ({stars}*): {text}')
    model = _model(handler, _chat(requests))
    examples = [{"text": "broke {product}", "product": "kettle {text}", "stars": "1"},
                {"text": "fine", "product": "mug", "stars": "5"}]
    try:
        out = handler.run_inference(examples, model)
    finally:
        model.session.close()
    assert [r["messages"][-1]["content"] for r in requests] == [
        '{"task": "label"} kettle {text} (1*): broke {product}', '{"task": "label"} mug (5*): fine']
    assert [o["completion"] for o in out] == ["fine", "fine"]
    with pytest.raises(TypeError, match="prompt fields"):
        handler.prompt("a text without its fields")
    with pytest.raises(TypeError, match=r"got the keys \['text'\]"):
        handler.prompt({"text": "no product"})


@pytest.mark.parametrize(("template", "fields", "message"), [
    ("{title}: {text}", (), r"names \{title\}, which is not .*give --prompt-fields /title"),
    ("{text}", ("title",), r"--prompt-fields \['title'\]: the prompt template names no \{title\}"),
    ("{title} {text} {tilte}", ("title",), r"names \{tilte\}.*--prompt-fields gives \['title'\]"),
    ("{text}", ("text",), "distinct and not text / text_pair"),
])
def test_a_template_and_its_prompt_fields_must_name_each_other(template, fields, message) -> None:
    with pytest.raises(ConfigError, match=message):
        OpenAIGenerationHandler(url="http://s", model="m", prompt_template=template, prompt_fields=fields)
