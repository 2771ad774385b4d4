"""Which ModelHandler a job or SQL function runs, chosen by options alone (no code)."""

from __future__ import annotations

import importlib
from typing import Any

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.inference.handlers import (
    ExecutionProvider,
    OnnxClassifierHandler,
    OnnxEncoderHandler,
    OnnxPredictorHandler,
    OrtProfiling,
    SentimentHandler,
    TorchSentimentHandler,
)
from pyflink_aisp.inference.handlers.remote import (
    CallLogConfig,
    LimiterConfig,
    OpenAIEmbeddingHandler,
    OpenAIGenerationHandler,
    V2PredictorHandler,
)
from pyflink_aisp.models import ensure_model_assets, load_model_assets
from pyflink_aisp.pipeline._config import InferenceOptions
from pyflink_aisp.pipeline._options import GpuProvider, InferenceRuntime
from pyflink_aisp.pipeline._remote_options import RemoteApi

__all__ = ["handler_for", "model_assets", "onnx_providers", "remote_handler", "torch_device_kwargs",
           "user_handler"]


def model_assets(options: InferenceOptions) -> Any:
    """The sentiment :class:`~pyflink_aisp.models.ModelAssets`: ``model_dir``, else
    ``$AISP_MODEL_DIR``, else the cached build (built on first use, ~30 s).

    Raises:
        ModelError: The directory has no valid manifest or the build failed.
        ChecksumError: A file differs from its manifest.
    """
    directory = options.resolved_model_dir
    return load_model_assets(directory) if directory is not None else ensure_model_assets()


def onnx_providers(options: InferenceOptions) -> tuple[tuple[ExecutionProvider, ...], int | None]:
    """ONNX Runtime execution providers and CUDA device index for ``device``:
    CPU only for ``cpu``; for ``cuda:N`` CUDA (or TensorRT then CUDA) on device N,
    without the CPU provider (ORT places the nodes no GPU provider takes on the
    CPU itself; a GPU that fails to initialise fails the load, see
    :func:`~pyflink_aisp.inference.handlers._onnx.open_session`)."""
    device = options.resolved_device
    if device == "cpu":
        return (ExecutionProvider.CPU,), None
    gpu = (ExecutionProvider.CUDA,) if options.onnx_provider is GpuProvider.CUDA else (
        ExecutionProvider.TENSORRT, ExecutionProvider.CUDA)
    return gpu, int(device.split(":")[1])


def user_handler(path: str, kwargs: dict[str, Any]) -> ModelHandler[Any, Any, Any]:
    """``module:Class`` imported and built with ``kwargs`` (``--handler``, ``--handler-args``).

    Raises:
        ConfigError: The module does not import (not shipped with the job?), has no such
            class, the class refuses the arguments, or it is not a ModelHandler.
    """
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--handler {path}: cannot import {module_name} ({exc}); ship it with the job "
                          "(flink run -pyfs DIR, or a package in the job's venv)") from exc
    cls: Any = module
    for name in attr.split("."):
        cls = getattr(cls, name, None)
    if cls is None:
        raise ConfigError(f"--handler {path}: {module_name} has no {attr}")
    try:
        handler = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"--handler {path}: --handler-args do not fit {attr}: {exc}") from exc
    if not isinstance(handler, ModelHandler):
        raise ConfigError(f"--handler {path}: {attr} is not a pyflink_aisp.inference.ModelHandler")
    return handler


def remote_handler(options: InferenceOptions) -> ModelHandler[Any, Any, Any]:
    """The handler of ``--remote-url`` and the ``--remote-*`` options: Open Inference Protocol v2
    (``--remote-api v2``), or OpenAI-compatible embeddings or generation (with the generation
    options).

    Raises:
        ConfigError: Bad endpoint or generation options.
    """
    assert options.remote_url is not None and options.remote_model is not None  # checked by the options
    concurrency = LimiterConfig(initial=min(4, options.remote_max_concurrency),
                                maximum=options.remote_max_concurrency,
                                max_requests_per_s=options.remote_max_requests_per_s,
                                max_tokens_per_min=options.remote_max_tokens_per_min)
    endpoint: dict[str, Any] = {
        "url": options.remote_url, "model": options.remote_model,
        "api_key_env": options.remote_api_key_env, "api_key_file": options.remote_api_key_file,
        "ca_file": options.remote_ca_file, "request_timeout_s": options.remote_request_timeout_s,
        "deadline_s": options.remote_deadline_s, "concurrency": concurrency}
    api, rows = options.remote_api, options.remote_rows_per_request
    if options.remote_call_log is not None:
        servers = options.remote_call_log_servers or getattr(options, "servers", None)
        if servers is None:
            raise ConfigError("--remote-call-log needs --remote-call-log-servers here (a SQL function's "
                              "registry entry has no job bootstrap servers)")
        endpoint["call_log"] = CallLogConfig(topic=options.remote_call_log, bootstrap_servers=servers)
    if api is RemoteApi.V2:
        # a job without --feature-fields reads each record's text; a registry entry (task predict) vectors
        texts = hasattr(options, "feature_fields") and not options.feature_fields
        return V2PredictorHandler(version=options.remote_model_version, rows_per_request=rows, texts=texts,
                                  binary=options.remote_v2_binary, **endpoint)
    if api is RemoteApi.OPENAI_EMBEDDINGS:
        return OpenAIEmbeddingHandler(rows_per_request=rows, **endpoint)
    # a job's --prompt-fields (their placeholder names); a SQL function's options have none
    mapping = getattr(options, "field_mapping", None)
    fields = tuple(mapping().prompt_names) if mapping is not None else ()
    return OpenAIGenerationHandler(
        api="chat" if api is RemoteApi.OPENAI_CHAT else "completions", rows_per_request=rows,
        prompt_fields=fields,
        prompt_template=options.prompt_template, system_prompt=options.system_prompt,
        max_tokens=options.max_tokens, temperature=options.temperature, seed=options.seed,
        json_schema=options.json_schema_value(), prompt_limit=options.prompt_limit(), **endpoint)


