"""Which ModelHandler a job or SQL function runs, chosen by options alone (no code)."""

from __future__ import annotations

from typing import Any

from pyflink_aisp.inference import ModelHandler, OnnxEncoderHandler, SentimentHandler
from pyflink_aisp.pipeline._config import PipelineOptions

__all__ = ["handler_for", "model_assets"]


def model_assets(options: PipelineOptions) -> Any:
    """The sentiment :class:`~pyflink_aisp.models.ModelAssets`: ``model_dir``, else
    ``$AISP_MODEL_DIR``, else the cached build (built on first use, ~30 s).

    Raises:
        ModelError: The directory has no valid manifest or the build failed.
        ChecksumError: A file differs from its manifest.
    """
    from pyflink_aisp.models import ensure_model_assets, load_model_assets

    directory = options.resolved_model_dir
    return load_model_assets(directory) if directory is not None else ensure_model_assets()


def handler_for(options: PipelineOptions) -> ModelHandler[Any, Any, Any]:
    """The handler the options name: the sentiment model on ONNX Runtime (CPU), or
    the generic ONNX encoder of ``encoder_onnx`` + ``encoder_tokenizer``.

    Raises:
        ModelError: The sentiment assets cannot be found or built.
        ConfigError: Bad encoder options.
    """
    threads = options.intra_op_threads or None
    if options.encoder_onnx is not None:
        assert options.encoder_tokenizer is not None  # PipelineOptions checks they go together
        return OnnxEncoderHandler(
            model_path=options.encoder_onnx, tokenizer_path=options.encoder_tokenizer,
            output=options.encoder_output, pooling=options.encoder_pooling,
            normalize=options.encoder_normalize, intra_op_num_threads=threads)
    return SentimentHandler(model_assets(options), intra_op_num_threads=threads,
                            allow_spinning=options.effective_spin_wait)
