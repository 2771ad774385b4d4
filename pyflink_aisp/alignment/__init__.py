"""Stream/batch alignment: prove that two runs of a job over the same input agree.

:func:`compare_outputs` compares the output records of two runs (e.g. a BATCH
backfill and the STREAMING job over the same range) by id; :func:`multiset_digest`
is an order-independent digest of a run's output records. ``aisp verify`` reads
two output topics and runs the comparison. PyFlink-free.
"""

from __future__ import annotations

from pyflink_aisp.alignment._verify import (
    DEFAULT_SCORE_TOLERANCE,
    ScoreDiff,
    VerifyReport,
    compare_outputs,
    multiset_digest,
)

__all__ = ["DEFAULT_SCORE_TOLERANCE", "ScoreDiff", "VerifyReport", "compare_outputs", "multiset_digest"]
