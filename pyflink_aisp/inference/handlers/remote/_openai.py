"""Models behind an OpenAI-compatible server (vLLM, llama.cpp's ``llama-server``, TGI, the
OpenAI API itself): embeddings and text generation, over REST.

The API (https://platform.openai.com/docs/api-reference):

- ``GET /v1/models``: ``{"data": [{"id": ...}]}``, the health check (the model must be listed);
- ``POST /v1/embeddings``: ``{"model", "input": [texts], "encoding_format": "float"}`` answers
  ``{"data": [{"index", "embedding"}], "usage"}``: many texts per request;
- ``POST /v1/completions``: ``{"model", "prompt": [prompts], "max_tokens", ...}`` answers
  ``{"choices": [{"index", "text", "finish_reason"}], "usage"}``: many prompts per request
  (usage is the request's total, so a record's token counts are None when it shared one);
- ``POST /v1/chat/completions``: one conversation per request (``messages``), many requests in
  flight; ``choices[0].message.content``, ``usage`` per record; ``response_format`` with a JSON
  schema (``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``) asks for
  structured output, parsed into the schema's fields.

A request that fails fails its records alone (``remote_error`` / ``remote_timeout``). A request
of several records refused with 400, 413 or 422 (one record's prompt may exceed the context
window) is sent again one record per request, once, so that only the records the server
refuses alone fail. Structured output that does not parse, or lacks a required field or has one
of another type, is an ``invalid_model_output`` dead letter. A prompt the server refuses as past
its context window is a ``prompt_too_long`` dead letter; with a :class:`PromptLimit` each prompt
is counted before it is sent, and dead-lettered or cut to fit (:mod:`._prompt`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyflink_aisp.errors import (
    ConfigError,
    ModelError,
    RemoteError,
)
from pyflink_aisp.inference._handler import ModelHandler, Prepared, as_list
from pyflink_aisp.inference.handlers.remote._call_log import CallLog, CallLogConfig, answer_with_log, call_key
from pyflink_aisp.inference.handlers.remote._client import RemoteEndpoint, RemoteSession
from pyflink_aisp.inference.handlers.remote._prompt import (
    TokenCounter,
)
from pyflink_aisp.inference.tasks import EmbeddingTask

__all__ = ["OpenAIEmbeddingHandler", "OpenAIHandlerBase", "OpenAIModel", "answer_choices"]

#: A request of several records refused with these is split into one request per record.
_SPLIT_STATUSES = frozenset({400, 413, 422})


@dataclass(eq=False)
class OpenAIModel:
    """A worker's connection to the served model.

    Attributes:
        session: The connection pool, limiter and retries.
        call_log: The worker's call log (answers kept across failovers), or None.
        prompt_tokens / completion_tokens: Token usage the server reported, summed.
        counter: Counts prompts in tokens (generation with a :class:`PromptLimit`), or None.
    """

    session: RemoteSession
    call_log: CallLog | None = None
    counter: TokenCounter | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, usage: Any) -> tuple[int | None, int | None]:
        """Add one answer's ``usage``; returns its ``(prompt_tokens, completion_tokens)``."""
        if not isinstance(usage, dict):
            return None, None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        prompt = prompt if isinstance(prompt, int) else None
        completion = completion if isinstance(completion, int) else None
        with self._lock:
            self.prompt_tokens += prompt or 0
            self.completion_tokens += completion or 0
        return prompt, completion


