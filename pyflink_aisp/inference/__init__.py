"""Model inference: ModelHandler plug-in, shared batcher, SLO controller, PyFlink operators.

Public API: :class:`ModelHandler`; batching: :class:`BatchingConfig`,
:class:`BatchQueue`, :class:`MicroBatcher`, :class:`BatchStats`,
:class:`BatchReport`, :func:`is_out_of_memory`; the SLO controller:
:class:`SloController`, :class:`Knobs`, :class:`ParetoPoint`; the per-worker
runtime: :class:`ModelRuntime`, :class:`Inferred`; hot swap:
:class:`ModelSwapConfig`, :class:`ModelPointer`, :func:`publish_model`,
:func:`read_pointer`; the DataStream operator :class:`BatchedInferenceFunction`;
the sentiment model: :class:`SentimentHandler`, :data:`SentimentPrediction`,
:class:`OnnxSentimentModel`, :class:`ExecutionProvider`, :data:`ProviderSpec`,
:func:`normalize_providers`, :func:`provider_device`; the PyTorch handler
:class:`TorchSentimentHandler` / :class:`TorchSentimentModel` (``torch`` extra,
imported only when a model loads), :func:`parse_torch_device`. The SQL
functions live in :mod:`pyflink_aisp.inference.sql`; the handler contract test
in :mod:`pyflink_aisp.inference.testing`.
"""

from __future__ import annotations

from pyflink_aisp.inference._batcher import BatchReport, BatchStats, MicroBatcher, is_out_of_memory
from pyflink_aisp.inference._handler import ModelHandler
from pyflink_aisp.inference._onnx import (
    ExecutionProvider,
    OnnxSentimentModel,
    ProviderSpec,
    normalize_providers,
    provider_device,
)
from pyflink_aisp.inference._operator import BatchedInferenceFunction
from pyflink_aisp.inference._queue import BatchingConfig, BatchQueue
from pyflink_aisp.inference._runtime import Inferred, ModelRuntime
from pyflink_aisp.inference._sentiment import SentimentHandler, SentimentPrediction
from pyflink_aisp.inference._slo import Knobs, ParetoPoint, SloController
from pyflink_aisp.inference._swap import ModelPointer, ModelSwapConfig, publish_model, read_pointer
from pyflink_aisp.inference._torch import TorchSentimentHandler, TorchSentimentModel, parse_torch_device

__all__ = [
    "BatchQueue",
    "BatchReport",
    "BatchStats",
    "BatchedInferenceFunction",
    "BatchingConfig",
    "ExecutionProvider",
    "Inferred",
    "Knobs",
    "MicroBatcher",
    "ModelHandler",
    "ModelPointer",
    "ModelRuntime",
    "ModelSwapConfig",
    "OnnxSentimentModel",
    "ParetoPoint",
    "ProviderSpec",
    "SentimentHandler",
    "SentimentPrediction",
    "SloController",
    "TorchSentimentHandler",
    "TorchSentimentModel",
    "is_out_of_memory",
    "normalize_providers",
    "parse_torch_device",
    "provider_device",
    "publish_model",
    "read_pointer",
]
