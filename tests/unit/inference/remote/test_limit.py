"""The AIMD limiter: additive growth while in use, one multiplicative decrease per round trip,
Retry-After holds (a fake clock; no server)."""

import asyncio
import itertools
import time

import pytest

from pyflink_aisp.errors import ConfigError
from pyflink_aisp.inference.handlers.remote import AimdLimiter, LimiterConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_limit_grows_by_one_over_limit_per_answer_while_half_of_it_is_in_use() -> None:
    clock = Clock()
    limiter = AimdLimiter(LimiterConfig(initial=4, maximum=6), clock=clock)

    async def run() -> list[float]:
        limits = []
        for _ in range(12):
            starts = [await limiter.acquire() for _ in range(int(limiter.limit))]
            clock.now += 0.01
            for s in starts:
                limiter.release(s, overloaded=False)
            limits.append(limiter.limit)
        return limits

    limits = asyncio.run(run())
    # round one: the releases with 4 and 3 of 4 in flight grow it (+1/4, then +1/4.25); with 2 and 1, not
    assert limits[0] == pytest.approx(4 + 1 / 4 + 1 / 4.25)
    assert all(b >= a for a, b in itertools.pairwise(limits))
    assert limits[-1] == 6.0  # capped at the maximum


def test_an_idle_limiter_does_not_grow() -> None:
    limiter = AimdLimiter(LimiterConfig(initial=8), clock=Clock())

    async def run() -> None:
        for _ in range(50):  # one request at a time: 1 in flight of 8, not "in use"
            limiter.release(await limiter.acquire(), overloaded=False)

    asyncio.run(run())
    assert limiter.limit == 8.0


def test_overload_halves_the_limit_once_per_round_trip() -> None:
    clock = Clock()
    limiter = AimdLimiter(LimiterConfig(initial=16, maximum=16), clock=clock)

    async def run() -> None:
        starts = [await limiter.acquire() for _ in range(16)]
        clock.now += 0.5  # each took 0.5 s
        for s in starts:  # the whole window fails together: one loss
            limiter.release(s, overloaded=True)
        assert limiter.limit == 8.0 and limiter.decreases == 1
        clock.now += 0.6  # a round trip later, another loss halves again
        limiter.release(await limiter.acquire(), overloaded=True)
        assert limiter.limit == 4.0
        for _ in range(10):
            clock.now += 10
            limiter.release(await limiter.acquire(), overloaded=True)

    asyncio.run(run())
    assert limiter.limit == 1.0  # never below the minimum


def test_retry_after_holds_new_requests_and_counts_the_time() -> None:
    limiter = AimdLimiter(LimiterConfig(initial=2))

    async def run() -> float:
        loop = asyncio.get_running_loop()
        limiter.release(await limiter.acquire(), overloaded=True, retry_after_s=0.3)
        start = loop.time()
        await limiter.acquire()
        return loop.time() - start

    waited = asyncio.run(run())
    assert waited >= 0.28 and limiter.throttled_s >= 0.28


def test_a_full_limiter_makes_callers_wait_for_a_release() -> None:
    limiter = AimdLimiter(LimiterConfig(initial=2, maximum=2))

    async def run() -> list[str]:
        order: list[str] = []
        a, b = await limiter.acquire(), await limiter.acquire()

        async def third() -> None:
            await limiter.acquire()
            order.append("third acquired")

        task = asyncio.create_task(third())
        await asyncio.sleep(0.05)
        order.append("released")
        limiter.release(a, overloaded=False)
        await task
        limiter.release(b, overloaded=False)
        return order

    assert asyncio.run(run()) == ["released", "third acquired"]


@pytest.mark.parametrize("kwargs", [{"initial": 0}, {"minimum": 5, "initial": 4},
                                    {"maximum": 2, "initial": 4},
                                    {"backoff_ratio": 1.0}, {"backoff_ratio": 0.0}])
def test_bad_bounds_are_refused(kwargs) -> None:
    with pytest.raises(ConfigError):
        LimiterConfig(**kwargs)


def test_acquire_gives_up_at_its_deadline_in_a_hold_and_in_the_queue() -> None:
    limiter = AimdLimiter(LimiterConfig(initial=1, maximum=1))

    async def run() -> tuple[float | None, float | None, float | None, int]:
        first = await limiter.acquire()
        queued = await limiter.acquire(time.monotonic() + 0.05)  # the one slot is taken
        limiter.release(first, overloaded=True, retry_after_s=3600)
        held = await limiter.acquire(time.monotonic() + 0.05)  # a Retry-After hold past the deadline
        return first, queued, held, limiter.inflight

    first, queued, held, inflight = asyncio.run(run())
    assert first is not None and queued is None and held is None and inflight == 0


def test_a_fixed_request_rate_spaces_the_starts_by_one_over_the_rate() -> None:
    limiter = AimdLimiter(LimiterConfig(initial=8, maximum=8, max_requests_per_s=20))

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        starts: list[float] = []

        async def one() -> None:
            began = await limiter.acquire()
            starts.append(loop.time())
            limiter.release(began, overloaded=False)

        await asyncio.gather(*(one() for _ in range(8)))  # 8 slots free: only the rate holds them
        return starts

    starts = asyncio.run(run())
    gaps = [b - a for a, b in itertools.pairwise(sorted(starts))]
    assert len(starts) == 8 and min(gaps) >= 0.045, gaps  # 1 / 20 s, less the timer's slack
    assert limiter.throttled_s >= 0.3


def test_a_token_budget_lets_a_minute_of_tokens_through_then_holds_for_the_debt() -> None:
    limiter = AimdLimiter(LimiterConfig(initial=2, max_tokens_per_min=600))  # 10 tokens/s

    async def run() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        limiter.release(await limiter.acquire(), overloaded=False)
        limiter.charge_tokens(600)  # one minute's budget: the next request still goes at once
        start = loop.time()
        limiter.release(await limiter.acquire(), overloaded=False)
        at_once = loop.time() - start
        limiter.charge_tokens(5)  # half a second past the budget
        start = loop.time()
        await limiter.acquire()
        return at_once, loop.time() - start

    at_once, held = asyncio.run(run())
    assert at_once < 0.05 and 0.45 <= held < 1.5 and limiter.tokens == 605


@pytest.mark.parametrize("name", ["max_requests_per_s", "max_tokens_per_min"])
def test_a_fixed_limit_must_be_positive(name) -> None:
    with pytest.raises(ConfigError, match=name):
        LimiterConfig(**{name: 0})
