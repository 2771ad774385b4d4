"""Host topology: GPUs (NVML or a topology file), MIG instances, NUMA nodes and CPUs.

One schema serves both sources: :func:`discover` reads NVML (nvidia-ml-py) when a
driver answers, :func:`load_topology` reads a JSON or YAML file of the same
shape (what ``aisp affinity topology --json`` prints), so the service runs and is
tested on hosts without a GPU. A file is validated field by field (pydantic over
these dataclasses) and then as a whole (:meth:`Topology.__post_init__`); any
problem is one :class:`~pyflink_aisp.errors.TopologyError` line naming the field.

Host CPUs and NUMA nodes come from the OS (``/sys/devices/system/node``: psutil
has no NUMA view; one node of all online CPUs when sysfs has none) unless the
file gives ``numa_nodes``. NVML sources: ``nvmlDeviceGetNumaNodeId`` (else the
PCI device's ``numa_node`` in sysfs), ``nvmlDeviceGetCpuAffinity``,
``nvmlDeviceGetTopologyCommonAncestor`` for peer links, ``nvmlDeviceGetMigMode``
and ``nvmlDeviceGetMigDeviceHandleByIndex`` for MIG (NVML API reference,
docs.nvidia.com/deploy/nvml-api).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from pyflink_aisp.errors import TopologyError

__all__ = [
    "Gpu",
    "MigInstance",
    "NumaNode",
    "Peer",
    "Topology",
    "host_numa_nodes",
    "hostname",
    "load_topology",
    "parse_cpulist",
    "topology_from_dict",
]

#: pydantic config of the dataclasses (a plain dict: pydantic is imported only to validate a file)
_STRICT: dict[str, Any] = {"extra": "forbid"}
#: Peer link levels, nearest first (NVML ``nvmlGpuTopologyLevel_t`` names, plus NVLink).
LINK_LEVELS = ("nvlink", "internal", "single", "multiple", "hostbridge", "node", "system")


@dataclass(frozen=True, kw_only=True)
class NumaNode:
    """One NUMA node: its id, online CPUs and SLIT distances (10 = local) to every node, by id order."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    id: int
    cpus: tuple[int, ...]
    distances: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.id < 0 or any(c < 0 for c in self.cpus):
            raise TopologyError(f"numa node {self.id}: ids and cpus must be >= 0")


@dataclass(frozen=True, kw_only=True)
class MigInstance:
    """A MIG instance of a GPU (its own UUID, ``MIG-...``, and memory)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    uuid: str
    index: int
    memory_total_bytes: int

    def __post_init__(self) -> None:
        if not self.uuid or self.index < 0 or self.memory_total_bytes <= 0:
            raise TopologyError(f"mig instance {self.uuid!r}: needs a uuid, index >= 0, memory > 0")


@dataclass(frozen=True, kw_only=True)
class Peer:
    """Another GPU and the closest common link to it (``LINK_LEVELS``)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    uuid: str
    link: str

    def __post_init__(self) -> None:
        if self.link not in LINK_LEVELS:
            raise TopologyError(
                f"peer {self.uuid}: link must be one of {', '.join(LINK_LEVELS)}, got {self.link!r}"
            )


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One physical GPU as NVML reports it (memory in bytes, PCIe width in lanes)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    uuid: str
    index: int
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    pci_bus_id: str
    pcie_max_gen: int
    pcie_max_width: int
    pcie_current_gen: int | None = None
    pcie_current_width: int | None = None
    numa_node: int | None = None
    utilization_pct: int | None = None
    cpu_affinity: tuple[int, ...] = ()
    peers: tuple[Peer, ...] = ()
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()

    def __post_init__(self) -> None:
        where = f"gpu {self.index} ({self.uuid})"
        if not self.uuid or self.index < 0:
            raise TopologyError(f"{where}: needs a uuid and an index >= 0")
        if not 0 < self.memory_total_bytes or not 0 <= self.memory_free_bytes <= self.memory_total_bytes:
            raise TopologyError(f"{where}: memory_total_bytes must be > 0 and 0 <= memory_free_bytes <= it")
        if not 1 <= self.pcie_max_gen <= 7 or self.pcie_max_width not in (1, 2, 4, 8, 16, 32):
            raise TopologyError(
                f"{where}: pcie_max_gen must be 1..7 and pcie_max_width one of "
                f"1, 2, 4, 8, 16, 32, got {self.pcie_max_gen} x{self.pcie_max_width}"
            )
        if self.mig_instances and not self.mig_enabled:
            raise TopologyError(f"{where}: mig_instances given but mig_enabled is false")
        if sum(m.memory_total_bytes for m in self.mig_instances) > self.memory_total_bytes:
            raise TopologyError(f"{where}: its MIG instances hold more memory than the GPU")
        if self.utilization_pct is not None and not 0 <= self.utilization_pct <= 100:
            raise TopologyError(f"{where}: utilization_pct must be within 0..100")

    @property
    def link_gbps(self) -> float:
        """Unidirectional PCIe bandwidth of the maximal link, GB/s (PCI-SIG per-lane
        rates after encoding: gen1 0.25, gen2 0.5, gen3 0.985, gen4 1.969, gen5 3.938,
        gen6 7.563, gen7 15.125 GB/s)."""
        return _LANE_GBPS[self.pcie_max_gen] * self.pcie_max_width


_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563, 7: 15.125}


