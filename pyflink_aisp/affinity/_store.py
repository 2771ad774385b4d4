"""Leases in SQLite: acquire / renew / release with a TTL, idempotent per subtask.

One table, one row per lease ever granted (``active``, then ``released`` or
``expired``); a partial unique index keeps one active lease per (job, operator,
subtask). Every acquire is one ``BEGIN IMMEDIATE`` transaction (SQLite's write
lock, taken up front) that expires overdue leases, returns the subtask's live
lease if it has one (idempotent: its expiry moves on), else reads the live leases,
places (:func:`~pyflink_aisp.affinity._placement.place`) and inserts: concurrent
acquirers, threads or processes, are serialised and none can over-commit a
device. WAL journal with ``synchronous=NORMAL``: a committed lease survives the
process being killed (kill -9); a power cut may lose the last transactions
(sqlite.org/wal.html). Thread-safe: one connection per thread; the threads of one
process take a lock before SQLite's write lock (no busy-wait sleeps). Time comes from
an injected clock (seconds, ``time.time`` by default).
"""

from __future__ import annotations

import enum
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.affinity._placement import Held, LeaseKind, PlacementRequest, place
from pyflink_aisp.affinity._topology import Topology
from pyflink_aisp.errors import ConfigError, LeaseNotFoundError

