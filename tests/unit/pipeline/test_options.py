"""The options, declared once as fields, and what is derived from them: the table, job
parameters, command-line flags and the PyFlink settings (no JVM, no services)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from pyflink_aisp import pipeline
from pyflink_aisp.affinity import AffinityPolicy
from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import BatchCuts, BatchingConfig, ModelSwapConfig
from pyflink_aisp.inference.handlers import Pooling
from pyflink_aisp.pipeline import (
    INFERENCE_OPTIONS,
    OPTIONS,
    InferenceOptions,
    OptionGroup,
    PipelineOptions,
    RemoteApi,
    Runner,
    default_bundle_time_ms,
    flink_settings,
    format_job_parameters,
    option,
)
from pyflink_aisp.pipeline._handlers import handler_for
from pyflink_aisp.pipeline._options import (
    GpuProvider,
    InferenceRuntime,
    Precision,
    read_job_parameters,
    render_job_parameter,
)
from pyflink_aisp.pipeline._remote_options import GENERATION_OPTION_NAMES

BASE = ["--input-topic", "in", "--output-topic", "out"]


def get_from(params: dict[str, str]) -> Any:
    """A ``FunctionContext.get_job_parameter`` over ``params``."""
    return lambda key, default: params.get(key, default)


def from_params(base: InferenceOptions | None = None, **params: str) -> InferenceOptions:
    return InferenceOptions.from_job_parameters(get_from(params), base=base)


def job(**values: Any) -> PipelineOptions:
    """A job's options with topics ``in`` → ``out`` (they are required)."""
    return PipelineOptions(**{"input_topic": "in", "output_topic": "out", **values})


def test_public_api_is_complete() -> None:
    assert len(pipeline.__all__) == len(set(pipeline.__all__))
    for name in pipeline.__all__:
        assert getattr(pipeline, name) is not None, name


# -- (a) the table and the dataclass ---------------------------------------------------------


def test_each_option_is_declared_once_as_a_field_and_the_table_is_read_from_the_fields() -> None:
    import typing

    job_fields = {f.name: f for f in dataclasses.fields(PipelineOptions)}
    assert sorted(job_fields) == sorted(o.name for o in OPTIONS)  # one row per field, no other
    hints = typing.get_type_hints(PipelineOptions)
    for opt in OPTIONS:
        field = job_fields[opt.name]
        assert field.metadata["aisp.option"]["doc"] == opt.doc  # the row is the field's declaration
        # a device-aware field defaults to None ("not given"); its row shows the CPU's default
        default = field.metadata["aisp.option"].get("cpu_default", field.default)
        assert opt.default == (None if opt.required else default), opt.name
        hint = hints[opt.name]
        assert opt.kind is tuple or opt.kind is hint or opt.kind in typing.get_args(hint), opt.name
    # the groups are in order (job, batching, model, worker), each in field order
    groups = [o.group for o in OPTIONS]
    assert groups == sorted(groups, key=[OptionGroup.JOB, OptionGroup.BATCHING, OptionGroup.MODEL,
                                         OptionGroup.WORKER].index)
    assert job() == job(**{o.name: o.default for o in OPTIONS if not o.required})


def test_the_sql_functions_read_every_job_parameter_and_no_job_option() -> None:
    inference = {o.name for o in INFERENCE_OPTIONS}
    assert inference < {o.name for o in OPTIONS}
    assert {o.name for o in OPTIONS if o.job_param} <= inference
    groups = {o.group for o in INFERENCE_OPTIONS}
    assert groups == {OptionGroup.BATCHING, OptionGroup.MODEL, OptionGroup.WORKER}
    assert not any(o.group is OptionGroup.JOB for o in INFERENCE_OPTIONS)
    assert InferenceOptions() == InferenceOptions(**{o.name: o.default for o in INFERENCE_OPTIONS})
    with pytest.raises(TypeError, match="input_topic"):
        PipelineOptions(output_topic="out")  # type: ignore[call-arg]


def test_a_field_without_a_declaration_is_refused() -> None:
    from pyflink_aisp.pipeline._options import options_of

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Loose:
        x: int = 1

    with pytest.raises(TypeError, match=r"Loose\.x is not declared with opt"):
        options_of(Loose)


def test_strings_for_enum_and_device_fields_parse_as_their_flags_do() -> None:
    from pyflink_aisp.device import Device, DeviceKind
    from pyflink_aisp.kafka import StartupMode
    from pyflink_aisp.pipeline import RuntimeMode

    options = job(mode="BATCH", startup_mode="latest-offset", device="cuda:2", runtime="torch")
    assert options.mode is RuntimeMode.BATCH and options.bounded
    assert options.startup_mode is StartupMode.LATEST and options.effective_startup_mode is StartupMode.LATEST
    assert options.device == Device(DeviceKind.CUDA, 2) and options.resolved_device == "cuda:2"
    assert options.runtime is InferenceRuntime.TORCH
    assert job().effective_startup_mode is StartupMode.GROUP_OFFSETS
    assert job(mode="batch").effective_startup_mode is StartupMode.EARLIEST
    with pytest.raises(ConfigError, match="--startup-mode must be one of"):
        job(startup_mode="specific-offsets")  # a range sets that itself
    with pytest.raises(ConfigError, match="--device must be cpu, cuda or cuda:N, got 'gpu'"):
        InferenceOptions(device="gpu")


def test_options_are_unique_named_flagged_and_documented() -> None:
    names = [o.name for o in OPTIONS]
    params = [o.job_param for o in OPTIONS if o.job_param is not None]
    assert len(set(names)) == len(names) and len(set(params)) == len(params)
    assert all(p.startswith("aisp.") for p in params)
    for opt in OPTIONS:
        assert opt.flag == "--" + opt.name.replace("_", "-")
        assert opt.doc.strip() and isinstance(opt.group, OptionGroup)
        assert option(opt.name) is opt
    with pytest.raises(KeyError):
        option("no_such_option")
    assert {o.name for o in OPTIONS if o.required} == {"input_topic", "output_topic"}


def test_batching_defaults_are_one_set() -> None:
    assert option("max_batch_size").default == 32
    assert option("max_wait_ms").default == 5.0
    assert option("max_idle_ms").default == 2.0
    expected = BatchingConfig(max_batch_size=32, max_wait_ms=5.0, max_idle_ms=2.0)
    assert InferenceOptions().batching() == expected
    assert BatchingConfig() == InferenceOptions().batching()  # the dataclass has the same defaults
    assert from_params() == InferenceOptions()
    assert PipelineOptions.from_args(BASE).batching() == InferenceOptions().batching()


