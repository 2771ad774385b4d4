"""Model backends on the :class:`~pyflink_aisp.inference.ModelHandler` plug-in.

ONNX Runtime (in-process, any execution provider): the sentiment model
:class:`SentimentHandler` / :class:`OnnxSentimentModel` and any text encoder
:class:`OnnxEncoderHandler`, any HF sequence-classification model directory
:class:`OnnxClassifierHandler`, any numeric model on feature vectors
:class:`OnnxPredictorHandler`; PyTorch (``torch`` extra, imported only when a model
loads): :class:`TorchSentimentHandler` and :class:`TorchEncoderHandler`. The
encoders share one tokenize / sort-and-cut / pool path (:class:`Pooling`,
:class:`TokenField`); the sentiment handlers share the hot-swap probe
(:data:`SWAP_PROBE_TEXTS`, :func:`check_probe_outputs`).
"""

from __future__ import annotations

from pyflink_aisp.inference.handlers._common import Pooling, TokenField
from pyflink_aisp.inference.handlers._onnx import (
    ExecutionProvider,
    OnnxSentimentModel,
    ProviderSpec,
    normalize_providers,
    provider_device,
)
from pyflink_aisp.inference.handlers._onnx_classifier import OnnxClassifierHandler, read_classifier_config
from pyflink_aisp.inference.handlers._onnx_encoder import OnnxEncoderHandler, OnnxEncoderModel
from pyflink_aisp.inference.handlers._onnx_predictor import (
    OnnxPredictorHandler,
    PredictorModel,
    predictor_fields,
)
from pyflink_aisp.inference.handlers._onnx_profile import OrtProfiling, ProfiledRuns
from pyflink_aisp.inference.handlers._onnx_runs import MAX_CONCURRENT_RUNS, run_threads
from pyflink_aisp.inference.handlers._probe import SWAP_PROBE_TEXTS, check_probe_outputs
from pyflink_aisp.inference.handlers._sentiment import SentimentHandler, SentimentPrediction
from pyflink_aisp.inference.handlers._torch import (
    TorchSentimentHandler,
    TorchSentimentModel,
    parse_torch_device,
)
from pyflink_aisp.inference.handlers._torch_encoder import TorchEncoderHandler, TorchEncoderModel

__all__ = [
    "MAX_CONCURRENT_RUNS",
    "SWAP_PROBE_TEXTS",
    "ExecutionProvider",
    "OnnxClassifierHandler",
    "OnnxEncoderHandler",
    "OnnxEncoderModel",
    "OnnxPredictorHandler",
    "OnnxSentimentModel",
    "OrtProfiling",
    "Pooling",
    "PredictorModel",
    "ProfiledRuns",
    "ProviderSpec",
    "SentimentHandler",
    "SentimentPrediction",
    "TokenField",
    "TorchEncoderHandler",
    "TorchEncoderModel",
    "TorchSentimentHandler",
    "TorchSentimentModel",
    "check_probe_outputs",
    "normalize_providers",
    "parse_torch_device",
    "predictor_fields",
    "provider_device",
    "read_classifier_config",
    "run_threads",
]
