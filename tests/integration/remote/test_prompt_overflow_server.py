"""Issue 22: prompts past the context window against llama.cpp's own ``llama-server`` (the
``openai_server`` fixture: SmolLM2-135M-Instruct, 2,048 tokens a slot). Without a limit the
server's own refusal (``exceed_context_size_error``) is a ``prompt_too_long`` dead letter, sent
once; with ``--prompt-max-tokens`` counted by the server's ``/tokenize`` the over-long review is
dead-lettered before any request, or its text is cut until the prompt fits and the server answers."""

from __future__ import annotations

import pytest

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.errors import PromptTooLongError
from pyflink_aisp.inference.handlers.remote import OpenAIGenerationHandler, PromptLimit, PromptOverflow
from pyflink_aisp.outcome import Reason, reason_of

pytestmark = pytest.mark.integration
TEMPLATE = "Is this movie review positive or negative?\nReview: {text}\nAnswer:"
#: A 135M model on 2 busy cores answers a 1,500-token prompt in seconds: attempts get a minute here
SLOW = {"request_timeout_s": 60.0, "deadline_s": 120.0}
LIMIT = 1500


@pytest.fixture(scope="module")
def texts():
    reviews = [r.text for r in load_rotten_tomatoes()[:12]]
    return [reviews[0], " ".join(reviews) * 40]  # the second far past a slot's 2,048 tokens


def _run(handler, examples):
    model = handler.load_model()  # the health check, /tokenize too with a limit counted by the server
    try:
        return handler.run_inference(list(examples), model), model
    finally:
        handler.release_model(model)


def test_prompt_overflow_on_llama_server_is_prompt_too_long_in_every_mode(openai_server, texts) -> None:
    common = {"url": openai_server, "model": "smollm2", "prompt_template": TEMPLATE, "max_tokens": 4, **SLOW}

    # no limit: the server refuses the long prompt itself (HTTP 400, exceed_context_size_error), once
    out, model = _run(OpenAIGenerationHandler(**common), texts)
    assert isinstance(out[0], dict) and isinstance(out[1], PromptTooLongError), out[1]
    assert out[1].status == 400 and reason_of(out[1]) is Reason.PROMPT_TOO_LONG
    assert "context" in str(out[1]) and model.session.stats.retries == 0
    assert model.session.stats.requests == 2  # one conversation each, nothing retried

    # dead-letter: counted by the server's /tokenize, the long prompt is never sent
    limited = OpenAIGenerationHandler(**common, prompt_limit=PromptLimit(max_tokens=LIMIT))
    out, _ = _run(limited, texts)
    assert isinstance(out[0], dict) and "prompt_truncated" not in out[0]
    assert isinstance(out[1], PromptTooLongError) and out[1].status is None, out[1]
    assert f"over --prompt-max-tokens {LIMIT}" in str(out[1])

    # truncate: the text is cut until the prompt fits, and the server answers it
    cutting = OpenAIGenerationHandler(**common, prompt_limit=PromptLimit(max_tokens=LIMIT,
                                                                         overflow=PromptOverflow.TRUNCATE))
    out, _ = _run(cutting, texts)
    assert [o["prompt_truncated"] for o in out] == [False, True], out
    assert out[1]["finish_reason"] in ("stop", "length") and isinstance(out[1]["completion"], str)
    # the server's usage adds its chat template and special tokens to the counted text
    assert LIMIT - 20 <= out[1]["prompt_tokens"] <= LIMIT + 60, out[1]
    assert out[0]["prompt_tokens"] < 200
