"""Text generation on an OpenAI-compatible server: ``/v1/chat/completions`` (one conversation per
request, many in flight; a JSON schema as ``response_format`` for structured output, parsed into the
schema's fields) and ``/v1/completions`` (many prompts per request). The shared client, health check
and call log are :mod:`._openai`'s.

Structured output that does not parse, or lacks a required field or has one of another type, is an
``invalid_model_output`` dead letter. A prompt the server refuses as past its context window is a
``prompt_too_long`` dead letter; with a :class:`PromptLimit` each prompt is counted before it is
sent, and dead-lettered or cut to fit (:mod:`._prompt`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pyflink_aisp.errors import (
    ConfigError,
    InvalidModelOutputError,
    RemoteError,
)
from pyflink_aisp.inference.handlers.remote._openai import OpenAIHandlerBase, OpenAIModel, answer_choices
from pyflink_aisp.inference.handlers.remote._prompt import (
    Fitted,
    PromptLimit,
    PromptOverflow,
    check_tokenize,
    fit_prompts,
    prompt_counter,
)
from pyflink_aisp.inference.tasks import GenerationTask, OutputField, SqlType

__all__ = ["ChatApi", "OpenAIGenerationHandler", "schema_fields"]

_JSON_TYPES: dict[str, SqlType] = {"string": SqlType.STRING, "number": SqlType.DOUBLE,
                                   "integer": SqlType.BIGINT, "boolean": SqlType.BOOLEAN}
_JSON_ARRAYS: dict[str, SqlType] = {"string": SqlType.ARRAY_STRING, "number": SqlType.ARRAY_DOUBLE,
                                    "integer": SqlType.ARRAY_DOUBLE}

#: Which generation route: ``"chat"`` (/v1/chat/completions) or ``"completions"`` (/v1/completions).
ChatApi = Literal["chat", "completions"]


def schema_fields(schema: Any) -> tuple[OutputField, ...]:
    """The output fields of a structured-output JSON schema: one per top-level property, typed
    ``string`` → STRING, ``number`` → DOUBLE, ``integer`` → BIGINT, ``boolean`` → BOOLEAN, an
    ``array`` of ``string`` → ARRAY<STRING>, of ``number`` / ``integer`` → ARRAY<DOUBLE>
    (a ``string`` with ``enum`` is a STRING).

    Raises:
        ConfigError: Not an object schema with ``properties``, or a property of another type or
            with a name that is not a field name.
    """
    if not isinstance(schema, dict) or schema.get("type") != "object" or not isinstance(
            schema.get("properties"), dict) or not schema["properties"]:
        raise ConfigError("a structured-output schema must be a JSON object schema with properties "
                          '({"type": "object", "properties": {...}})')
    fields = []
    for name, spec in schema["properties"].items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        items = spec.get("items", {}).get("type") if isinstance(spec, dict) and isinstance(
            spec.get("items"), dict) else None
        sql_type = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
        if kind == "array" and isinstance(items, str):
            sql_type = _JSON_ARRAYS.get(items)
        if sql_type is None:
            raise ConfigError(f"structured-output property {name!r} is {spec!r}: a field takes a string, "
                              "number, integer, boolean or an array of strings or numbers")
        fields.append(OutputField(name=name, sql_type=sql_type))
    return tuple(fields)


def _structured(content: str, schema: dict[str, Any], fields: tuple[OutputField, ...]) -> dict[str, Any]:
    """The structured fields of one completion.

    Raises:
        InvalidModelOutputError: Not a JSON object, a required property missing, a value of
            another type.
    """
    try:
        value = json.loads(content)
    except ValueError as exc:
        raise InvalidModelOutputError(f"the completion is not JSON ({exc}): {content[:200]!r}") from None
    if not isinstance(value, dict):
        raise InvalidModelOutputError(f"the completion is JSON but not an object: {content[:200]!r}")
    required = set(schema.get("required") or ())
    out: dict[str, Any] = {}
    for f in fields:
        item = value.get(f.name)
        if item is None:
            if f.name in required:
                raise InvalidModelOutputError(f"the completion lacks the required field {f.name!r}: "
                                              f"{content[:200]!r}")
            out[f.name] = None
            continue
        if not _fits(item, f.sql_type):
            raise InvalidModelOutputError(f"field {f.name!r} of the completion is {item!r}, not "
                                          f"{f.sql_type.value}")
        out[f.name] = item
    return out


def _fits(item: Any, sql_type: SqlType) -> bool:
    number = (int, float)
    if sql_type is SqlType.STRING:
        return isinstance(item, str)
    if sql_type is SqlType.BOOLEAN:
        return isinstance(item, bool)
    if sql_type is SqlType.BIGINT:
        return isinstance(item, int) and not isinstance(item, bool)
    if sql_type is SqlType.DOUBLE:
        return isinstance(item, number) and not isinstance(item, bool) and math.isfinite(item)
    if not isinstance(item, list):
        return False
    if sql_type is SqlType.ARRAY_STRING:
        return all(isinstance(v, str) for v in item)
    return all(isinstance(v, number) and not isinstance(v, bool) and math.isfinite(v) for v in item)


#: A ``{name}`` placeholder of a prompt template (a Python identifier in braces); other braces,
#: such as a JSON example's, stay as they are.
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _placeholders(template: str, fields: tuple[str, ...]) -> re.Pattern[str]:
    """The pattern of the template's replaced placeholders: ``{text}``, ``{text_pair}`` and
    each field's.

    Raises:
        ConfigError: A field named twice or as a text, a field the template does not name, or a
            ``{name}`` of the template that is none of them.
    """
    names = ("text", "text_pair", *fields)
    if len(set(names)) < len(names):
        raise ConfigError(f"prompt fields must be distinct and not text / text_pair, got {list(fields)}")
    absent = [f for f in fields if "{" + f + "}" not in template]
    if absent:
        raise ConfigError(f"--prompt-fields {absent}: the prompt template names no {{{absent[0]}}} "
                          f"({template[:120]!r})")
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(template)} - set(names))
    if unknown:
        hint = (f"give --prompt-fields /{unknown[0]} (a field of the record)" if not fields else
                f"--prompt-fields gives {list(fields)}")
        raise ConfigError(f"the prompt template names {{{unknown[0]}}}, which is not {{text}}, {{text_pair}} "
                          f"or a prompt field: {hint}; in SQL, build the prompt in the query (CONCAT)")
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile("\\{(" + alternatives + ")\\}")


class OpenAIGenerationHandler(OpenAIHandlerBase):
    """Text generation from ``/v1/chat/completions`` or ``/v1/completions`` (see the module
    docstring): each record's prompt is ``prompt_template`` with ``{text}`` (and ``{text_pair}``,
    for records mapped with a second text, and ``{name}`` of each of ``prompt_fields``) replaced
    in one pass (a value holding a placeholder is not replaced again); other braces are kept as
    they are, except a ``{name}`` that names no text or prompt field, which is refused.

    Predictions are mappings rendered by :class:`~pyflink_aisp.inference.tasks.GenerationTask`:
    ``completion``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, with a
    ``prompt_limit`` that truncates ``prompt_truncated``, and with ``json_schema`` (chat only)
    one field per property of the schema (:func:`schema_fields`). The model version is
    ``openai:{model}``.

    Args:
        url: The server's base URL (without ``/v1``).
        model: The model's id on the server.
        api: ``"chat"`` (one record per request) or ``"completions"`` (``rows_per_request``).
        prompt_template: The prompt, with ``{text}``.
        prompt_fields: The placeholder names of record fields the template names beside the text
            (a job's ``--prompt-fields``); examples are then ``dict`` s of name → value.
        system_prompt: A system message (chat only), or None.
        max_tokens: Most tokens generated per record.
        temperature: Sampling temperature (0: greedy).
        seed: A sampling seed for servers that take one, or None.
        json_schema: A JSON object schema the completion must follow (chat only), or None.
        rows_per_request: Most prompts in one ``/v1/completions`` request.
        prompt_limit: Count each prompt before it is sent and dead-letter or truncate one over the
            limit (:mod:`._prompt`), or None (the server's own refusal is still ``prompt_too_long``).
        api_key_env / ... / concurrency: As :class:`~pyflink_aisp.inference.handlers.remote.RemoteEndpoint`.

    Raises:
        ConfigError: An unknown ``api``, a template without ``{text}``, a ``{name}`` of the template
            that is not a text or prompt field, a prompt field the template does not name, a
            system prompt or schema with ``completions``, a bad schema, or bad numbers.
    """

    accepts_text_pairs: ClassVar[bool] = True

    def __init__(self, *, url: str, model: str, api: ChatApi = "chat", prompt_template: str = "{text}",
                 system_prompt: str | None = None, max_tokens: int = 256, temperature: float = 0.0,
                 seed: int | None = None, json_schema: dict[str, Any] | None = None,
                 rows_per_request: int = 16, prompt_limit: PromptLimit | None = None,
                 prompt_fields: Sequence[str] = (), **endpoint: Any) -> None:
        super().__init__(url=url, model=model, **endpoint)
        if api not in ("chat", "completions"):
            raise ConfigError(f"api must be 'chat' or 'completions', got {api!r}")
        if "{text}" not in prompt_template:
            raise ConfigError(f"the prompt template must hold {{text}} (the record's text), "
                              f"got {prompt_template!r}")
        self.prompt_fields = tuple(prompt_fields)
        self._placeholders = _placeholders(prompt_template, self.prompt_fields)
        if api == "completions" and (system_prompt is not None or json_schema is not None):
            raise ConfigError("a system prompt and a JSON schema need api 'chat' (/v1/chat/completions)")
        if max_tokens < 1 or not 0.0 <= temperature <= 2.0 or rows_per_request < 1:
            raise ConfigError(f"need max_tokens >= 1, 0 <= temperature <= 2 and rows_per_request >= 1, got "
                              f"{max_tokens}, {temperature}, {rows_per_request}")
        self.structured = schema_fields(json_schema) if json_schema is not None else ()
        self.prompt_limit = prompt_limit
        truncates = prompt_limit is not None and prompt_limit.overflow is PromptOverflow.TRUNCATE
        # a clash with its own fields raises here
        self._task = GenerationTask(structured=self.structured, prompt_truncated=truncates)
        self.api, self.prompt_template, self.system_prompt = api, prompt_template, system_prompt
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.json_schema = json_schema
        self.rows_per_request = rows_per_request if api == "completions" else 1

    def task(self, *, with_embedding: bool = False) -> GenerationTask:
        """The generation fields and the schema's, after the health check (:meth:`check`)."""
        self.check()
        return self._task

    def check(self) -> None:
        """As the base's, and with a :class:`PromptLimit` counted by the server: ``POST
        /tokenize`` answers (one line when it does not).

        Raises:
            RemoteError / ModelError: As the base's, or no ``/tokenize``.
        """
        checked = self._checked
        super().check()
        if checked or self.prompt_limit is None or self.prompt_limit.tokenizer is not None:
            return
        try:
            check_tokenize(self.endpoint, self.model)
        except RemoteError:
            self._checked = False
            raise

    def load_model(self) -> OpenAIModel:
        """As the base's, with the prompt counter of a :class:`PromptLimit` (its tokenizer loaded).

        Raises:
            ModelError: Also: the prompt tokenizer cannot be loaded.
        """
        model = super().load_model()
        if self.prompt_limit is not None:
            try:
                model.counter = prompt_counter(self.prompt_limit, model.session, self.model)
            except BaseException:
                self.release_model(model)
                raise
        return model

    def run_inference(self, batch: Sequence[Any], model: OpenAIModel) -> list[Any]:
        """As the base's; with a :class:`PromptLimit` the prompts are fitted first, and only those
        that fit are sent (with ``truncate`` each row says ``prompt_truncated``)."""
        if self.prompt_limit is None:
            return super().run_inference(batch, model)
        examples = list(batch)
        for x in examples:
            self._text(x)
        if model.counter is None:  # a model not from load_model
            model.counter = prompt_counter(self.prompt_limit, model.session, self.model)
        fitted = fit_prompts(examples, self.prompt_limit, model.counter, self.prompt)
        sent = [f for f in fitted if isinstance(f, Fitted)]
        answers = iter(self._answers([f.example for f in sent], model) if sent else [])
        flag = self._task.prompt_truncated
        out: list[Any] = []
        for f in fitted:
            result = next(answers) if isinstance(f, Fitted) else f
            if flag and isinstance(f, Fitted) and isinstance(result, dict):
                result = {**result, "prompt_truncated": f.truncated}
            out.append(result)
        return out

    def _text(self, example: Any) -> str:
        if isinstance(example, tuple) and len(example) == 2 and all(isinstance(t, str) for t in example):
            return f"{example[0]}\n{example[1]}"
        if isinstance(example, dict):
            want = {"text", *self.prompt_fields}
            if not want <= example.keys() <= want | {"text_pair"} or not all(
                    isinstance(v, str) for v in example.values()):
                raise TypeError(f"expected a dict of str holding text and the prompt fields {sorted(want)}, "
                                f"got the keys {sorted(example)}")
            return "\n".join(example.values())
        if self.prompt_fields:
            raise TypeError(f"expected a dict holding the prompt fields {list(self.prompt_fields)}, got "
                            f"{type(example).__name__}")
        return super()._text(example)

    def prompt(self, example: Any) -> str:
        """The prompt of one example: ``{text}``, ``{text_pair}`` (empty for one text) and each
        prompt field's ``{name}`` replaced in one pass.

        Raises:
            TypeError: Not an example of this handler (a text, a pair, or a dict of the fields).
        """
        self._text(example)
        if isinstance(example, dict):
            values = {"text_pair": "", **example}
        else:
            text, pair = example if isinstance(example, tuple) else (example, "")
            values = {"text": text, "text_pair": pair}
        return self._placeholders.sub(lambda m: values[m.group(1)], self.prompt_template)

    def _sampling(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens,
                                "temperature": self.temperature}
        if self.seed is not None:
            body["seed"] = self.seed
        return body

    def _request(self, examples: Sequence[Any]) -> tuple[str, dict[str, Any]]:
        body = self._sampling()
        if self.api == "completions":
            body["prompt"] = [self.prompt(x) for x in examples]
            return "/v1/completions", body
        (example,) = examples
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        body["messages"] = [*messages, {"role": "user", "content": self.prompt(example)}]
        if self.json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": self.json_schema, "strict": True}}
        return "/v1/chat/completions", body

    def _read(self, answer: Any, examples: Sequence[Any], model: OpenAIModel) -> list[Any]:
        prompt, completion = model.count(answer.get("usage") if isinstance(answer, dict) else None)
        if len(examples) > 1:
            prompt = completion = None  # the request's total, not a record's
        out: list[Any] = []
        for choice in answer_choices(answer, len(examples), "choices"):
            text = choice.get("text") if self.api == "completions" else (
                choice.get("message") or {}).get("content")
            if not isinstance(text, str):
                raise RemoteError(f"a choice of the answer has no text: {str(choice)[:200]!r}")
            row: dict[str, Any] = {"completion": text, "finish_reason": str(choice.get("finish_reason")),
                                   "prompt_tokens": prompt, "completion_tokens": completion}
            if self.json_schema is not None:
                try:
                    row.update(_structured(text, self.json_schema, self.structured))
                except InvalidModelOutputError as exc:
                    out.append(exc)
                    continue
            out.append(row)
        return out
