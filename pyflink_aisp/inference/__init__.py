"""The inference core, without PyFlink: the ModelHandler plug-in, batching, the runtime.

Importing this package does not import PyFlink (a Beam or plain-Python user can
use the handlers and the runtime); the Flink operators and SQL functions that
use it live in :mod:`pyflink_aisp.pipeline`, the backends (ONNX Runtime,
PyTorch) in :mod:`pyflink_aisp.inference.handlers`.

Public API: the plug-in :class:`ModelHandler` (with the batch-path
:class:`Prepared`); what its predictions mean, a
:class:`~pyflink_aisp.inference.tasks.Task` of output fields, is in
:mod:`pyflink_aisp.inference.tasks`; batching: :class:`BatchingConfig`, :class:`BatchCuts`,
:class:`MicroBatcher`, :func:`is_out_of_memory` and the SLO controller
:class:`SloController`; the per-worker runtime :class:`ModelRuntime` (its
results :class:`Inferred`, its registry key :func:`handler_key`); hot swap:
:class:`ModelSwapConfig`, :func:`publish_model`; the inference-failure circuit
breaker :class:`FailureRateBreaker` / :class:`BreakerConfig`. Metrics glue is in
:mod:`pyflink_aisp.inference.metrics`, the handler contract test in
:mod:`pyflink_aisp.inference.testing`.
"""

from __future__ import annotations

from pyflink_aisp.inference._batcher import MicroBatcher, is_out_of_memory
from pyflink_aisp.inference._breaker import BreakerConfig, FailureRateBreaker
from pyflink_aisp.inference._cost import BatchCuts
from pyflink_aisp.inference._handler import ModelHandler, Prepared
from pyflink_aisp.inference._queue import BatchingConfig
from pyflink_aisp.inference._runtime import Inferred, ModelRuntime, handler_key
from pyflink_aisp.inference._slo import SloController
from pyflink_aisp.inference._swap import ModelSwapConfig, publish_model

__all__ = [
    "BatchCuts",
    "BatchingConfig",
    "BreakerConfig",
    "FailureRateBreaker",
    "Inferred",
    "MicroBatcher",
    "ModelHandler",
    "ModelRuntime",
    "ModelSwapConfig",
    "Prepared",
    "SloController",
    "handler_key",
    "is_out_of_memory",
    "publish_model",
]
