"""Placement: which GPU, MIG instance or NUMA node a subtask gets, and why.

Candidates. A GPU request (``kind=gpu``) may get a whole GPU whose MIG mode is off,
or one MIG instance of a GPU whose MIG mode is on (never the MIG-enabled GPU
whole). A CPU request (``kind=cpu``, ``--device cpu``) gets a NUMA node's CPUs.

Capacity and rejection. A whole GPU offers the memory NVML reported free at
discovery (``memory_free_bytes``: memory other processes hold is not offered);
a MIG instance its own memory. A candidate is rejected when the live leases on it
plus the request exceed that (memory is never over-committed), when the request
names another device, or when it is a MIG-enabled GPU. No fitting candidate:
:class:`~pyflink_aisp.errors.PlacementRefusedError` with every candidate's reason.

Cost of a fitting candidate (dimensionless; lower is better)::

    cost = 4.0 * numa + 2.0 * spread + 1.0 * pcie + 1.0 * memory + 1.0 * load

- ``numa``: (SLIT distance(worker's NUMA node, device's node) - 10) / 10: 0 on the
  worker's node, 1.0 at distance 20 (remote socket), 1.1 at 21; 0 when the request
  gives no worker node or the device has none. Weighted most: a remote NUMA node
  costs every host-to-device copy a socket hop (the issue's first criterion).
- ``spread``: live leases of the same (job, operator) on the same physical device
  (a MIG instance counts for its GPU; a NUMA node for CPU leases), a count: one
  operator's subtasks spread over devices before they double up.
- ``pcie`` (GPU): 1 - (link GB/s / (k + 1)) / (largest link GB/s on the host), k
  the live leases on the same physical GPU: the share of the best link's bandwidth
  this subtask would not get (PCIe max generation x width, PCI-SIG lane rates).
- ``memory`` (GPU): (committed bytes + requested bytes) / capacity bytes, in (0, 1]:
  memory pressure after placing.
- ``load`` (CPU): (live CPU leases on the node + 1) / CPUs of the node.

Ties (equal cost rounded to 1e-9) go to the lower GPU index (NUMA node id), then
the lower MIG instance index: the same state and request always give the same
answer. The answer lists each candidate's terms, cost or rejection reason.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyflink_aisp.affinity._topology import Topology
from pyflink_aisp.errors import ConfigError, PlacementRefusedError, UnknownDeviceError

__all__ = [
    "WEIGHTS",
    "Candidate",
    "Held",
    "LeaseKind",
    "Placement",
    "PlacementRequest",
    "Scored",
    "candidates",
    "place",
]

#: Weight of each cost term (see the module docstring).
WEIGHTS = {"numa": 4.0, "spread": 2.0, "pcie": 1.0, "memory": 1.0, "load": 1.0}


class LeaseKind(enum.StrEnum):
    """What a lease holds: a GPU (or MIG instance) and its CPUs, or a NUMA node's CPUs only."""

    GPU = "gpu"
    CPU = "cpu"


@dataclass(frozen=True, kw_only=True)
class PlacementRequest:
    """What a subtask asks for.

    Attributes:
        job: Job name. operator: Operator (task) name. subtask: Subtask index (>= 0).
        host: The TaskManager host ("" = this one).
        mem_bytes: GPU memory needed (>= 0; 0 for CPU leases).
        kind: GPU or CPU lease.
        worker_numa_node: NUMA node of the worker's CPUs now, if known (a preference).
        gpu: Require this GPU or MIG instance (uuid, or a GPU index as text); None: any.
    """

    job: str
    operator: str
    subtask: int
    host: str = ""
    mem_bytes: int = 0
    kind: LeaseKind = LeaseKind.GPU
    worker_numa_node: int | None = None
    gpu: str | None = None

    def __post_init__(self) -> None:
        if not self.job or not self.operator:
            raise ConfigError("job and operator must be non-empty")
        if self.subtask < 0 or self.mem_bytes < 0:
            raise ConfigError(f"subtask and mem_bytes must be >= 0, got {self.subtask}, {self.mem_bytes}")


