"""GPU affinity: NVML topology, NUMA/PCIe-aware placement, persisted leases, the side service and its client.

A side service per TaskManager host (``aisp affinity serve``) hands each inference
operator subtask a GPU or MIG instance and the CPUs near it as a lease with a TTL;
the operators take it in ``open()`` (``--gpu-affinity URL``) and give it back in
``close()``. Importable without pyflink, FastAPI or uvicorn (the app and server
import them; the client needs httpx and tenacity, a topology file pydantic and
PyYAML: all imported where used, so the store, placement, NVML discovery and
:func:`apply_lease` run with the standard library and nvidia-ml-py alone, as on
the GPU host of ``bench/gpu_affinity_check.py``).
"""

from typing import TYPE_CHECKING, Any

from pyflink_aisp.affinity._cli import add_affinity_commands
from pyflink_aisp.affinity._nvml import discover, discover_nvml
from pyflink_aisp.affinity._placement import (
    WEIGHTS,
    Candidate,
    Held,
    LeaseKind,
    Placement,
    PlacementRequest,
    Scored,
    candidates,
    place,
)
from pyflink_aisp.affinity._store import Lease, LeaseState, LeaseStore
from pyflink_aisp.affinity._token import TOKEN_ENV, TOKEN_FILE_ENV, resolve_token
from pyflink_aisp.affinity._topology import (
    Gpu,
    MigInstance,
    NumaNode,
    Peer,
    Topology,
    host_numa_nodes,
    load_topology,
    online_cpus,
    parse_cpulist,
    topology_from_dict,
)
from pyflink_aisp.affinity._worker import (
    TOPOLOGY_ENV,
    AffinityPolicy,
    AffinitySettings,
    WorkerAffinity,
    apply_lease,
    check_lease_device,
    local_lease,
    open_affinity,
    unapply_lease,
)

if TYPE_CHECKING:
    from pyflink_aisp.affinity._client import AffinityClient, ClientConfig


def __getattr__(name: str) -> Any:
    if name in ("AffinityClient", "ClientConfig"):
        from pyflink_aisp.affinity import _client

        return getattr(_client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "TOPOLOGY_ENV",
    "WEIGHTS",
    "AffinityClient",
    "AffinityPolicy",
    "AffinitySettings",
    "Candidate",
    "ClientConfig",
    "Gpu",
    "Held",
    "Lease",
    "LeaseKind",
    "LeaseState",
    "LeaseStore",
    "MigInstance",
    "NumaNode",
    "Peer",
    "Placement",
    "PlacementRequest",
    "Scored",
    "Topology",
    "WorkerAffinity",
    "add_affinity_commands",
    "apply_lease",
    "candidates",
    "check_lease_device",
    "discover",
    "discover_nvml",
    "host_numa_nodes",
    "load_topology",
    "local_lease",
    "online_cpus",
    "open_affinity",
    "parse_cpulist",
    "place",
    "resolve_token",
    "topology_from_dict",
    "unapply_lease",
]
