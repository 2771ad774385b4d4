"""The model registry: named models in one YAML file, read by jobs (``--models FILE --model
NAME``), SQL functions (:mod:`pyflink_aisp.pipeline.registry`) and ``aisp models``.

The file::

    models:
      intent:                     # a name: [a-z_][a-z0-9_]*, the SQL function's name
        task: classify            # classify | embed | predict | sentiment | handler
        path: intent-classifier   # relative paths are relative to this file
        top-k: 3
        max-batch-size: 64        # any model, batching or worker option of the options table
      intent_head:
        task: predict
        path: intent-head.onnx
      minilm:
        task: embed
        path: minilm/model.onnx
        tokenizer: minilm/tokenizer.json
        encoder-normalize: true
      fraud:                      # a numeric model on an Open Inference Protocol v2 server
        task: predict
        remote-url: http://triton:8000
        remote-model: fraud
      label_llm:                  # a chat model on an OpenAI-compatible server (vLLM, llama.cpp)
        task: generate
        remote-url: http://vllm:8000
        remote-model: Qwen/Qwen2.5-1.5B-Instruct
        prompt-template: "Sentiment of this review, one word: {text}"
        max-tokens: 4
        prompt-max-tokens: 1500   # longer prompts: their text cut to fit (or dead-letter)
        prompt-overflow: truncate
      lexicon:
        task: handler
        class: lexicon_handler:LexiconHandler   # importable on the workers
        args: {positive: [good], negative: [bad]}

What each task's ``path`` is: ``classify`` a HF sequence-classification directory
(``--classifier``), ``embed`` an ONNX encoder file with its ``tokenizer``
(``--encoder-onnx``, ``--encoder-tokenizer``), ``predict`` a numeric ONNX model
(``--predictor``), ``sentiment`` the project's model directory (optional: the cached build).
A model on a server has ``remote-url`` and ``remote-model`` instead of a path: ``predict`` on
an Open Inference Protocol v2 server, ``embed`` on an OpenAI-compatible one
(``/v1/embeddings``), ``generate`` (only there) by ``remote-api`` ``openai-chat`` (the default)
or ``openai-completions``, with the generation options (``prompt-template``, ``max-tokens``,
``json-schema``, ``prompt-max-tokens``, ...; a relative ``prompt-tokenizer`` path is relative
to this file). Every other key is an option of the
model, batching or worker group (``docs/options.md``) by its flag's name without ``--``;
options of the job (topics, checkpoints) are the job's, not a model's.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.pipeline._config import INFERENCE_OPTIONS, InferenceOptions, PipelineOptions
from pyflink_aisp.pipeline._handlers import handler_for
from pyflink_aisp.pipeline._options import Option, OptionGroup
from pyflink_aisp.pipeline._remote_options import SERVER_TOKENIZER, RemoteApi

__all__ = ["MODELS_ENV", "ModelRegistry", "ModelTask", "RegisteredModel", "load_registry",
           "options_from_args", "registry_from_env"]

#: Environment variable naming the registry file of the SQL functions (``aisp sql --models`` sets it).
MODELS_ENV = "AISP_MODELS"

_NAME = re.compile(r"[a-z_][a-z0-9_]*")


class ModelTask(enum.StrEnum):
    """What a registered model is used for."""

    CLASSIFY = "classify"
    EMBED = "embed"
    PREDICT = "predict"
    GENERATE = "generate"
    SENTIMENT = "sentiment"
    HANDLER = "handler"


#: The ``remote-api`` values a task's model on a server may speak (the first is the default).
_REMOTE_APIS: dict[ModelTask, tuple[RemoteApi, ...]] = {
    ModelTask.PREDICT: (RemoteApi.V2,),
    ModelTask.EMBED: (RemoteApi.OPENAI_EMBEDDINGS,),
    ModelTask.GENERATE: (RemoteApi.OPENAI_CHAT, RemoteApi.OPENAI_COMPLETIONS),
}
#: The options that name the model: set from ``task``/``path``, never by a key.
_IDENTITY = ("model_dir", "encoder_onnx", "encoder_tokenizer", "classifier", "predictor", "handler",
             "handler_args")
#: Keys an entry may set beside task, path, tokenizer, class and args: flag name → option.
_KEYS: dict[str, Option] = {o.flag[2:]: o for o in INFERENCE_OPTIONS
                            if o.name not in _IDENTITY and o.group is not OptionGroup.JOB}
_OWN_KEYS = {"task", "path", "tokenizer", "class", "args"}


def _value_text(value: Any) -> str:
    """A YAML scalar or list as the text a flag would take."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if value is None:
        return "none"
    return str(value)


