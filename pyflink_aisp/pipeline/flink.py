"""The Flink parts of the pipeline (importing this module imports PyFlink).

:func:`build_pipeline` and :func:`make_environment` build and submit the
packaged inference job (:func:`pipeline_statements`: its graph, not submitted);
:class:`ArrowInferenceFunction` (batch-native, the default) and
:class:`BatchedInferenceFunction` (per-record async) are its two inference operators, usable in your own jobs.
"""

from __future__ import annotations

from pyflink_aisp.pipeline._arrow_op import SCORED_ROW_TYPE, ArrowInferenceFunction, arrow_inference_udf
from pyflink_aisp.pipeline._async_op import BatchedInferenceFunction
from pyflink_aisp.pipeline._build import SCORED_TYPE, build_pipeline, make_environment, pipeline_statements
from pyflink_aisp.pipeline._run import model_files, run_job

__all__ = [
    "SCORED_ROW_TYPE",
    "SCORED_TYPE",
    "ArrowInferenceFunction",
    "BatchedInferenceFunction",
    "arrow_inference_udf",
    "build_pipeline",
    "make_environment",
    "model_files",
    "pipeline_statements",
    "run_job",
]
