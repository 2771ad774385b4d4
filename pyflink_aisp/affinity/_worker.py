"""Operator glue: a Python worker takes its lease in ``open()`` and gives it back in ``close()``.

:func:`open_affinity` (called by the inference operators and SQL functions before
they load the model, when ``--gpu-affinity URL`` / ``aisp.gpu-affinity`` is set):

1. acquires the lease of (job, operator = task name, subtask index) from the
   service; ``--device cuda`` asks for a GPU lease (a whole GPU or a MIG
   instance), ``--device cpu`` for a CPU lease (a NUMA node's CPUs, no GPU);
2. sets ``CUDA_VISIBLE_DEVICES`` to the leased GPU or MIG uuid (to "" for a CPU
   lease: no GPU is visible, the model runs on the CPU as asked), before CUDA
   initialises, so the model's ``cuda:0`` is the leased device; if CUDA is
   already initialised in the process with other devices, it fails instead;
3. pins every thread of the worker to the lease's CPU set
   (``os.sched_setaffinity`` on each thread of ``/proc/self/task``; threads
   started later inherit it); several leases in one worker process pin to the
   union of their CPU sets, and two different GPUs in one process are refused;
4. renews the lease every ``ttl_s / 3`` seconds in a daemon thread (a lease that
   expired meanwhile, e.g. while the service was down, is acquired again if it
   lands on the same device; else it is given back and counted as a failure).

:meth:`WorkerAffinity.close` stops the renewer, releases the lease and undoes 2 and 3
(:func:`unapply_lease`: PyFlink's MiniCluster runs the Python functions of every
subtask in the client process itself, its loopback mode, so a process may hold
several leases and outlive them). When the
service cannot be reached, ``--gpu-affinity-policy`` decides: ``fail`` (the
operator's ``open()`` raises, the job fails in one line) or ``local`` (a
deterministic local choice: the placement the service would make for subtasks
0..N of this operator on an empty host, on this host's NVML topology or the file
in ``$AISP_AFFINITY_TOPOLOGY``; metric ``affinityFallback`` = 1 and a warning).
A GPU request without any GPU topology fails either way: never a silent CPU run.

Metrics (operator group ``aisp``): ``affinityFallback`` (0/1),
``affinityRenewals``, ``affinityRenewFailures``.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyflink_aisp.affinity._placement import Held, LeaseKind, PlacementRequest, place
from pyflink_aisp.affinity._store import Lease, LeaseState, device_fields
from pyflink_aisp.affinity._token import resolve_token
from pyflink_aisp.affinity._topology import Topology, host_numa_nodes, hostname, online_cpus
from pyflink_aisp.errors import AffinityError, AffinityUnavailableError, ConfigError, LeaseNotFoundError

__all__ = [
    "TOPOLOGY_ENV",
    "AffinityPolicy",
    "AffinitySettings",
    "WorkerAffinity",
    "apply_lease",
    "check_lease_device",
    "local_lease",
    "open_affinity",
    "operator_key",
]

if TYPE_CHECKING:
    from pyflink_aisp.affinity._client import AffinityClient, ClientConfig

_log = logging.getLogger(__name__)
#: Topology file for the ``local`` policy on hosts without NVML.
TOPOLOGY_ENV = "AISP_AFFINITY_TOPOLOGY"
_APPLIED: dict[str, Lease] = {}  # this process's applied leases by id
_BEFORE: dict[str, Any] = {}  # CPU set and CUDA_VISIBLE_DEVICES before the first applied lease
_APPLIED_LOCK = threading.Lock()


class AffinityPolicy(enum.StrEnum):
    """What a worker does when the service cannot be reached (``--gpu-affinity-policy``)."""

    FAIL = "fail"  # open() raises: the job fails (Flink's restart strategy retries it)
    LOCAL = "local"  # the deterministic local choice, metric affinityFallback = 1


@dataclass(frozen=True, kw_only=True)
class AffinitySettings:
    """A worker's affinity request (from the options; picklable, shipped to the workers).

    Attributes:
        url: The service. job: Lease key part (the job name).
        device: ``cpu`` (CPU lease) or ``cuda:0`` (GPU lease: the leased device becomes cuda:0).
        mem_bytes: GPU memory to reserve. policy: ``fail`` or ``local`` when unreachable.
        ttl_s: Lease TTL, s. timeout_s: per-call timeout, s. retries: client retries.
    """

    url: str
    job: str
    device: str = "cpu"
    mem_bytes: int = 0
    policy: AffinityPolicy = AffinityPolicy.FAIL
    ttl_s: float = 30.0
    timeout_s: float = 2.0
    retries: int = 3

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda:0"):
            raise ConfigError(
                f"with --gpu-affinity the service picks the GPU: use --device cuda (the leased "
                f"device becomes cuda:0) or cpu, not {self.device}"
            )
        if not isinstance(self.policy, AffinityPolicy):
            raise ConfigError(f"policy must be an AffinityPolicy, got {self.policy!r}")
        if self.mem_bytes < 0 or not self.ttl_s > 0:
            raise ConfigError("mem_bytes must be >= 0 and ttl_s > 0")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(
                f"the affinity service URL must start with http:// or https://, got {self.url!r}"
            )

    @property
    def kind(self) -> LeaseKind:
        return LeaseKind.CPU if self.device == "cpu" else LeaseKind.GPU


@dataclass
class WorkerAffinity:
    """A worker's applied lease; :meth:`close` releases it (idempotent)."""

    lease: Lease
    fallback: bool
    client: AffinityClient | None
    renewals: int = 0
    renew_failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start_renewing(self) -> None:
        if self.client is None:
            return
        self._thread = threading.Thread(target=self._renew_loop, name="aisp-affinity-renew", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        assert self.client is not None
        while not self._stop.wait(max(0.2, self.lease.ttl_s / 3)):
            try:
                self.client.renew(self.lease.id, self.lease.ttl_s)
                self.renewals += 1
            except LeaseNotFoundError as exc:  # expired (e.g. the service was down past the TTL)
                self._reacquire(exc)
            except (AffinityError, OSError) as exc:  # keep trying: the lease outlives a few misses
                self.renew_failures += 1
                _log.warning("renewing GPU affinity lease %s failed: %s", self.lease.id, exc)

    def _reacquire(self, lost: Exception) -> None:
        """Take the subtask's lease again after it expired; the loaded model cannot move, so a
        lease on another device is given back and counted as a failure."""
        assert self.client is not None
        old = self.lease
        try:
            lease = self.client.acquire(
                job=old.job,
                operator=old.operator,
                subtask=old.subtask,
                mem_bytes=old.mem_bytes,
                kind=old.kind,
                host=old.host,
                ttl_s=old.ttl_s,
            )
        except (AffinityError, OSError) as exc:
            self.renew_failures += 1
            _log.warning("GPU affinity lease %s lost (%s) and not re-acquired: %s", old.id, lost, exc)
            return
        if lease.device != old.device:
            self.client.release(lease.id)
            self.renew_failures += 1
            _log.error(
                "GPU affinity lease %s lost; the service now offers %s, but the model is on %s",
                old.id,
                lease.device,
                old.device,
            )
            return
        self.lease = lease
        self.renewals += 1

    def bind_metrics(self, group: Any) -> None:
        """Register the gauges on a PyFlink metric group (None: skip)."""
        if group is None:
            return
        group.gauge("affinityFallback", lambda: int(self.fallback))
        group.gauge("affinityRenewals", lambda: self.renewals)
        group.gauge("affinityRenewFailures", lambda: self.renew_failures)

    def close(self) -> None:
        """Stop renewing and release the lease (a lost release expires after its TTL)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        unapply_lease(self.lease.id)
        if self.client is not None:
            try:
                self.client.release(self.lease.id)
            except (AffinityError, OSError) as exc:
                _log.warning(
                    "releasing GPU affinity lease %s failed (it expires after %gs): %s",
                    self.lease.id,
                    self.lease.ttl_s,
                    exc,
                )
            self.client.close()
            self.client = None


#: CPUs this process could run on before any lease pinned it (cgroup cpuset, taskset).
_START_CPUS = frozenset(os.sched_getaffinity(0))


def _allowed_cpus() -> set[int]:
    """Online CPUs this process may use (a container's cpuset may hold fewer than NVML lists)."""
    return set(online_cpus()) & _START_CPUS


def _pin_threads(cpus: set[int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):  # the thread ended meanwhile
            continue


def _cuda_initialised() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def apply_lease(lease: Lease) -> None:
    """Set ``CUDA_VISIBLE_DEVICES`` and pin this process's threads to the lease.

    Raises:
        AffinityError: The lease's CPUs are not on this host, another GPU lease is
            already applied in this process, or CUDA is initialised with other devices.
    """
    cpus = set(lease.cpus) & _allowed_cpus()
    if not cpus:
        raise AffinityError(
            f"lease {lease.id}: none of its CPUs {list(lease.cpus)} is online and allowed to this "
            f"process on {hostname()} (allowed: {sorted(_allowed_cpus())}; topology of another host?)"
        )
    with _APPLIED_LOCK:
        gpus = {other.cuda_visible_devices for other in _APPLIED.values() if other.kind is LeaseKind.GPU}
        if lease.kind is LeaseKind.GPU and gpus - {lease.device}:
            raise AffinityError(
                f"lease {lease.id}: this worker process already holds GPU {gpus.pop()}; "
                f"one process cannot also use {lease.device}"
            )
        wanted = lease.cuda_visible_devices if not gpus else next(iter(gpus))
        if os.environ.get("CUDA_VISIBLE_DEVICES") != wanted and _cuda_initialised():
            raise AffinityError(
                f"lease {lease.id}: CUDA is already initialised in this worker, "
                f"CUDA_VISIBLE_DEVICES={wanted!r} would not take effect"
            )
        if not _APPLIED:
            _BEFORE.update(cpus=os.sched_getaffinity(0), cuda=os.environ.get("CUDA_VISIBLE_DEVICES"))
        os.environ["CUDA_VISIBLE_DEVICES"] = wanted
        _APPLIED[lease.id] = lease
        pinned = set().union(*(set(a.cpus) for a in _APPLIED.values())) & _allowed_cpus()
        # under the lock: two subtasks' pins must land in the order of their states (a late
        # pin to an older union left a loopback client process on one CPU after both closed)
        _pin_threads(pinned)


def _uuid_body(uuid: str) -> str:
    """A device UUID without its ``GPU-`` / ``MIG-`` prefixes, lower case (NVML writes
    ``GPU-8c2f...``, a MIG instance ``MIG-...``, older drivers ``MIG-GPU-.../gi/ci``)."""
    body = uuid.strip().lower()
    while body.startswith(("gpu-", "mig-")):
        body = body[4:]
    return body


def check_lease_device(lease: Lease, device_uuid: str | None) -> None:
    """Refuse a model that does not run on the device its lease holds.

    ``CUDA_VISIBLE_DEVICES`` only takes effect before CUDA initialises in the process: in
    a MiniCluster run the client process (where the Python functions run) may have called
    ``torch.cuda.is_available()`` already, and then every GPU stays visible and the
    model's ``cuda:0`` is not the leased device. The loaded model's device UUID
    (``ModelHandler.device_uuid``) is compared with the lease's: the GPU's UUID, or for a
    MIG lease the MIG instance's. PyFlink-free (``bench/gpu_check.py`` calls it on the
    GPU host).

    Args:
        lease: The applied lease.
        device_uuid: The UUID of the device the model runs on (``GPU-...`` / ``MIG-...``;
            compared without those prefixes, case-insensitively); None for a model on the
            CPU, which passes (a CPU model holds no device).

    Raises:
        AffinityError: The model runs on another GPU than the lease's, or on a GPU while
            the lease holds none (a CPU lease); the message names both.
    """
    if device_uuid is None:
        return
    if lease.kind is not LeaseKind.GPU:
        raise AffinityError(
            f"lease {lease.id} holds no GPU ({lease.device}), but the model runs on GPU {device_uuid}: "
            "CUDA was initialised in this worker before the lease applied, so CUDA_VISIBLE_DEVICES='' "
            "did not hide the GPUs"
        )
    if _uuid_body(device_uuid) != _uuid_body(lease.device):
        raise AffinityError(
            f"lease {lease.id} holds {'MIG instance' if lease.mig else 'GPU'} {lease.device}, but the model "
            f"runs on {device_uuid}: CUDA was initialised in this worker before the lease applied (e.g. "
            "torch.cuda.is_available() in a MiniCluster's client process), so "
            f"CUDA_VISIBLE_DEVICES={lease.cuda_visible_devices} did not take effect; run the job on a "
            "cluster, or do not touch CUDA in the client before it submits"
        )


def unapply_lease(lease_id: str) -> None:
    """Undo :func:`apply_lease` once the lease ends: the process is pinned to the CPUs of its
    other leases, or, after its last, back to the CPU set and ``CUDA_VISIBLE_DEVICES`` it had
    before the first (the released CPUs may be leased to another subtask next). A process
    that initialised CUDA keeps its devices whatever the variable says. Unknown ids: no-op."""
    with _APPLIED_LOCK:
        if _APPLIED.pop(lease_id, None) is None:
            return
        if _APPLIED:
            pinned = set().union(*(set(a.cpus) for a in _APPLIED.values())) & _allowed_cpus()
        else:
            pinned = set(_BEFORE["cpus"])
            if _BEFORE["cuda"] is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = _BEFORE["cuda"]
        _pin_threads(pinned)  # under the lock, see apply_lease


def local_lease(settings: AffinitySettings, operator: str, subtask: int, topology: Topology) -> Lease:
    """The deterministic local choice: place subtasks 0..``subtask`` of the operator in
    order on an empty host and return the last (what the service would give them).

    Raises:
        PlacementRefusedError: Nothing fits.
    """
    held: list[Held] = []
    for index in range(subtask + 1):
        request = PlacementRequest(
            job=settings.job,
            operator=operator,
            subtask=index,
            mem_bytes=settings.mem_bytes,
            kind=settings.kind,
        )
        placement = place(topology, request, held)
        c = placement.chosen
        held.append(
            Held(
                device=c.id,
                parent=c.parent,
                mem_bytes=settings.mem_bytes,
                job=settings.job,
                operator=operator,
            )
        )
    return Lease(
        id=f"local-{os.getpid()}-{subtask}",
        job=settings.job,
        operator=operator,
        subtask=subtask,
        host=topology.host,
        kind=settings.kind,
        **device_fields(c),
        mem_bytes=settings.mem_bytes,
        ttl_s=settings.ttl_s,
        acquired_at=0.0,
        expires_at=float("inf"),
        released_at=None,
        state=LeaseState.ACTIVE,
        reason="local choice (service unreachable): " + placement.reason,
    )


def _local_topology(kind: LeaseKind) -> Topology:
    from pyflink_aisp.affinity._nvml import discover

    path = os.environ.get(TOPOLOGY_ENV)
    if kind is LeaseKind.CPU and not path:
        return Topology(host=hostname(), source="os", numa_nodes=host_numa_nodes())
    return discover(Path(path) if path else None)


def operator_key(task_name: str) -> str:
    """A task name as a lease's operator (<= 200 chars: long names keep a sha1 suffix)."""
    if len(task_name) <= 200:
        return task_name
    return task_name[:160] + "#" + hashlib.sha1(task_name.encode()).hexdigest()


def open_affinity(
    settings: AffinitySettings | None,
    context: Any,
    *,
    metric_group: Any = None,
    client_factory: Callable[[ClientConfig], AffinityClient] | None = None,
) -> WorkerAffinity | None:
    """Take and apply this subtask's lease (see the module docstring); None when not configured.

    Args:
        settings: From the options; None: do nothing.
        context: PyFlink ``FunctionContext`` / ``RuntimeContext`` (task name, subtask index).
        metric_group: Where to register the affinity gauges (None: nowhere).
        client_factory: Builds the client (None: :class:`AffinityClient`; inject a fake in unit tests).

    Raises:
        AffinityUnavailableError: Unreachable service with policy ``fail``.
        PlacementRefusedError: No device fits.
        AffinityError: The lease cannot be applied in this process.
    """
    if settings is None:
        return None
    from pyflink_aisp.affinity._client import AffinityClient, ClientConfig  # httpx: only where a worker calls

    operator, subtask = operator_key(context.get_task_name()), int(context.get_index_of_this_subtask())
    client = (client_factory or AffinityClient)(
        ClientConfig(
            url=settings.url, token=resolve_token(), timeout_s=settings.timeout_s, retries=settings.retries
        )
    )
    try:
        lease = client.acquire(
            job=settings.job,
            operator=operator,
            subtask=subtask,
            mem_bytes=settings.mem_bytes,
            kind=settings.kind,
            host=hostname(),
            ttl_s=settings.ttl_s,
        )
        worker = WorkerAffinity(lease=lease, fallback=False, client=client)
    except AffinityUnavailableError as exc:
        client.close()
        if settings.policy is AffinityPolicy.FAIL:
            raise
        lease = local_lease(settings, operator, subtask, _local_topology(settings.kind))
        _log.warning(
            "GPU affinity service unreachable (%s); local choice %s for %s/%s",
            exc,
            lease.device,
            operator,
            subtask,
        )
        worker = WorkerAffinity(lease=lease, fallback=True, client=None)
    try:
        apply_lease(worker.lease)
    except AffinityError:
        worker.close()
        raise
    worker.start_renewing()
    worker.bind_metrics(metric_group)
    return worker
