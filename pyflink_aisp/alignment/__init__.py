"""Stream/batch alignment: one job, two modes, proven equal. PyFlink-free.

* Ranges (:func:`resolve_range`, :func:`parse_bound`): ``[start, end)`` per
  partition from offsets, timestamps, the last stable offset, a consumer group,
  a streaming job's last completed checkpoint (:func:`checkpoint_offsets`) or a
  manifest, checked against the topic before a job starts.
* Manifests (:class:`RunManifest`, :func:`summarize_outputs`): what a run read,
  with which model, and the counts and order-independent digests of what it wrote,
  found by each output's lineage header.
* Verification (:func:`compare_outputs`, :func:`multiset_digest`): two runs'
  outputs agree by id (label, model version, score within a tolerance);
  :func:`select_scored_by` keeps one model's records of a route's run, to compare
  with a run of that model alone.
"""

from __future__ import annotations

from pyflink_aisp.alignment._checkpoint import (
    CheckpointPosition,
    cancel_job,
    checkpoint_offsets,
    completed_checkpoint,
    job_exceptions,
    job_id_named,
    job_state,
)
from pyflink_aisp.alignment._compare import verify_manifests
from pyflink_aisp.alignment._manifest import (
    OutcomeTracker,
    OutputSummary,
    RunManifest,
    code_version,
    file_sha256,
    read_range,
    summarize_outputs,
)
from pyflink_aisp.alignment._ranges import (
    Bound,
    BoundKind,
    PartitionRange,
    TopicOffsets,
    TopicRange,
    parse_bound,
    resolve_bound,
    resolve_range,
    topic_offsets,
)
from pyflink_aisp.alignment._scored_by import ScoredBySelection, select_scored_by
from pyflink_aisp.alignment._verify import (
    DEFAULT_SCORE_TOLERANCE,
    ScoreDiff,
    VerifyReport,
    compare_outputs,
    multiset_digest,
)

__all__ = [
    "DEFAULT_SCORE_TOLERANCE",
    "Bound",
    "BoundKind",
    "CheckpointPosition",
    "OutcomeTracker",
    "OutputSummary",
    "PartitionRange",
    "RunManifest",
    "ScoreDiff",
    "ScoredBySelection",
    "TopicOffsets",
    "TopicRange",
    "VerifyReport",
    "cancel_job",
    "checkpoint_offsets",
    "code_version",
    "compare_outputs",
    "completed_checkpoint",
    "file_sha256",
    "job_exceptions",
    "job_id_named",
    "job_state",
    "multiset_digest",
    "parse_bound",
    "read_range",
    "resolve_bound",
    "resolve_range",
    "select_scored_by",
    "summarize_outputs",
    "topic_offsets",
    "verify_manifests",
]