class OpenAIHandlerBase(ModelHandler[Any, Any, OpenAIModel]):
    """What the embedding and generation handlers share: the endpoint, the health check, the
    session, the gauges, splitting refused multi-record requests."""

    def __init__(self, *, url: str, model: str, call_log: CallLogConfig | None = None,
                 **endpoint: Any) -> None:
        if not model or any(ord(c) < 0x20 for c in model):
            raise ConfigError(f"a remote model name must be non-empty without control characters, "
                              f"got {model!r}")
        self.endpoint = RemoteEndpoint(url=url, **endpoint)
        if self.endpoint.is_grpc:
            raise ConfigError(f"the OpenAI API is HTTP: give an http:// or https:// URL, not {url!r} (gRPC "
                              "URLs are for the Open Inference Protocol v2 handler)")
        self.model = model
        self.call_log = call_log
        self._checked = False

    def check(self) -> None:
        """The health check a job runs before it starts: the server answers ``/v1/models`` and
        lists the model.

        Raises:
            RemoteError: Unreachable, refused, or the model is not listed.
            ModelError: The answer is not an OpenAI model list.
        """
        if self._checked:
            return
        listing = self.endpoint.get_json("/v1/models")
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            raise ModelError(f"{self.endpoint.url}/v1/models is not an OpenAI model list: is the URL an "
                             f"OpenAI-compatible server? got {str(listing)[:200]!r}")
        served = [m.get("id") for m in data if isinstance(m, dict)]
        if self.model not in served:
            raise RemoteError(f"{self.endpoint.url} serves no model {self.model!r} (it serves {served})", 404)
        self._checked = True

    def model_version(self) -> str:
        return f"openai:{self.model}"

    def load_model(self) -> OpenAIModel:
        """Check the model from this worker, then open its connection pool.

        Raises:
            RemoteError / ModelError: As :meth:`check`.
            ConfigError: The API key cannot be read on this worker.
        """
        self._checked = False
        self.check()
        log = None if self.call_log is None else CallLog(self.call_log, scope=self.model_version()).open()
        return OpenAIModel(RemoteSession(self.endpoint), call_log=log)

    def release_model(self, model: OpenAIModel) -> None:
        model.session.close()
        if model.call_log is not None:
            model.call_log.close()

    def metrics(self, model: OpenAIModel) -> dict[str, Callable[[], int]]:
        """The session's gauges plus ``remotePromptTokens`` and ``remoteCompletionTokens`` (and,
        with a call log, ``remoteCallLogHits``: records answered from it, ``remoteCallLogSize``)."""
        gauges = {**model.session.gauges(), "remotePromptTokens": lambda: model.prompt_tokens,
                  "remoteCompletionTokens": lambda: model.completion_tokens}
        log = model.call_log
        if log is not None:
            gauges.update(remoteCallLogHits=lambda: log.hits, remoteCallLogSize=lambda: log.size)
        return gauges

    def prepare_batch(self, batch: Sequence[Any], model: OpenAIModel) -> Prepared:
        """The examples as a list; lengths: characters (no tokenizer here)."""
        examples = as_list(batch)
        return Prepared(examples, np.fromiter((len(self._text(x)) for x in examples), dtype=np.int64,
                                              count=len(examples)))

    def run_inference(self, batch: Sequence[Any], model: OpenAIModel) -> list[Any]:
        examples = list(batch)
        for x in examples:
            self._text(x)  # a bad example fails the batch, which the runtime bisects
        return self._answers(examples, model)

    def batch_byte_size(self, batch: Sequence[Any]) -> int:
        return sum(len(self._text(x).encode("utf-8", "replace")) for x in batch)

    def _text(self, example: Any) -> str:
        if not isinstance(example, str):
            raise TypeError(f"expected a text (str), got {type(example).__name__}")
        return example

    # -- subclasses --------------------------------------------------------------------------
    rows_per_request: int = 1

    def _request(self, examples: Sequence[Any]) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def _read(self, answer: Any, examples: Sequence[Any], model: OpenAIModel) -> list[Any]:
        raise NotImplementedError

    def _answers(self, examples: list[Any], model: OpenAIModel) -> list[Any]:
        """One prediction, or the error, per example: from the call log where it holds the
        record's request (no request is made), else from the server (logged)."""
        log = model.call_log
        if log is None:
            return self._call(examples, model)
        keys = [call_key(self.model_version(), self._request([x])) for x in examples]
        return answer_with_log(
            log, keys, self.endpoint.deadline_s,
            lambda todo, on_final: self._call([examples[i] for i in todo], model, on_final=on_final),
            encode=self._encode, decode=self._decode)

    def _encode(self, result: Any) -> Any:
        """A prediction as JSON (generation rows are JSON already)."""
        return result

    def _decode(self, value: Any) -> Any:
        """:meth:`_encode` undone."""
        return value

    def _call(self, examples: list[Any], model: OpenAIModel,
              on_final: Callable[[int, list[Any]], None] | None = None) -> list[Any]:
        """One prediction, or the error, per example; requests of ``rows_per_request``.

        ``on_final(first, outcomes)`` is called as soon as the outcomes of ``examples[first:first
        + len(outcomes)]`` are final (one request's answer read, on the session's loop), so that a
        call log holds each answer before the whole batch ends.
        """
        step = self.rows_per_request
        starts = list(range(0, len(examples), step))
        parts = [examples[i:i + step] for i in starts]
        done: dict[int, list[Any]] = {}

        def answered(j: int, answer: Any) -> None:
            part = parts[j]
            if isinstance(answer, RemoteError) and answer.status in _SPLIT_STATUSES and len(part) > 1:
                return  # sent again one record per request below
            done[j] = self._outcome(answer, part, model)
            if on_final is not None:
                on_final(starts[j], done[j])

        model.session.gather([self._request(p) for p in parts], on_answer=answered)
        results: list[Any] = []
        for j, part in enumerate(parts):
            if j in done:
                results.extend(done[j])
                continue
            singles = model.session.gather([self._request([x]) for x in part])  # once, per record
            for k, (x, single) in enumerate(zip(part, singles, strict=True)):
                outcome = self._outcome(single, [x], model)
                if on_final is not None:
                    on_final(starts[j] + k, outcome)
                results.extend(outcome)
        return results

    def _outcome(self, answer: Any, part: list[Any], model: OpenAIModel) -> list[Any]:
        if isinstance(answer, RemoteError):
            return [answer] * len(part)
        try:
            return self._read(answer, part, model)
        except RemoteError as exc:
            return [exc] * len(part)


