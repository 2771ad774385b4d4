"""``open_affinity`` in a worker-like child process against the real service: renewal, release, fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyflink_aisp.affinity import AffinityClient, ClientConfig, LeaseState

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]

_WORKER = """
import json, os, sys, time
from pyflink_aisp.affinity import AffinityPolicy, AffinitySettings, open_affinity
url, policy, ttl_s = sys.argv[1], sys.argv[2], float(sys.argv[3])

class Context:
    def get_task_name(self): return "score (1/1)"
    def get_index_of_this_subtask(self): return 0

class Group:
    gauges = {}
    def gauge(self, name, read): self.gauges[name] = read

group = Group()
settings = AffinitySettings(url=url, job="worker-test", device="cpu", policy=AffinityPolicy(policy),
                            ttl_s=ttl_s, timeout_s=1.0, retries=1)
worker = open_affinity(settings, Context(), metric_group=group)
deadline = time.monotonic() + 30
while worker.client is not None and worker.renewals < 3 and time.monotonic() < deadline:
    time.sleep(0.05)
out = {"lease": worker.lease.id, "cpus": list(worker.lease.cpus), "env": os.environ["CUDA_VISIBLE_DEVICES"],
       "pinned": sorted(os.sched_getaffinity(0)), "metrics": {k: read() for k, read in group.gauges.items()},
       "reason": worker.lease.reason}
worker.close()
print(json.dumps(out))
"""


def _worker(url: str, policy: str, ttl_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, url, policy, str(ttl_s)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_worker_renews_in_the_background_and_releases_on_close(affinity_service, tmp_path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    (tmp_path / "host.json").write_text(
        json.dumps({"host": "this-host", "numa_nodes": [{"id": 0, "cpus": cpus}], "gpus": []})
    )
    service = affinity_service(tmp_path / "host.json")
    env_token = os.environ.get("AISP_AFFINITY_TOKEN")
    os.environ["AISP_AFFINITY_TOKEN"] = service.token  # the worker reads it from its environment
    try:
        out = _worker(service.url, "fail", 0.6)
    finally:
        if env_token is None:
            os.environ.pop("AISP_AFFINITY_TOKEN")
        else:
            os.environ["AISP_AFFINITY_TOKEN"] = env_token
    metrics = out["metrics"]
    assert (metrics["affinityFallback"], metrics["affinityRenewFailures"]) == (0, 0)
    assert metrics["affinityRenewals"] >= 3
    assert (out["env"], out["pinned"], out["cpus"]) == ("", cpus, cpus)
    lease = AffinityClient(ClientConfig(url=service.url)).get(out["lease"])
    assert lease.state is LeaseState.RELEASED
    assert lease.expires_at > lease.acquired_at + lease.ttl_s  # renewed, else it would end at acquire + TTL


def test_an_unreachable_service_with_the_local_policy_falls_back_visibly() -> None:
    from pyflink_aisp.local import find_free_port

    out = _worker(f"http://127.0.0.1:{find_free_port()}", "local", 30)
    assert out["lease"].startswith("local-")
    assert out["metrics"]["affinityFallback"] == 1
    assert out["reason"].startswith("local choice (service unreachable): numa:0 has the lowest cost")
    assert out["env"] == "" and out["pinned"] == out["cpus"]


def test_an_unreachable_service_fails_the_worker_by_default() -> None:
    from pyflink_aisp.local import find_free_port

    url = f"http://127.0.0.1:{find_free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, url, "fail", "30"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"pyflink_aisp.errors.AffinityUnavailableError: affinity service {url} did not "
        "answer POST /v1/leases after 2 attempt(s)"
    )
