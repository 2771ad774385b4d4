"""The input offsets of a streaming job's last completed checkpoint.

Flink's Kafka source commits the offsets of a checkpoint to the job's consumer
group when the checkpoint completes (``notifyCheckpointComplete``; Flink Kafka
connector docs, "Consumer Offset Committing"), the same moment the exactly-once
sink commits that checkpoint's transactions. So once checkpoint N is the job's
latest completed one (Flink REST API ``GET /jobs/:jobid/checkpoints``) and its
commits had time to land, the group's committed offsets are checkpoint N's
offsets, and the job's committed outputs are exactly those of the inputs before
them. :func:`checkpoint_offsets` reads them so, and re-reads when another
checkpoint completed meanwhile. A partition the group never committed (nothing
was read from it yet) counts at its log start offset.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyflink_aisp.errors import ConfigError, EnvironmentSetupError

__all__ = ["CheckpointPosition", "checkpoint_offsets", "completed_checkpoint", "job_id_named", "job_state"]

#: Seconds after a checkpoint completed before its offset and transaction commits
#: are taken as landed (both are sent right after completion; they take milliseconds).
SETTLE_S = 0.5


def _get(rest_url: str, path: str, timeout_s: float) -> Any:
    url = rest_url.rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EnvironmentSetupError(f"the Flink REST API at {url} did not answer ({exc}): "
                                    "is the cluster up?") from exc


def job_id_named(rest_url: str, name: str, timeout_s: float = 10.0) -> str:
    """The id of the RUNNING job called ``name``.

    Raises:
        ConfigError: No running job of that name (the message lists the names that run).
        EnvironmentSetupError: The REST API did not answer.
    """
    jobs = _get(rest_url, "/jobs/overview", timeout_s).get("jobs", [])
    running = [j for j in jobs if j.get("state") == "RUNNING"]
    for job in running:
        if job.get("name") == name:
            return str(job["jid"])
    names = sorted(str(j.get("name")) for j in running) or ["none"]
    raise ConfigError(f"no running job named {name!r} on the cluster at {rest_url} "
                      f"(running: {', '.join(names)})")


def job_state(rest_url: str, job_id: str, timeout_s: float = 10.0) -> str:
    """The job's state (``RUNNING``, ``FINISHED``, ...).

    Raises:
        EnvironmentSetupError: The REST API did not answer.
    """
    return str(_get(rest_url, f"/jobs/{job_id}", timeout_s).get("state"))


def job_exceptions(rest_url: str, job_id: str, timeout_s: float = 10.0) -> list[str]:
    """The stack traces of the job's failures so far, newest first (REST
    ``/jobs/:jobid/exceptions``, ``exceptionHistory``).

    Raises:
        EnvironmentSetupError: The REST API did not answer.
    """
    history = (_get(rest_url, f"/jobs/{job_id}/exceptions", timeout_s).get("exceptionHistory") or {})
    return [str(e.get("stacktrace") or "") for e in history.get("entries") or []]


def cancel_job(rest_url: str, job_id: str, timeout_s: float = 10.0) -> None:
    """Cancel the job (REST ``PATCH /jobs/:jobid?mode=cancel``).

    Raises:
        EnvironmentSetupError: The REST API did not answer or refused.
    """
    url = f"{rest_url.rstrip('/')}/jobs/{job_id}?mode=cancel"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="PATCH"), timeout=timeout_s):
            pass
    except (urllib.error.URLError, OSError) as exc:
        raise EnvironmentSetupError(f"the Flink REST API at {url} refused the cancel ({exc})") from exc


def completed_checkpoint(rest_url: str, job_id: str, timeout_s: float = 10.0) -> tuple[int, int] | None:
    """``(id, completion time in epoch ms)`` of the job's latest completed checkpoint, or None.

    Raises:
        EnvironmentSetupError: The REST API did not answer.
    """
    latest = (_get(rest_url, f"/jobs/{job_id}/checkpoints", timeout_s).get("latest") or {}).get("completed")
    if not latest:
        return None
    return int(latest["id"]), int(latest.get("latest_ack_timestamp") or 0)


@dataclass(frozen=True, kw_only=True)
class CheckpointPosition:
    """Where a streaming job's last completed checkpoint stands on its input topic.

    Attributes:
        job_id: Flink job id.
        job_name: Its name.
        checkpoint_id: The checkpoint.
        completed_ms: When it completed (epoch ms).
        offsets: Input offset per partition: the next record the job reads after it.
    """

    job_id: str
    job_name: str
    checkpoint_id: int
    completed_ms: int
    offsets: dict[int, int]


def checkpoint_offsets(
    rest_url: str,
    job_name: str,
    read_group_offsets: Callable[[], dict[int, int]],
    *,
    attempts: int = 10,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> CheckpointPosition:
    """The input offsets of running job ``job_name``'s last completed checkpoint.

    Args:
        rest_url: The job's cluster (``http://host:port``).
        job_name: The job's name (``--job-name``).
        read_group_offsets: Reads the job's consumer group's committed offsets per partition.
        attempts: Tries while newer checkpoints keep completing during the read.
        clock: Epoch seconds (tests inject one).
        sleep: Waits (tests inject one).

    Raises:
        ConfigError: No running job of that name, no completed checkpoint yet, or
            checkpoints kept completing during every attempt.
        EnvironmentSetupError: The REST API did not answer.
    """
    job_id = job_id_named(rest_url, job_name)
    for _ in range(attempts):
        before = completed_checkpoint(rest_url, job_id)
        if before is None:
            raise ConfigError(f"job {job_name!r} ({job_id}) has no completed checkpoint yet: "
                              "wait for one (--checkpoint-interval-ms)")
        wait = before[1] / 1000 + SETTLE_S - clock()
        if wait > 0:
            sleep(wait)
        offsets = read_group_offsets()
        if completed_checkpoint(rest_url, job_id) == before:
            return CheckpointPosition(job_id=job_id, job_name=job_name, checkpoint_id=before[0],
                                      completed_ms=before[1], offsets=offsets)
    raise ConfigError(f"job {job_name!r}: checkpoints completed during each of {attempts} reads of its "
                      "offsets; retry, or use a longer --checkpoint-interval-ms")
