"""Issue 22: the OpenAI-compatible handlers against llama.cpp's own ``llama-server`` serving a real
chat model (SmolLM2-135M-Instruct, the ``openai_server`` / ``openai_embedding_server`` fixtures):
answers equal the server's own to the same request sent directly; structured output parses into
its fields; a prompt past the context window fails alone; 429 / 503 from the fault proxy are
retried with nothing lost."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from pyflink_aisp.chaos import FaultProxy, Faults
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.errors import InvalidModelOutputError, RemoteError
from pyflink_aisp.inference.handlers.remote import (
    LimiterConfig,
    OpenAIEmbeddingHandler,
    OpenAIGenerationHandler,
)

pytestmark = pytest.mark.integration
TEMPLATE = "Is this movie review positive or negative?\nReview: {text}\nAnswer:"
#: A 135M model on 2 busy cores answers a first request in seconds: attempts get a minute here
SLOW = {"request_timeout_s": 60.0, "deadline_s": 120.0}
SCHEMA = {"type": "object", "properties": {"sentiment": {"type": "string", "enum": ["positive", "negative"]}},
          "required": ["sentiment"]}


@pytest.fixture(scope="module")
def reviews():
    return [r.text for r in load_rotten_tomatoes()[:12]]


def _run(handler, examples):
    model = handler.load_model()
    try:
        return handler.run_inference(list(examples), model), model
    finally:
        handler.release_model(model)


def test_chat_answers_equal_the_servers_own_and_count_its_usage(openai_server, reviews) -> None:
    # one request in flight, as the direct requests below: llama.cpp decodes concurrent conversations in
    # one batch, whose float sums differ in the last bits, enough to flip a greedy token now and then
    # (seen once in CI: "Positive." against "This movie review is positive.")
    handler = OpenAIGenerationHandler(url=openai_server, model="smollm2", prompt_template=TEMPLATE,
                                      system_prompt="Answer with one word.", max_tokens=8, seed=7,
                                      concurrency=LimiterConfig(initial=1, maximum=1), **SLOW)
    out, model = _run(handler, reviews[:6])
    for text, got in zip(reviews[:6], out, strict=True):
        body = {"model": "smollm2", "max_tokens": 8, "temperature": 0.0, "seed": 7, "messages": [
            {"role": "system", "content": "Answer with one word."},
            {"role": "user", "content": TEMPLATE.replace("{text}", text)}]}
        want = httpx.post(f"{openai_server}/v1/chat/completions", json=body, timeout=60).json()
        assert got["completion"] == want["choices"][0]["message"]["content"]
        assert got["finish_reason"] == want["choices"][0]["finish_reason"] in ("stop", "length")
        assert got["prompt_tokens"] == want["usage"]["prompt_tokens"] > 20
        assert got["completion_tokens"] == want["usage"]["completion_tokens"] <= 8
    assert model.prompt_tokens == sum(o["prompt_tokens"] for o in out)
    assert model.session.stats.requests == 6  # one conversation per request


def test_structured_output_parses_into_the_schemas_fields(openai_server, reviews) -> None:
    handler = OpenAIGenerationHandler(url=openai_server, model="smollm2", prompt_template=TEMPLATE,
                                      json_schema=SCHEMA, max_tokens=24, **SLOW)
    out, _ = _run(handler, reviews)
    assert [f.name for f in handler.task().fields][-1] == "sentiment"
    # the grammar lets SmolLM2 pad with whitespace until max_tokens cuts the object: such a record is
    # an invalid_model_output, never a half-parsed row
    bad = [o for o in out if not isinstance(o, dict)]
    assert all(isinstance(o, InvalidModelOutputError) and "not JSON" in str(o) for o in bad), bad
    parsed = [o for o in out if isinstance(o, dict)]
    assert len(parsed) >= len(out) // 2, bad
    assert {o["sentiment"] for o in parsed} <= {"positive", "negative"}
    assert all(f'"{o["sentiment"]}"' in o["completion"] for o in parsed)  # parsed from the completion


def test_completions_take_many_prompts_per_request(openai_server, reviews) -> None:
    handler = OpenAIGenerationHandler(url=openai_server, model="smollm2", api="completions",
                                      prompt_template=TEMPLATE, max_tokens=6, rows_per_request=4, **SLOW)
    out, model = _run(handler, reviews[:8])
    assert model.session.stats.requests == 2 and len(out) == 8
    assert all(isinstance(o["completion"], str) and o["prompt_tokens"] is None for o in out)
    singles, _ = _run(OpenAIGenerationHandler(url=openai_server, model="smollm2", api="completions",
                                              prompt_template=TEMPLATE, max_tokens=6, rows_per_request=1,
                                              **SLOW),
                      reviews[:8])
    assert [o["completion"] for o in out] == [o["completion"] for o in singles]  # greedy: the same text
    # (llama.cpp reports one usage per multi-prompt request that is not the prompts' sum: not compared)


def test_a_prompt_past_the_context_window_fails_alone(openai_server, reviews) -> None:
    handler = OpenAIGenerationHandler(url=openai_server, model="smollm2", api="completions",
                                      prompt_template="{text}", max_tokens=4, rows_per_request=3, **SLOW)
    huge = " ".join(reviews) * 40  # far past the 2,048-token window of a slot
    out, model = _run(handler, [reviews[0], huge, reviews[1]])
    assert isinstance(out[1], RemoteError) and out[1].status == 400, out[1]
    assert "context" in str(out[1]).lower()
    assert isinstance(out[0], dict) and isinstance(out[2], dict)
    assert model.session.stats.requests == 4  # the batch, then each prompt alone once


def test_embeddings_equal_the_servers_own_in_order(openai_embedding_server, reviews) -> None:
    handler = OpenAIEmbeddingHandler(url=openai_embedding_server, model="smollm2-embed", rows_per_request=5,
                                     **SLOW)
    out, model = _run(handler, reviews)
    assert model.session.stats.requests == 3
    direct = httpx.post(f"{openai_embedding_server}/v1/embeddings", timeout=60, json={
        "model": "smollm2-embed", "input": reviews, "encoding_format": "float"}).json()["data"]
    want = np.array([d["embedding"] for d in sorted(direct, key=lambda d: d["index"])], dtype=np.float32)
    got = np.stack(out)
    assert got.shape == (12, 576)  # SmolLM2-135M's hidden size
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert len({round(float(v), 4) for v in got[:, 0]}) > 6  # twelve texts, not one vector twelve times


def test_throttled_server_answers_are_retried_and_nothing_is_lost(openai_server, reviews) -> None:
    faults = Faults(rate_limited=0.3, unavailable=0.1, retry_after_s=1, path_suffix="/chat/completions",
                    seed=5)
    # one conversation in flight in both runs: llama.cpp decodes concurrent conversations in one batch,
    # whose float sums may flip a greedy token (this comparison failed so once, in a full suite run)
    one = LimiterConfig(initial=1, maximum=1)
    with FaultProxy(openai_server, faults) as proxy:
        handler = OpenAIGenerationHandler(url=proxy.url, model="smollm2", prompt_template=TEMPLATE,
                                          max_tokens=4, concurrency=one, **SLOW)
        out, model = _run(handler, reviews)
        counts = {outcome: n for (path, outcome), n in proxy.counts.items() if path.endswith("/completions")}
    calm, _ = _run(OpenAIGenerationHandler(url=openai_server, model="smollm2", prompt_template=TEMPLATE,
                                           max_tokens=4, concurrency=one, **SLOW), reviews)
    assert [o["completion"] for o in out] == [o["completion"] for o in calm]
    refused = counts.get("rate_limited", 0) + counts.get("unavailable", 0)
    assert refused > 0 and model.session.stats.retries == refused
    assert counts["forwarded"] == len(reviews)  # each conversation reached the server once
