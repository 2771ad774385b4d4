"""Adaptive concurrency for a remote model server: AIMD over the requests in flight.

The limit is the number of requests a worker keeps in flight. It grows additively while
answers come back in time and shrinks multiplicatively when the server says it is
overloaded (HTTP 429 or 503, a timeout), as TCP's congestion window does (RFC 5681, §3.1:
additive increase of about one segment per round trip, multiplicative decrease on loss)
and as Netflix's ``concurrency-limits`` library does for RPC clients (its ``AIMDLimit``:
grow only while the limit is in use, back off by a ratio on a drop or timeout). Here:

- on a good answer, while at least half of the limit is in flight, the limit grows by
  ``1 / limit`` (about +1 per round trip of a full window);
- on an overload signal the limit is multiplied by ``backoff_ratio``, at most once per
  round trip (the answers of one window that all fail together count as one loss);
- a ``Retry-After`` (RFC 9110, §10.2.3) holds every new request until it passes.

Optional fixed limits sit on top, as the generic cell rate algorithm does (GCRA, ITU-T I.371: a
theoretical arrival time that each admitted unit pushes forward by its cost over the rate):

- ``max_requests_per_s``: request starts are spaced by at least ``1 / rate`` (no burst), so
  any interval of ``T`` seconds sees at most ``rate * T + 1`` starts;
- ``max_tokens_per_min``: each answer's ``usage.total_tokens`` (OpenAI) is charged when it
  arrives; a new request waits while the tokens charged run more than one minute's budget ahead
  of the clock (a bucket of one minute's tokens). Tokens are known only from answers, so the
  requests in flight when the budget runs out may overshoot it by their own tokens.

A request waits for a free slot: that wait is the backpressure that reaches the Kafka
source (the batching thread blocks, the operator's queue fills, Flink's channels fill).
All methods run on one asyncio event loop (no locks).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyflink_aisp.errors import ConfigError

__all__ = ["AimdLimiter", "LimiterConfig"]


@dataclass(frozen=True)
class LimiterConfig:
    """Bounds of the adaptive limit.

    Attributes:
        initial: Requests in flight at the start (>= 1).
        minimum: Never fewer (>= 1).
        maximum: Never more (>= initial).
        backoff_ratio: Factor on an overload signal, in (0, 1).
        max_requests_per_s: Fixed limit on request starts, requests/s (None: none).
        max_tokens_per_min: Fixed limit on the tokens answers report, tokens/min (None: none).

    Raises:
        ConfigError: A bound out of range.
    """

    initial: int = 4
    minimum: int = 1
    maximum: int = 64
    backoff_ratio: float = 0.5
    max_requests_per_s: float | None = None
    max_tokens_per_min: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.initial <= self.maximum:
            raise ConfigError(f"concurrency bounds must satisfy 1 <= minimum <= initial <= maximum, got "
                              f"{self.minimum}, {self.initial}, {self.maximum}")
        if not 0 < self.backoff_ratio < 1:
            raise ConfigError(f"backoff_ratio must be in (0, 1), got {self.backoff_ratio}")
        for name in ("max_requests_per_s", "max_tokens_per_min"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0 (or None: no limit), got {value}")


class AimdLimiter:
    """The requests a worker may have in flight to one server (see the module docstring).

    Attributes:
        limit: The current limit (a float; ``int(limit)`` requests may be in flight).
        inflight: Requests in flight now.
        throttled_s: Seconds requests waited for a ``Retry-After`` or a fixed limit, summed.
        decreases: Multiplicative decreases so far.
        tokens: Tokens charged by :meth:`charge_tokens`, summed.
    """

    def __init__(self, config: LimiterConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or LimiterConfig()
        self.limit = float(self.config.initial)
        self.inflight = 0
        self.throttled_s = 0.0
        self.decreases = 0
        self.tokens = 0
        self._clock = clock
        self._next_start = 0.0  # max_requests_per_s: no start before this (GCRA's arrival time)
        self._tokens_until = 0.0  # max_tokens_per_min: when the tokens charged so far are paid off
        self._hold_until = 0.0  # Retry-After: no new request before this
        self._calm_until = 0.0  # one decrease per round trip
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self, deadline: float | None = None) -> float | None:
        """Wait for a slot (and for any ``Retry-After`` and fixed limit to pass), until ``deadline``
        (on the limiter's clock; None: no bound).

        Returns:
            The start time to give :meth:`release`, or None when the deadline came first (no
            slot taken).
        """
        while True:
            now = self._clock()
            if deadline is not None and now >= deadline:
                return None
            until = self._admitted_at()
            if now < until:
                wait = min(until, deadline if deadline is not None else until) - now
                self.throttled_s += wait
                await asyncio.sleep(wait)
                continue
            if self.inflight < int(self.limit):
                self.inflight += 1
                rate = self.config.max_requests_per_s
                if rate is not None:
                    self._next_start = max(self._next_start, now) + 1.0 / rate
                return now
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, None if deadline is None else max(deadline - now, 0.0))
            except TimeoutError:
                self._wake()  # a slot handed to this waiter as it gave up goes to the next
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _admitted_at(self) -> float:
        """The earliest time a new request may start (Retry-After hold, fixed limits)."""
        until = max(self._hold_until, self._next_start)
        if self.config.max_tokens_per_min is not None:
            until = max(until, self._tokens_until - 60.0)
        return until

    def charge_tokens(self, tokens: int) -> None:
        """Charge an answer's tokens against ``max_tokens_per_min`` (counted in :attr:`tokens`
        even without that limit).

        Args:
            tokens: The answer's ``usage.total_tokens`` (>= 0).
        """
        self.tokens += tokens
        rate = self.config.max_tokens_per_min
        if rate is not None and tokens > 0:
            self._tokens_until = max(self._tokens_until, self._clock()) + tokens * 60.0 / rate

    def release(self, started: float, *, overloaded: bool, retry_after_s: float | None = None) -> None:
        """Free a slot and adjust the limit.

        Args:
            started: :meth:`acquire`'s return value.
            overloaded: The server signalled overload (429, 503, a timeout): decrease.
            retry_after_s: The answer's ``Retry-After`` in seconds (hold new requests).
        """
        now = self._clock()
        in_use = self.inflight
        self.inflight -= 1
        cfg = self.config
        if overloaded:
            if now >= self._calm_until:
                self.limit = max(float(cfg.minimum), self.limit * cfg.backoff_ratio)
                self.decreases += 1
                self._calm_until = now + max(now - started, 0.0)
        elif in_use * 2 >= self.limit:
            self.limit = min(float(cfg.maximum), self.limit + 1.0 / self.limit)
        if retry_after_s is not None and retry_after_s > 0:
            self._hold_until = max(self._hold_until, now + retry_after_s)
        self._wake()

    def _wake(self) -> None:
        free = int(self.limit) - self.inflight
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1
