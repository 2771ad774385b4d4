"""Prompts past the context window (issue 22, item 2): a server's own overflow answer (llama.cpp,
OpenAI, vLLM) is a prompt_too_long dead letter, not retried; with a PromptLimit each prompt is
counted first (a local tokenizer.json or the server's /tokenize, httpx.MockTransport as the
server) and dead-lettered or its text cut to fit; the circuit breaker does not count them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from pyflink_aisp.errors import CircuitOpenError, ConfigError, PromptTooLongError, RemoteError
from pyflink_aisp.inference import BreakerConfig, FailureRateBreaker
from pyflink_aisp.inference.handlers.remote import (
    OpenAIGenerationHandler,
    OpenAIModel,
    PromptLimit,
    PromptOverflow,
    RemoteSession,
    context_overflow,
)
from pyflink_aisp.inference.handlers.remote._prompt import fit_prompts, prompt_counter
from pyflink_aisp.inference.tasks import SqlType, render_fields
from pyflink_aisp.outcome import Reason, is_record_fault, reason_of
from pyflink_aisp.tokenize import ArrowTokenizer, TokenizerConfig

TEMPLATE = "Is this review positive or negative?\nReview: {text}\nAnswer:"
#: The context-overflow answers as each server sends them (HTTP 400).
LLAMA_CPP = {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 4100,
                       "n_ctx": 2048, "message": "request (4100 tokens) exceeds the available context size "
                                                 "(2048 tokens), try increasing it"}}
OPENAI = {"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages "
                               "resulted in 9000 tokens. Please reduce the length of the messages.",
                    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
VLLM = {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
        "message": "This model's maximum context length is 2048 tokens. However, you requested 4100 tokens "
                   "(4000 in the messages, 100 in the completion). Please reduce the length of the messages "
                   "or completion."}


@pytest.fixture(scope="module")
def tokenizer_json() -> Path:
    from pyflink_aisp.models import locate_source_model

    return locate_source_model().directory / "tokenizer.json"


@pytest.fixture(scope="module")
def count_tokens(tokenizer_json):
    tokenizer = ArrowTokenizer.from_file(tokenizer_json, TokenizerConfig(max_length=None,
                                                                         add_special_tokens=False))
    return tokenizer.count_tokens


def _server(requests: list, *, refuse=None, tokenize=lambda text: text.split(), tokenize_status=200):
    """A chat server: ``refuse(prompt)`` → an error answer, or a completion echoing the prompt's
    length; ``/tokenize`` counts whitespace-separated words (``tokenize_status`` != 200: missing)."""
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append((request.url.path, body))
        if request.url.path == "/tokenize":
            if tokenize_status != 200:
                return httpx.Response(tokenize_status, json={"detail": "Not Found"})
            return httpx.Response(200, json={"tokens": list(range(len(tokenize(body["content"]))))})
        prompt = body["messages"][-1]["content"]
        if refuse is not None and refuse(prompt) is not None:
            return httpx.Response(400, json=refuse(prompt))
        return httpx.Response(200, json={
            "choices": [{"index": 0, "message": {"content": f"{len(prompt)}"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}})
    return answer


def _model(handler: OpenAIGenerationHandler, answer) -> OpenAIModel:
    handler._checked = True  # the mock server stands in for the health check
    model = OpenAIModel(RemoteSession(handler.endpoint, transport=httpx.MockTransport(answer)))
    if handler.prompt_limit is not None:
        model.counter = prompt_counter(handler.prompt_limit, model.session, handler.model)
    return model


def _sent(requests: list) -> list[str]:
    return [body["messages"][-1]["content"] for path, body in requests if path == "/v1/chat/completions"]


@pytest.mark.parametrize("body", [LLAMA_CPP, OPENAI, VLLM], ids=["llama.cpp", "openai", "vllm"])
def test_a_servers_own_overflow_answer_is_prompt_too_long_and_not_retried(body) -> None:
    requests: list = []
    handler = OpenAIGenerationHandler(url="http://s", model="m", prompt_template=TEMPLATE)
    model = _model(handler, _server(requests, refuse=lambda p: body if "long" in p else None))
    try:
        out = handler.run_inference(["fine", "too long"], model)
    finally:
        model.session.close()
    assert isinstance(out[0], dict)
    assert isinstance(out[1], PromptTooLongError) and out[1].status == 400
    assert reason_of(out[1]) is Reason.PROMPT_TOO_LONG and is_record_fault(out[1])
    assert len(requests) == 2 and model.session.stats.retries == 0  # each conversation sent once


def test_the_overflow_matcher_reads_only_the_errors_own_fields() -> None:
    for body in (LLAMA_CPP, OPENAI, VLLM):
        assert context_overflow(400, json.dumps(body))
    assert not context_overflow(400, json.dumps({"error": {"message": "unknown model", "type": "invalid"}}))
    assert not context_overflow(503, json.dumps(LLAMA_CPP))  # retried as any 503
    assert not context_overflow(400, "maximum context length, as plain text")
    echoed = {"error": {"message": "bad field"}, "prompt": "tell me the maximum context length"}
    assert not context_overflow(400, json.dumps(echoed))
    plain = RemoteError("HTTP 400: bad request", 400)
    assert reason_of(plain) is Reason.REMOTE_ERROR and not is_record_fault(plain)


def test_the_breaker_does_not_count_prompts_too_long() -> None:
    from pyflink_aisp.pipeline._shell import OperatorShell

    breaker = FailureRateBreaker(BreakerConfig(max_failure_rate=0.5, window_records=10, min_records=2))
    shell = OperatorShell(counters=())
    shell.breaker = breaker
    for _ in range(20):
        shell.judge(PromptTooLongError("the prompt is 900 tokens, over --prompt-max-tokens 500"))
    shell.judge_many(0, 4, None)
    assert (breaker.records_total, breaker.failures_total, breaker.is_open) == (24, 0, False)
    with pytest.raises(CircuitOpenError):
        for _ in range(10):
            shell.judge(RemoteError("HTTP 500", 500))


def test_dead_letter_mode_with_a_tokenizer_sends_only_the_prompts_that_fit(tokenizer_json, count_tokens):
    requests: list = []
    limit = PromptLimit(max_tokens=40, tokenizer=tokenizer_json)
    handler = OpenAIGenerationHandler(url="http://s", model="m", prompt_template=TEMPLATE, prompt_limit=limit)
    model = _model(handler, _server(requests))
    long_text = "a gripping, beautifully shot film " * 20
    try:
        out = handler.run_inference(["a fine film", long_text], model)
    finally:
        model.session.close()
    assert isinstance(out[0], dict) and "prompt_truncated" not in out[0]
    assert isinstance(out[1], PromptTooLongError) and out[1].status is None
    assert reason_of(out[1]) is Reason.PROMPT_TOO_LONG and "over --prompt-max-tokens 40" in str(out[1])
    assert _sent(requests) == [TEMPLATE.replace("{text}", "a fine film")]  # the long one never sent
    assert count_tokens(TEMPLATE.replace("{text}", long_text)) > 40
    assert [f.name for f in handler.task().fields] == ["completion", "finish_reason", "prompt_tokens",
                                                       "completion_tokens"]  # unchanged


def test_truncate_mode_keeps_the_template_and_cuts_only_the_text_to_fit(tokenizer_json, count_tokens):
    requests: list = []
    limit = PromptLimit(max_tokens=60, overflow=PromptOverflow.TRUNCATE, tokenizer=tokenizer_json)
    handler = OpenAIGenerationHandler(url="http://s", model="m", prompt_template=TEMPLATE, prompt_limit=limit)
    model = _model(handler, _server(requests))
    texts = ["short and sweet", "the plot meanders, yet the acting carries it " * 30,
             "unforgettable: " + "a triumph of craft and heart " * 50]
    try:
        out = handler.run_inference(texts, model)
    finally:
        model.session.close()
    assert [o["prompt_truncated"] for o in out] == [False, True, True]
    head, tail = TEMPLATE.split("{text}")
    sent = sorted(_sent(requests), key=lambda p: [t[:5] for t in texts].index(p[len(head):len(head) + 5]))
    assert len(sent) == 3 and sent[0] == TEMPLATE.replace("{text}", texts[0])
    for prompt, text in zip(sent[1:], texts[1:], strict=True):
        assert prompt.startswith(head) and prompt.endswith(tail)
        kept = prompt[len(head):len(prompt) - len(tail)]
        assert text.startswith(kept) and 0 < len(kept) < len(text)
        assert 60 - 3 <= count_tokens(prompt) <= 60  # fits, and not much shorter than it could be
    task = handler.task()
    assert [(f.name, f.sql_type) for f in task.fields][4] == ("prompt_truncated", SqlType.BOOLEAN)
    assert render_fields(task, out[1])["prompt_truncated"] is True


def test_a_text_that_cannot_fit_even_empty_is_dead_lettered(tokenizer_json, count_tokens):
    requests: list = []
    limit = PromptLimit(max_tokens=8, overflow="truncate", tokenizer=tokenizer_json)
    assert count_tokens(TEMPLATE.replace("{text}", "")) > 8
    handler = OpenAIGenerationHandler(url="http://s", model="m", prompt_template=TEMPLATE, prompt_limit=limit)
    model = _model(handler, _server(requests))
    try:
        out = handler.run_inference(["good"], model)
    finally:
        model.session.close()
    assert isinstance(out[0], PromptTooLongError) and "no part of the text fits" in str(out[0])
    assert requests == []


def test_the_servers_tokenize_counts_in_both_modes() -> None:
    requests: list = []
    words = " ".join(f"w{i}" for i in range(100))
    for overflow in ("dead-letter", "truncate"):
        requests.clear()
        handler = OpenAIGenerationHandler(url="http://s", model="m",
                                          prompt_template="Summarise: {text} Done.",
                                          prompt_limit=PromptLimit(max_tokens=12, overflow=overflow))
        model = _model(handler, _server(requests))
        try:
            out = handler.run_inference(["one two three", words, "one two three"], model)
        finally:
            model.session.close()
        tokenized = [body for path, body in requests if path == "/tokenize"]
        assert tokenized[0] == {"model": "m", "content": "Summarise: one two three Done.",
                                "prompt": "Summarise: one two three Done.", "add_special": False,
                                "add_special_tokens": False}
        assert len({b["content"] for b in tokenized}) == len(tokenized)  # each distinct prompt counted once
        assert isinstance(out[0], dict) and out[0] == out[2]
        if overflow == "dead-letter":
            assert isinstance(out[1], PromptTooLongError) and "102 tokens" in str(out[1])
            assert len(_sent(requests)) == 2
        else:
            assert out[1]["prompt_truncated"] is True
            # the most words that fit: 12 less the template's 2
            (cut,) = [p for p in _sent(requests) if "w0" in p]
            assert cut.split() == ["Summarise:", *(f"w{i}" for i in range(10)), "Done."]


def test_a_server_without_tokenize_fails_the_health_check_in_one_line(monkeypatch) -> None:
    handler = OpenAIGenerationHandler(url="http://s", model="m", prompt_limit=PromptLimit(max_tokens=100))
    transport = httpx.MockTransport(
        lambda r: httpx.Response(200, json={"data": [{"id": "m"}]}) if r.url.path == "/v1/models"
        else httpx.Response(404, text="File Not Found"))
    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=transport, **kw))
    with pytest.raises(RemoteError) as caught:
        handler.check()
    assert "\n" not in str(caught.value) and "POST /tokenize" in str(caught.value)
    assert "--prompt-tokenizer PATH" in str(caught.value) and caught.value.status == 404
    assert not handler._checked  # checked again next time


def test_a_count_the_server_fails_is_that_records_remote_error() -> None:
    def count(texts):
        return [RemoteError("/tokenize: HTTP 500", 500) if "bad" in t else len(t.split()) for t in texts]
    out = fit_prompts(["ok", "bad", "x " * 50], PromptLimit(max_tokens=10, overflow="truncate"), count,
                      lambda x: f"P: {x}")
    assert out[0].example == "ok" and not out[0].truncated
    assert isinstance(out[1], RemoteError) and out[1].status == 500
    assert out[2].truncated and len(f"P: {out[2].example}".split()) == 10


def test_pairs_cut_the_first_text_and_keep_the_second() -> None:
    def count(texts):
        return [len(t.split()) for t in texts]
    pair = (" ".join(["long"] * 30), "question here")
    (fitted,) = fit_prompts([pair], PromptLimit(max_tokens=10, overflow="truncate"), count,
                            lambda x: f"{x[0]} | {x[1]}")
    assert fitted.truncated and fitted.example[1] == "question here"
    assert fitted.example[0].split() == ["long"] * 7 and count([f"{fitted.example[0]} | x y"]) == [10]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_tokens": 0}, "must be >= 1"),
    ({"max_tokens": 5, "overflow": "drop"}, "prompt overflow must be one of"),
    ({"max_tokens": 5, "tokenizer": Path("/nonexistent/tokenizer.json")}, "is not a tokenizer.json"),
])
def test_a_bad_prompt_limit_is_refused(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        PromptLimit(**kwargs)


def test_a_server_refusal_replayed_from_the_call_log_is_still_prompt_too_long() -> None:
    from tests.unit.inference.remote.test_call_log import MemoryLog

    topic: list = []
    handler = OpenAIGenerationHandler(url="http://s", model="m")
    for round_ in range(2):  # the first worker asks the server; its restarted successor reads the log
        requests: list = []
        model = _model(handler, _server(requests, refuse=lambda p: LLAMA_CPP))
        model.call_log = MemoryLog(topic, handler.model_version()).open()
        try:
            (out,) = handler.run_inference(["far too long"], model)
        finally:
            model.session.close()
        assert isinstance(out, PromptTooLongError) and out.status == 400
        assert len(requests) == (1 if round_ == 0 else 0)


def test_truncation_cuts_only_the_text_of_a_record_with_prompt_fields(tokenizer_json, count_tokens):
    requests: list = []
    template = "Product: {product}\nReview: {text}\nAnswer:"
    limit = PromptLimit(max_tokens=40, overflow=PromptOverflow.TRUNCATE, tokenizer=tokenizer_json)
    handler = OpenAIGenerationHandler(url="http://s", model="m", prompt_template=template, prompt_limit=limit,
                                      prompt_fields=("product",))
    model = _model(handler, _server(requests))
    example = {"text": "the lid leaks and the handle gets hot " * 20, "product": "a steel kettle"}
    try:
        (out,) = handler.run_inference([example], model)
    finally:
        model.session.close()
    (prompt,) = _sent(requests)
    assert out["prompt_truncated"] is True
    head = "Product: a steel kettle\nReview: "
    assert prompt.startswith(head + "the lid leaks") and prompt.endswith("\nAnswer:")
    kept = prompt[len(head):-len("\nAnswer:")]
    assert example["text"].startswith(kept) and 0 < len(kept) < len(example["text"])
    assert 40 - 3 <= count_tokens(prompt) <= 40
