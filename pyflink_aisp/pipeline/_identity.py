"""Job identity: one live job per name on a cluster.

A job's name (``--job-name``, default ``aisp-<input-topic>-<output-topic>``) is its
Flink job name (``pipeline.name``) and, unless set apart, its consumer group and
the transactional id prefix of its sinks. Two live jobs sharing a transactional
id prefix fence each other's Kafka producers (the newer ``initTransactions``
aborts the older one's transactions), and two sharing a consumer group share
committed offsets, so a second live job of the same name is refused before it
is submitted. The check asks the cluster's REST API (``GET /jobs/overview``,
Flink REST API docs) when the job goes to a remote cluster (``flink run``:
``execution.target = remote``); an in-process MiniCluster starts empty.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping

from pyflink_aisp.errors import ConfigError, EnvironmentSetupError

__all__ = ["LIVE_STATES", "check_no_live_job", "live_jobs_named"]

#: Job states of a job that still runs or may run again (Flink ``JobStatus``, not globally terminal).
LIVE_STATES = frozenset({"INITIALIZING", "CREATED", "RUNNING", "FAILING", "CANCELLING", "RESTARTING",
                         "SUSPENDED", "RECONCILING"})


def live_jobs_named(rest_url: str, name: str, timeout_s: float = 10.0) -> list[tuple[str, str]]:
    """``(job id, state)`` of the live jobs called ``name`` on the cluster at ``rest_url``.

    Raises:
        EnvironmentSetupError: The REST API did not answer or answered something else.
    """
    url = rest_url.rstrip("/") + "/jobs/overview"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            overview = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EnvironmentSetupError(f"the Flink REST API at {url} did not answer ({exc}): "
                                    "is the cluster up?") from exc
    jobs = overview.get("jobs", []) if isinstance(overview, dict) else []
    return [(str(j.get("jid")), str(j.get("state"))) for j in jobs
            if j.get("name") == name and j.get("state") in LIVE_STATES]


def check_no_live_job(name: str, config: Mapping[str, str]) -> None:
    """Refuse to submit a job called ``name`` when one of that name is live on the
    remote cluster of ``config`` (nothing to check for a local MiniCluster).

    Args:
        name: The job name.
        config: The environment's configuration (``execution.target``,
            ``rest.address``, ``rest.port``).

    Raises:
        ConfigError: One line naming the live job and the fix.
        EnvironmentSetupError: The cluster's REST API did not answer.
    """
    if config.get("execution.target") != "remote":
        return
    address = config.get("rest.address") or config.get("jobmanager.rpc.address") or "localhost"
    rest = f"http://{address}:{config.get('rest.port', '8081')}"
    live = live_jobs_named(rest, name)
    if live:
        job_id, state = live[0]
        raise ConfigError(f"a job named {name!r} is already {state} on the cluster at {rest} (job {job_id}): "
                          f"stop it (`flink stop {job_id}`) or pass another --job-name")