@dataclass(frozen=True, kw_only=True)
class Topology:
    """A host: its NUMA nodes (CPUs) and GPUs; ``source`` is ``nvml`` or the file it came from."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    host: str
    source: str = "file"
    numa_nodes: tuple[NumaNode, ...] = ()
    gpus: tuple[Gpu, ...] = ()

    def __post_init__(self) -> None:
        nodes = {n.id for n in self.numa_nodes}
        if not self.numa_nodes or len(nodes) != len(self.numa_nodes):
            raise TopologyError("numa_nodes: at least one, with distinct ids")
        for n in self.numa_nodes:
            if n.distances and len(n.distances) != len(nodes):
                raise TopologyError(
                    f"numa node {n.id}: distances must have one entry per node ({len(nodes)})"
                )
        cpus = self.cpus
        uuids = [g.uuid for g in self.gpus] + [m.uuid for g in self.gpus for m in g.mig_instances]
        if len(set(uuids)) != len(uuids) or len({g.index for g in self.gpus}) != len(self.gpus):
            raise TopologyError("gpus: uuids (MIG instances included) and indices must be distinct")
        for g in self.gpus:
            if g.numa_node is not None and g.numa_node not in nodes:
                raise TopologyError(
                    f"gpu {g.index}: numa_node {g.numa_node} is not among numa_nodes {sorted(nodes)}"
                )
            if not set(g.cpu_affinity) <= set(cpus):
                raise TopologyError(
                    f"gpu {g.index}: cpu_affinity has CPUs the host lacks: "
                    f"{sorted(set(g.cpu_affinity) - set(cpus))}"
                )

    @property
    def cpus(self) -> tuple[int, ...]:
        """Every CPU of the host, ascending."""
        return tuple(sorted({c for n in self.numa_nodes for c in n.cpus}))

    def node(self, node_id: int) -> NumaNode:
        """The NUMA node of that id (KeyError if none)."""
        for n in self.numa_nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def numa_distance(self, a: int, b: int) -> int:
        """SLIT distance between two nodes (10 local; 20 remote when the topology gives none)."""
        order = sorted(n.id for n in self.numa_nodes)
        distances = self.node(a).distances
        if distances:
            return distances[order.index(b)]
        return 10 if a == b else 20

    def gpu_cpus(self, gpu: Gpu) -> tuple[int, ...]:
        """CPUs near a GPU: NVML's CPU affinity, else its NUMA node's CPUs, else all."""
        if gpu.cpu_affinity:
            return tuple(sorted(gpu.cpu_affinity))
        if gpu.numa_node is not None:
            return tuple(sorted(self.node(gpu.numa_node).cpus))
        return self.cpus

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (the topology file schema)."""
        return asdict(self)


def topology_from_dict(data: Any, *, where: str = "topology") -> Topology:
    """Validate a parsed topology document.

    Raises:
        TopologyError: One line: the first bad field (``gpus.1.pcie_max_width: ...``) or rule.
    """
    from pydantic import TypeAdapter, ValidationError

    if isinstance(data, dict) and "numa_nodes" not in data:
        data = {**data, "numa_nodes": [asdict(n) for n in host_numa_nodes()]}
    try:
        return TypeAdapter(Topology).validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise TopologyError(f"{where}: {loc}: {first['msg']} ({exc.error_count()} problem(s))") from exc
    except TopologyError as exc:
        raise TopologyError(f"{where}: {exc}") from exc


def load_topology(path: Path) -> Topology:
    """A topology file (``.json``, ``.yaml`` / ``.yml``); ``numa_nodes`` default to this host's.

    Raises:
        TopologyError: Unreadable, not JSON/YAML, or invalid (one line naming the field).
    """
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise TopologyError(f"cannot read topology file {path}: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise TopologyError(f"topology file {path}: expected a mapping with host, numa_nodes, gpus")
    data.setdefault("source", str(path))
    return topology_from_dict(data, where=str(path))


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Linux cpulist syntax (``0-3,8,10-11``) → CPU ids, ascending.

    Raises:
        ValueError: Not a cpulist.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(cpus))


def host_numa_nodes(sys_root: Path = Path("/sys/devices/system/node")) -> tuple[NumaNode, ...]:
    """This host's NUMA nodes from sysfs (one node of the online CPUs when sysfs has no nodes)."""
    nodes = []
    for d in sorted(sys_root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            cpus = parse_cpulist((d / "cpulist").read_text())
            distances = tuple(int(x) for x in (d / "distance").read_text().split())
        except (OSError, ValueError):
            continue
        if cpus:
            nodes.append(NumaNode(id=int(d.name[4:]), cpus=cpus, distances=distances))
    if nodes and all(len(n.distances) == len(nodes) for n in nodes):
        return tuple(nodes)
    if nodes:
        return tuple(NumaNode(id=n.id, cpus=n.cpus) for n in nodes)
    return (NumaNode(id=0, cpus=online_cpus()),)


def online_cpus(path: Path = Path("/sys/devices/system/cpu/online")) -> tuple[int, ...]:
    """The host's online CPUs (sysfs; ``range(os.cpu_count())`` when it cannot be read)."""
    try:
        return parse_cpulist(path.read_text())
    except (OSError, ValueError):
        return tuple(range(os.cpu_count() or 1))


def hostname() -> str:
    """This host's name (the ``host`` of a discovered topology)."""
    return socket.gethostname()
