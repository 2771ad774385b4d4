"""Model inference: ModelHandler protocol, micro-batcher, PyFlink async operator, ONNX scoring.

Public API: :class:`ModelHandler`, :class:`BatchingConfig`, :class:`BatchStats`,
:class:`MicroBatcher`, :class:`BatchedInferenceFunction`,
:class:`SentimentHandler`, :data:`SentimentPrediction`,
:class:`OnnxSentimentModel`, :class:`ExecutionProvider`, :data:`ProviderSpec`.
"""

from __future__ import annotations

from pyflink_aisp.inference._batcher import BatchStats, MicroBatcher
from pyflink_aisp.inference._handler import ModelHandler
from pyflink_aisp.inference._onnx import ExecutionProvider, OnnxSentimentModel, ProviderSpec
from pyflink_aisp.inference._operator import BatchedInferenceFunction
from pyflink_aisp.inference._queue import BatchingConfig, BatchQueue
from pyflink_aisp.inference._sentiment import SentimentHandler, SentimentPrediction

__all__ = [
    "BatchQueue",
    "BatchStats",
    "BatchedInferenceFunction",
    "BatchingConfig",
    "ExecutionProvider",
    "MicroBatcher",
    "ModelHandler",
    "OnnxSentimentModel",
    "ProviderSpec",
    "SentimentHandler",
    "SentimentPrediction",
]
