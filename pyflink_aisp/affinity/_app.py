"""The affinity service over HTTP/JSON: FastAPI app (OpenAPI at ``/openapi.json``), uvicorn server.

Endpoints (``/v1``): ``POST /v1/leases`` acquire (201 new, 200 the subtask's live
lease), ``GET /v1/leases[?state=&job=]``, ``GET /v1/leases/{id}``,
``POST /v1/leases/{id}/renew``, ``DELETE /v1/leases/{id}`` release,
``GET /v1/topology``; ``GET /healthz``; ``GET /metrics`` (Prometheus text).
Mutating calls need ``Authorization: Bearer <token>`` (401 without, 403 wrong).
Errors: 400 a body that is not even text (FastAPI cannot parse it), 422 malformed or
out-of-range body (FastAPI's field list), 404 unknown
lease or device, 409 placement refused (every candidate's reason in
``candidates``), 410 lease no longer active, 422 text with lone surrogates. The endpoints
run on the event loop and call the store directly: a call holds the loop for its
SQLite transaction (well under a millisecond unloaded), which serialises writes as
SQLite would anyway and saves the thread-pool hop of sync endpoints.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field

from pyflink_aisp.affinity._placement import LeaseKind, PlacementRequest
from pyflink_aisp.affinity._store import Lease, LeaseState, LeaseStore
from pyflink_aisp.errors import LeaseNotFoundError, PlacementRefusedError, UnknownDeviceError

__all__ = ["AcquireBody", "LeaseBody", "create_app", "serve"]

#: Largest byte count accepted: 2**53 (8 PiB) is exact in a JSON number (an IEEE double).
_MAX_BYTES = 2**53


class AcquireBody(BaseModel):
    """``POST /v1/leases``."""

    model_config = ConfigDict(extra="forbid")
    job: str = Field(min_length=1, max_length=256)
    operator: str = Field(min_length=1, max_length=256)
    subtask: int = Field(ge=0, le=2**31 - 1)
    host: str = Field(default="", max_length=256)
    mem_bytes: int = Field(default=0, ge=0, le=_MAX_BYTES, description="GPU memory needed, bytes")
    kind: LeaseKind = LeaseKind.GPU
    worker_numa_node: int | None = Field(default=None, ge=0, le=4096)
    gpu: str | None = Field(
        default=None, min_length=1, max_length=128, description="require this GPU / MIG uuid or GPU index"
    )
    ttl_s: float | None = Field(default=None, gt=0, le=86400, description="seconds")


class RenewBody(BaseModel):
    """``POST /v1/leases/{id}/renew`` (body optional)."""

    model_config = ConfigDict(extra="forbid")
    ttl_s: float | None = Field(default=None, gt=0, le=86400)


class Verdict(BaseModel):
    device: str
    terms: dict[str, float]
    cost: float | None
    rejected: str | None


class LeaseBody(BaseModel):
    """A lease as the API returns it (see :class:`~pyflink_aisp.affinity.Lease`)."""

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
    cpus: list[int]
    mem_bytes: int
    ttl_s: float
    acquired_at: float
    expires_at: float
    released_at: float | None
    state: LeaseState
    reason: str
    candidates: list[Verdict]
    created: bool = False


class ErrorBody(BaseModel):
    detail: str


class RefusedBody(BaseModel):
    detail: str
    candidates: list[Verdict]


class Health(BaseModel):
    status: str
    host: str
    source: str
    devices: int
    leases: dict[str, int]


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    404: {"model": ErrorBody},
}


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "aisp_affinity_requests",
            "Lease calls by operation and outcome",
            ["op", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "aisp_affinity_request_seconds",
            "Lease call latency (store + placement)",
            ["op"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
        )
        self.leases = Gauge("aisp_affinity_leases", "Leases by state", ["state"], registry=self.registry)
        self.committed = Gauge(
            "aisp_affinity_committed_bytes", "Leased GPU memory by device", ["device"], registry=self.registry
        )

    def timed(self, op: str, call: Callable[[], Any]) -> Any:
        """``call()``, counted by outcome and timed."""
        start = time.perf_counter()
        outcome = "ok"
        try:
            return call()
        except (PlacementRefusedError, LeaseNotFoundError, UnknownDeviceError) as exc:
            outcome = type(exc).__name__
            raise
        finally:
            self.requests.labels(op, outcome).inc()
            self.latency.labels(op).observe(time.perf_counter() - start)


def _body(lease: Lease, created: bool = False) -> LeaseBody:
    return LeaseBody.model_validate({**lease.to_dict(), "created": created})


_BEARER = HTTPBearer(auto_error=False, description="the service's token (file or $AISP_AFFINITY_TOKEN)")


def _auth(token: str | None) -> Callable[..., None]:
    def check(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        if token is None:
            return
        if credentials is None:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(403, "wrong bearer token")

    return check


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(PlacementRefusedError)
    def refused(_: Request, exc: PlacementRefusedError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "candidates": exc.explanation}, status_code=409)

    @app.exception_handler(UnicodeEncodeError)
    def not_utf8(_: Request, exc: UnicodeEncodeError) -> JSONResponse:
        # JSON allows lone surrogates (\ud800) that no UTF-8 store can hold: a client error
        return JSONResponse(
            {"detail": f"text must be valid Unicode (no lone surrogates): {exc.reason}"}, status_code=422
        )

    @app.exception_handler(UnknownDeviceError)
    def unknown_device(_: Request, exc: UnknownDeviceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(LeaseNotFoundError)
    def not_found(_: Request, exc: LeaseNotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=410 if exc.gone else 404)


def create_app(store: LeaseStore, *, token: str | None) -> FastAPI:
    """The service over a store; ``token`` None: mutating calls are open (tests, trusted hosts)."""
    app = FastAPI(title="aisp GPU affinity", version="1", description=__doc__.split("\n\n")[0])
    metrics = _Metrics()
    _add_error_handlers(app)
    _add_lease_routes(app, store, metrics, [Depends(_auth(token))])
    _add_info_routes(app, store, metrics)
    return app


def _add_lease_routes(app: FastAPI, store: LeaseStore, metrics: _Metrics, authorized: list[Any]) -> None:
    timed = metrics.timed

    @app.post(
        "/v1/leases",
        response_model=LeaseBody,
        status_code=201,
        dependencies=authorized,
        responses={
            **_ERRORS,
            200: {"model": LeaseBody},
            400: {"model": ErrorBody},
            409: {"model": RefusedBody},
        },
    )
    async def acquire(body: AcquireBody, response: Response) -> LeaseBody:
        request = PlacementRequest(
            job=body.job,
            operator=body.operator,
            subtask=body.subtask,
            host=body.host,
            mem_bytes=body.mem_bytes,
            kind=body.kind,
            worker_numa_node=body.worker_numa_node,
            gpu=body.gpu,
        )
        lease, created = timed("acquire", lambda: store.acquire(request, body.ttl_s))
        response.status_code = 201 if created else 200
        return _body(lease, created)

    @app.post(
        "/v1/leases/{lease_id}/renew",
        response_model=LeaseBody,
        dependencies=authorized,
        responses={**_ERRORS, 400: {"model": ErrorBody}, 410: {"model": ErrorBody}},
    )
    async def renew(lease_id: str, body: RenewBody | None = None) -> LeaseBody:
        return _body(timed("renew", lambda: store.renew(lease_id, body.ttl_s if body else None)))

    @app.delete(
        "/v1/leases/{lease_id}",
        response_model=LeaseBody,
        dependencies=authorized,
        responses={**_ERRORS, 410: {"model": ErrorBody}},
    )
    async def release(lease_id: str) -> LeaseBody:
        return _body(timed("release", lambda: store.release(lease_id)))

    @app.get("/v1/leases/{lease_id}", response_model=LeaseBody, responses={404: {"model": ErrorBody}})
    async def get_lease(lease_id: str) -> LeaseBody:
        return _body(store.get(lease_id))

    @app.get("/v1/leases", response_model=list[LeaseBody])
    async def list_leases(
        state: Annotated[LeaseState | None, Query()] = None,
        job: Annotated[str | None, Query(max_length=256)] = None,
    ) -> list[LeaseBody]:
        return [_body(lease) for lease in store.leases(state, job)]


def _add_info_routes(app: FastAPI, store: LeaseStore, metrics: _Metrics) -> None:
    @app.get("/v1/topology")
    async def topology() -> dict[str, Any]:
        return store.topology.to_dict()

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        t = store.topology
        devices = sum(1 for g in t.gpus if not g.mig_enabled) + sum(len(g.mig_instances) for g in t.gpus)
        return Health(status="ok", host=t.host, source=t.source, devices=devices, leases=store.counts())

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        for state, n in store.counts().items():
            metrics.leases.labels(state).set(n)
        metrics.committed.clear()
        for device, n in store.committed_bytes().items():
            metrics.committed.labels(device).set(n)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def serve(
    *,
    db: Path,
    topology_file: Path | None,
    host: str,
    port: int,
    token: str | None,
    default_ttl_s: float = 30.0,
) -> None:
    """Run the service in this process until interrupted (uvicorn, one process, thread pool).

    Raises:
        TopologyError: No usable topology (invalid file, or no file and no NVIDIA driver).
    """
    import uvicorn

    from pyflink_aisp.affinity._nvml import discover

    topology = discover(topology_file)
    store = LeaseStore(db, topology, default_ttl_s=default_ttl_s)
    devices = len(topology.gpus)
    print(
        f"aisp affinity: serving http://{host}:{port} ({topology.source}: {devices} GPU(s), "
        f"{len(topology.numa_nodes)} NUMA node(s); leases in {db}; "
        f"{'bearer token required' if token else 'NO TOKEN: mutating calls open'})",
        flush=True,
    )
    uvicorn.run(create_app(store, token=token), host=host, port=port, log_level="warning", access_log=False)