def test_options_are_frozen_and_keyword_only() -> None:
    with pytest.raises(TypeError):
        PipelineOptions("in")  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job().max_batch_size = 2  # type: ignore[misc]


def test_derived_configs_and_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = PipelineOptions(input_topic="in", output_topic="out", model_pointer=Path("p.json"),
                              model_poll_interval_s=0.5)
    assert options.dlq == "out.dlq" and options.name == "aisp-in-out"
    assert options.group == options.transactional_prefix == "aisp-in-out"
    assert job(dlq_topic="d", group_id="g").dlq == "d"
    assert job(dlq_topic="d", group_id="g").group == "g"
    named = PipelineOptions(input_topic="in", output_topic="out", job_name="nightly")
    assert (named.name, named.group, named.transactional_prefix) == ("nightly", "nightly", "nightly")
    apart = dataclasses.replace(named, group_id="g", transactional_id_prefix="tx")
    assert (apart.name, apart.group, apart.transactional_prefix) == ("nightly", "g", "tx")
    # two jobs reading one topic into different outputs no longer share a group or transactional ids
    assert PipelineOptions(input_topic="in", output_topic="a").group != PipelineOptions(
        input_topic="in", output_topic="b").group
    assert options.swap() == ModelSwapConfig(pointer_path=Path("p.json").resolve(), poll_interval_s=0.5)
    assert InferenceOptions().swap() is None
    monkeypatch.delenv("AISP_MODEL_DIR", raising=False)
    assert InferenceOptions().resolved_model_dir is None
    monkeypatch.setenv("AISP_MODEL_DIR", str(tmp_path))
    assert InferenceOptions().resolved_model_dir == tmp_path
    assert InferenceOptions(model_dir=tmp_path / "x").resolved_model_dir == tmp_path / "x"


# -- (b) job parameters ------------------------------------------------------------------


def _non_default(tmp_path: Path) -> InferenceOptions:
    return InferenceOptions(
        max_batch_size=3, max_wait_ms=0.25, max_idle_ms=None, max_batch_tokens=99,
        batch_cuts=BatchCuts.FIXED, length_buckets=(4, 8), latency_slo_ms=12.5, model_dir=tmp_path / "m",
        model_pointer=tmp_path / "p.json", model_poll_interval_s=3.0, intra_op_threads=4,
        encoder_onnx=tmp_path / "e.onnx", encoder_tokenizer=tmp_path / "tokenizer.json",
        encoder_output="last_hidden_state", encoder_pooling=Pooling.CLS, encoder_normalize=True,
        stats_dir=tmp_path / "s", onnx_spin_wait=False, max_failure_rate=0.25, failure_window=40,
        onnx_profile_dir=tmp_path / "prof", onnx_profile_runs=9,
        device="cuda", onnx_provider=GpuProvider.TENSORRT, gpu_affinity="http://127.0.0.1:7420",
        gpu_affinity_policy=AffinityPolicy.LOCAL, gpu_mem_mib=2048,
    )


def test_every_job_parameter_round_trips(tmp_path: Path) -> None:
    options = _non_default(tmp_path)
    params = options.job_parameters()
    # they exclude the encoder: below (each names the model; unset paths are left out)
    classifier = ("classifier", "top_k", "predictor", "handler", "handler_args")
    torch = ("tf32", "pad_to_multiple_of", "batch_size_buckets", "pipeline_depth")  # test_device_defaults
    remote = tuple(o.name for o in OPTIONS if o.name.startswith("remote_")  # below, with their model
                   or o.name in GENERATION_OPTION_NAMES)
    unset_paths = ("classifier", "predictor", "remote_api_key_file", "remote_ca_file")
    assert set(params) == {o.job_param for o in OPTIONS
                           if o.job_param is not None and o.name not in unset_paths}
    for opt in OPTIONS:  # every job parameter differs from its default here, so each is exercised
        if opt.job_param is not None and opt.name not in ("runtime", "precision", *classifier, *remote,
                                                          *torch):
            assert getattr(options, opt.name) != opt.default, opt.name
    assert all(isinstance(v, str) for v in params.values())
    assert InferenceOptions.from_job_parameters(get_from(params)) == options
    # through the JSON of pipeline.global-job-parameters too
    through_json = json.loads(format_job_parameters(params))
    assert InferenceOptions.from_job_parameters(get_from(through_json)) == options


def test_the_classifier_job_parameters_round_trip(tmp_path: Path) -> None:
    options = InferenceOptions(classifier=tmp_path / "intent", top_k=3)
    params = options.job_parameters()
    assert (params["aisp.classifier.dir"], params["aisp.classifier.top-k"]) == (str(tmp_path / "intent"), "3")
    assert InferenceOptions.from_job_parameters(get_from(params)) == options


