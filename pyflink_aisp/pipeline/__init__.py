"""The Flink edge of pyflink-aisp, in one place.

PyFlink-free (importable anywhere): the options table (:data:`OPTIONS`,
:class:`Option`, :class:`PipelineOptions`, :func:`flink_settings`) and the
input plan (:func:`plan_input`). A record's outcome lives on the ground floor
(:mod:`pyflink_aisp.outcome`), the connector-jar lookup too (:mod:`pyflink_aisp.jars`).
The Flink parts import PyFlink:
:mod:`pyflink_aisp.pipeline.flink` (``build_pipeline`` and the DataStream /
Arrow operators) and :mod:`pyflink_aisp.pipeline.sql` (the SQL functions).
"""

from __future__ import annotations

from pyflink_aisp.pipeline._config import (
    INFERENCE_OPTIONS,
    MODEL_DIR_ENV,
    OPTIONS,
    InferenceOptions,
    PipelineOptions,
    default_bundle_time_ms,
    option,
)
from pyflink_aisp.pipeline._identity import live_jobs_named
from pyflink_aisp.pipeline._options import (
    GpuProvider,
    InferenceRuntime,
    Option,
    OptionGroup,
    Precision,
    RestartStrategy,
    Runner,
    RuntimeMode,
    options_markdown,
)
from pyflink_aisp.pipeline._plan import InputPlan, plan_input, rest_url
from pyflink_aisp.pipeline._registry import (
    MODELS_ENV,
    ModelRegistry,
    ModelTask,
    RegisteredModel,
    load_registry,
    options_from_args,
    registry_from_env,
)
from pyflink_aisp.pipeline._remote_options import RemoteApi
from pyflink_aisp.pipeline._routes import RoutePlan, describe_route, route_plan
from pyflink_aisp.pipeline._settings import flink_settings, format_job_parameters, restart_settings

__all__ = [
    "INFERENCE_OPTIONS",
    "MODELS_ENV",
    "MODEL_DIR_ENV",
    "OPTIONS",
    "GpuProvider",
    "InferenceOptions",
    "InferenceRuntime",
    "InputPlan",
    "ModelRegistry",
    "ModelTask",
    "Option",
    "OptionGroup",
    "PipelineOptions",
    "Precision",
    "RegisteredModel",
    "RemoteApi",
    "RestartStrategy",
    "RoutePlan",
    "Runner",
    "RuntimeMode",
    "default_bundle_time_ms",
    "describe_route",
    "flink_settings",
    "format_job_parameters",
    "live_jobs_named",
    "load_registry",
    "option",
    "options_from_args",
    "options_markdown",
    "plan_input",
    "registry_from_env",
    "rest_url",
    "restart_settings",
    "route_plan",
]
