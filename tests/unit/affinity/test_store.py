"""The SQLite lease store: TTL, idempotency, release, persistence, concurrent acquirers (issue 12.3)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from pyflink_aisp.affinity import LeaseKind, LeaseState, LeaseStore, PlacementRequest, load_topology
from pyflink_aisp.errors import ConfigError, LeaseNotFoundError, PlacementRefusedError

DATA = Path(__file__).resolve().parents[2] / "data" / "affinity"
GIB = 2**30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _req(subtask: int, mem: int = 8 * GIB, job: str = "j") -> PlacementRequest:
    return PlacementRequest(job=job, operator="score", subtask=subtask, mem_bytes=mem)


@pytest.fixture
def store(tmp_path: Path):
    clock = Clock()
    s = LeaseStore(
        tmp_path / "leases.db", load_topology(DATA / "full_gpu.yaml"), clock=clock, default_ttl_s=10
    )
    s.clock_ = clock
    yield s
    s.close()


def test_acquire_is_idempotent_per_subtask_and_moves_the_expiry(store) -> None:
    first, created = store.acquire(_req(0))
    store.clock_.now += 4
    again, created_again = store.acquire(_req(0))
    assert (created, created_again) == (True, False)
    assert again.id == first.id and again.device == first.device
    assert (first.expires_at, again.expires_at) == (1010.0, 1014.0)
    assert store.acquire(_req(1))[0].id != first.id


def test_ttl_expiry_frees_the_memory_and_a_late_renew_is_refused(store) -> None:
    lease, _ = store.acquire(_req(0, mem=40 * GIB))  # all of GPU 1
    with pytest.raises(PlacementRefusedError):
        store.acquire(_req(1, mem=GIB))
    store.clock_.now += 9.999
    assert store.renew(lease.id).expires_at == pytest.approx(1019.999)
    store.clock_.now += 10  # past the renewed expiry
    assert store.get(lease.id).state is LeaseState.EXPIRED
    with pytest.raises(LeaseNotFoundError, match=f"lease {lease.id} is expired"):
        store.renew(lease.id)
    other, created = store.acquire(_req(1, mem=GIB))
    assert created and other.device == lease.device
    assert store.counts() == {"active": 1, "released": 0, "expired": 1}


def test_release_ends_the_lease_once(store) -> None:
    lease, _ = store.acquire(_req(0))
    store.clock_.now += 1
    released = store.release(lease.id)
    assert (released.state, released.released_at) == (LeaseState.RELEASED, 1001.0)
    with pytest.raises(LeaseNotFoundError, match="is released"):
        store.release(lease.id)
    with pytest.raises(LeaseNotFoundError, match="no lease nope"):
        store.renew("nope")
    assert store.acquire(_req(0))[0].id != lease.id  # the subtask gets a new lease after a release


def test_ttl_is_capped_and_must_be_positive(store) -> None:
    assert store.acquire(_req(0), ttl_s=1e9)[0].ttl_s == store.max_ttl_s
    with pytest.raises(ConfigError, match="ttl_s must be > 0"):
        store.acquire(_req(1), ttl_s=-1)


def test_leases_survive_reopening_the_file(tmp_path: Path) -> None:
    topology = load_topology(DATA / "numa2x4.yaml")
    a = LeaseStore(tmp_path / "l.db", topology)
    leases = [a.acquire(_req(s))[0] for s in range(5)]
    a.release(leases[0].id)
    a.close()
    b = LeaseStore(tmp_path / "l.db", topology)
    assert [x.id for x in b.leases(LeaseState.ACTIVE)] == [x.id for x in leases[1:]]
    assert b.get(leases[2].id) == leases[2]


def test_200_threads_acquiring_at_once_never_over_commit(tmp_path: Path) -> None:
    """GPU 1 holds 40 GiB and GPU 0 is full: 200 subtasks asking 1 GiB each → exactly 40 served."""
    store = LeaseStore(tmp_path / "l.db", load_topology(DATA / "full_gpu.yaml"))
    start = threading.Barrier(200)
    served: list[str] = []
    refused: list[str] = []

    def worker(i: int) -> None:
        start.wait()
        try:
            served.append(store.acquire(_req(i, GIB, job=f"job{i % 7}"))[0].device)
        except PlacementRefusedError as exc:
            refused.append(str(exc))
        finally:
            store.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(served), len(refused)) == (40, 160)
    assert Counter(served) == {load_topology(DATA / "full_gpu.yaml").gpus[1].uuid: 40}
    assert all("would over-commit memory" in r for r in refused)
    assert store.committed_bytes() == {served[0]: 40 * GIB}


def test_cpu_leases_carry_no_gpu(store) -> None:
    lease, _ = store.acquire(PlacementRequest(job="j", operator="o", subtask=0, kind=LeaseKind.CPU))
    assert (lease.device, lease.gpu_uuid, lease.cuda_visible_devices, lease.cpus) == (
        "numa:0",
        None,
        "",
        (0, 1, 2, 3),
    )