def torch_device_kwargs(options: InferenceOptions) -> dict[str, Any]:
    """The torch handlers' batch size and device-path arguments from the options.

    ``batch_size`` is ``max_batch_size`` (the device's batch-size buckets reach it);
    ``pad_to_multiple_of``, ``batch_size_buckets`` and ``pipeline_depth`` are passed as
    given (None / () : the handler's device default); ``tf32`` as given; and with
    ``--gpu-affinity`` on a CUDA device, ``memory_limit_bytes`` is the lease's
    ``--gpu-mem-mib`` (the handler caps the process's CUDA allocator there, so the
    memory the service reserved is the memory the worker may use; None without a lease
    or with 0 MiB).
    """
    leased = options.gpu_affinity is not None and options.device.is_gpu and options.gpu_mem_mib > 0
    return {"batch_size": int(options.max_batch_size), "pad_to_multiple_of": options.pad_to_multiple_of,
            "batch_size_buckets": options.batch_size_buckets, "tf32": options.tf32,
            "pipeline_depth": options.pipeline_depth,
            "memory_limit_bytes": options.gpu_mem_mib * 2**20 if leased else None}


def _onnx_sentiment(options: InferenceOptions) -> bool:
    """Whether the options name the ONNX sentiment model (no other model given)."""
    others = (options.handler, options.remote_url, options.predictor, options.encoder_onnx,
              options.classifier)
    return all(x is None for x in others) and options.runtime is InferenceRuntime.ONNX


def handler_for(options: InferenceOptions) -> ModelHandler[Any, Any, Any]:
    """The handler the options name: the sentiment model on ONNX Runtime or PyTorch
    (``runtime``) on ``device``, the generic ONNX encoder of ``encoder_onnx`` +
    ``encoder_tokenizer``, the sequence classifier of ``classifier``, the numeric model of
    ``predictor``, the V2 server's model of ``remote_url``, or the user's ``handler``.

    Raises:
        ModelError: The sentiment assets cannot be found or built, or the classifier
            directory or numeric model is not one.
        ConfigError: Bad encoder options, or a ``handler`` that cannot be built.
    """
    if options.onnx_profile_dir is not None and not _onnx_sentiment(options):
        raise ConfigError("--onnx-profile-dir profiles the ONNX sentiment model (the default model, "
                          "--runtime onnx): not a remote, user, torch, encoder, classifier or predictor "
                          "model")
    if options.handler is not None:
        return user_handler(options.handler, options.handler_kwargs())
    if options.remote_url is not None:
        return remote_handler(options)
    threads = options.intra_op_threads or None
    spin = options.effective_spin_wait
    providers, device_id = onnx_providers(options)
    if options.predictor is not None:
        return OnnxPredictorHandler(model_path=options.predictor, intra_op_num_threads=threads,
                                    allow_spinning=spin, providers=providers, device_id=device_id)
    if options.encoder_onnx is not None:
        assert options.encoder_tokenizer is not None  # InferenceOptions checks they go together
        return OnnxEncoderHandler(
            model_path=options.encoder_onnx, tokenizer_path=options.encoder_tokenizer,
            output=options.encoder_output, pooling=options.encoder_pooling,
            normalize=options.encoder_normalize, intra_op_num_threads=threads,
            allow_spinning=spin, providers=providers, device_id=device_id)
    if options.classifier is not None:
        return OnnxClassifierHandler(model_dir=options.classifier, top_k=options.top_k,
                                     intra_op_num_threads=threads, allow_spinning=spin,
                                     providers=providers, device_id=device_id)
    if options.runtime is InferenceRuntime.TORCH:
        return TorchSentimentHandler(model_assets(options), device=options.resolved_device,
                                     intra_op_num_threads=threads, precision=options.precision.value,
                                     **torch_device_kwargs(options))
    profiling = None if options.onnx_profile_dir is None else OrtProfiling(
        directory=options.onnx_profile_dir.resolve(), runs=options.onnx_profile_runs)
    return SentimentHandler(model_assets(options), intra_op_num_threads=threads, providers=providers,
                            device_id=device_id, allow_spinning=spin,
                            concurrent_runs=options.concurrent_runs, profiling=profiling)
