"""Placement on the topology files: expected choices, explanations, refusals (issue 12.2)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pyflink_aisp.affinity import Held, LeaseKind, PlacementRequest, load_topology, place
from pyflink_aisp.errors import PlacementRefusedError, UnknownDeviceError

DATA = Path(__file__).resolve().parents[2] / "data" / "affinity"
GIB = 2**30


@pytest.fixture(scope="module")
def numa2x4():
    return load_topology(DATA / "numa2x4.yaml")


@pytest.fixture(scope="module")
def mig():
    return load_topology(DATA / "mig.json")


@pytest.fixture(scope="module")
def full():
    return load_topology(DATA / "full_gpu.yaml")


def _req(subtask: int = 0, mem: int = 8 * GIB, **kw) -> PlacementRequest:
    return PlacementRequest(job="j", operator="score", subtask=subtask, mem_bytes=mem, **kw)


def _place_all(topology, n: int, mem: int = 8 * GIB) -> list[int]:
    held: list[Held] = []
    chosen = []
    for s in range(n):
        c = place(topology, _req(s, mem), held).chosen
        held.append(Held(device=c.id, parent=c.parent, mem_bytes=mem, job="j", operator="score"))
        chosen.append(c.gpu_index)
    return chosen


def test_a_worker_on_numa_node_1_gets_a_wide_gpu_of_node_1(numa2x4) -> None:
    p = place(numa2x4, _req(worker_numa_node=1), [])
    assert p.chosen.gpu_index == 4  # GPUs 4 and 5 tie (node 1, gen5 x16): the lower index
    assert p.chosen.cpus == tuple(range(16, 32))
    by_device = {s.device: s for s in p.scored}
    remote = by_device[numa2x4.gpus[0].uuid]
    assert remote.terms["numa"] == pytest.approx(1.1)  # SLIT 21 → (21 - 10) / 10
    assert remote.cost == pytest.approx(4 * 1.1 + 0.1)
    narrow = by_device[numa2x4.gpus[7].uuid]  # gen4 x8 = a quarter of gen5 x16
    assert narrow.terms["pcie"] == pytest.approx(0.75)
    assert p.reason.startswith(f"{numa2x4.gpus[4].uuid} has the lowest cost 0.1")
    assert f"next {numa2x4.gpus[5].uuid} at 0.1" in p.reason


def test_one_operators_subtasks_spread_over_all_gpus_widest_links_first(numa2x4) -> None:
    # gen5 x16 (0, 1, 4, 5), then gen5 x8 / gen4 x16 at half the bandwidth (2, 6, 3), then gen4 x8 (7);
    # only then does a GPU get a second subtask of the operator (spread costs 2 per subtask already there).
    assert _place_all(numa2x4, 9) == [0, 1, 4, 5, 2, 3, 6, 7, 0]


def test_a_mig_gpu_is_leased_by_instance_never_whole(mig) -> None:
    p = place(mig, _req(mem=8 * GIB), [])
    assert p.chosen.id == mig.gpus[1].uuid  # the full GPU: memory 0.1 against 0.2 on the 40 GiB instance
    assert "MIG enabled, only its instances are leased" in p.reason
    assert mig.gpus[0].uuid not in {s.device for s in p.scored}
    held = [Held(device=p.chosen.id, parent=p.chosen.parent, mem_bytes=8 * GIB, job="j", operator="score")]
    second = place(mig, _req(1, 8 * GIB), held)
    assert (second.chosen.id, second.chosen.mig_index) == ("MIG-33333333-0000-0000-0000-000000000000", 2)
    assert second.chosen.parent == mig.gpus[0].uuid


def test_a_request_larger_than_a_mig_slice_rejects_it_with_the_reason(mig) -> None:
    p = place(mig, _req(mem=12 * GIB, gpu="MIG-33333333-0000-0000-0000-000000000000"), [])
    assert p.chosen.id == "MIG-33333333-0000-0000-0000-000000000000"
    with pytest.raises(PlacementRefusedError) as info:
        place(mig, _req(mem=12 * GIB, gpu="MIG-11111111-0000-0000-0000-000000000000"), [])
    verdicts = {v["device"]: v["rejected"] for v in info.value.explanation}
    assert verdicts["MIG-11111111-0000-0000-0000-000000000000"] == (
        f"would over-commit memory: needs {12 * GIB} B, {10 * GIB} B left of {10 * GIB} B (0 B leased)"
    )
    assert verdicts[mig.gpus[1].uuid] == "not the requested device MIG-11111111-0000-0000-0000-000000000000"


def test_a_full_gpu_is_rejected_and_the_other_chosen(full) -> None:
    p = place(full, _req(mem=2 * GIB), [])
    assert p.chosen.gpu_index == 1
    rejected = {s.device: s.rejected for s in p.scored if s.rejected}
    assert rejected == {
        full.gpus[0].uuid: f"would over-commit memory: needs {2 * GIB} B, {512 * 2**20} B "
        f"left of {512 * 2**20} B (0 B leased)"
    }
    assert p.reason.endswith("; 1 rejected")


def test_nothing_fits_refuses_with_every_candidates_reason(full) -> None:
    with pytest.raises(PlacementRefusedError, match="no gpu device on gpu-host-full can take") as info:
        place(full, _req(mem=41 * GIB), [])
    assert [v["device"] for v in info.value.explanation] == [g.uuid for g in full.gpus]
    assert all(v["rejected"].startswith("would over-commit memory") for v in info.value.explanation)


def test_memory_is_never_over_committed_by_earlier_leases(full) -> None:
    held = [
        Held(device=full.gpus[1].uuid, parent=full.gpus[1].uuid, mem_bytes=35 * GIB, job="o", operator="x")
    ]
    with pytest.raises(
        PlacementRefusedError, match=r"5368709120 B left of 42949672960 B \(37580963840 B leased\)"
    ):
        place(full, _req(mem=6 * GIB), held)
    assert place(full, _req(mem=5 * GIB), held).chosen.gpu_index == 1  # exactly the rest fits


def test_unknown_device_is_its_own_error(numa2x4) -> None:
    with pytest.raises(UnknownDeviceError, match="unknown gpu device 'GPU-nope' on gpu-host-a"):
        place(numa2x4, _req(gpu="GPU-nope"), [])
    assert place(numa2x4, _req(gpu="6"), []).chosen.gpu_index == 6  # an index names a whole GPU


def test_the_same_state_gives_the_same_answer_whatever_the_order(numa2x4) -> None:
    held = [
        Held(device=g.uuid, parent=g.uuid, mem_bytes=GIB * (i + 1), job="o", operator=f"op{i % 2}")
        for i, g in enumerate(numa2x4.gpus[:6])
    ]
    first = place(numa2x4, _req(3), held)
    for seed in range(5):
        shuffled = held[:]
        random.Random(seed).shuffle(shuffled)
        again = place(numa2x4, _req(3), shuffled)
        assert (again.chosen, again.scored, again.reason) == (first.chosen, first.scored, first.reason)


def test_cpu_leases_spread_over_numa_nodes(numa2x4) -> None:
    a = place(numa2x4, _req(0, 0, kind=LeaseKind.CPU), [])
    held = [Held(device=a.chosen.id, parent=a.chosen.parent, mem_bytes=0, job="j", operator="score")]
    b = place(numa2x4, _req(1, 0, kind=LeaseKind.CPU), held)
    assert (a.chosen.id, b.chosen.id) == ("numa:0", "numa:1")
    assert b.chosen.cpus == tuple(range(16, 32))
    assert {s.device: s.terms for s in b.scored}["numa:0"] == {"numa": 0.0, "spread": 1.0, "load": 2 / 16}
