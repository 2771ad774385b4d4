"""GPU affinity: NVML topology, NUMA/PCIe-aware placement, persisted leases, the side service and its client.

A side service per TaskManager host (``aisp affinity serve``) hands each inference
operator subtask a GPU or MIG instance and the CPUs near it as a lease with a TTL;
the operators take it in ``open()`` (``--gpu-affinity URL``) and give it back in
``close()``. Importable without pyflink, FastAPI or uvicorn (the app and server
import them; the store, placement, topology and client do not).
"""

from pyflink_aisp.affinity._client import AffinityClient, ClientConfig
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
    parse_cpulist,
    topology_from_dict,
)
from pyflink_aisp.affinity._worker import (
    TOPOLOGY_ENV,
    AffinityPolicy,
    AffinitySettings,
    WorkerAffinity,
    apply_lease,
    local_lease,
    open_affinity,
)

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
    "apply_lease",
    "candidates",
    "discover",
    "discover_nvml",
    "host_numa_nodes",
    "load_topology",
    "local_lease",
    "open_affinity",
    "parse_cpulist",
    "place",
    "resolve_token",
    "topology_from_dict",
]
