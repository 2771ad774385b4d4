"""The lease's device against the device the model actually runs on (issue 23.4): the pure check and
the operator shell that refuses a mismatch and gives back what it took."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pyflink_aisp.affinity import LeaseKind, LeaseState, check_lease_device
from pyflink_aisp.affinity._store import Lease
from pyflink_aisp.errors import AffinityError
from pyflink_aisp.inference import BatchingConfig, ModelHandler, ModelRuntime
from pyflink_aisp.pipeline._shell import OperatorShell, WorkerSpec

GPU_A = "GPU-8c2f0a41-1111-2222-3333-444444444444"
GPU_B = "GPU-0d9e7b52-5555-6666-7777-888888888888"
MIG = "MIG-33333333-0000-0000-0000-000000000000"


def _lease(device: str, kind: LeaseKind = LeaseKind.GPU, *, gpu_uuid: str | None = GPU_A) -> Lease:
    return Lease(id="lease-1", job="j", operator="o", subtask=0, host="h", kind=kind, device=device,
                 gpu_uuid=gpu_uuid if kind is LeaseKind.GPU else None, gpu_index=0,
                 mig=device.startswith("MIG-"), numa_node=0, cpus=(0,), mem_bytes=2**30, ttl_s=30,
                 acquired_at=0, expires_at=30, released_at=None, state=LeaseState.ACTIVE, reason="")


# -- the pure check ----------------------------------------------------------------------


@pytest.mark.parametrize("uuid", [GPU_A, GPU_A.lower(), GPU_A.upper(), GPU_A.removeprefix("GPU-")])
def test_the_leased_gpu_passes_however_its_uuid_is_spelled(uuid: str) -> None:
    check_lease_device(_lease(GPU_A), uuid)


def test_a_mig_lease_passes_on_its_instance() -> None:
    check_lease_device(_lease(MIG), MIG)


def test_a_model_on_another_gpu_is_refused_naming_both() -> None:
    with pytest.raises(AffinityError) as info:
        check_lease_device(_lease(GPU_A), GPU_B)
    message = str(info.value)
    assert GPU_A in message and GPU_B in message and "lease-1" in message
    assert "CUDA_VISIBLE_DEVICES" in message


def test_a_mig_lease_refuses_its_whole_parent_gpu() -> None:
    """All devices visible (the lease did not apply): the model runs on the parent GPU, not the instance."""
    with pytest.raises(AffinityError, match=f"MIG instance {MIG}, but the model runs on {GPU_A}"):
        check_lease_device(_lease(MIG), GPU_A)


def test_a_model_on_the_cpu_holds_no_device_and_passes() -> None:
    check_lease_device(_lease(GPU_A), None)
    check_lease_device(_lease("numa:0", LeaseKind.CPU), None)


def test_a_cpu_lease_refuses_a_model_on_a_gpu() -> None:
    with pytest.raises(AffinityError, match=f"holds no GPU .numa:0., but the model runs on GPU {GPU_A}"):
        check_lease_device(_lease("numa:0", LeaseKind.CPU), GPU_A)


# -- the operator shell ------------------------------------------------------------------


class OnDevice(ModelHandler[str, int, str]):
    """A model that says it runs on ``uuid`` (None: on the CPU)."""

    def __init__(self, uuid: str | None) -> None:
        self.uuid = uuid

    def load_model(self) -> str:
        return "model"

    def run_inference(self, batch: Sequence[str], model: str, inference_args: Any = None) -> list[int]:
        return [len(text) for text in batch]

    def model_version(self) -> str:
        return "v" * 64

    def device_uuid(self, model: str) -> str | None:
        assert model == "model"  # asked of the loaded model
        return self.uuid


class HeldLease:
    """What open_affinity hands back, reduced to what the shell uses."""

    def __init__(self, lease: Lease, events: list[str]) -> None:
        self.lease = lease
        self.events = events

    def bind_metrics(self, group: Any) -> None:
        pass

    def close(self) -> None:
        self.events.append("lease released")


class Context:
    def get_task_name(self) -> str:
        return "scores"

    def get_index_of_this_subtask(self) -> int:
        return 0

    def get_metric_group(self) -> Any:
        raise RuntimeError("Metric has not been enabled")


def _shell(uuid: str | None, lease: Lease, events: list[str]) -> OperatorShell:
    spec = WorkerSpec.of(OnDevice(uuid), batching=BatchingConfig(max_batch_size=4, max_wait_ms=1))
    return OperatorShell(spec, counters=("recordsIn",), open_lease=lambda settings, context: HeldLease(
        lease, events))


def test_the_shell_opens_when_the_model_runs_on_the_leased_gpu() -> None:
    events: list[str] = []
    shell = _shell(GPU_A.lower(), _lease(GPU_A), events)
    runtime = shell.open(Context())
    try:
        assert [r.prediction for r in runtime.infer_batch(["ab", "c"])] == [2, 1]  # type: ignore[union-attr]
        assert events == []
    finally:
        shell.close()
    assert events == ["lease released"]


def test_the_shell_refuses_a_model_on_another_gpu_and_releases_model_and_lease() -> None:
    events: list[str] = []
    shell = _shell(GPU_B, _lease(GPU_A), events)
    with pytest.raises(AffinityError, match=f"{GPU_A}, but the model runs on {GPU_B}"):
        shell.open(Context())
    assert events == ["lease released"]
    assert shell.runtime is None and shell.affinity is None
    assert not [r for r in ModelRuntime._registry.values() if isinstance(r.handler, OnDevice)]


def test_the_shell_skips_the_check_for_a_model_on_the_cpu() -> None:
    events: list[str] = []
    shell = _shell(None, _lease(GPU_A), events)
    shell.open(Context())
    shell.close()
    assert events == ["lease released"]
