"""Topology discovery with NVML (nvidia-ml-py, imported as ``pynvml``).

Not run by the test suite on hosts without an NVIDIA driver (there,
:func:`discover_nvml` raises :class:`~pyflink_aisp.errors.TopologyError` in one
line and callers use a topology file); ``bench/gpu_affinity_check.py`` runs it on
the GPU host. Calls follow the NVML API reference (docs.nvidia.com/deploy/nvml-api):
optional queries that a device does not support (``NVMLError_NotSupported``)
leave their field at its default instead of failing discovery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from pyflink_aisp.affinity._topology import (
    Gpu,
    MigInstance,
    NumaNode,
    Peer,
    Topology,
    host_numa_nodes,
    hostname,
)
from pyflink_aisp.errors import TopologyError

__all__ = ["discover", "discover_nvml"]

#: NVML topology levels (``nvmlGpuTopologyLevel_t``) → our link names.
_LEVELS = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}


def _opt(call: Callable[[], Any], default: Any) -> Any:
    """``call()``, or ``default`` when the device does not support the query."""
    import pynvml

    try:
        return call()
    except pynvml.NVMLError:
        return default


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cpu_affinity(nv: Any, handle: Any, ncpus: int) -> tuple[int, ...]:
    words = max(1, (ncpus + 63) // 64)
    masks = _opt(lambda: nv.nvmlDeviceGetCpuAffinity(handle, words), [])
    return tuple(w * 64 + b for w, mask in enumerate(masks) for b in range(64) if int(mask) >> b & 1)


def _numa_node(nv: Any, handle: Any, bus_id: str) -> int | None:
    node = _opt(lambda: int(nv.nvmlDeviceGetNumaNodeId(handle)), None)
    if node is not None and node >= 0:
        return node
    # sysfs names PCI devices with a 4-hex-digit domain; NVML's bus id has 8.
    domain, _, rest = bus_id.lower().partition(":")
    try:
        value = int(Path(f"/sys/bus/pci/devices/{domain[-4:]}:{rest}/numa_node").read_text())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _mig_instances(nv: Any, handle: Any) -> tuple[bool, tuple[MigInstance, ...]]:
    current = _opt(lambda: nv.nvmlDeviceGetMigMode(handle)[0], 0)
    if current != 1:  # NVML_DEVICE_MIG_ENABLE
        return False, ()
    instances = []
    for i in range(_opt(lambda: int(nv.nvmlDeviceGetMaxMigDeviceCount(handle)), 0)):
        mig = _opt(partial(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i), None)
        if mig is None:
            continue
        instances.append(
            MigInstance(
                uuid=_text(nv.nvmlDeviceGetUUID(mig)),
                index=i,
                memory_total_bytes=int(nv.nvmlDeviceGetMemoryInfo(mig).total),
            )
        )
    return True, tuple(instances)


def _gpu(nv: Any, index: int, handle: Any, peers: tuple[Peer, ...], ncpus: int) -> Gpu:
    memory = nv.nvmlDeviceGetMemoryInfo(handle)
    bus_id = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
    mig_enabled, migs = _mig_instances(nv, handle)
    util = _opt(lambda: int(nv.nvmlDeviceGetUtilizationRates(handle).gpu), None)
    return Gpu(
        uuid=_text(nv.nvmlDeviceGetUUID(handle)),
        index=index,
        name=_text(nv.nvmlDeviceGetName(handle)),
        memory_total_bytes=int(memory.total),
        memory_free_bytes=int(memory.free),
        pci_bus_id=bus_id,
        pcie_max_gen=int(_opt(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(handle), 1)),
        pcie_max_width=int(_opt(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(handle), 16)),
        pcie_current_gen=_opt(lambda: int(nv.nvmlDeviceGetCurrPcieLinkGeneration(handle)), None),
        pcie_current_width=_opt(lambda: int(nv.nvmlDeviceGetCurrPcieLinkWidth(handle)), None),
        numa_node=_numa_node(nv, handle, bus_id),
        utilization_pct=util,
        cpu_affinity=_cpu_affinity(nv, handle, ncpus),
        peers=peers,
        mig_enabled=mig_enabled,
        mig_instances=migs,
    )


def _nvlink_to(nv: Any, handle: Any, link: int, bus_id: str) -> bool:
    """Whether NVLink ``link`` of a GPU is up and ends at the PCI device ``bus_id``."""
    if _opt(partial(nv.nvmlDeviceGetNvLinkState, handle, link), 0) != 1:
        return False
    remote = _opt(partial(nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link), None)
    return remote is not None and _text(remote.busId) == bus_id


def _peers(nv: Any, handles: list[Any], uuids: list[str], i: int) -> tuple[Peer, ...]:
    peers = []
    for j, other in enumerate(handles):
        if j == i:
            continue
        bus = _text(nv.nvmlDeviceGetPciInfo(other).busId)
        nvlink = any(_nvlink_to(nv, handles[i], link, bus) for link in range(18))
        level = _opt(partial(nv.nvmlDeviceGetTopologyCommonAncestor, handles[i], other), 50)
        peers.append(Peer(uuid=uuids[j], link="nvlink" if nvlink else _LEVELS.get(int(level), "system")))
    return tuple(peers)


def _within(gpus: tuple[Gpu, ...], nodes: tuple[NumaNode, ...]) -> tuple[Gpu, ...]:
    """GPUs with their NUMA node and CPU affinity cut to what the OS lists (a node without CPUs,
    e.g. GPU memory exposed as a NUMA node, or CPUs offline, would fail the topology's checks)."""
    ids = {n.id for n in nodes}
    cpus = {c for n in nodes for c in n.cpus}
    return tuple(
        replace(
            g,
            numa_node=g.numa_node if g.numa_node in ids else None,
            cpu_affinity=tuple(c for c in g.cpu_affinity if c in cpus),
        )
        for g in gpus
    )


def discover_nvml() -> Topology:
    """This host's GPUs from NVML, its NUMA nodes from the OS.

    Raises:
        TopologyError: No NVIDIA driver (NVML does not initialise): one line.
    """
    import pynvml as nv

    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise TopologyError(
            f"no NVIDIA driver here (NVML: {exc}); give a topology file (--topology FILE, JSON or YAML)"
        ) from exc
    try:
        nodes = host_numa_nodes()
        ncpus = max(c for n in nodes for c in n.cpus) + 1
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        gpus = tuple(_gpu(nv, i, h, _peers(nv, handles, uuids, i), ncpus) for i, h in enumerate(handles))
        return Topology(host=hostname(), source="nvml", numa_nodes=nodes, gpus=_within(gpus, nodes))
    finally:
        nv.nvmlShutdown()


def discover(topology_file: Path | None = None) -> Topology:
    """The topology file when given, else NVML.

    Raises:
        TopologyError: The file is invalid, or no file and no NVIDIA driver.
    """
    if topology_file is not None:
        from pyflink_aisp.affinity._topology import load_topology

        return load_topology(topology_file)
    return discover_nvml()
