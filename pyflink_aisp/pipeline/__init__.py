"""The Flink edge of pyflink-aisp, in one place.

PyFlink-free (importable anywhere): the options table (:data:`OPTIONS`,
:class:`Option`, :class:`PipelineOptions`, :func:`flink_settings`), the
outcome of a record (:class:`Reason`, :class:`DeadLettered`), and the
connector-jar lookup (:func:`connector_jars`). The Flink parts import PyFlink:
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
from pyflink_aisp.pipeline._connector import CONNECTOR_JARS_ENV, connector_jars
from pyflink_aisp.pipeline._options import OPTIONS, Option, OptionGroup, Runner, option
from pyflink_aisp.pipeline._outcome import MAX_DEAD_LETTER_VALUE_BYTES, DeadLettered, Reason, reason_of
from pyflink_aisp.pipeline._plan import InputPlan, plan_input, rest_url

__all__ = [
    "CONNECTOR_JARS_ENV",
    "MAX_DEAD_LETTER_VALUE_BYTES",
    "MODEL_DIR_ENV",
    "OPTIONS",
    "DeadLettered",
    "InputPlan",
    "Option",
    "OptionGroup",
    "PipelineOptions",
    "Reason",
    "Runner",
    "connector_jars",
    "default_bundle_time_ms",
    "flink_settings",
    "format_job_parameters",
    "option",
    "plan_input",
    "reason_of",
    "rest_url",
]
