"""A fault-injecting HTTP proxy in front of a model server: the failures a remote model
meets in production (rate limits, overload, slow answers, truncated bodies), on purpose
and counted.

:class:`FaultProxy` serves on a loopback port (uvicorn, in a thread) and forwards every
request to ``upstream`` with httpx, except those its :class:`Faults` pick: a share answered
``429`` with ``Retry-After``, a share ``503``, a share delayed, a share whose body is cut
short. (Dropped connections are not among them: an ASGI app cannot close its socket;
the client's handling of them is unit-tested.) Which requests are hit is drawn
from a seeded random source, so a run is repeatable. Every request is counted by path and
by what happened to it (:attr:`FaultProxy.counts`): the count of requests a job made is
read here, at the server's door.
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx
import uvicorn

from pyflink_aisp.errors import ConfigError

__all__ = ["FaultProxy", "Faults"]


@dataclass(frozen=True)
class Faults:
    """Which share of requests meets which fault (shares in [0, 1], summing to at most 1).

    Attributes:
        rate_limited: Answered ``429 Too Many Requests`` with ``Retry-After: retry_after_s``.
        unavailable: Answered ``503 Service Unavailable`` (no ``Retry-After``).
        truncated: Forwarded, but the body is cut to half its length.
        slow: Forwarded after ``slow_s`` seconds.
        retry_after_s: The ``Retry-After`` of a 429, in whole seconds.
        slow_s: The delay of a slow request, in seconds.
        path_suffix: Only requests whose path ends with this meet faults (e.g. ``/infer``: the
            metadata a job checks at start-up is served); empty: all.
        seed: Seed of the draw.
    """

    rate_limited: float = 0.0
    unavailable: float = 0.0
    truncated: float = 0.0
    slow: float = 0.0
    retry_after_s: int = 1
    slow_s: float = 2.0
    path_suffix: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        shares = (self.rate_limited, self.unavailable, self.truncated, self.slow)
        if any(not 0 <= s <= 1 for s in shares) or sum(shares) > 1 + 1e-9:
            raise ConfigError(f"fault shares must be in [0, 1] and sum to at most 1, got {shares}")


class FaultProxy:
    """The proxy (see the module docstring); a context manager that starts and stops it.

    Attributes:
        url: ``http://127.0.0.1:PORT`` once started.
        counts: ``(path, outcome) -> requests``; outcome is ``forwarded``, ``rate_limited``,
            ``unavailable``, ``truncated`` or ``slow``.
        arrivals: ``path -> wall-clock times (time.time(), s)`` of its requests, in arrival order.
    """

    def __init__(self, upstream: str, faults: Faults | None = None, *,
                 rewrite: Callable[[str], str] | None = None) -> None:
        """``upstream``: the server's base URL. ``rewrite``: request path → the path to count and
        forward (a gateway's rewrite, e.g. dropping a V2 ``/versions/N`` segment for a server
        that serves one version); None forwards paths as they come."""
        self.upstream = upstream.rstrip("/")
        self._rewrite = rewrite
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.arrivals: collections.defaultdict[str, list[float]] = collections.defaultdict(list)
        #: Per path, ``[start, end]`` wall-clock seconds of each request (end None while in flight).
        self.spans: collections.defaultdict[str, list[list[float | None]]] = collections.defaultdict(list)
        self._faults = faults or Faults()
        self._rng = random.Random(self._faults.seed)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(self._app, log_level="warning", lifespan="off", access_log=False,
                                interface="asgi3")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="aisp-fault-proxy", daemon=True)
        self._client: httpx.AsyncClient | None = None

    @property
    def faults(self) -> Faults:
        return self._faults

    def set_faults(self, faults: Faults) -> None:
        """Change the faults from now on (keeps the draw's position unless the seed changes)."""
        if faults.seed != self._faults.seed:
            self._rng = random.Random(faults.seed)
        self._faults = faults

    def heal(self) -> None:
        """No more faults (every request forwarded)."""
        self.set_faults(replace(self._faults, rate_limited=0.0, unavailable=0.0, truncated=0.0, slow=0.0))

    def requests(self, path_suffix: str = "") -> int:
        """Requests seen whose path ends with ``path_suffix`` (all when empty)."""
        return sum(n for (path, _), n in self.counts.items() if path.endswith(path_suffix))

    def first_request_since(self, since: float, path_suffix: str = "") -> float | None:
        """The wall-clock time (s) of the first request at or after ``since`` whose path ends with
        ``path_suffix``, or None."""
        times = [t for path, ts in self.arrivals.items() if path.endswith(path_suffix)
                 for t in ts if t >= since]
        return min(times, default=None)

    def inflight_at(self, t: float, path_suffix: str = "") -> int:
        """Requests whose path ends with ``path_suffix`` that had arrived and not been answered at
        wall-clock time ``t`` (s): the client's concurrency as the server's door sees it."""
        return sum(1 for path, spans in self.spans.items() if path.endswith(path_suffix)
                   for start, end in spans if start is not None and start <= t and (end is None or end > t))

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fault proxy did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def _draw(self) -> str:
        f, x = self._faults, self._rng.random()
        for name, share in (("rate_limited", f.rate_limited), ("unavailable", f.unavailable),
                            ("truncated", f.truncated), ("slow", f.slow)):
            if x < share:
                return name
            x -= share
        return "forwarded"

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self._rewrite is not None:
            scope = {**scope, "path": self._rewrite(scope["path"])}
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        outcome = self._draw() if scope["path"].endswith(self._faults.path_suffix) else "forwarded"
        self.counts[(scope["path"], outcome)] += 1
        self.arrivals[scope["path"]].append(time.time())
        span: list[float | None] = [self.arrivals[scope["path"]][-1], None]
        self.spans[scope["path"]].append(span)
        try:
            await self._serve(scope, body, path, outcome, send)
        finally:
            span[1] = time.time()

    async def _serve(self, scope: dict[str, Any], body: bytes, path: str, outcome: str, send: Any) -> None:
        if outcome == "rate_limited":
            await _answer(send, 429, b'{"error": "rate limited"}',
                          [(b"retry-after", str(self._faults.retry_after_s).encode())])
            return
        if outcome == "unavailable":
            await _answer(send, 503, b'{"error": "overloaded"}')
            return
        if outcome == "slow":
            await asyncio.sleep(self._faults.slow_s)
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=60)
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"host", b"content-length")]
        response = await self._client.request(scope["method"], f"{self.upstream}{path}", content=body,
                                              headers=[(k.decode(), v.decode()) for k, v in headers])
        content = response.content
        if outcome == "truncated":
            content = content[: len(content) // 2]
        headers = [(k.encode(), v.encode()) for k, v in response.headers.items() if k.lower() not in _HOP]
        await _answer(send, response.status_code, content, headers)


#: Response headers the proxy does not pass on: its own framing (it sends the body whole, decoded).
_HOP = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"})


async def _answer(send: Any, status: int, body: bytes,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
