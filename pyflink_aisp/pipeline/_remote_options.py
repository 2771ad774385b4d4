"""The ``--remote-*`` and generation options of :class:`~pyflink_aisp.pipeline.InferenceOptions`
(a model on a remote server: Open Inference Protocol v2 or OpenAI-compatible), declared once here."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference.handlers.remote import (
    GRPC_SCHEMES,
    CallLogConfig,
    PromptLimit,
    PromptOverflow,
    check_base_url,
    path_segment,
    schema_fields,
)
from pyflink_aisp.pipeline._options import OptionGroup, opt, options_of

__all__ = ["GENERATION_OPTION_NAMES", "SERVER_TOKENIZER", "RemoteApi", "RemoteOptions"]

M = OptionGroup.MODEL


class RemoteApi(enum.StrEnum):
    """Which protocol and task a ``--remote-url`` model speaks (``--remote-api``)."""

    V2 = "v2"  # Open Inference Protocol v2 /infer: a numeric model on feature vectors
    OPENAI_EMBEDDINGS = "openai-embeddings"  # /v1/embeddings
    OPENAI_CHAT = "openai-chat"  # /v1/chat/completions
    OPENAI_COMPLETIONS = "openai-completions"  # /v1/completions

    @property
    def generates(self) -> bool:
        """Whether the API generates text (the generation options apply)."""
        return self in (RemoteApi.OPENAI_CHAT, RemoteApi.OPENAI_COMPLETIONS)


#: The generation options (they apply to ``--remote-api openai-chat`` / ``openai-completions``).
GENERATION_OPTION_NAMES = ("prompt_template", "system_prompt", "max_tokens", "temperature", "seed",
                           "json_schema", "prompt_max_tokens", "prompt_overflow", "prompt_tokenizer")
#: ``--prompt-tokenizer`` value that counts with the server's ``POST /tokenize``.
SERVER_TOKENIZER = "server"


@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """A model on a remote server (see the module docstring); checked by :meth:`_check_remote`."""

    remote_url: str | None = opt(None, M, 'A model on a remote server instead of an in-process one: its base '
        'URL (http:// or https://, no credentials in it; a V2 server\'s gRPC endpoint: grpc://host:port, '
        'grpcs:// for TLS). --remote-api says which protocol and task.',
        job_param='aisp.remote.url', nullable=True)
    remote_api: RemoteApi = opt(RemoteApi.V2, M, 'v2: a numeric model on an Open Inference Protocol v2 '
        'server (KServe, Triton, MLServer) on the feature vectors of --feature-fields, one field per output '
        'of its metadata; openai-embeddings: embeddings of the text (/v1/embeddings); openai-chat / '
        'openai-completions: generation from --prompt-template (/v1/chat/completions, one record per '
        'request; /v1/completions, --remote-rows-per-request prompts per request), fields completion, '
        'finish_reason, prompt_tokens, completion_tokens and those of --json-schema.',
        job_param='aisp.remote.api')
    remote_model: str | None = opt(None, M, 'The model name on the --remote-url server (for OpenAI: its id '
        'in /v1/models).',
        job_param='aisp.remote.model', nullable=True)
    remote_model_version: str | None = opt(None, M, "The model version on the server (none: the server's "
        'choice).', job_param='aisp.remote.model-version', nullable=True)
    remote_api_key_env: str | None = opt(None, M, 'Environment variable on the workers holding the API key '
        '(sent as Authorization: Bearer; never logged or written).', job_param='aisp.remote.api-key-env',
        nullable=True)
    remote_api_key_file: Path | None = opt(None, M, 'File on the workers holding the API key (its first '
        'line).', job_param='aisp.remote.api-key-file', nullable=True)
    remote_ca_file: Path | None = opt(None, M, "PEM bundle to verify the server's TLS certificate against "
        "(default: the system's).", job_param='aisp.remote.ca-file', nullable=True)
    remote_rows_per_request: int = opt(64, M, 'Most records in one request (one V2 tensor; texts of one '
        'embeddings or completions request).',
        unit='records', job_param='aisp.remote.rows-per-request', minimum=1)
    remote_v2_binary: bool = opt(False, M, "V2 over REST: send each request's tensor in the binary tensor "
        'data extension (raw little-endian bytes after a JSON header; Triton, KServe), not as a JSON list '
        'of numbers; numeric models only.', job_param='aisp.remote.v2-binary')
    remote_max_concurrency: int = opt(64, M, 'Most requests in flight per worker: the adaptive limit '
        '(AIMD) grows towards it while answers come and halves on 429 / 503 / timeouts.',
        unit='requests', job_param='aisp.remote.max-concurrency', minimum=1)
    remote_max_requests_per_s: float | None = opt(None, M, 'A fixed limit on request starts per worker '
        '(each parallel instance), on top of the adaptive one; starts are spaced by 1 / rate.',
        unit='requests/s', job_param='aisp.remote.max-requests-per-s', nullable=True, minimum=0.001)
    remote_max_tokens_per_min: float | None = opt(None, M, "OpenAI APIs: a fixed limit on the tokens the "
        "answers report (usage.total_tokens) per worker; new requests wait while the worker is a minute's "
        'budget ahead.', unit='tokens/min', job_param='aisp.remote.max-tokens-per-min', nullable=True,
        minimum=1)
    remote_deadline_s: float = opt(30.0, M, 'Longest one request may take, retries with backoff included; '
        'its records are then remote_timeout dead letters.', unit='s', job_param='aisp.remote.deadline-s',
        minimum=0.001)
    remote_request_timeout_s: float = opt(10.0, M, 'Longest one attempt may take.', unit='s',
        job_param='aisp.remote.request-timeout-s', minimum=0.001)
    remote_call_log: str | None = opt(None, M, 'A Kafka topic that keeps each remote answer (created '
        'compacted when missing), so that records replayed after a failover are answered from it instead '
        'of the server, and a record that failed for good or ran out of --remote-deadline-s is not '
        'retried after a restart.', job_param='aisp.remote.call-log', nullable=True)
    remote_call_log_servers: str | None = opt(None, M, "The call log's Kafka bootstrap servers (default: "
        "the job's --bootstrap-servers).", job_param='aisp.remote.call-log-servers', nullable=True)
    prompt_template: str = opt('{text}', M, "Generation: the prompt, with {text} (and {text_pair}) replaced "
        "by the record's text, and in a job each field of --prompt-fields by its value ({product}); other "
        "{name} placeholders are refused, other braces stay.", job_param='aisp.generate.prompt-template')
    system_prompt: str | None = opt(None, M, 'Generation (openai-chat): a system message.',
        job_param='aisp.generate.system-prompt', nullable=True)
    max_tokens: int = opt(256, M, 'Generation: most tokens generated per record.', unit='tokens',
        job_param='aisp.generate.max-tokens', minimum=1)
    temperature: float = opt(0.0, M, 'Generation: sampling temperature (0: greedy).',
        job_param='aisp.generate.temperature', minimum=0)
    seed: int | None = opt(None, M, 'Generation: a sampling seed, for servers that take one.',
        job_param='aisp.generate.seed', nullable=True)
    json_schema: str | None = opt(None, M, 'Generation (openai-chat): structured output, a JSON object '
        'schema (inline JSON, or @FILE); each property becomes an output field, and a completion that '
        'does not parse or fit is an invalid_model_output dead letter.',
        job_param='aisp.generate.json-schema', nullable=True)
    prompt_max_tokens: int | None = opt(None, M, "Generation: count each record's prompt before it is sent "
        '(--prompt-tokenizer); one over this many tokens is a prompt_too_long dead letter or has its text '
        "cut (--prompt-overflow). none: prompts go as they are (a server's own context-window refusal is "
        'still prompt_too_long).', unit='tokens', job_param='aisp.generate.prompt-max-tokens', nullable=True,
        minimum=1)
    prompt_overflow: PromptOverflow = opt(PromptOverflow.DEAD_LETTER, M, 'Generation, with '
        '--prompt-max-tokens: dead-letter: a prompt over it is a prompt_too_long dead letter; truncate: the '
        "record's {text} is cut from the end until the prompt fits (the template stays whole), and the "
        'field prompt_truncated says whether it was.', job_param='aisp.generate.prompt-overflow')
    prompt_tokenizer: str | None = opt(None, M, 'Generation, with --prompt-max-tokens: what counts a '
        "prompt's tokens: PATH to the model's HF tokenizer.json, or server (none: the same): the "
        "server's POST /tokenize (llama.cpp, vLLM), checked before the job starts. The chat template, "
        'system prompt and special tokens are not counted: leave them room.',
        job_param='aisp.generate.prompt-tokenizer', nullable=True)

    def json_schema_value(self) -> dict[str, Any] | None:
        """``--json-schema`` parsed (inline JSON, or ``@FILE``), or None.

        Raises:
            ConfigError: The file cannot be read, or the text is not a JSON object.
        """
        if self.json_schema is None:
            return None
        text = self.json_schema
        if text.startswith("@"):
            try:
                text = Path(text[1:]).read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"--json-schema {self.json_schema}: cannot read it ({exc})") from None
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--json-schema is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError("--json-schema must be a JSON object schema")
        return value

    def prompt_limit(self) -> PromptLimit | None:
        """The prompt limit of ``--prompt-max-tokens``, ``--prompt-overflow`` and
        ``--prompt-tokenizer``, or None.

        Raises:
            ConfigError: The tokenizer is not a tokenizer.json (or a directory holding one).
        """
        if self.prompt_max_tokens is None:
            return None
        counter = self.prompt_tokenizer
        tokenizer = None if counter is None or counter == SERVER_TOKENIZER else Path(counter)
        try:
            return PromptLimit(max_tokens=self.prompt_max_tokens, overflow=self.prompt_overflow,
                               tokenizer=tokenizer)
        except ConfigError as exc:
            raise ConfigError(f"--prompt-tokenizer: {exc}") from None

    def _check_remote(self) -> None:
        """``--remote-*`` go with ``--remote-url`` and ``--remote-model``, the generation options
        with a generating ``--remote-api``; a well-formed URL without credentials; names that
        are one path segment."""
        changed = [o for o in options_of(RemoteOptions) if getattr(self, o.name) != o.default]
        remote = [o.flag for o in changed if o.flag.startswith("--remote-")
                  and o.name not in ("remote_url", "remote_model")]
        generation = [o.flag for o in changed if o.name in GENERATION_OPTION_NAMES]
        if self.remote_url is None:
            if self.remote_model is not None or remote or generation:
                flags = ["--remote-model"] * (self.remote_model is not None) + remote + generation
                raise ConfigError(f"{', '.join(flags)} apply to --remote-url only")
            return
        self._check_generation(generation)
        self._check_endpoint(self.remote_url)

    def _check_generation(self, generation: list[str]) -> None:
        if generation and not self.remote_api.generates:
            raise ConfigError(f"{', '.join(generation)} apply to --remote-api openai-chat or "
                              f"openai-completions, not {self.remote_api.value}")
        if self.remote_api is RemoteApi.OPENAI_COMPLETIONS and (
                self.system_prompt is not None or self.json_schema is not None):
            raise ConfigError("--system-prompt and --json-schema need --remote-api openai-chat")
        if self.remote_api.generates and "{text}" not in self.prompt_template:
            raise ConfigError(f"--prompt-template must hold {{text}} (the record's text), got "
                              f"{self.prompt_template!r}")
        if self.temperature > 2:
            raise ConfigError(f"--temperature must be <= 2 (the OpenAI API's range), "
                              f"got {self.temperature:g}")
        limited = [f for f in ("--prompt-overflow", "--prompt-tokenizer") if f in generation]
        if limited and self.prompt_max_tokens is None:
            raise ConfigError(f"{', '.join(limited)} apply with --prompt-max-tokens (the most tokens of a "
                              "prompt)")
        self.prompt_limit()
        schema = self.json_schema_value()
        if schema is not None:
            try:
                schema_fields(schema)
            except ConfigError as exc:
                raise ConfigError(f"--json-schema: {exc}") from None

    def _check_endpoint(self, url: str) -> None:
        if not url.strip():
            raise ConfigError("--remote-url is empty: give the server's base URL (e.g. http://triton:8000)")
        try:
            check_base_url(url)
        except ConfigError as exc:
            raise ConfigError(f"--remote-url: {exc}") from None
        if url.strip().split(":", 1)[0] in GRPC_SCHEMES and self.remote_api is not RemoteApi.V2:
            raise ConfigError(f"--remote-url {url.strip()} is a gRPC endpoint: gRPC is for --remote-api v2 "
                              f"(the OpenAI API is HTTP), got --remote-api {self.remote_api.value}")
        if self.remote_model is None:
            raise ConfigError("--remote-url needs --remote-model (the model's name on the server)")
        if self.remote_model_version is not None and self.remote_api is not RemoteApi.V2:
            raise ConfigError("--remote-model-version is for --remote-api v2 (an OpenAI model id names its "
                              "version)")
        for flag, kind, value in (("--remote-model", "model name", self.remote_model),
                                  ("--remote-model-version", "model version", self.remote_model_version)):
            if value is not None and (self.remote_api is RemoteApi.V2 or flag == "--remote-model-version"):
                try:
                    path_segment(kind, value)
                except ConfigError as exc:
                    raise ConfigError(f"{flag}: {exc}") from None
        if self.remote_api_key_env is not None and self.remote_api_key_file is not None:
            raise ConfigError("give the API key by --remote-api-key-env or --remote-api-key-file, not both")
        if self.remote_ca_file is not None and not self.remote_ca_file.is_file():
            raise ConfigError(f"--remote-ca-file {self.remote_ca_file} is not a file")
        if self.remote_max_tokens_per_min is not None and self.remote_api is RemoteApi.V2:
            raise ConfigError("--remote-max-tokens-per-min is for the OpenAI APIs (V2 answers report no "
                              "tokens); limit a V2 server with --remote-max-requests-per-s")
        if self.remote_call_log_servers is not None and self.remote_call_log is None:
            raise ConfigError("--remote-call-log-servers applies to --remote-call-log only")
        if self.remote_call_log is not None:
            try:
                CallLogConfig(topic=self.remote_call_log,
                              bootstrap_servers=self.remote_call_log_servers or "checked-at-start")
            except ConfigError as exc:
                raise ConfigError(f"--remote-call-log: {exc}") from None
        if self.remote_request_timeout_s > self.remote_deadline_s:
            raise ConfigError(f"--remote-request-timeout-s ({self.remote_request_timeout_s:g}) must not "
                              f"exceed --remote-deadline-s ({self.remote_deadline_s:g})")
