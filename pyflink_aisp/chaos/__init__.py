"""Failure injection on the local stack: kill TaskManagers and their Python workers,
restart the broker, and count what a job lost or duplicated (``bench/chaos.py`` and
the e2e failure tests run it); a fault-injecting HTTP proxy in front of a model server
(:class:`FaultProxy`, :class:`Faults`: 429 with Retry-After, 503, truncated bodies, slow
answers).

Top floor: it drives :mod:`pyflink_aisp.local` and reads and writes topics with
:mod:`pyflink_aisp.kafka`.
"""

from __future__ import annotations

from pyflink_aisp.chaos._http_proxy import FaultProxy, Faults
from pyflink_aisp.chaos._kill import JobProgress, job_progress, job_restarts, kill_taskmanager, wait_recovered
from pyflink_aisp.chaos._run import FailureEvent, FailurePlan, FailureResult, run_chaos

__all__ = [
    "FailureEvent",
    "FailurePlan",
    "FailureResult",
    "FaultProxy",
    "Faults",
    "JobProgress",
    "job_progress",
    "job_restarts",
    "kill_taskmanager",
    "run_chaos",
    "wait_recovered",
]
