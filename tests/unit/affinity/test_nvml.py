"""NVML discovery against a fake ``pynvml`` (this host has no driver; the GPU host runs the real one)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from pyflink_aisp.affinity import discover_nvml, host_numa_nodes
from pyflink_aisp.errors import TopologyError

GIB = 2**30


class NVMLError(Exception):
    pass


def _fake_nvml(*, init_fails: bool = False) -> types.ModuleType:
    """Two GPUs: 0 plain (NUMA node 0), 1 with MIG on (two instances, NUMA node 7, unknown to the OS)."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    gpus = [
        SimpleNamespace(uuid=b"GPU-0", numa=0, mig=0, bus=b"00000000:18:00.0"),
        SimpleNamespace(uuid="GPU-1", numa=7, mig=1, bus=b"00000000:9A:00.0"),
    ]
    migs = {
        ("GPU-1", 0): SimpleNamespace(uuid="MIG-a", total=10 * GIB),
        ("GPU-1", 1): SimpleNamespace(uuid="MIG-b", total=20 * GIB),
    }

    def unsupported(*_: object) -> None:
        raise NVMLError("Not Supported")

    def init() -> None:
        if init_fails:
            raise NVMLError("NVML Shared Library Not Found")

    def mig_handle(h, i):
        if (h.uuid, i) not in migs:
            raise NVMLError("Not Found")
        return migs[(h.uuid, i)]

    def memory(h):
        total = getattr(h, "total", 80 * GIB)
        return SimpleNamespace(total=total, free=total - GIB)

    def utilisation(h):
        if h.mig:
            raise NVMLError("Not Supported")
        return SimpleNamespace(gpu=37)

    nv.__dict__.update(
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetUUID=lambda h: h.uuid,
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=h.bus),
        nvmlDeviceGetMigMode=lambda h: (h.mig, h.mig),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetUtilizationRates=utilisation,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 1,
        nvmlDeviceGetCurrPcieLinkWidth=unsupported,
        nvmlDeviceGetNumaNodeId=lambda h: h.numa,
        nvmlDeviceGetCpuAffinity=lambda h, words: [0b11] + [0] * (words - 1),
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 20,
        nvmlDeviceGetNvLinkState=unsupported,
    )
    return nv


def test_discovery_reads_gpus_mig_instances_links_and_affinity(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    t = discover_nvml()
    assert t.source == "nvml" and t.numa_nodes == host_numa_nodes()
    g0, g1 = t.gpus
    host_cpus = set(t.cpus)
    assert (g0.uuid, g0.name, g0.pci_bus_id, g0.memory_total_bytes, g0.memory_free_bytes) == (
        "GPU-0",
        "NVIDIA H200",
        "00000000:18:00.0",
        80 * GIB,
        79 * GIB,
    )
    assert (g0.pcie_max_gen, g0.pcie_max_width, g0.pcie_current_gen, g0.pcie_current_width) == (
        5,
        16,
        1,
        None,
    )
    assert (g0.utilization_pct, g0.numa_node, g0.mig_enabled, g0.mig_instances) == (37, 0, False, ())
    assert g0.cpu_affinity == tuple(c for c in (0, 1) if c in host_cpus)
    assert [(p.uuid, p.link) for p in g0.peers] == [("GPU-1", "multiple")]
    assert g1.numa_node is None  # node 7 has no CPUs the OS lists: dropped, not a failed discovery
    assert (g1.mig_enabled, g1.utilization_pct) == (True, None)
    assert [(m.uuid, m.index, m.memory_total_bytes) for m in g1.mig_instances] == [
        ("MIG-a", 0, 10 * GIB),
        ("MIG-b", 1, 20 * GIB),
    ]


def test_no_driver_is_one_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(init_fails=True))
    with pytest.raises(
        TopologyError, match=r"^no NVIDIA driver here \(NVML: NVML Shared Library Not Found\)"
    ):
        discover_nvml()