@dataclass(frozen=True, kw_only=True)
class RegisteredModel:
    """One named model of a registry.

    Attributes:
        name: Its name (the SQL function's).
        task: What it is used for.
        options: The model, batching and worker options that run it (identity fields set
            from ``task`` and ``path``; paths absolute).
    """

    name: str
    task: ModelTask
    options: InferenceOptions

    def handler(self) -> ModelHandler[Any, Any, Any]:
        """The handler the entry names (:func:`~pyflink_aisp.pipeline._handlers.handler_for`).

        Raises:
            ModelError: The files are not a model of the task.
            ConfigError: A handler class that cannot be built.
        """
        return handler_for(self.options)

    @property
    def source(self) -> str:
        """Where the model is: its path, or the handler class."""
        o = self.options
        found = o.handler or o.remote_url or o.predictor or o.classifier or o.encoder_onnx or o.model_dir
        return str(found) if found is not None else "the cached sentiment build"

    def overrides(self) -> dict[str, Any]:
        """The option values the entry sets (for a job's options: the model's part)."""
        return {name: getattr(self.options, name) for name in (*_IDENTITY, *(o.name for o in _KEYS.values()))}


@dataclass(frozen=True)
class ModelRegistry:
    """The models of one registry file, by name.

    Attributes:
        path: The file.
        models: Name → model, in the file's order.
        routes: Name → the route's entry as the file has it (``routes:``; built into a route by
            :func:`~pyflink_aisp.pipeline._routes.route_plan`).
    """

    path: Path
    models: Mapping[str, RegisteredModel] = field(default_factory=dict)
    routes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def get(self, name: str) -> RegisteredModel:
        """The model of that name.

        Raises:
            ConfigError: No such name (the message lists the names).
        """
        if name not in self.models:
            raise ConfigError(f"{self.path} names no model {name!r}; it has {sorted(self.models)}")
        return self.models[name]