__all__ = ["Lease", "LeaseState", "LeaseStore", "device_fields"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
  id TEXT PRIMARY KEY, job TEXT NOT NULL, operator TEXT NOT NULL, subtask INTEGER NOT NULL,
  host TEXT NOT NULL, kind TEXT NOT NULL, device TEXT NOT NULL, gpu_uuid TEXT, gpu_index INTEGER,
  mig INTEGER NOT NULL, numa_node INTEGER, cpus TEXT NOT NULL, mem_bytes INTEGER NOT NULL,
  ttl_s REAL NOT NULL, acquired_at REAL NOT NULL, expires_at REAL NOT NULL, released_at REAL,
  state TEXT NOT NULL, reason TEXT NOT NULL, candidates TEXT NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS one_active_lease ON leases(job, operator, subtask) WHERE state = 'active';
CREATE INDEX IF NOT EXISTS by_state ON leases(state, expires_at);
"""


class LeaseState(enum.StrEnum):
    """A lease's life: active until released or past its expiry."""

    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A granted placement.

    Attributes:
        id: Lease id (uuid4 hex). job, operator, subtask, host: whose it is.
        kind: ``gpu`` or ``cpu``.
        device: GPU uuid, MIG instance uuid (``MIG-...``) or ``numa:N``.
        gpu_uuid: The physical GPU (None for CPU leases). gpu_index: its NVML index.
        mig: ``device`` is a MIG instance.
        numa_node: NUMA node of the device. cpus: CPU set to pin the worker to.
        mem_bytes: GPU memory reserved. ttl_s: renewal period granted, s.
        acquired_at, expires_at, released_at: clock seconds (epoch by default).
        state: active, released or expired.
        reason: Why this device (placement's explanation).
        candidates: Every candidate's terms, cost or rejection.
    """

    id: str
    job: str
    operator: str
    subtask: int
    host: str
    kind: LeaseKind
    device: str
    gpu_uuid: str | None
    gpu_index: int | None
    mig: bool
    numa_node: int | None
    cpus: tuple[int, ...]
    mem_bytes: int
    ttl_s: float
    acquired_at: float
    expires_at: float
    released_at: float | None
    state: LeaseState
    reason: str
    candidates: tuple[dict[str, Any], ...] = ()

    @property
    def cuda_visible_devices(self) -> str:
        """The ``CUDA_VISIBLE_DEVICES`` value for this lease: the GPU or MIG uuid; "" (no GPU) for CPU."""
        return self.device if self.kind is LeaseKind.GPU else ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpus": list(self.cpus), "candidates": list(self.candidates)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lease:
        return cls(
            **{
                **data,
                "kind": LeaseKind(data["kind"]),
                "state": LeaseState(data["state"]),
                "cpus": tuple(data["cpus"]),
                "candidates": tuple(data.get("candidates", ())),
            }
        )


def device_fields(chosen: Any) -> dict[str, Any]:
    """The :class:`Lease` fields that come from the placement's chosen candidate
    (device, GPU uuid and index, MIG, NUMA node, CPUs)."""
    return {"device": chosen.id, "gpu_uuid": None if chosen.kind is LeaseKind.CPU else chosen.parent,
            "gpu_index": chosen.gpu_index, "mig": chosen.mig_index is not None,
            "numa_node": chosen.numa_node, "cpus": chosen.cpus}


def _row_lease(row: sqlite3.Row) -> Lease:
    d = dict(row)
    d.update(
        mig=bool(d["mig"]), cpus=tuple(json.loads(d["cpus"])), candidates=tuple(json.loads(d["candidates"]))
    )
    return Lease.from_dict(d)


class LeaseStore:
    """Persisted leases over one topology.

    Args:
        path: SQLite file (created with its directory).
        topology: The host's devices.
        clock: Seconds now (inject for exact TTL tests).
        default_ttl_s: TTL when a request gives none (> 0).
        max_ttl_s: Largest TTL granted (longer requests are cut to it).

    Raises:
        ConfigError: Non-positive TTLs.
    """

    def __init__(
        self,
        path: Path,
        topology: Topology,
        *,
        clock: Callable[[], float] = time.time,
        default_ttl_s: float = 30.0,
        max_ttl_s: float = 3600.0,
    ) -> None:
        if not 0 < default_ttl_s <= max_ttl_s:
            raise ConfigError(f"need 0 < default_ttl_s <= max_ttl_s, got {default_ttl_s}, {max_ttl_s}")
        self.path = Path(path)
        self.topology = topology
        self.clock = clock
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn().executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        # Threads of this process queue on a lock first: contending for SQLite's write lock
        # would put them in its busy handler, which sleeps up to 100 ms between tries.
        # BEGIN IMMEDIATE still serialises writers of other processes on the same file.
        db = self._conn()
        with self._lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _ttl(self, ttl_s: float | None) -> float:
        if ttl_s is not None and not ttl_s > 0:
            raise ConfigError(f"ttl_s must be > 0, got {ttl_s}")
        return min(ttl_s or self.default_ttl_s, self.max_ttl_s)

    @staticmethod
    def _expire(db: sqlite3.Connection, now: float) -> int:
        return db.execute(
            "UPDATE leases SET state = 'expired' WHERE state = 'active' AND expires_at <= ?", (now,)
        ).rowcount

    def acquire(self, request: PlacementRequest, ttl_s: float | None = None) -> tuple[Lease, bool]:
        """The subtask's live lease (expiry moved on), else a new one.

        Returns:
            ``(lease, created)``.

        Raises:
            PlacementRefusedError: No device fits (nothing is written).
            UnknownDeviceError: The request names a device the host lacks.
            ConfigError: ttl_s <= 0.
        """
        ttl = self._ttl(ttl_s)
        with self._write() as db:
            now = self.clock()
            self._expire(db, now)
            row = db.execute(
                "SELECT * FROM leases WHERE job = ? AND operator = ? AND subtask = ? AND state = 'active'",
                (request.job, request.operator, request.subtask),
            ).fetchone()
            if row is not None:
                db.execute(
                    "UPDATE leases SET expires_at = ?, ttl_s = ? WHERE id = ?", (now + ttl, ttl, row["id"])
                )
                return _row_lease(
                    db.execute("SELECT * FROM leases WHERE id = ?", (row["id"],)).fetchone()
                ), False
            held = [
                Held(
                    device=r["device"],
                    parent=r["gpu_uuid"] or r["device"],
                    mem_bytes=r["mem_bytes"],
                    job=r["job"],
                    operator=r["operator"],
                )
                for r in db.execute(
                    "SELECT * FROM leases WHERE state = 'active' AND kind = ?", (request.kind.value,)
                )
            ]
            placement = place(self.topology, request, held)
            c = placement.chosen
            lease = Lease(
                id=uuid.uuid4().hex,
                job=request.job,
                operator=request.operator,
                subtask=request.subtask,
                host=request.host or self.topology.host,
                kind=request.kind,
                **device_fields(c),
                mem_bytes=request.mem_bytes,
                ttl_s=ttl,
                acquired_at=now,
                expires_at=now + ttl,
                released_at=None,
                state=LeaseState.ACTIVE,
                reason=placement.reason,
                candidates=tuple(s.to_dict() for s in placement.scored),
            )
            self._insert(db, lease)
            return lease, True

    @staticmethod
    def _insert(db: sqlite3.Connection, lease: Lease) -> None:
        d = lease.to_dict()
        d.update(
            mig=int(lease.mig),
            cpus=json.dumps(d["cpus"]),
            candidates=json.dumps(d["candidates"]),
            kind=lease.kind.value,
            state=lease.state.value,
        )
        columns = ", ".join(d)
        db.execute(f"INSERT INTO leases ({columns}) VALUES ({', '.join('?' * len(d))})", tuple(d.values()))

    def _active(self, db: sqlite3.Connection, lease_id: str) -> sqlite3.Row:
        row = db.execute("SELECT * FROM leases WHERE id = ?", (lease_id,)).fetchone()
        if row is None:
            raise LeaseNotFoundError(f"no lease {lease_id}")
        if row["state"] != LeaseState.ACTIVE:
            raise LeaseNotFoundError(f"lease {lease_id} is {row['state']} (acquire again)", gone=True)
        return row

    def renew(self, lease_id: str, ttl_s: float | None = None) -> Lease:
        """Move a live lease's expiry to now + TTL.

        Raises:
            LeaseNotFoundError: Unknown, released or expired (acquire again).
        """
        ttl = self._ttl(ttl_s)
        with self._write() as db:
            now = self.clock()
            self._expire(db, now)
            self._active(db, lease_id)
            db.execute("UPDATE leases SET expires_at = ?, ttl_s = ? WHERE id = ?", (now + ttl, ttl, lease_id))
            return _row_lease(db.execute("SELECT * FROM leases WHERE id = ?", (lease_id,)).fetchone())

    def release(self, lease_id: str) -> Lease:
        """End a live lease now.

        Raises:
            LeaseNotFoundError: Unknown, already released or expired.
        """
        with self._write() as db:
            now = self.clock()
            self._expire(db, now)
            self._active(db, lease_id)
            db.execute("UPDATE leases SET state = 'released', released_at = ? WHERE id = ?", (now, lease_id))
            return _row_lease(db.execute("SELECT * FROM leases WHERE id = ?", (lease_id,)).fetchone())

    def reclaim_expired(self) -> int:
        """Mark every lease past its expiry ``expired``; returns how many."""
        with self._write() as db:
            return self._expire(db, self.clock())

    def get(self, lease_id: str) -> Lease:
        """A lease in any state (an active one past its expiry reads as expired).

        Raises:
            LeaseNotFoundError: No such id.
        """
        row = self._conn().execute("SELECT * FROM leases WHERE id = ?", (lease_id,)).fetchone()
        if row is None:
            raise LeaseNotFoundError(f"no lease {lease_id}")
        lease = _row_lease(row)
        if lease.state is LeaseState.ACTIVE and lease.expires_at <= self.clock():
            return Lease.from_dict({**lease.to_dict(), "state": "expired"})
        return lease

    def leases(self, state: LeaseState | None = None, job: str | None = None) -> list[Lease]:
        """Leases (all, or of a state / job), oldest first; overdue active ones are expired first."""
        self.reclaim_expired()
        sql, args = "SELECT * FROM leases WHERE 1 = 1", list[str]()
        if state is not None:
            sql, args = sql + " AND state = ?", [*args, state.value]
        if job is not None:
            sql, args = sql + " AND job = ?", [*args, job]
        return [_row_lease(r) for r in self._conn().execute(sql + " ORDER BY acquired_at, id", args)]

    def counts(self) -> dict[str, int]:
        """Leases by state (overdue active ones counted as expired)."""
        rows = self._conn().execute(
            "SELECT CASE WHEN state = 'active' AND expires_at <= ? THEN 'expired' ELSE state END AS s, "
            "count(*) FROM leases GROUP BY s",
            (self.clock(),),
        )
        return {**{s.value: 0 for s in LeaseState}, **{r[0]: r[1] for r in rows}}

    def committed_bytes(self) -> dict[str, int]:
        """Live leased GPU memory per device id."""
        rows = self._conn().execute(
            "SELECT device, sum(mem_bytes) FROM leases WHERE state = 'active' AND "
            "expires_at > ? GROUP BY device",
            (self.clock(),),
        )
        return {r[0]: int(r[1]) for r in rows}

    def close(self) -> None:
        """Close this thread's connection."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
