"""--prompt-max-tokens, --prompt-overflow, --prompt-tokenizer: job parameters and registry keys
round trip into the generation handler's PromptLimit; what does not fit together is refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference.handlers.remote import OpenAIGenerationHandler, PromptLimit, PromptOverflow
from pyflink_aisp.pipeline import InferenceOptions, RemoteApi
from pyflink_aisp.pipeline._handlers import remote_handler
from pyflink_aisp.pipeline._registry import load_registry

CHAT = {"remote_url": "http://llm:8080", "remote_model": "smollm2", "remote_api": RemoteApi.OPENAI_CHAT}


def _get_from(params):
    return lambda key, default: params.get(key, default)


def test_the_prompt_options_round_trip_through_job_parameters_into_the_handler(tmp_path) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    options = InferenceOptions(**CHAT, prompt_max_tokens=1500, prompt_overflow=PromptOverflow.TRUNCATE,
                               prompt_tokenizer=str(tokenizer))
    params = options.job_parameters()
    assert {k: v for k, v in params.items() if k.startswith("aisp.generate.prompt-")} == {
        "aisp.generate.prompt-template": "{text}", "aisp.generate.prompt-max-tokens": "1500",
        "aisp.generate.prompt-overflow": "truncate", "aisp.generate.prompt-tokenizer": str(tokenizer)}
    again = InferenceOptions.from_job_parameters(_get_from(params))
    assert again == options
    handler = remote_handler(again)
    assert isinstance(handler, OpenAIGenerationHandler)
    assert handler.prompt_limit == PromptLimit(max_tokens=1500, overflow=PromptOverflow.TRUNCATE,
                                               tokenizer=tokenizer)
    assert handler._task.prompt_truncated  # the output says which prompts were cut


def test_server_and_none_count_with_the_servers_tokenize_and_no_limit_changes_nothing() -> None:
    for counter in (None, "server"):
        limit = InferenceOptions(**CHAT, prompt_max_tokens=100, prompt_tokenizer=counter).prompt_limit()
        assert limit == PromptLimit(max_tokens=100, overflow=PromptOverflow.DEAD_LETTER, tokenizer=None)
    plain = remote_handler(InferenceOptions(**CHAT))
    assert isinstance(plain, OpenAIGenerationHandler) and plain.prompt_limit is None
    assert "prompt_truncated" not in [f.name for f in plain._task.fields]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({**CHAT, "prompt_overflow": PromptOverflow.TRUNCATE},
     "--prompt-overflow apply with --prompt-max-tokens"),
    ({**CHAT, "prompt_tokenizer": "server"}, "--prompt-tokenizer apply with --prompt-max-tokens"),
    ({**CHAT, "prompt_max_tokens": 100, "prompt_tokenizer": "/nonexistent/tokenizer.json"},
     "--prompt-tokenizer: the prompt tokenizer /nonexistent/tokenizer.json is not a tokenizer.json"),
    ({**CHAT, "remote_api": RemoteApi.OPENAI_EMBEDDINGS, "prompt_max_tokens": 100},
     "--prompt-max-tokens apply to --remote-api openai-chat or openai-completions"),
    ({"prompt_max_tokens": 100}, "--prompt-max-tokens apply to --remote-url only"),
])
def test_prompt_options_that_do_not_fit_together_are_refused(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        InferenceOptions(**kwargs)


def test_prompt_max_tokens_below_one_is_refused() -> None:
    with pytest.raises(ConfigError):
        replace(InferenceOptions(**CHAT), prompt_max_tokens=0)


def test_a_registry_entry_takes_the_prompt_keys_with_a_tokenizer_beside_the_file(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    path = tmp_path / "models.yaml"
    path.write_text("""
models:
  judge:
    task: generate
    remote-url: http://llm:8080
    remote-model: smollm2
    prompt-template: "Review: {text}"
    prompt-max-tokens: 900
    prompt-overflow: truncate
    prompt-tokenizer: tok
  strict:
    task: generate
    remote-url: http://llm:8080
    remote-model: smollm2
    prompt-max-tokens: 900
""", encoding="utf-8")
    registry = load_registry(path)
    judge = registry.get("judge").options
    assert judge.prompt_limit() == PromptLimit(max_tokens=900, overflow=PromptOverflow.TRUNCATE,
                                               tokenizer=tmp_path / "tok" / "tokenizer.json")
    strict = registry.get("strict").options
    assert strict.prompt_limit() == PromptLimit(max_tokens=900)
    assert registry.get("judge").overrides()["prompt_overflow"] is PromptOverflow.TRUNCATE


def test_a_registry_entry_with_overflow_but_no_limit_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  a: {task: generate, remote-url: 'http://h', remote-model: m, "
                    "prompt-overflow: truncate}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model a: --prompt-overflow apply with --prompt-max-tokens"):
        load_registry(path)
