"""Which ModelHandler a job or SQL function runs, chosen by options alone (no code)."""

from __future__ import annotations

from typing import Any

from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.inference.handlers import (
    ExecutionProvider,
    OnnxClassifierHandler,
    OnnxEncoderHandler,
    SentimentHandler,
    TorchSentimentHandler,
)
from pyflink_aisp.models import ensure_model_assets, load_model_assets
from pyflink_aisp.pipeline._config import InferenceOptions
from pyflink_aisp.pipeline._options import GpuProvider, InferenceRuntime

__all__ = ["handler_for", "model_assets", "onnx_providers"]


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


def handler_for(options: InferenceOptions) -> ModelHandler[Any, Any, Any]:
    """The handler the options name: the sentiment model on ONNX Runtime or PyTorch
    (``runtime``) on ``device``, the generic ONNX encoder of ``encoder_onnx`` +
    ``encoder_tokenizer``, or the sequence classifier of ``classifier``.

    Raises:
        ModelError: The sentiment assets cannot be found or built, or the classifier
            directory is not one.
        ConfigError: Bad encoder options.
    """
    threads = options.intra_op_threads or None
    providers, device_id = onnx_providers(options)
    if options.encoder_onnx is not None:
        assert options.encoder_tokenizer is not None  # InferenceOptions checks they go together
        return OnnxEncoderHandler(
            model_path=options.encoder_onnx, tokenizer_path=options.encoder_tokenizer,
            output=options.encoder_output, pooling=options.encoder_pooling,
            normalize=options.encoder_normalize, intra_op_num_threads=threads,
            providers=providers, device_id=device_id)
    if options.classifier is not None:
        return OnnxClassifierHandler(model_dir=options.classifier, top_k=options.top_k,
                                     intra_op_num_threads=threads, providers=providers, device_id=device_id)
    if options.runtime is InferenceRuntime.TORCH:
        return TorchSentimentHandler(model_assets(options), device=options.resolved_device,
                                     intra_op_num_threads=threads, precision=options.precision.value)
    return SentimentHandler(model_assets(options), intra_op_num_threads=threads, providers=providers,
                            device_id=device_id, allow_spinning=options.effective_spin_wait)