@dataclass(frozen=True, kw_only=True)
class Held:
    """A live lease as placement sees it."""

    device: str
    parent: str
    mem_bytes: int
    job: str
    operator: str


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A device that can be leased: a whole GPU, a MIG instance or a NUMA node (``numa:N``)."""

    id: str
    parent: str
    kind: LeaseKind
    gpu_index: int | None
    mig_index: int | None
    numa_node: int | None
    capacity_bytes: int
    link_gbps: float
    cpus: tuple[int, ...]

    @property
    def order(self) -> tuple[int, int]:
        """The tie-break key."""
        first = self.gpu_index if self.gpu_index is not None else self.numa_node or 0
        return first, -1 if self.mig_index is None else self.mig_index


@dataclass(frozen=True, kw_only=True)
class Scored:
    """One candidate's verdict: its cost terms and cost, or why it was rejected."""

    device: str
    terms: dict[str, float] = field(default_factory=dict)
    cost: float | None = None
    rejected: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "terms": self.terms, "cost": self.cost, "rejected": self.rejected}


@dataclass(frozen=True, kw_only=True)
class Placement:
    """The choice and its explanation (every candidate, in tie-break order)."""

    chosen: Candidate
    scored: tuple[Scored, ...]
    reason: str


def candidates(topology: Topology, kind: LeaseKind) -> tuple[Candidate, ...]:
    """Every leasable device of a kind, in tie-break order (MIG-enabled GPUs give their instances)."""
    if kind is LeaseKind.CPU:
        return tuple(
            Candidate(
                id=f"numa:{n.id}",
                parent=f"numa:{n.id}",
                kind=kind,
                gpu_index=None,
                mig_index=None,
                numa_node=n.id,
                capacity_bytes=0,
                link_gbps=0.0,
                cpus=tuple(sorted(n.cpus)),
            )
            for n in sorted(topology.numa_nodes, key=lambda n: n.id)
        )
    out = []
    for g in sorted(topology.gpus, key=lambda g: g.index):
        cpus = topology.gpu_cpus(g)
        if not g.mig_enabled:
            out.append(
                Candidate(
                    id=g.uuid,
                    parent=g.uuid,
                    kind=kind,
                    gpu_index=g.index,
                    mig_index=None,
                    numa_node=g.numa_node,
                    capacity_bytes=g.memory_free_bytes,
                    link_gbps=g.link_gbps,
                    cpus=cpus,
                )
            )
        for m in sorted(g.mig_instances, key=lambda m: m.index):
            out.append(
                Candidate(
                    id=m.uuid,
                    parent=g.uuid,
                    kind=kind,
                    gpu_index=g.index,
                    mig_index=m.index,
                    numa_node=g.numa_node,
                    capacity_bytes=m.memory_total_bytes,
                    link_gbps=g.link_gbps,
                    cpus=cpus,
                )
            )
    return tuple(out)


def _wanted(topology: Topology, request: PlacementRequest, pool: Sequence[Candidate]) -> str | None:
    """The device id a request names, resolved (None: any).

    Raises:
        UnknownDeviceError: The host has no such GPU / MIG instance / node.
    """
    if request.gpu is None:
        return None
    for c in pool:
        if request.gpu in (c.id, str(c.gpu_index) if c.mig_index is None else c.id):
            return c.id
    known = ", ".join(f"{c.gpu_index}={c.id}" if c.gpu_index is not None else c.id for c in pool) or "none"
    raise UnknownDeviceError(
        f"unknown {request.kind.value} device {request.gpu!r} on {topology.host} (known: {known})"
    )


def _terms(
    topology: Topology, c: Candidate, request: PlacementRequest, held: Sequence[Held], best_gbps: float
) -> dict[str, float]:
    same_parent = [h for h in held if h.parent == c.parent]
    spread = sum(1 for h in same_parent if (h.job, h.operator) == (request.job, request.operator))
    numa = 0.0
    if request.worker_numa_node is not None and c.numa_node is not None:
        numa = (topology.numa_distance(request.worker_numa_node, c.numa_node) - 10) / 10
    if c.kind is LeaseKind.CPU:
        return {"numa": numa, "spread": float(spread), "load": (len(same_parent) + 1) / max(1, len(c.cpus))}
    committed = sum(h.mem_bytes for h in held if h.device == c.id)
    return {
        "numa": numa,
        "spread": float(spread),
        "pcie": 1 - (c.link_gbps / (len(same_parent) + 1)) / best_gbps,
        "memory": (committed + request.mem_bytes) / c.capacity_bytes,
    }