def test_the_remote_job_parameters_round_trip(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    options = InferenceOptions(
        remote_url="https://models.example:8443", remote_model="fraud", remote_model_version="3",
        remote_api_key_env="FRAUD_KEY", remote_ca_file=tmp_path / "ca.pem", remote_rows_per_request=7,
        remote_max_concurrency=9, remote_deadline_s=12.5, remote_request_timeout_s=2.5,
        remote_max_requests_per_s=2.5, remote_v2_binary=True)
    params = options.job_parameters()
    assert {k: v for k, v in params.items() if k.startswith("aisp.remote.")} == {
        "aisp.remote.url": "https://models.example:8443", "aisp.remote.model": "fraud",
        "aisp.remote.model-version": "3", "aisp.remote.api-key-env": "FRAUD_KEY",
        "aisp.remote.ca-file": str(tmp_path / "ca.pem"), "aisp.remote.rows-per-request": "7",
        "aisp.remote.max-concurrency": "9", "aisp.remote.deadline-s": "12.5",
        "aisp.remote.request-timeout-s": "2.5", "aisp.remote.api": "v2",
        "aisp.remote.max-requests-per-s": "2.5", "aisp.remote.max-tokens-per-min": "none",
        "aisp.remote.call-log": "none", "aisp.remote.call-log-servers": "none",
        "aisp.remote.v2-binary": "true"}
    assert InferenceOptions.from_job_parameters(get_from(params)) == options


def test_the_generation_job_parameters_round_trip() -> None:
    schema = '{"type": "object", "properties": {"label": {"type": "string"}}}'
    options = InferenceOptions(
        remote_url="http://llm:8080", remote_model="smollm2", remote_api=RemoteApi.OPENAI_CHAT,
        prompt_template="Review: {text}\nSentiment:", system_prompt="One word.", max_tokens=4,
        temperature=0.7, seed=11, json_schema=schema, remote_max_tokens_per_min=90000.0)
    params = options.job_parameters()
    assert params["aisp.remote.max-tokens-per-min"] == "90000.0"
    assert {k: v for k, v in params.items() if k.startswith("aisp.generate.")} == {
        "aisp.generate.prompt-template": "Review: {text}\nSentiment:",
        "aisp.generate.system-prompt": "One word.",
        "aisp.generate.max-tokens": "4", "aisp.generate.temperature": "0.7", "aisp.generate.seed": "11",
        "aisp.generate.json-schema": schema, "aisp.generate.prompt-max-tokens": "none",
        "aisp.generate.prompt-overflow": "dead-letter", "aisp.generate.prompt-tokenizer": "none"}
    assert InferenceOptions.from_job_parameters(get_from(params)) == options
    assert options.json_schema_value() == json.loads(schema)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"remote_url": "http://h:8000"}, "--remote-url needs --remote-model"),
    ({"remote_model": "m"}, "--remote-model apply to --remote-url only"),
    ({"remote_deadline_s": 5.0}, "--remote-deadline-s apply to --remote-url only"),
    ({"remote_url": "http://u:secret@h:8000", "remote_model": "m"}, "must not carry credentials"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_request_timeout_s": 40.0},
     "must not exceed --remote-deadline-s"),
    ({"remote_url": "http://h", "remote_model": "m", "predictor": Path("x.onnx")}, "each name the model"),
    ({"remote_url": "", "remote_model": "m"}, "--remote-url is empty: give the server's base URL"),
    ({"remote_url": "ftp://h", "remote_model": "m"},
     "--remote-url: .* must be http://, https://, grpc:// or grpcs://"),
    ({"remote_url": "grpc://h:8001", "remote_model": "m", "remote_api": "openai-embeddings"},
     "gRPC is for --remote-api v2"),
    ({"remote_url": "http://h", "remote_model": "a/b"}, "--remote-model: .* without '/'"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_model_version": ".."}, "--remote-model-version"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api_key_env": "K",
      "remote_api_key_file": Path("k")}, "--remote-api-key-env or --remote-api-key-file, not both"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_ca_file": Path("/no/ca.pem")},
     "--remote-ca-file /no/ca.pem is not a file"),
    ({"max_tokens": 5}, "--max-tokens apply to --remote-url only"),
    ({"remote_url": "http://h", "remote_model": "m", "prompt_template": "x {text}"},
     "--prompt-template apply to --remote-api openai-chat or openai-completions, not v2"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-chat",
      "prompt_template": "no text"},
     "--prompt-template must hold {text}"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-completions",
      "system_prompt": "be brief"}, "--system-prompt and --json-schema need --remote-api openai-chat"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-chat", "json_schema": "[1]"},
     "--json-schema must be a JSON object schema"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-chat",
      "json_schema": "@/no/s.json"},
     "--json-schema @/no/s.json: cannot read it"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-chat",
      "json_schema": '{"type": "object", "properties": {"x": {"type": "object"}}}'}, "--json-schema: .*'x'"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-chat", "temperature": 2.5},
     "--temperature must be <= 2"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-embeddings",
      "remote_model_version": "2"}, "--remote-model-version is for --remote-api v2"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_max_tokens_per_min": 1000.0},
     "--remote-max-tokens-per-min is for the OpenAI APIs"),
    ({"remote_max_requests_per_s": 5.0}, "--remote-max-requests-per-s apply to --remote-url only"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-chat",
      "remote_call_log_servers": "k:9092"}, "--remote-call-log-servers applies to --remote-call-log only"),
    ({"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-chat", "remote_call_log": "a b"},
     "--remote-call-log: call log topic 'a b'"),
    ({"remote_call_log": "calls"}, "--remote-call-log apply to --remote-url only"),
])
def test_remote_options_are_refused_in_one_line(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        InferenceOptions(**kwargs)
    assert "secret" not in str(info.value)


def test_the_runtime_job_parameter_round_trips() -> None:
    options = InferenceOptions(runtime=InferenceRuntime.TORCH, device="cuda", precision=Precision.BF16)
    params = options.job_parameters()
    picked = (params["aisp.runtime"], params["aisp.device"], params["aisp.precision"])
    assert picked == ("torch", "cuda:0", "bf16")  # the canonical name of "cuda"
    assert InferenceOptions.from_job_parameters(get_from(params)) == options
    assert options.resolved_device == "cuda:0"


def test_default_job_parameters_round_trip_and_leave_unset_paths_out() -> None:
    params = InferenceOptions().job_parameters()
    assert params == {  # the batch size and token budget are the device's: not written, derived by the reader
        "aisp.batch.max-wait-ms": "5.0",
        "aisp.batch.max-idle-ms": "2.0",
        "aisp.batch.cuts": "cost",
        "aisp.batch.pipeline-depth": "none",
        "aisp.batch.length-buckets": "none",
        "aisp.latency-slo-ms": "none",
        "aisp.breaker.max-failure-rate": "0.5",
        "aisp.breaker.window": "1000",
        "aisp.runtime": "onnx",
        "aisp.device": "cpu",
        "aisp.precision": "fp32",
        "aisp.onnx.provider": "cuda",
        "aisp.torch.tf32": "false",
        "aisp.torch.pad-to-multiple-of": "none",
        "aisp.torch.batch-size-buckets": "none",
        "aisp.gpu-affinity": "none",
        "aisp.gpu-affinity.policy": "fail",
        "aisp.gpu-affinity.mem-mib": "1024",
        "aisp.model.poll-interval-s": "2.0",
        "aisp.onnx.intra-op-threads": "0",
        "aisp.onnx.spin-wait": "none",
        "aisp.onnx.profile-runs": "500",
        "aisp.encoder.output": "none",
        "aisp.encoder.pooling": "mean",
        "aisp.encoder.normalize": "false",
        "aisp.classifier.top-k": "0",
        "aisp.handler": "none",
        "aisp.handler.args": "none",
        "aisp.remote.url": "none",
        "aisp.remote.model": "none",
        "aisp.remote.model-version": "none",
        "aisp.remote.api-key-env": "none",
        "aisp.remote.rows-per-request": "64",
        "aisp.remote.v2-binary": "false",
        "aisp.remote.max-concurrency": "64",
        "aisp.remote.max-requests-per-s": "none",
        "aisp.remote.max-tokens-per-min": "none",
        "aisp.remote.call-log": "none",
        "aisp.remote.call-log-servers": "none",
        "aisp.remote.deadline-s": "30.0",
        "aisp.remote.request-timeout-s": "10.0",
        "aisp.remote.api": "v2",
        "aisp.generate.prompt-template": "{text}",
        "aisp.generate.system-prompt": "none",
        "aisp.generate.max-tokens": "256",
        "aisp.generate.temperature": "0.0",
        "aisp.generate.seed": "none",
        "aisp.generate.json-schema": "none",
        "aisp.generate.prompt-max-tokens": "none",
        "aisp.generate.prompt-overflow": "dead-letter",
        "aisp.generate.prompt-tokenizer": "none",
    }
    assert InferenceOptions.from_job_parameters(get_from(params)) == InferenceOptions()


def test_every_job_parameter_is_read(tmp_path: Path) -> None:
    options = from_params(**{
        "aisp.model.dir": str(tmp_path / "model"),
        "aisp.batch.max-size": " 128 ",
        "aisp.batch.max-wait-ms": "2.5",
        "aisp.batch.max-idle-ms": "0.5",
        "aisp.batch.max-tokens": "4096",
        "aisp.batch.length-buckets": "16,32;64",
        "aisp.latency-slo-ms": "150",
        "aisp.onnx.intra-op-threads": "2",
        "aisp.model.pointer": str(tmp_path / "ptr.json"),
        "aisp.model.poll-interval-s": "0.5",
        "aisp.stats.dir": str(tmp_path / "stats"),
    })
    assert options == InferenceOptions(
        model_dir=tmp_path / "model", max_batch_size=128, max_wait_ms=2.5, max_idle_ms=0.5,
        max_batch_tokens=4096, length_buckets=(16, 32, 64), latency_slo_ms=150.0, intra_op_threads=2,
        model_pointer=tmp_path / "ptr.json", model_poll_interval_s=0.5, stats_dir=tmp_path / "stats")
    assert options.batching() == BatchingConfig(
        max_batch_size=128, max_wait_ms=2.5, max_idle_ms=0.5, max_batch_tokens=4096,
        length_buckets=(16, 32, 64), latency_slo_ms=150.0)
    assert options.swap() == ModelSwapConfig(pointer_path=tmp_path / "ptr.json", poll_interval_s=0.5)


def test_none_switches_optional_knobs_off() -> None:
    base = InferenceOptions(max_batch_tokens=100, length_buckets=(8,), latency_slo_ms=50.0, max_idle_ms=1.0,
                           intra_op_threads=3)
    options = from_params(base, **{
        "aisp.batch.max-tokens": "none",
        "aisp.batch.max-idle-ms": "NONE",
        "aisp.batch.length-buckets": "None",
        "aisp.latency-slo-ms": "null",
        "aisp.onnx.intra-op-threads": "0",
    })
    assert options.batching() == BatchingConfig(max_batch_size=32, max_wait_ms=5.0, max_idle_ms=None)
    assert options.length_buckets == () and options.intra_op_threads == 0


def test_unset_or_empty_parameters_keep_the_base_values(tmp_path: Path) -> None:
    base = InferenceOptions(model_dir=tmp_path, max_batch_size=7, max_wait_ms=1.0, intra_op_threads=1)
    options = from_params(base, **{"aisp.batch.max-wait-ms": "9", "aisp.batch.max-size": "  "})
    assert options == dataclasses.replace(base, max_wait_ms=9.0)
    read = read_job_parameters(INFERENCE_OPTIONS, get_from({"aisp.batch.max-wait-ms": "9", "other": "x"}))
    assert read == {"max_wait_ms": 9.0}


def test_render_job_parameter_is_the_inverse_of_parse(tmp_path: Path) -> None:
    for opt in OPTIONS:
        if opt.job_param is None:
            continue
        for value in (opt.default, getattr(_non_default(tmp_path), opt.name)):
            if value is None and opt.kind is Path:
                continue
            assert opt.parse(render_job_parameter(opt, value)) == value, (opt.name, value)


# -- (e) job parameter errors name the parameter -------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"aisp.batch.max-size": "0"}, "job parameter aisp.batch.max-size must be >= 1, got 0"),
        ({"aisp.batch.max-size": "many"}, "job parameter aisp.batch.max-size must be an integer, got 'many'"),
        ({"aisp.batch.max-wait-ms": "-1"}, "job parameter aisp.batch.max-wait-ms must be >= 0"),
        ({"aisp.batch.max-wait-ms": "soon"}, "job parameter aisp.batch.max-wait-ms must be a finite number"),
        ({"aisp.batch.max-wait-ms": "nan"}, "job parameter aisp.batch.max-wait-ms must be a finite number"),
        ({"aisp.batch.max-wait-ms": "inf"}, "job parameter aisp.batch.max-wait-ms must be a finite number"),
        ({"aisp.batch.max-wait-ms": "7200000"}, "job parameter aisp.batch.max-wait-ms: --max-wait-ms: "
                                                "max_wait_ms must be a finite number of ms up to 3,600,000"),
        ({"aisp.batch.max-idle-ms": "-1"}, "job parameter aisp.batch.max-idle-ms must be >= 0"),
        ({"aisp.batch.max-idle-ms": "nan"}, "job parameter aisp.batch.max-idle-ms must be a finite number"),
        ({"aisp.batch.max-tokens": "0"}, "job parameter aisp.batch.max-tokens must be >= 1"),
        ({"aisp.batch.length-buckets": "32,16"},
         "job parameter aisp.batch.length-buckets: --length-buckets: "
         "length_buckets must be strictly ascending"),
        ({"aisp.batch.length-buckets": "16,x"},
         "job parameter aisp.batch.length-buckets must be comma-separated integers"),
        ({"aisp.batch.length-buckets": "0,16"}, "job parameter aisp.batch.length-buckets must be >= 1"),
        ({"aisp.latency-slo-ms": "0"}, "job parameter aisp.latency-slo-ms must be >= 0.001"),
        ({"aisp.latency-slo-ms": "inf"}, "job parameter aisp.latency-slo-ms must be a finite number"),
        ({"aisp.onnx.intra-op-threads": "-2"}, "job parameter aisp.onnx.intra-op-threads must be >= 0"),
        ({"aisp.model.poll-interval-s": "0"}, "job parameter aisp.model.poll-interval-s must be >= 0.001"),
        ({"aisp.model.poll-interval-s": "inf"},
         "job parameter aisp.model.poll-interval-s must be a finite number"),
        ({"aisp.model.poll-interval-s": "none"},
         "job parameter aisp.model.poll-interval-s must be a finite number"),
        ({"aisp.encoder.pooling": "max"},
         "job parameter aisp.encoder.pooling must be one of none, mean, cls"),
        ({"aisp.encoder.normalize": "maybe"}, "job parameter aisp.encoder.normalize must be true or false"),
        ({"aisp.encoder.onnx": "/e.onnx"},
         "job parameter aisp.encoder.onnx: --encoder-onnx and --encoder-tokenizer go together"),
    ],
)
def test_invalid_job_parameters_raise_config_errors_naming_the_parameter(
    params: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        from_params(**params)
    assert str(info.value).startswith(message)


def test_a_job_parameter_that_conflicts_with_the_base_is_refused() -> None:
    base = job(operator=Runner.ASYNC, capacity=64)
    with pytest.raises(ConfigError, match=r"--capacity \(64\) must be >= --max-batch-size \(128\)"):
        PipelineOptions.from_job_parameters(get_from({"aisp.batch.max-size": "128"}), base=base)


# -- (c) command-line flags --------------------------------------------------------------


def test_every_kind_of_flag_parses(tmp_path: Path) -> None:
    options = PipelineOptions.from_args([
        *BASE, "--dlq-topic", "dead", "--bootstrap-servers", "h:9092", "--group-id", "g",
        "--transactional-id-prefix", "tx", "--mode", "batch", "--startup-mode", "latest-offset",
        "--checkpoint-interval-ms", "250", "--parallelism", "3", "--jars", "file:///a.jar;file:///b.jar",
        "--with-embedding", "--operator", "ASYNC", "--ordered", "--capacity", "512", "--timeout-s", "30",
        "--max-batch-size", "128", "--max-wait-ms", "2.5", "--max-idle-ms", "none",
        "--max-batch-tokens", "8192", "--length-buckets", "16,32,64", "--latency-slo-ms", "150",
        "--model-dir", str(tmp_path / "m"), "--model-pointer", str(tmp_path / "p.json"),
        "--model-poll-interval-s", "0.5", "--intra-op-threads", "2",
        "--encoder-onnx", str(tmp_path / "e.onnx"), "--encoder-tokenizer", str(tmp_path / "t.json"),
        "--encoder-output", "pooled", "--encoder-pooling", "cls", "--encoder-normalize",
        "--stats-dir", str(tmp_path / "s"), "--arrow-batch-size", "4096", "--bundle-time-ms", "20",
    ])
    assert options == PipelineOptions(
        input_topic="in", output_topic="out", dlq_topic="dead", bootstrap_servers="h:9092", group_id="g",
        transactional_id_prefix="tx", mode="batch", startup_mode="latest-offset", checkpoint_interval_ms=250,
        parallelism=3, jars="file:///a.jar;file:///b.jar", with_embedding=True, operator=Runner.ASYNC,
        ordered=True, capacity=512, timeout_s=30, max_batch_size=128, max_wait_ms=2.5, max_idle_ms=None,
        max_batch_tokens=8192, length_buckets=(16, 32, 64), latency_slo_ms=150.0, model_dir=tmp_path / "m",
        model_pointer=tmp_path / "p.json", model_poll_interval_s=0.5, intra_op_threads=2,
        encoder_onnx=tmp_path / "e.onnx", encoder_tokenizer=tmp_path / "t.json", encoder_output="pooled",
        encoder_pooling=Pooling.CLS, encoder_normalize=True, stats_dir=tmp_path / "s",
        arrow_batch_size=4096, bundle_time_ms=20,
    )
    assert options.operator is Runner.ASYNC and options.encoder_pooling is Pooling.CLS
    assert isinstance(options.model_dir, Path) and options.effective_bundle_time_ms == 20


def test_no_flags_give_the_defaults() -> None:
    options = PipelineOptions.from_args(BASE)
    assert options == PipelineOptions(input_topic="in", output_topic="out")
    assert options.length_buckets == () and options.max_idle_ms == 2.0
    assert PipelineOptions.from_args([*BASE, "--length-buckets", "none"]).length_buckets == ()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-batch-size", "0"], "argument --max-batch-size: --max-batch-size must be >= 1, got 0"),
        (["--max-batch-size", "x"],
         "argument --max-batch-size: --max-batch-size must be an integer, got 'x'"),
        (["--max-wait-ms", "inf"],
         "argument --max-wait-ms: --max-wait-ms must be a finite number, got 'inf'"),
        (["--max-idle-ms", "nan"],
         "argument --max-idle-ms: --max-idle-ms must be a finite number, got 'nan'"),
        (["--latency-slo-ms", "1e309"],
         "argument --latency-slo-ms: --latency-slo-ms must be a finite number"),
        (["--length-buckets", "16,x"],
         "argument --length-buckets: --length-buckets must be comma-separated integers"),
        (["--length-buckets", "32,16"], "--length-buckets: length_buckets must be strictly ascending"),
        (["--parallelism", "0"], "argument --parallelism: --parallelism must be >= 1, got 0"),
        (["--checkpoint-interval-ms", "1.5"], "--checkpoint-interval-ms must be an integer, got '1.5'"),
        (["--operator", "fast"],
         "argument --operator: --operator must be one of arrow, async, record, got 'fast'"),
        (["--encoder-pooling", "max"], "--encoder-pooling must be one of none, mean, cls, got 'max'"),
        (["--mode", "micro"], "--mode must be one of streaming, batch, got 'micro'"),
        (["--startup-mode", "now"], "--startup-mode must be one of"),
        (["--bundle-time-ms", "0"], "argument --bundle-time-ms: --bundle-time-ms must be >= 1, got 0"),
        (["--capacity", "0"], "argument --capacity: --capacity must be >= 1, got 0"),
        (["--operator", "async", "--capacity", "4"], "--capacity (4) must be >= --max-batch-size (32)"),
        (["--encoder-onnx", "e.onnx"], "--encoder-onnx and --encoder-tokenizer go together"),
        (["--max-batch-size", "none"], "--max-batch-size must be an integer, got 'none'"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(flags: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as info:
        PipelineOptions.from_args([*BASE, *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_missing_required_flag_exits_2(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as info:
        PipelineOptions.from_args(["--input-topic", "in"])
    assert info.value.code == 2
    assert "--output-topic" in capsys.readouterr().err


def test_help_lists_every_flag_with_unit_and_default(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as info:
        PipelineOptions.from_args(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for opt in OPTIONS:
        assert opt.flag in out, opt.flag
    assert "[records, default 32; cuda: 1024]" in out
    assert "[ms, default 5.0]" in out and "[ms, default none]" in out


# -- (d) PyFlink settings -----------------------------------------------------------------


def test_flink_settings_without_a_latency_target() -> None:
    assert flink_settings(job()) == flink_settings(InferenceOptions()) == {
        "python.fn-execution.bundle.time": "50",
        "python.fn-execution.bundle.size": "4096",
        "python.fn-execution.arrow.batch.size": "1024",
        "table.exec.async-scalar.max-concurrent-operations": "64",
        "table.exec.async-scalar.timeout": "600000 ms",
        "table.exec.async-scalar.retry-strategy": "NO_RETRY",
        "restart-strategy.type": "exponential-delay",
        "restart-strategy.exponential-delay.initial-backoff": "5 s",
        "restart-strategy.exponential-delay.max-backoff": "60 s",
        "restart-strategy.exponential-delay.backoff-multiplier": "2.0",
        "restart-strategy.exponential-delay.jitter-factor": "0.1",
        "restart-strategy.exponential-delay.reset-backoff-threshold": "600 s",
        "restart-strategy.exponential-delay.attempts-before-reset-backoff": "10",
        "execution.checkpointing.timeout": "600000 ms",
    }


def test_the_transaction_timeout_must_outlive_two_checkpoint_spans_a_restart_and_the_record_timeout() -> None:
    options = job(checkpoint_interval_ms=5_000, checkpoint_timeout_ms=600_000, restart_delay_s=10,
                  restart_max_delay_s=10)
    assert options.min_transaction_timeout_ms == 2 * (5_000 + 600_000) + 10_000 == 1_220_000
    # the longest wait counts: exponential-delay's max (60 s by default), failure-rate's only delay
    assert job(checkpoint_interval_ms=5_000).min_transaction_timeout_ms == 2 * 605_000 + 60_000
    assert job(restart_strategy="failure-rate", restart_delay_s=10).min_transaction_timeout_ms == 1_220_000
    assert job(timeout_s=900).min_transaction_timeout_ms == 1_800_000  # 2 x the record timeout
    job(transaction_timeout_ms=1_270_000)  # exactly the floor of the defaults is fine
    with pytest.raises(ConfigError, match="--transaction-timeout-ms 1269999 is below 1270000"):
        job(transaction_timeout_ms=1_269_999)
    with pytest.raises(ConfigError, match="--transaction-timeout-ms 900000 is below 1220000"):
        job(transaction_timeout_ms=900_000, restart_max_delay_s=10, restart_delay_s=10)


def test_restart_strategy_is_bounded_and_none_for_zero_attempts() -> None:
    settings = flink_settings(job(restart_strategy="failure-rate", restart_attempts=5, restart_interval_s=60,
                                  restart_delay_s=0))
    assert {k: v for k, v in settings.items() if k.startswith("restart-strategy")} == {
        "restart-strategy.type": "failure-rate",
        "restart-strategy.failure-rate.max-failures-per-interval": "5",
        "restart-strategy.failure-rate.failure-rate-interval": "60 s",
        "restart-strategy.failure-rate.delay": "0 s",
    }
    none = flink_settings(job(restart_attempts=0))
    restart = {k: v for k, v in none.items() if k.startswith("restart-strategy")}
    assert restart == {"restart-strategy.type": "none"}
    exponential = flink_settings(job(restart_attempts=4, restart_interval_s=120, restart_delay_s=1,
                                     restart_max_delay_s=8))
    assert {k.rsplit(".", 1)[1]: v for k, v in exponential.items() if ".exponential-delay." in k} == {
        "initial-backoff": "1 s", "max-backoff": "8 s", "backoff-multiplier": "2.0", "jitter-factor": "0.1",
        "reset-backoff-threshold": "120 s", "attempts-before-reset-backoff": "4"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"restart_delay_s": 0}, "--restart-delay-s must be >= 1 for --restart-strategy exponential-delay"),
    ({"restart_delay_s": 30, "restart_max_delay_s": 20}, r"--restart-max-delay-s \(20\) must be >= "),
    ({"max_dead_letter_rate": 1.0}, "--max-dead-letter-rate must be < 1"),
    ({"restart_attempts": 2**31}, "--restart-attempts must be <= 2147483647"),
])
def test_restart_and_dead_letter_options_that_cannot_work_are_refused(fields, message) -> None:
    with pytest.raises(ConfigError, match=message):
        job(**fields)


def test_the_exponential_delay_checks_do_not_refuse_what_another_strategy_or_no_restart_allows() -> None:
    assert job(restart_strategy="failure-rate", restart_delay_s=120).longest_restart_delay_s == 120
    assert job(restart_strategy="failure-rate", restart_delay_s=0).restart_delay_s == 0
    assert flink_settings(job(restart_attempts=0, restart_delay_s=0))["restart-strategy.type"] == "none"


def test_the_dead_letter_watch_warns_at_half_or_at_the_failure_share_if_lower() -> None:
    assert (job().dead_letter_watch().warn_share, job().dead_letter_watch().max_share) == (0.5, None)
    strict = job(max_dead_letter_rate=0.2).dead_letter_watch()
    assert (strict.warn_share, strict.max_share) == (0.2, 0.2)
    lax = job(max_dead_letter_rate=0.9).dead_letter_watch()
    assert (lax.warn_share, lax.max_share) == (0.5, 0.9)


@pytest.mark.parametrize("flags", [["--max-failure-rate", "1.5"], ["--max-failure-rate", "0"],
                                   ["--failure-window", "0"], ["--max-request-size", "1000"],
                                   ["--restart-attempts", "-1"], ["--max-dead-letter-rate", "-0.1"],
                                   ["--restart-strategy", "fixed-delay"]])
def test_breaker_sink_and_restart_flags_out_of_range_exit_2(flags: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        PipelineOptions.from_args(["--input-topic", "i", "--output-topic", "o", *flags])
    assert exc.value.code == 2
    assert flags[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "bundle_time", "bundle_size", "arrow_batch", "concurrent"),
    [
        (InferenceOptions(latency_slo_ms=150.0), "5", "4096", "1024", "64"),
        (InferenceOptions(latency_slo_ms=600.0), "20", "4096", "1024", "64"),
        (InferenceOptions(max_batch_size=1, latency_slo_ms=2.0, arrow_batch_size=100),
         "5", "1000", "100", "2"),
        (InferenceOptions(max_batch_size=1, arrow_batch_size=250), "50", "1000", "250", "2"),
        (InferenceOptions(latency_slo_ms=3000.0), "50", "4096", "1024", "64"),
        (InferenceOptions(max_batch_size=512, arrow_batch_size=512), "50", "4096", "512", "1024"),
        (InferenceOptions(max_batch_size=1024, arrow_batch_size=512), "50", "8192", "512", "2048"),
        (InferenceOptions(arrow_batch_size=8192), "50", "32768", "8192", "64"),
        (InferenceOptions(latency_slo_ms=150.0, bundle_time_ms=20), "20", "4096", "1024", "64"),
    ],
)
def test_flink_settings_follow_the_options(
    options: InferenceOptions, bundle_time: str, bundle_size: str, arrow_batch: str, concurrent: str
) -> None:
    settings = flink_settings(options)
    assert settings["python.fn-execution.bundle.time"] == bundle_time
    assert settings["python.fn-execution.bundle.size"] == bundle_size
    assert settings["python.fn-execution.arrow.batch.size"] == arrow_batch
    assert settings["table.exec.async-scalar.max-concurrent-operations"] == concurrent
    size = options.max_batch_size
    assert int(bundle_size) == max(1000, 4 * options.arrow_batch_size, 8 * size) >= 4 * 2 * size


@pytest.mark.parametrize(("slo", "expected"), [(None, 50), (1.0, 5), (30.0, 5), (150.0, 5), (180.0, 6),
                                                (300.0, 10), (1499.0, 49), (1500.0, 50), (60_000.0, 50)])
def test_default_bundle_time(slo: float | None, expected: int) -> None:
    assert default_bundle_time_ms(slo) == expected


@pytest.mark.parametrize(("flags", "timeout", "linger"), [
    ([], None, None),                                             # Flink's 100 ms, the client's 5 ms
    (["--latency-slo-ms", "100"], None, None),                    # measured no better: not derived
    (["--buffer-timeout-ms", "5", "--sink-linger-ms", "0"], "5 ms", 0),
    (["--buffer-timeout-ms", "0"], "0 ms", None),                 # 0: flush after every record
])
def test_buffer_timeout_and_sink_linger_are_set_only_when_asked(
        flags: list[str], timeout: str | None, linger: int | None) -> None:
    options = PipelineOptions.from_args([*BASE, *flags])
    assert flink_settings(options).get("execution.buffer-timeout.interval") == timeout
    assert options.sink_linger_ms == linger


@pytest.mark.parametrize(("flags", "separate", "timeout"), [
    ([], False, None),                                               # the Arrow operator: chained sinks
    (["--operator", "record"], True, "0 ms"),                        # its model runs in the task thread
    (["--operator", "record", "--separate-sinks", "false"], False, None),
    (["--operator", "record", "--buffer-timeout-ms", "5"], True, "5 ms"),  # a given timeout stays
    (["--operator", "record", "--mode", "batch"], False, None),      # BATCH: no checkpoint to wait out
    (["--separate-sinks", "true"], True, "0 ms"),
])
def test_the_record_operator_gets_sinks_of_their_own_and_a_zero_buffer_timeout(
        flags: list[str], separate: bool, timeout: str | None) -> None:
    options = PipelineOptions.from_args([*BASE, *flags])
    assert options.effective_separate_sinks is separate
    assert flink_settings(options).get("execution.buffer-timeout.interval") == timeout


def test_an_infinite_latency_target_is_refused_before_the_settings() -> None:
    with pytest.raises(ConfigError, match="latency_slo_ms must be a finite number"):
        InferenceOptions(latency_slo_ms=math.inf)


def test_job_parameters_format_survives_commas_colons_quotes_and_empty_values() -> None:
    params = {"aisp.model.dir": "/m:1,2", "q": 'it\'s "x"', "e": ""}
    assert json.loads(format_job_parameters(params)) == params


@pytest.mark.parametrize(("flags", "spin"), [
    ([], False),                                      # the model shares its cores with the JVMs
    (["--latency-slo-ms", "150"], False),
    (["--latency-slo-ms", "150", "--onnx-spin-wait", "true"], True),
    (["--onnx-spin-wait", "true"], True),             # ORT's own default, asked for
    (["--onnx-spin-wait", "false"], False),
    (["--onnx-spin-wait", "none"], False),
])
def test_onnx_spin_wait_is_off_unless_asked_for(flags: list[str], spin: bool) -> None:
    options = PipelineOptions.from_args([*BASE, *flags])
    assert options.effective_spin_wait is spin
    params = get_from(options.job_parameters())
    assert PipelineOptions.from_job_parameters(params, base=options) == options
    assert InferenceOptions.from_job_parameters(params).onnx_spin_wait is options.onnx_spin_wait


@pytest.mark.parametrize("flag", ["--max-batch-size", "--arrow-batch-size", "--capacity", "--parallelism",
                                  "--max-request-size"])
def test_integer_flags_over_a_java_int_exit_2_naming_the_flag(flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        PipelineOptions.from_args(["--input-topic", "i", "--output-topic", "o", flag, str(2**31)])
    assert exc.value.code == 2
    assert f"{flag} must be <= 2147483647 (a Java int), got {2**31}" in capsys.readouterr().err


def test_the_largest_batch_size_keeps_the_derived_settings_java_ints() -> None:
    settings = flink_settings(job(max_batch_size=2**31 - 1, capacity=2**31 - 1))
    assert settings["python.fn-execution.bundle.size"] == str(2**31 - 1)
    assert settings["table.exec.async-scalar.max-concurrent-operations"] == str(2**31 - 1)


@pytest.mark.parametrize(("flags", "named"), [
    (["--input-topic", "t", "--output-topic", "o", "--dlq-topic", "t"], "'--dlq-topic': 't'"),
    (["--input-topic", "t", "--output-topic", "t"], "'--output-topic': 't'"),
    (["--input-topic", "t", "--output-topic", "o", "--dlq-topic", "o"], "'--dlq-topic': 'o'"),
    (["--input-topic", "o.dlq", "--output-topic", "o"], "'--dlq-topic': 'o.dlq'"),
])
def test_a_topic_used_twice_exits_2_before_a_feedback_loop(flags: list[str], named: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        PipelineOptions.from_args(flags)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "the input, output and dead-letter topics must differ" in err and named in err


def test_a_second_text_field_maps_a_pair_and_is_refused_where_it_cannot_run() -> None:
    options = job(text_field="/query", text_pair_field="/doc/passage")
    mapping = options.field_mapping()
    assert (mapping.text, mapping.text_pair, mapping.text_pair_path) == ("/query", "/doc/passage",
                                                                          ("doc", "passage"))
    assert job().field_mapping().text_pair is None
    with pytest.raises(ConfigError, match="--text-pair-field runs on --operator arrow"):
        job(text_pair_field="/passage", operator=Runner.ASYNC)
    with pytest.raises(ConfigError, match=r"--text-pair-field .*: raw values are the text itself"):
        job(text_pair_field="/passage", value_format="raw")
    parsed = PipelineOptions.from_args(["--input-topic", "in", "--output-topic", "out",
                                        "--text-pair-field", "/passage"])
    assert parsed.text_pair_field == "/passage"


def test_prompt_fields_map_a_generation_models_placeholders_and_are_refused_where_they_cannot_run() -> None:
    chat = {"remote_url": "http://h", "remote_model": "m", "remote_api": "openai-chat",
            "prompt_template": "{product} ({stars}): {text}"}
    options = job(text_field="/body", prompt_fields="/meta/product, /stars", **chat)
    assert options.field_mapping().prompt_names == ["product", "stars"]
    handler = handler_for(options)
    assert handler.prompt_fields == ("product", "stars")
    assert handler.prompt({"text": "t", "product": "p", "stars": "4"}) == "p (4): t"
    with pytest.raises(ConfigError, match=r"names \{stars\}, which is not"):
        handler_for(job(prompt_fields="/meta/product", **chat))
    with pytest.raises(ConfigError, match="--prompt-fields runs on --operator arrow"):
        job(prompt_fields="/stars", operator=Runner.ASYNC, **chat)
    with pytest.raises(ConfigError, match=r"--prompt-fields / .*: --prompt-fields are fields of a JSON"):
        job(prompt_fields="/stars", value_format="raw", **chat)
    parsed = PipelineOptions.from_args(["--input-topic", "in", "--output-topic", "out", "--prompt-fields",
                                        "/stars"])
    assert parsed.prompt_fields == "/stars"


@pytest.mark.parametrize(("fields", "message"), [
    ({"predictor": Path("m.onnx")}, "--predictor reads the feature vectors of --feature-fields: give both"),
    ({"feature_fields": "/x"}, "--feature-fields is read by --predictor and --remote-url .* only"),
    ({"remote_url": "http://h", "remote_model": "m", "text_pair_field": "/b"},
     "--text-pair-field is not for a V2 text model"),
])
def test_feature_fields_go_with_numeric_models_and_a_v2_text_model_takes_one_text(fields, message) -> None:
    with pytest.raises(ConfigError, match=message):
        job(**fields)


def test_a_v2_model_takes_texts_without_feature_fields_and_vectors_with_them() -> None:
    from pyflink_aisp.pipeline._handlers import remote_handler

    remote = ["--remote-url", "grpc://h:8001", "--remote-model", "m"]
    assert remote_handler(PipelineOptions.from_args([*BASE, *remote])).texts is True  # type: ignore[attr-defined]
    vectors = PipelineOptions.from_args([*BASE, *remote, "--feature-fields", "/x"])
    assert remote_handler(vectors).texts is False  # type: ignore[attr-defined]
    registry_entry = InferenceOptions(remote_url="http://h", remote_model="m")  # task predict: vectors
    assert remote_handler(registry_entry).texts is False  # type: ignore[attr-defined]


@pytest.mark.parametrize(("flags", "jit", "args"), [
    ([], "tiered", []),                                           # HotSpot's default
    (["--latency-slo-ms", "100"], "c1", ["-XX:TieredStopAtLevel=1"]),  # no C2 threads in the first minute
    (["--latency-slo-ms", "100", "--jvm-jit", "tiered"], "tiered", []),
    (["--jvm-jit", "c1"], "c1", ["-XX:TieredStopAtLevel=1"]),
])
def test_the_jvm_jit_follows_the_latency_target_unless_set(
        flags: list[str], jit: str, args: list[str]) -> None:
    from pyflink_aisp.pipeline._settings import gateway_jvm_args

    options = PipelineOptions.from_args([*BASE, *flags])
    assert options.effective_jvm_jit == jit
    assert gateway_jvm_args(options) == args


def test_a_given_jvm_jit_is_refused_where_the_jvm_already_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyflink_aisp.pipeline._settings import start_gateway

    monkeypatch.setenv("PYFLINK_GATEWAY_PORT", "1")  # what flink run's client hands the job
    with pytest.raises(ConfigError, match=r"--jvm-jit c1: this job runs in a JVM already started .*"
                                          r"env\.java\.opts\.taskmanager: -XX:TieredStopAtLevel=1"):
        start_gateway(PipelineOptions.from_args([*BASE, "--jvm-jit", "c1"]))
    start_gateway(PipelineOptions.from_args([*BASE, "--latency-slo-ms", "100"]))  # derived: left to that JVM


def test_a_remote_models_batch_is_as_many_full_requests_as_may_be_in_flight() -> None:
    """A request never holds more than one model batch: with the in-process default (32) a job of
    64 rows per request sent 32 and one request at a time."""
    remote = {"remote_url": "grpc://127.0.0.1:8081", "remote_model": "intent_head", "feature_fields": "/e"}
    assert job(**remote).batching().max_batch_size == 64 * 64
    assert job(**remote, remote_rows_per_request=16, remote_max_concurrency=8).max_batch_size == 128
    assert job(**remote, max_batch_size=16).batching().max_batch_size == 16  # a given one holds
    embeddings = {"remote_url": "http://127.0.0.1:8080", "remote_model": "e",
                  "remote_api": RemoteApi.OPENAI_EMBEDDINGS}
    assert job(**embeddings, operator=Runner.ASYNC).max_batch_size == 256  # within --capacity
    sql = InferenceOptions(remote_url="grpc://127.0.0.1:8081", remote_model="intent_head")  # a SQL function's
    assert job().max_batch_size == 32 and sql.max_batch_size == 4096
