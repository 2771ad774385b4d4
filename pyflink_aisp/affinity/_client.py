"""Client of the affinity service: httpx with timeouts, tenacity retries, typed results.

Every call is safe to retry: acquire is idempotent per (job, operator, subtask),
renew sets an absolute expiry, and a release retried after a lost answer finds the
lease released (410) and counts that as done. Connection failures, timeouts and
5xx answers are retried with exponential backoff (``retries`` attempts after the
first); 4xx answers are not. Thread-safe (one ``httpx.Client``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from pyflink_aisp.affinity._placement import LeaseKind
from pyflink_aisp.affinity._store import Lease
from pyflink_aisp.errors import (
    AffinityError,
    AffinityUnavailableError,
    ConfigError,
    LeaseNotFoundError,
    PlacementRefusedError,
    UnknownDeviceError,
)

__all__ = ["AffinityClient", "ClientConfig"]


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """Where the service is and how long to wait for it.

    Attributes:
        url: Base URL (``http://127.0.0.1:7420``).
        token: Bearer token for mutating calls (None: send none).
        timeout_s: Per-request connect/read timeout, seconds (> 0).
        retries: Retries after the first attempt on connection errors, timeouts and 5xx (>= 0).
        backoff_s: First retry delay, seconds (doubles, capped at 2 s).
    """

    url: str
    token: str | None = None
    timeout_s: float = 2.0
    retries: int = 3
    backoff_s: float = 0.05

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(
                f"the affinity service URL must start with http:// or https://, got {self.url!r}"
            )
        if not self.timeout_s > 0 or self.retries < 0 or self.backoff_s < 0:
            raise ConfigError("timeout_s must be > 0, retries and backoff_s >= 0")


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500


class AffinityClient:
    """Typed calls to the service.

    Raises (every method):
        AffinityUnavailableError: No answer after the retries (the URL in the message).
        AffinityError: Another refusal (401/403/422), with the service's detail.
    """

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        self._http = httpx.Client(
            base_url=config.url.rstrip("/"), headers=headers, timeout=httpx.Timeout(config.timeout_s)
        )

    def _call(self, method: str, path: str, json: Any = None, params: Any = None) -> httpx.Response:
        retrying = Retrying(
            stop=stop_after_attempt(self.config.retries + 1),
            reraise=True,
            wait=wait_exponential(multiplier=self.config.backoff_s, max=2.0),
            retry=retry_if_exception(_retryable),
        )
        try:
            for attempt in retrying:
                with attempt:
                    response = self._http.request(method, path, json=json, params=params)
                    if response.status_code >= 500:
                        response.raise_for_status()
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            raise AffinityUnavailableError(
                f"affinity service {self.config.url} did not answer {method} {path} "
                f"after {self.config.retries + 1} attempt(s): {exc}"
            ) from exc
        return response

    @staticmethod
    def _detail(response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            return {"detail": response.text[:300]}

    def _lease(self, response: httpx.Response, what: str) -> Lease:
        body = self._detail(response)
        code = response.status_code
        if code in (200, 201):
            body.pop("created", None)
            return Lease.from_dict(body)
        detail = body.get("detail") if isinstance(body, dict) else body
        if code == 409:
            raise PlacementRefusedError(str(detail), body.get("candidates", []))
        if code == 404 and str(detail).startswith("unknown "):  # a device or NUMA node, not a lease
            raise UnknownDeviceError(str(detail))
        if code in (404, 410):
            raise LeaseNotFoundError(str(detail), gone=code == 410)
        raise AffinityError(f"affinity service refused {what} ({code}): {detail}")

    def acquire(
        self,
        *,
        job: str,
        operator: str,
        subtask: int,
        mem_bytes: int = 0,
        kind: LeaseKind = LeaseKind.GPU,
        host: str = "",
        worker_numa_node: int | None = None,
        gpu: str | None = None,
        ttl_s: float | None = None,
    ) -> Lease:
        """The subtask's lease (its live one, or a new placement).

        Raises:
            PlacementRefusedError: No device fits (``explanation``: every candidate's reason).
            UnknownDeviceError: ``gpu`` names no device of the host.
        """
        body = {
            "job": job,
            "operator": operator,
            "subtask": subtask,
            "mem_bytes": mem_bytes,
            "kind": kind.value,
            "host": host,
            "worker_numa_node": worker_numa_node,
            "gpu": gpu,
            "ttl_s": ttl_s,
        }
        return self._lease(self._call("POST", "/v1/leases", json=body), "acquire")

    def renew(self, lease_id: str, ttl_s: float | None = None) -> Lease:
        """Move the lease's expiry on.

        Raises:
            LeaseNotFoundError: Unknown, released or expired.
        """
        return self._lease(self._call("POST", f"/v1/leases/{lease_id}/renew", json={"ttl_s": ttl_s}), "renew")

    def release(self, lease_id: str) -> bool:
        """End the lease; True if this call released it, False if it was no longer active."""
        response = self._call("DELETE", f"/v1/leases/{lease_id}")
        if response.status_code == 410:
            return False
        self._lease(response, "release")
        return True

    def get(self, lease_id: str) -> Lease:
        """One lease in any state."""
        return self._lease(self._call("GET", f"/v1/leases/{lease_id}"), "get")

    def leases(self, *, state: str | None = None, job: str | None = None) -> list[Lease]:
        """Leases, oldest first."""
        params = {k: v for k, v in (("state", state), ("job", job)) if v is not None}
        response = self._call("GET", "/v1/leases", params=params)
        if response.status_code != 200:
            raise AffinityError(
                f"affinity service refused list ({response.status_code}): {self._detail(response)}"
            )
        return [Lease.from_dict({k: v for k, v in d.items() if k != "created"}) for d in response.json()]

    def topology(self) -> dict[str, Any]:
        """The service's topology document."""
        return dict(self._call("GET", "/v1/topology").json())

    def health(self) -> dict[str, Any]:
        """``/healthz``."""
        return dict(self._call("GET", "/healthz").json())

    def close(self) -> None:
        self._http.close()