def _rejection(
    c: Candidate, request: PlacementRequest, held: Sequence[Held], wanted: str | None
) -> str | None:
    if wanted is not None and c.id != wanted:
        return f"not the requested device {wanted}"
    if c.kind is LeaseKind.CPU:
        return None
    committed = sum(h.mem_bytes for h in held if h.device == c.id)
    free = c.capacity_bytes - committed
    if request.mem_bytes > free:
        return (
            f"would over-commit memory: needs {request.mem_bytes} B, {max(free, 0)} B left of "
            f"{c.capacity_bytes} B ({committed} B leased)"
        )
    return None


def place(topology: Topology, request: PlacementRequest, held: Iterable[Held]) -> Placement:
    """Choose the lowest-cost fitting candidate (see the module docstring).

    Args:
        topology: The host.
        request: The subtask's request.
        held: Live leases on the host (other subtasks' and this one's previous, if any).

    Raises:
        UnknownDeviceError: ``request.gpu`` names no device of the host, or
            ``request.worker_numa_node`` no NUMA node of it.
        PlacementRefusedError: No candidate fits; ``explanation`` holds every verdict.
    """
    nodes = sorted(n.id for n in topology.numa_nodes)
    if request.worker_numa_node is not None and request.worker_numa_node not in nodes:
        raise UnknownDeviceError(
            f"unknown NUMA node {request.worker_numa_node} on {topology.host} (known: {nodes})"
        )
    pool = candidates(topology, request.kind)
    held = list(held)
    wanted = _wanted(topology, request, pool)
    best_gbps = max((c.link_gbps for c in pool), default=1.0) or 1.0
    scored: list[tuple[tuple[float, int, int], Candidate, Scored]] = []
    for c in pool:
        rejected = _rejection(c, request, held, wanted)
        if rejected is not None:
            scored.append(((float("inf"), *c.order), c, Scored(device=c.id, rejected=rejected)))
            continue
        terms = {k: round(v, 9) for k, v in _terms(topology, c, request, held, best_gbps).items()}
        cost = round(sum(WEIGHTS[k] * v for k, v in terms.items()), 9)
        scored.append(((cost, *c.order), c, Scored(device=c.id, terms=terms, cost=cost)))
    scored.sort(key=lambda t: t[0])
    verdicts = tuple(s for _, _, s in scored)
    fitting = [(c, s) for _, c, s in scored if s.rejected is None]
    if not fitting:
        raise PlacementRefusedError(
            f"no {request.kind.value} device on {topology.host} can take {request.mem_bytes} B for "
            f"{request.job}/{request.operator}/{request.subtask}: "
            + ("; ".join(f"{s.device}: {s.rejected}" for s in verdicts) or "the host has none"),
            [s.to_dict() for s in verdicts],
        )
    chosen = fitting[0][0]
    return Placement(chosen=chosen, scored=verdicts, reason=_explain(topology, fitting, len(verdicts)))


def _explain(topology: Topology, fitting: Sequence[tuple[Candidate, Scored]], n_verdicts: int) -> str:
    """The one-line reason: the winner's terms, the runner-up's, rejections, MIG-enabled GPUs."""
    chosen, best = fitting[0]
    why = f"{chosen.id} has the lowest cost {best.cost:g} ({_fmt(best.terms)})"
    if len(fitting) > 1:
        runner = fitting[1][1]
        why += f"; next {runner.device} at {runner.cost:g} ({_fmt(runner.terms)})"
    if n_verdicts > len(fitting):
        why += f"; {n_verdicts - len(fitting)} rejected"
    for g in topology.gpus:
        if g.mig_enabled:
            why += f"; GPU {g.index} ({g.uuid}): MIG enabled, only its instances are leased"
    return why


def _fmt(terms: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}x{WEIGHTS[k]:g}" for k, v in terms.items())
