"""Models behind a remote server, on the same :class:`~pyflink_aisp.inference.ModelHandler`
plug-in: an Open Inference Protocol v2 server (KServe, Triton, MLServer) with
:class:`V2PredictorHandler` (REST, or gRPC at a ``grpc://`` URL), an OpenAI-compatible
server (vLLM, llama.cpp, the OpenAI API)
with :class:`OpenAIEmbeddingHandler` and :class:`OpenAIGenerationHandler`; the HTTP
underneath (:class:`RemoteEndpoint`,
:class:`RemoteSession`: a connection pool per worker, adaptive concurrency
:class:`AimdLimiter`, retries with backoff inside a deadline) is shared by every remote
handler. The OpenAI handlers keep their answers in a call log (:class:`CallLog`, a compacted
Kafka topic) when given one, so records replayed after a failover are not sent again. A
:class:`PromptLimit` counts each generation prompt before it is sent, and dead-letters or
truncates one that does not fit (:class:`PromptOverflow`).
"""

from __future__ import annotations

from pyflink_aisp.inference.handlers.remote._call_log import CallLog, CallLogConfig, call_key
from pyflink_aisp.inference.handlers.remote._client import (
    GRPC_SCHEMES,
    RETRYABLE_STATUSES,
    RemoteEndpoint,
    RemoteSession,
    check_base_url,
    context_overflow,
    path_segment,
    retry_after_seconds,
)
from pyflink_aisp.inference.handlers.remote._limit import AimdLimiter, LimiterConfig
from pyflink_aisp.inference.handlers.remote._openai import OpenAIEmbeddingHandler, OpenAIModel
from pyflink_aisp.inference.handlers.remote._openai_generation import (
    ChatApi,
    OpenAIGenerationHandler,
    schema_fields,
)
from pyflink_aisp.inference.handlers.remote._prompt import PromptLimit, PromptOverflow
from pyflink_aisp.inference.handlers.remote._v2 import V2Model, V2PredictorHandler

__all__ = [
    "GRPC_SCHEMES",
    "RETRYABLE_STATUSES",
    "AimdLimiter",
    "CallLog",
    "CallLogConfig",
    "ChatApi",
    "LimiterConfig",
    "OpenAIEmbeddingHandler",
    "OpenAIGenerationHandler",
    "OpenAIModel",
    "PromptLimit",
    "PromptOverflow",
    "RemoteEndpoint",
    "RemoteSession",
    "V2Model",
    "V2PredictorHandler",
    "call_key",
    "check_base_url",
    "context_overflow",
    "path_segment",
    "retry_after_seconds",
    "schema_fields",
]
