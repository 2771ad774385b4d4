"""Operator glue: applying a lease in a process, the unreachable-service policies (issue 12.5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pyflink_aisp.affinity import (
    AffinityPolicy,
    AffinitySettings,
    LeaseKind,
    LeaseState,
    WorkerAffinity,
    load_topology,
    local_lease,
    open_affinity,
)
from pyflink_aisp.affinity._store import Lease
from pyflink_aisp.errors import AffinityUnavailableError, ConfigError, LeaseNotFoundError
from pyflink_aisp.pipeline import InferenceOptions, PipelineOptions

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "affinity"
MIG = "MIG-33333333-0000-0000-0000-000000000000"


def _lease(device: str, cpus: tuple[int, ...], kind: LeaseKind = LeaseKind.GPU, lease_id: str = "a") -> Lease:
    return Lease(
        id=lease_id,
        job="j",
        operator="o",
        subtask=0,
        host="h",
        kind=kind,
        device=device,
        gpu_uuid=None,
        gpu_index=None,
        mig=device.startswith("MIG-"),
        numa_node=0,
        cpus=cpus,
        mem_bytes=0,
        ttl_s=30,
        acquired_at=0,
        expires_at=30,
        released_at=None,
        state=LeaseState.ACTIVE,
        reason="",
    )


_APPLY = """
import json, os, sys, threading, time
from pyflink_aisp.affinity import apply_lease
from pyflink_aisp.affinity._store import Lease
from pyflink_aisp.errors import AffinityError
stop = threading.Event()
early = threading.Thread(target=stop.wait)  # a thread started before the lease: pinned as well
early.start()
out = {}
for d in json.loads(sys.argv[1]):
    try:
        apply_lease(Lease.from_dict(d))
        out.setdefault("applied", []).append(d["id"])
    except AffinityError as exc:
        out["error"] = str(exc)
out["env"] = os.environ.get("CUDA_VISIBLE_DEVICES")
out["main"] = sorted(os.sched_getaffinity(0))
out["early"] = sorted(os.sched_getaffinity(early.native_id))
late = []
t = threading.Thread(target=lambda: late.extend(sorted(os.sched_getaffinity(0))))
t.start(); t.join(); stop.set(); early.join()
out["late"] = late
from pyflink_aisp.affinity import unapply_lease
for lease_id in out.get("applied", []):
    unapply_lease(lease_id)