def _entry(name: str, entry: Any, base_dir: Path, where: str) -> RegisteredModel:
    """One entry → a :class:`RegisteredModel`.

    Raises:
        ConfigError: A bad name, task, key or value (the message names the model and key).
    """
    if not _NAME.fullmatch(str(name)):
        raise ConfigError(f"{where}: model name {name!r} must match [a-z_][a-z0-9_]* (it is a SQL "
                          "function name)")
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: model {name}: expected a mapping of keys, got {type(entry).__name__}")
    try:
        task = ModelTask(str(entry.get("task", "")))
    except ValueError:
        raise ConfigError(f"{where}: model {name}: task must be one of "
                          f"{', '.join(t.value for t in ModelTask)}, got {entry.get('task')!r}") from None
    unknown = sorted(set(entry) - _OWN_KEYS - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}: model {name}: unknown key(s) {unknown}; a model takes task, path, "
                          f"tokenizer, class, args and the options {sorted(_KEYS)}")
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if key in _KEYS:
            option = _KEYS[key]
            values[option.name] = option.parse(_value_text(value), where=f"{where}: model {name}: {key}")

    schema = values.get("json_schema")
    if isinstance(schema, str) and schema.startswith("@") and not Path(schema[1:]).is_absolute():
        values["json_schema"] = f"@{base_dir / schema[1:]}"  # a schema file beside the registry
    counter = values.get("prompt_tokenizer")
    if counter not in (None, SERVER_TOKENIZER):  # a relative tokenizer.json is beside the registry
        found = Path(os.path.expanduser(str(counter)))
        values["prompt_tokenizer"] = str(found if found.is_absolute() else base_dir / found)

    def path(key: str, required: bool = True) -> Path | None:
        if entry.get(key) is None:
            if required:
                raise ConfigError(f"{where}: model {name}: task {task.value} needs {key!r}")
            return None
        found = Path(os.path.expanduser(str(entry[key])))
        found = found if found.is_absolute() else base_dir / found
        if not found.exists():
            raise ConfigError(f"{where}: model {name}: {key} {found} does not exist")
        return found.resolve()

    if task is ModelTask.CLASSIFY:
        values["classifier"] = path("path")
    elif "remote-url" in entry and task in _REMOTE_APIS:
        # a model on a server is named by remote-url and remote-model instead of a path
        if entry.get("path") is not None or entry.get("tokenizer") is not None:
            raise ConfigError(f"{where}: model {name}: a model on a server (remote-url) has no path or "
                              "tokenizer: the server owns its files")
        api = values.setdefault("remote_api", _REMOTE_APIS[task][0])
        if api not in _REMOTE_APIS[task]:
            raise ConfigError(f"{where}: model {name}: task {task.value} takes remote-api "
                              f"{' or '.join(a.value for a in _REMOTE_APIS[task])}, not {api.value}")
    elif task is ModelTask.GENERATE:
        raise ConfigError(f"{where}: model {name}: task generate needs remote-url and remote-model (an "
                          "OpenAI-compatible server)")
    elif task is ModelTask.PREDICT:
        values["predictor"] = path("path")
    elif task is ModelTask.EMBED:
        values["encoder_onnx"], values["encoder_tokenizer"] = path("path"), path("tokenizer")
    elif task is ModelTask.SENTIMENT:
        values["model_dir"] = path("path", required=False)
    else:
        if not entry.get("class"):
            raise ConfigError(f"{where}: model {name}: task handler needs 'class' (module:Class)")
        args = entry.get("args") or {}
        if not isinstance(args, dict):
            raise ConfigError(f"{where}: model {name}: args must be a mapping, got {type(args).__name__}")
        values["handler"], values["handler_args"] = str(entry["class"]), json.dumps(args)
    try:
        options = replace(InferenceOptions(), **values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: model {name}: {exc}") from None
    return RegisteredModel(name=str(name), task=task, options=options)


def load_registry(path: Path | str) -> ModelRegistry:
    """Read a registry file (see the module docstring).

    Raises:
        ConfigError: The file is unreadable, not YAML, has no ``models`` mapping, or an entry
            is refused (one line naming the file, the model and the key).
    """
    file = Path(path)
    try:
        document = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"model registry {file}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"model registry {file} is not YAML: {str(exc).splitlines()[0]}") from None
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, dict) or not models:
        raise ConfigError(f"model registry {file} needs a non-empty 'models:' mapping of names to models")
    base = file.resolve().parent
    where = str(file)
    routes = document.get("routes") or {}
    if not isinstance(routes, dict):
        raise ConfigError(f"model registry {file}: 'routes:' must map names to routes")
    for name, entry in routes.items():
        if not _NAME.fullmatch(str(name)) or str(name) in models:
            raise ConfigError(f"{where}: route name {name!r} must match [a-z_][a-z0-9_]* and differ from "
                              "every model's name")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: route {name}: expected a mapping, got {type(entry).__name__}")
    return ModelRegistry(file, {str(n): _entry(n, e, base, where) for n, e in models.items()},
                         {str(n): e for n, e in routes.items()})


def registry_from_env() -> ModelRegistry:
    """The registry of ``$AISP_MODELS``.

    Raises:
        ConfigError: The variable is unset, or as :func:`load_registry`.
    """
    path = os.environ.get(MODELS_ENV)
    if not path:
        raise ConfigError(f"${MODELS_ENV} names no model registry: run `aisp sql --models FILE ...`, or set "
                          f"{MODELS_ENV} for the SQL client")
    return load_registry(path)


def _model_options(path: Path, name: str) -> dict[str, Any]:
    return load_registry(path).get(name).overrides()


def options_from_args(argv: Sequence[str] | None = None, *, description: str = "") -> PipelineOptions:
    """A packaged job's command line → options, ``--models FILE --model NAME`` read from the
    registry (:meth:`PipelineOptions.from_args`; exits 2 on a bad flag or registry entry)."""
    return PipelineOptions.from_args(argv, description=description, model_options=_model_options)
