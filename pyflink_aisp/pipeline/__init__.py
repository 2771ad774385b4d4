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
    MODEL_DIR_ENV,
    PipelineOptions,
    default_bundle_time_ms,
    flink_settings,
    format_job_parameters,
)
from pyflink_aisp.pipeline._identity import live_jobs_named
from pyflink_aisp.pipeline._options import OPTIONS, Option, OptionGroup, Runner, option
from pyflink_aisp.pipeline._plan import InputPlan, plan_input, rest_url

__all__ = [
    "MODEL_DIR_ENV",
    "OPTIONS",
    "InputPlan",
    "Option",
    "OptionGroup",
    "PipelineOptions",
    "Runner",
    "default_bundle_time_ms",
    "flink_settings",
    "format_job_parameters",
    "live_jobs_named",
    "option",
    "plan_input",
    "rest_url",
]