out["after_env"] = os.environ.get("CUDA_VISIBLE_DEVICES")
out["after_main"] = sorted(os.sched_getaffinity(0))
print(json.dumps(out))
"""


def _apply_in_child(*leases: Lease) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-c", _APPLY, json.dumps([x.to_dict() for x in leases])],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_a_mig_lease_sets_cuda_visible_devices_and_pins_every_thread_until_it_ends() -> None:
    out = _apply_in_child(_lease(MIG, (0,)))
    assert (out["env"], out["main"], out["early"], out["late"]) == (MIG, [0], [0], [0])
    assert (out["after_env"], out["after_main"]) == (None, sorted(os.sched_getaffinity(0)))


def test_a_cpu_lease_hides_every_gpu_and_two_leases_pin_to_the_union() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    out = _apply_in_child(
        _lease("numa:0", (cpus[0],), LeaseKind.CPU, "a"),
        _lease("numa:0", tuple(cpus[1:2]), LeaseKind.CPU, "b"),
    )
    assert out["env"] == "" and out["main"] == cpus[:2] and out["applied"] == ["a", "b"]


def test_two_gpus_in_one_process_and_cpus_of_another_host_are_refused() -> None:
    out = _apply_in_child(_lease("GPU-a", (0,), lease_id="a"), _lease("GPU-b", (0,), lease_id="b"))
    assert out["applied"] == ["a"] and out["env"] == "GPU-a"
    assert (
        out["error"]
        == "lease b: this worker process already holds GPU GPU-a; one process cannot also use GPU-b"
    )
    out = _apply_in_child(_lease("GPU-a", (4096,)))
    assert "applied" not in out
    assert out["error"].startswith("lease a: none of its CPUs [4096] is online and allowed to this process")


class _Context:
    def __init__(self, subtask: int) -> None:
        self.subtask = subtask

    def get_task_name(self) -> str:
        return "score"

    def get_index_of_this_subtask(self) -> int:
        return self.subtask


class _Unreachable:
    def __init__(self, config) -> None:
        self.config = config

    def acquire(self, **_: object) -> Lease:
        raise AffinityUnavailableError(f"affinity service {self.config.url} did not answer")

    def close(self) -> None:
        pass


def test_unreachable_service_fails_by_default() -> None:
    settings = AffinitySettings(url="http://127.0.0.1:9", job="j", device="cuda:0", mem_bytes=1)
    with pytest.raises(AffinityUnavailableError, match=r"http://127\.0\.0\.1:9 did not answer"):
        open_affinity(settings, _Context(0), client_factory=_Unreachable)


def test_the_local_policy_without_a_gpu_topology_still_fails_for_a_gpu(monkeypatch) -> None:
    monkeypatch.delenv("AISP_AFFINITY_TOPOLOGY", raising=False)
    settings = AffinitySettings(
        url="http://127.0.0.1:9", job="j", device="cuda:0", policy=AffinityPolicy.LOCAL
    )
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    except pynvml.NVMLError:
        pass
    with pytest.raises(Exception, match="no NVIDIA driver here"):
        open_affinity(settings, _Context(0), client_factory=_Unreachable)


def test_the_local_choice_is_what_the_service_would_give_each_subtask() -> None:
    topology = load_topology(DATA / "numa2x4.yaml")
    settings = AffinitySettings(
        url="http://x:1", job="j", device="cuda:0", mem_bytes=2**33, policy=AffinityPolicy.LOCAL
    )
    chosen = [local_lease(settings, "score", s, topology).gpu_index for s in range(9)]
    assert chosen == [0, 1, 4, 5, 2, 3, 6, 7, 0]  # as test_placement's spread over the same file
    lease = local_lease(settings, "score", 2, topology)
    assert lease.reason.startswith("local choice (service unreachable): GPU-00000004")


def test_the_options_map_to_settings_and_refuse_a_fixed_gpu_index() -> None:
    options = PipelineOptions(
        input_topic="in",
        output_topic="out",
        gpu_affinity="http://127.0.0.1:7420",
        device="cuda",
        gpu_mem_mib=512,
    )
    s = options.affinity()
    assert s is not None
    assert (s.job, s.device, s.mem_bytes, s.kind, s.policy) == (
        "aisp-in-out",
        "cuda:0",
        512 * 2**20,
        LeaseKind.GPU,
        AffinityPolicy.FAIL,
    )
    assert InferenceOptions(gpu_affinity="http://h:1").affinity().kind is LeaseKind.CPU
    with pytest.raises(ConfigError, match=r"the service picks the GPU: use --device cuda "):
        InferenceOptions(gpu_affinity="http://127.0.0.1:7420", device="cuda:1")
    with pytest.raises(ConfigError, match="must start with http:// or https://"):
        InferenceOptions(gpu_affinity="127.0.0.1:7420")
    assert InferenceOptions().affinity() is None


class _ExpiringClient:
    """Renew always finds the lease expired; acquire offers ``device``."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.released: list[str] = []
        self.acquired = 0

    def renew(self, lease_id: str, ttl_s: float) -> Lease:
        raise LeaseNotFoundError(f"lease {lease_id} is expired (acquire again)")

    def acquire(self, **kw: object) -> Lease:
        self.acquired += 1
        return _lease(self.device, (0,), lease_id=f"new{self.acquired}")

    def release(self, lease_id: str) -> bool:
        self.released.append(lease_id)
        return True

    def close(self) -> None:
        pass


def _renew_until(worker: WorkerAffinity, done) -> None:
    import time

    worker.start_renewing()
    deadline = time.monotonic() + 30
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    worker._stop.set()


def test_an_expired_lease_is_taken_again_on_the_same_device() -> None:
    old = replace(_lease("GPU-a", (0,), lease_id="old"), ttl_s=0.3)
    worker = WorkerAffinity(lease=old, fallback=False, client=_ExpiringClient("GPU-a"))
    _renew_until(worker, lambda: worker.renewals >= 1)
    assert worker.lease.id.startswith("new") and worker.renew_failures == 0


def test_an_expired_lease_offered_elsewhere_is_given_back_and_counted() -> None:
    client = _ExpiringClient("GPU-b")
    worker = WorkerAffinity(lease=replace(_lease("GPU-a", (0,), lease_id="old"), ttl_s=0.3), fallback=False,
                            client=client)
    _renew_until(worker, lambda: worker.renew_failures >= 1)
    assert worker.lease.id == "old" and client.released[0] == "new1"
