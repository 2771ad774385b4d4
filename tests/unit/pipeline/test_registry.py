"""The model registry (YAML): named models with their task, path and options, read by jobs
(--models/--model), the SQL functions and `aisp models`; every bad entry is one line naming
the file, the model and the key."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference.handlers import OnnxClassifierHandler, OnnxEncoderHandler, OnnxPredictorHandler
from pyflink_aisp.inference.handlers.remote import (
    OpenAIEmbeddingHandler,
    OpenAIGenerationHandler,
    V2PredictorHandler,
)
from pyflink_aisp.inference.tasks import SqlType
from pyflink_aisp.models import build_intent_head
from pyflink_aisp.pipeline import ModelTask, load_registry, options_from_args, registry_from_env
from pyflink_aisp.pipeline._handlers import handler_for

HANDLER_MODULE = '''
from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.inference.tasks import OutputField, SqlType, Task


class LengthTask(Task):
    @property
    def fields(self):
        return (OutputField(name="chars", sql_type=SqlType.BIGINT),)

    def render(self, prediction):
        return {"chars": int(prediction)}


class LengthHandler(ModelHandler):
    def __init__(self, scale=1):
        self.scale = scale

    def load_model(self):
        return self.scale

    def run_inference(self, batch, model):
        return [len(text) * model for text in batch]

    def task(self, *, with_embedding=False):
        return LengthTask()
'''


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    return build_intent_head(tmp_path_factory.mktemp("head") / "intent-head.onnx")


@pytest.fixture()
def handler_module(tmp_path, monkeypatch):
    (tmp_path / "my_length_handler.py").write_text(HANDLER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_length_handler"
    sys.modules.pop("my_length_handler", None)


def _write(tmp_path, text, name="models.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_entries_become_options_with_paths_relative_to_the_file(tmp_path, head):
    (tmp_path / "enc").mkdir()
    for name in ("model.onnx", "tokenizer.json"):
        (tmp_path / "enc" / name).write_text("x")
    head_copy = tmp_path / "head.onnx"
    head_copy.write_bytes(head.read_bytes())
    registry = load_registry(_write(tmp_path, """
        models:
          risk:
            task: predict
            path: head.onnx
            max-batch-size: 64
            max-wait-ms: 2.5
            device: cpu
          minilm:
            task: embed
            path: enc/model.onnx
            tokenizer: enc/tokenizer.json
            encoder-pooling: none
            encoder-normalize: true
            length-buckets: [16, 32]
    """))
    assert list(registry.models) == ["risk", "minilm"]
    risk, minilm = registry.get("risk"), registry.get("minilm")
    assert risk.task is ModelTask.PREDICT and risk.options.predictor == head_copy.resolve()
    assert (risk.options.max_batch_size, risk.options.max_wait_ms) == (64, 2.5)
    assert minilm.options.encoder_onnx == (tmp_path / "enc" / "model.onnx").resolve()
    assert minilm.options.encoder_normalize is True and minilm.options.length_buckets == (16, 32)
    assert [(f.name, f.sql_type) for f in risk.handler().task().fields] == [
        ("label", SqlType.STRING), ("probabilities", SqlType.ARRAY_FLOAT)]
    assert isinstance(risk.handler(), OnnxPredictorHandler)


@pytest.mark.parametrize(("text", "message"), [
    ("models: {}", "needs a non-empty 'models:' mapping"),
    ("models: [a, b]", "needs a non-empty 'models:' mapping"),
    ("models:\n  a: {task: classify, path: x}\n   b: 1", "is not YAML"),
    ("models:\n  Intent: {task: classify, path: .}", "model name 'Intent' must match"),
    ("models:\n  a: {task: translate, path: .}", "task must be one of classify, embed, predict"),
    ("models:\n  a: {task: predict, path: nope.onnx}", "model a: path .*nope.onnx does not exist"),
    ("models:\n  a: {task: predict}", "task predict needs 'path'"),
    ("models:\n  a: {task: predict, remote-url: 'http://h:8000'}", "--remote-url needs --remote-model"),
    ("models:\n  a: {task: predict, path: ., remote-url: 'http://h', remote-model: m}",
     "a model on a server \\(remote-url\\) has no path"),
    ("models:\n  a: {task: generate}", "task generate needs remote-url and remote-model"),
    ("models:\n  a: {task: generate, remote-url: 'http://h', remote-model: m, remote-api: v2}",
     "task generate takes remote-api openai-chat or openai-completions, not v2"),
    ("models:\n  a: {task: embed, remote-url: 'http://h', remote-model: m, max-tokens: 3}",
     "--max-tokens apply to --remote-api openai-chat or openai-completions"),
    ("models:\n  a: {task: predict, path: ., input-topic: t}", r"unknown key\(s\) \['input-topic'\]"),
    ("models:\n  a: {task: predict, path: ., max-batch-size: 0}", "model a: max-batch-size must be >= 1"),
    ("models:\n  a: {task: predict, path: ., device: tpu}", "model a: device"),
    ("models:\n  a: {task: handler}", "task handler needs 'class'"),
    ("models:\n  a: {task: handler, class: 'not a path'}", "--handler must be 'module:Class'"),
    ("models:\n  a: {task: handler, class: 'm:C', args: [1]}", "args must be a mapping"),
])
def test_a_bad_registry_is_one_line_naming_the_file_and_model(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_registry(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_an_unknown_name_lists_the_names(tmp_path, head):
    registry = load_registry(_write(tmp_path, f"models:\n  risk: {{task: predict, path: {head}}}\n"))
    with pytest.raises(ConfigError, match=r"names no model 'fraud'; it has \['risk'\]"):
        registry.get("fraud")


def test_the_job_runs_the_named_model_with_its_options(tmp_path, head):
    path = _write(tmp_path, f"models:\n  risk: {{task: predict, path: {head}, max-batch-size: 16}}\n")
    options = options_from_args(["--input-topic", "in", "--output-topic", "out", "--models", str(path),
                                 "--model", "risk", "--feature-fields", "/embedding"])
    assert options.predictor == head and options.max_batch_size == 16
    assert isinstance(handler_for(options), OnnxPredictorHandler)


def test_a_predict_entry_on_a_v2_server_builds_the_remote_handler(tmp_path):
    path = _write(tmp_path, "models:\n  fraud: {task: predict, remote-url: 'https://triton:8000', "
                            "remote-model: fraud, remote-rows-per-request: 8, "
                            "remote-api-key-env: FRAUD_KEY}\n")
    options = options_from_args(["--input-topic", "in", "--output-topic", "out", "--models", str(path),
                                 "--model", "fraud", "--feature-fields", "/features"])
    handler = handler_for(options)
    assert isinstance(handler, V2PredictorHandler)
    assert (handler.endpoint.url, handler.model) == ("https://triton:8000", "fraud")
    assert handler.rows_per_request == 8
    assert handler.endpoint.api_key_env == "FRAUD_KEY" and handler.model_version() == "v2:fraud"


def test_generate_and_embed_entries_on_an_openai_server_build_their_handlers(tmp_path):
    (tmp_path / "label.json").write_text('{"type": "object", "properties": {"label": {"type": "string"}}, '
                                         '"required": ["label"]}')
    path = _write(tmp_path, "models:\n"
                  "  judge: {task: generate, remote-url: 'http://llm:8080', remote-model: smollm2, "
                  "prompt-template: 'Review: {text}', max-tokens: 8, seed: 3, json-schema: '@label.json'}\n"
                  "  bulk: {task: generate, remote-url: 'http://llm:8080', remote-model: smollm2, "
                  "remote-api: openai-completions, remote-rows-per-request: 4}\n"
                  "  vectors: {task: embed, remote-url: 'http://emb:8080', remote-model: minilm}\n")
    base = ["--input-topic", "in", "--output-topic", "out", "--models", str(path), "--model"]
    judge = handler_for(options_from_args([*base, "judge"]))  # the schema file beside the registry
    assert isinstance(judge, OpenAIGenerationHandler) and judge.api == "chat"
    assert (judge.prompt_template, judge.max_tokens, judge.seed) == ("Review: {text}", 8, 3)
    assert [f.name for f in judge.structured] == ["label"] and judge.model_version() == "openai:smollm2"
    bulk = handler_for(options_from_args([*base, "bulk"]))
    assert isinstance(bulk, OpenAIGenerationHandler)
    assert (bulk.api, bulk.rows_per_request) == ("completions", 4)
    vectors = handler_for(options_from_args([*base, "vectors"]))
    assert isinstance(vectors, OpenAIEmbeddingHandler) and vectors.endpoint.url == "http://emb:8080"


@pytest.mark.parametrize("flags", [("--model", "risk"), ("--route", "unsure"), ("--models", "m.yaml"),
                                   ("--models", "m.yaml", "--model", "risk", "--route", "unsure")])
def test_models_goes_with_one_of_model_and_route(tmp_path, head, capsys, flags):
    with pytest.raises(SystemExit):
        options_from_args(["--input-topic", "in", "--output-topic", "out", *flags])
    assert "--models FILE goes with one of --model NAME" in capsys.readouterr().err


@pytest.mark.parametrize("operator", ["async", "record"])
def test_a_route_runs_on_the_arrow_operator(capsys, operator):
    with pytest.raises(SystemExit):
        options_from_args(["--input-topic", "in", "--output-topic", "out", "--models", "m.yaml", "--route",
                           "unsure", "--operator", operator])
    assert "--route runs on --operator arrow" in capsys.readouterr().err


def test_the_sql_registry_comes_from_the_environment(tmp_path, head, monkeypatch):
    monkeypatch.delenv("AISP_MODELS", raising=False)
    with pytest.raises(ConfigError, match=r"\$AISP_MODELS names no model registry"):
        registry_from_env()
    path = _write(tmp_path, f"models:\n  risk: {{task: predict, path: {head}}}\n")
    monkeypatch.setenv("AISP_MODELS", str(path))
    assert list(registry_from_env().models) == ["risk"]


def test_a_handler_entry_builds_the_users_class_with_its_args(tmp_path, handler_module):
    registry = load_registry(_write(tmp_path, f"""
        models:
          length:
            task: handler
            class: {handler_module}:LengthHandler
            args: {{scale: 3}}
    """))
    handler = registry.get("length").handler()
    assert handler.run_inference(["abcd", ""], handler.load_model()) == [12, 0]
    assert [f.name for f in handler.task().fields] == ["chars"]


def test_handler_by_option_and_its_errors(handler_module):
    from pyflink_aisp.pipeline import InferenceOptions

    handler = handler_for(InferenceOptions(handler=f"{handler_module}:LengthHandler",
                                           handler_args=json.dumps({"scale": 2})))
    assert handler.run_inference(["abc"], handler.load_model()) == [6]
    for path, args, message in [
        ("no_such_module_here:X", None, "cannot import no_such_module_here .*flink run -pyfs"),
        (f"{handler_module}:Missing", None, "has no Missing"),
        (f"{handler_module}:LengthHandler", '{"weight": 1}', "--handler-args do not fit LengthHandler"),
        (f"{handler_module}:LengthTask", None, "is not a pyflink_aisp.inference.ModelHandler"),
    ]:
        with pytest.raises(ConfigError, match=message):
            handler_for(InferenceOptions(handler=path, handler_args=args))
    with pytest.raises(ConfigError, match="--handler-args must be a JSON object"):
        InferenceOptions(handler=f"{handler_module}:LengthHandler", handler_args="[1]")
    with pytest.raises(ConfigError, match="--classifier and --handler each name the model"):
        InferenceOptions(handler=f"{handler_module}:LengthHandler", classifier="/tmp")


def test_classify_and_embed_entries_build_their_handlers(tmp_path):
    from pyflink_aisp.models import build_intent_classifier

    intent = build_intent_classifier(tmp_path / "intent")
    registry = load_registry(_write(tmp_path, """
        models:
          intent: {task: classify, path: intent, top-k: 2}
          minilm: {task: embed, path: intent/model.onnx, tokenizer: intent/tokenizer.json,
                   encoder-output: logits, encoder-pooling: none}
    """))
    classify = registry.get("intent").handler()
    assert isinstance(classify, OnnxClassifierHandler) and classify.task().top_k == 2
    assert isinstance(registry.get("minilm").handler(), OnnxEncoderHandler)
    assert registry.get("intent").options.classifier == intent.resolve()


def test_manifests_name_the_files_of_the_model_the_job_runs(head, handler_module):
    from pyflink_aisp.checksums import sha256_file
    from pyflink_aisp.pipeline import PipelineOptions
    from pyflink_aisp.pipeline._run import model_files

    base = {"input_topic": "in", "output_topic": "out"}
    assert model_files(PipelineOptions(**base, predictor=head, feature_fields="/x")) == {
        "intent-head.onnx": sha256_file(head)}
    handler = f"{handler_module}:LengthHandler"
    assert model_files(PipelineOptions(**base, handler=handler)) == {handler: "unversioned"}


@pytest.mark.parametrize(("key", "entry"), [("true", "1"), ("false", "0"), (None, "0")])
def test_the_spin_wait_option_reaches_a_numeric_models_session(tmp_path, head, key, entry):
    spin = "" if key is None else f", onnx-spin-wait: {key}"  # none: off, the job's default
    path = _write(tmp_path, f"models:\n  risk: {{task: predict, path: {head}{spin}}}\n")
    options = options_from_args(["--input-topic", "in", "--output-topic", "out", "--models", str(path),
                                 "--model", "risk", "--feature-fields", "/embedding"])
    session = handler_for(options).load_model().session
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == entry