def answer_choices(answer: Any, k: int, what: str) -> list[dict[str, Any]]:
    """``k`` entries of an answer's ``choices`` / ``data`` (by their ``index``).

    Raises:
        RemoteError: Missing, or not ``k`` of them with indices 0..k-1 (status None).
    """
    items = answer.get(what) if isinstance(answer, dict) else None
    if not isinstance(items, list) or len(items) != k or not all(isinstance(i, dict) for i in items):
        raise RemoteError(f"the answer has {len(items) if isinstance(items, list) else 'no'} {what} for "
                          f"{k} records: {str(answer)[:200]!r}")
    by_index = sorted(items, key=lambda i: i.get("index", 0) if isinstance(i.get("index"), int) else 0)
    if [i.get("index", n) for n, i in enumerate(by_index)] != list(range(k)):
        raise RemoteError(f"the answer's {what} have the indices {[i.get('index') for i in items]}, "
                          f"not 0..{k - 1}")
    return by_index


class OpenAIEmbeddingHandler(OpenAIHandlerBase):
    """Text embeddings from ``/v1/embeddings`` (see the module docstring).

    Examples are texts; predictions ``(dim,)`` float32 vectors, rendered by
    :class:`~pyflink_aisp.inference.tasks.EmbeddingTask` (field ``embedding`` ARRAY<FLOAT>),
    as the server returns them (no normalisation here). The model version is ``openai:{model}``.

    Args:
        url: The server's base URL (without ``/v1``).
        model: The model's id on the server (as ``/v1/models`` lists it).
        rows_per_request: Most texts in one request.
        dimensions: Ask for this many dimensions (models that support it), or None.
        api_key_env / api_key_file / ca_file / request_timeout_s / deadline_s / max_attempts /
        concurrency: As :class:`~pyflink_aisp.inference.handlers.remote.RemoteEndpoint`.

    Raises:
        ConfigError: A bad URL, timing, key source, ``rows_per_request`` or ``dimensions``.
    """

    def __init__(self, *, url: str, model: str, rows_per_request: int = 64, dimensions: int | None = None,
                 **endpoint: Any) -> None:
        super().__init__(url=url, model=model, **endpoint)
        if rows_per_request < 1 or (dimensions is not None and dimensions < 1):
            raise ConfigError(f"rows_per_request and dimensions must be >= 1, got {rows_per_request}, "
                              f"{dimensions}")
        self.rows_per_request, self.dimensions = rows_per_request, dimensions

    def task(self, *, with_embedding: bool = False) -> EmbeddingTask:
        """Field ``embedding``, after the health check (:meth:`check`: the job fails before it starts)."""
        self.check()
        return EmbeddingTask()

    def _request(self, examples: Sequence[Any]) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.model, "input": list(examples), "encoding_format": "float"}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        return "/v1/embeddings", body

    def _encode(self, result: Any) -> Any:
        return [float(v) for v in result]  # float32 -> double -> float32 is exact

    def _decode(self, value: Any) -> Any:
        return np.asarray(value, dtype=np.float32)

    def _read(self, answer: Any, examples: Sequence[Any], model: OpenAIModel) -> list[Any]:
        model.count(answer.get("usage") if isinstance(answer, dict) else None)
        out = []
        for item in answer_choices(answer, len(examples), "data"):
            vector = np.asarray(item.get("embedding"), dtype=np.float32)
            if vector.ndim != 1 or not vector.size or not np.isfinite(vector).all():
                raise RemoteError(f"an embedding of the answer is not a finite vector: {str(item)[:120]!r}")
            out.append(vector)
        return out
