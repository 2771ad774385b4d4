"""Model inference without PyFlink: ModelHandler plug-in, shared batcher, SLO controller, runtime.

Importing this package does not import PyFlink (a Beam or plain-Python user
can use the handlers and the runtime); the Flink operators and SQL functions
that use it live in :mod:`pyflink_aisp.pipeline`.

Public API: :class:`ModelHandler` (with the batch-path :class:`Prepared`); batching: :class:`BatchingConfig`,
:class:`BatchCuts`, :class:`BatchQueue`, :class:`MicroBatcher`, :class:`BatchStats`,
:class:`BatchReport`, :func:`is_out_of_memory`; the SLO controller:
:class:`SloController`, :class:`Knobs`, :class:`ParetoPoint`; the per-worker
runtime: :class:`ModelRuntime`, :class:`Inferred`; hot swap:
:class:`ModelSwapConfig`, :class:`ModelPointer`, :func:`publish_model`,
:func:`read_pointer`, and the probe set a new version must pass:
:data:`SWAP_PROBE_TEXTS`, :func:`check_probe_outputs`; the inference-failure circuit
breaker: :class:`FailureRateBreaker`, :class:`BreakerConfig`; the sentiment model:
:class:`SentimentHandler`, :data:`SentimentPrediction`,
:class:`OnnxSentimentModel`, :class:`ExecutionProvider`, :data:`ProviderSpec`,
:func:`normalize_providers`, :func:`provider_device`; generic text encoders
(any ONNX graph or HF safetensors checkpoint with a ``tokenizer.json``):
:class:`OnnxEncoderHandler`, :class:`TorchEncoderHandler`, :class:`Pooling`,
:class:`TokenField`; the PyTorch handler
:class:`TorchSentimentHandler` / :class:`TorchSentimentModel` (``torch`` extra,
imported only when a model loads), :func:`parse_torch_device`. The handler
contract test is in :mod:`pyflink_aisp.inference.testing`.
"""

from __future__ import annotations

from pyflink_aisp.inference._batcher import BatchReport, BatchStats, MicroBatcher, is_out_of_memory
from pyflink_aisp.inference._breaker import BreakerConfig, FailureRateBreaker
from pyflink_aisp.inference._cost import BatchCuts
from pyflink_aisp.inference._encoder import OnnxEncoderHandler, OnnxEncoderModel
from pyflink_aisp.inference._encoder_common import Pooling, TokenField
from pyflink_aisp.inference._handler import ModelHandler, Prepared
from pyflink_aisp.inference._onnx import (
    ExecutionProvider,
    OnnxSentimentModel,
    ProviderSpec,
    normalize_providers,
    provider_device,
)
from pyflink_aisp.inference._probe import SWAP_PROBE_TEXTS, check_probe_outputs
from pyflink_aisp.inference._queue import BatchingConfig, BatchQueue
from pyflink_aisp.inference._runtime import Inferred, ModelRuntime
from pyflink_aisp.inference._sentiment import SentimentHandler, SentimentPrediction
from pyflink_aisp.inference._slo import Knobs, ParetoPoint, SloController
from pyflink_aisp.inference._swap import ModelPointer, ModelSwapConfig, publish_model, read_pointer
from pyflink_aisp.inference._torch import TorchSentimentHandler, TorchSentimentModel, parse_torch_device
from pyflink_aisp.inference._torch_encoder import TorchEncoderHandler, TorchEncoderModel

__all__ = [
    "SWAP_PROBE_TEXTS",
    "BatchCuts",
    "BatchQueue",
    "BatchReport",
    "BatchStats",
    "BatchingConfig",
    "BreakerConfig",
    "ExecutionProvider",
    "FailureRateBreaker",
    "Inferred",
    "Knobs",
    "MicroBatcher",
    "ModelHandler",
    "ModelPointer",
    "ModelRuntime",
    "ModelSwapConfig",
    "OnnxEncoderHandler",
    "OnnxEncoderModel",
    "OnnxSentimentModel",
    "ParetoPoint",
    "Pooling",
    "Prepared",
    "ProviderSpec",
    "SentimentHandler",
    "SentimentPrediction",
    "SloController",
    "TokenField",
    "TorchEncoderHandler",
    "TorchEncoderModel",
    "TorchSentimentHandler",
    "TorchSentimentModel",
    "check_probe_outputs",
    "is_out_of_memory",
    "normalize_providers",
    "parse_torch_device",
    "provider_device",
    "publish_model",
    "read_pointer",
]
