"""Retries, deadlines, Retry-After and secrets of the remote client (httpx.MockTransport stands in
for the server here; the real servers are in tests/integration/remote)."""

import asyncio
import email.utils
import json
import random
import threading
import time

import httpx
import pytest

from pyflink_aisp.errors import ConfigError, RemoteError, RemoteTimeoutError
from pyflink_aisp.inference.handlers.remote import (
    LimiterConfig,
    RemoteEndpoint,
    RemoteSession,
    path_segment,
    retry_after_seconds,
)


class Script:
    """Answers in order (the last one repeats); records each request."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _session(script, **endpoint) -> RemoteSession:
    endpoint.setdefault("backoff_base_s", 0.01)
    return RemoteSession(RemoteEndpoint(url="http://server:8000", **endpoint), rng=random.Random(7),
                         transport=httpx.MockTransport(script))


def test_429_with_retry_after_is_waited_out_and_retried() -> None:
    script = Script(httpx.Response(429, headers={"Retry-After": "1"}, text="slow down"),
                    httpx.Response(200, json={"ok": 1}))
    session = _session(script)
    try:
        start = time.monotonic()
        assert session.gather([("/v2/x", {"a": 1})]) == [{"ok": 1}]
        assert time.monotonic() - start >= 0.95  # the Retry-After second
        assert (session.stats.requests, session.stats.retries) == (2, 1)
        assert session.limiter.decreases == 1 and session.stats.throttled_s >= 0.95
        assert json.loads(script.requests[1].content) == {"a": 1}
    finally:
        session.close()


@pytest.mark.parametrize("status", [400, 404, 422, 500])
def test_a_final_status_fails_at_once_with_the_status_and_the_body(status) -> None:
    script = Script(httpx.Response(status, text="input 'x' has shape [3] not [384]"))
    session = _session(script)
    try:
        [error] = session.gather([("/v2/models/m/infer", {})])
        assert isinstance(error, RemoteError) and not isinstance(error, RemoteTimeoutError)
        assert error.status == status and "not [384]" in str(error) and f"HTTP {status}" in str(error)
        assert len(script.requests) == 1
        assert session.stats.failures == {status: 1}
    finally:
        session.close()


def test_a_server_that_stays_unavailable_is_a_timeout_at_the_deadline() -> None:
    script = Script(httpx.Response(503, text="overloaded"))
    session = _session(script, deadline_s=1.0, request_timeout_s=0.5, max_attempts=100)
    try:
        start = time.monotonic()
        [error] = session.gather([("/p", {})])
        spent = time.monotonic() - start
        assert isinstance(error, RemoteTimeoutError) and error.status == 503
        assert "1 s deadline" in str(error) and "HTTP 503: overloaded" in str(error)
        assert spent < 1.5 and len(script.requests) >= 3  # several backed-off tries, none past the deadline
    finally:
        session.close()


def test_connection_errors_retry_up_to_max_attempts() -> None:
    script = Script(httpx.ConnectError("connection refused"))
    session = _session(script, max_attempts=3)
    try:
        [error] = session.gather([("/p", {})])
        assert isinstance(error, RemoteError) and error.status is None
        assert "3 attempts failed" in str(error) and "ConnectError" in str(error)
        assert len(script.requests) == 3
    finally:
        session.close()


def test_a_slow_attempt_times_out_and_backs_off_the_limit() -> None:
    script = Script(httpx.ReadTimeout("read timed out"), httpx.Response(200, json=[1]))
    session = _session(script, concurrency=LimiterConfig(initial=8, maximum=8))
    try:
        assert session.gather([("/p", {})]) == [[1]]
        assert session.limiter.limit == 4.0
    finally:
        session.close()


def test_a_body_that_is_not_json_is_a_remote_error() -> None:
    session = _session(Script(httpx.Response(200, text="<html>proxy login</html>")))
    try:
        [error] = session.gather([("/p", {})])
        assert isinstance(error, RemoteError) and "not JSON" in str(error) and error.status == 200
    finally:
        session.close()


def test_requests_of_one_batch_are_in_flight_together() -> None:
    live, peak = [0], [0]

    async def handler(request: httpx.Request) -> httpx.Response:
        import asyncio

        live[0] += 1
        peak[0] = max(peak[0], live[0])
        await asyncio.sleep(0.05)
        live[0] -= 1
        return httpx.Response(200, json={"n": json.loads(request.content)["n"]})

    session = RemoteSession(RemoteEndpoint(url="http://s", concurrency=LimiterConfig(initial=4, maximum=4)),
                            transport=httpx.MockTransport(handler))
    try:
        out = session.gather([("/p", {"n": i}) for i in range(12)])
        assert out == [{"n": i} for i in range(12)]  # in order
        assert peak[0] == 4  # the limit, not one at a time and not all twelve
    finally:
        session.close()


def test_the_api_key_is_sent_as_a_bearer_token_and_never_in_a_message(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AISP_TEST_KEY", "sk-very-secret")
    script = Script(httpx.Response(401, text="bad token"))
    session = _session(script, api_key_env="AISP_TEST_KEY")
    try:
        [error] = session.gather([("/p", {})])
        assert script.requests[0].headers["authorization"] == "Bearer sk-very-secret"
        assert "sk-very-secret" not in str(error) and "sk-very-secret" not in repr(session.endpoint)
    finally:
        session.close()
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    headers = RemoteEndpoint(url="http://s", api_key_file=key_file).headers()
    assert headers == {"Authorization": "Bearer sk-from-file"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"url": "ftp://s"}, "http://, https://, grpc:// or grpcs://"),
    ({"url": "grpc://s"}, "grpc://host:port"),
    ({"url": "grpcs://s:8001/v2"}, "without a path"),
    ({"url": "http://"}, "with a host"),
    ({"url": "http://s/v2?x=1"}, "without '\\?' or '#'"),
    ({"url": "http://s", "api_key_env": "A", "api_key_file": "f"}, "not both"),
    ({"url": "http://s", "ca_file": "/no/such/ca.pem"}, "is not a file"),
    ({"url": "http://s", "request_timeout_s": 5.0, "deadline_s": 1.0}, "request timeout <= deadline"),
])
def test_bad_endpoints_are_refused(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        RemoteEndpoint(**kwargs)


def test_a_missing_key_is_refused_when_the_session_opens(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("AISP_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="AISP_NO_SUCH_KEY is not set"):
        RemoteSession(RemoteEndpoint(url="http://s", api_key_env="AISP_NO_SUCH_KEY"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        RemoteEndpoint(url="http://s", api_key_file=tmp_path / "empty").headers()


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    now = 1_800_000_000.0
    assert retry_after_seconds(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30)
    assert retry_after_seconds(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_the_gauges_count_attempts_retries_failures_and_throttling() -> None:
    script = Script(httpx.Response(429, headers={"Retry-After": "1"}), httpx.Response(200, json={}),
                    httpx.Response(404, text="no such model"))
    session = _session(script, concurrency=LimiterConfig(initial=4, maximum=8))
    try:
        session.gather([("/a", {})])  # 429, then 200
        session.gather([("/b", {})])  # 404
        gauges = {name: read() for name, read in session.gauges().items()}
    finally:
        session.close()
    assert gauges["remoteRequests"] == 3 and gauges["remoteRetries"] == 1
    failures = (gauges["remoteFailures4xx"], gauges["remoteFailures5xx"], gauges["remoteFailuresNoAnswer"])
    assert failures == (1, 0, 0)
    assert gauges["remoteThrottledMs"] >= 950 and gauges["remoteInflight"] == 0
    assert gauges["remoteConcurrencyLimit"] == 2  # halved once by the 429


def test_credentials_in_the_url_are_refused_without_repeating_them() -> None:
    with pytest.raises(ConfigError, match="must not carry credentials") as info:
        RemoteEndpoint(url="https://alice:hunter2@server:8000")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("key", ["sk-\nX-Injected: 1", "sk with space", "sk-\u00e9", "sk-\x7f"])
def test_an_api_key_a_header_cannot_carry_is_refused_without_echoing_it(monkeypatch, key) -> None:
    monkeypatch.setenv("AISP_TEST_KEY", key)
    with pytest.raises(ConfigError, match="AISP_TEST_KEY holds spaces, control or non-ASCII") as info:
        RemoteEndpoint(url="http://s", api_key_env="AISP_TEST_KEY").headers()
    assert key.strip() not in str(info.value)


def test_model_names_are_one_encoded_path_segment() -> None:
    assert path_segment("model name", "intent head?v=1") == "intent%20head%3Fv%3D1"
    for bad in ("", ".", "..", "a/b", "a\nb"):
        with pytest.raises(ConfigError, match="non-empty name without '/'"):
            path_segment("model name", bad)


def test_a_huge_retry_after_ends_the_request_and_holds_later_ones_only_up_to_their_deadline() -> None:
    script = Script(httpx.Response(429, headers={"Retry-After": "3600"}, text="come back in an hour"))
    session = _session(script, deadline_s=1.0, request_timeout_s=0.5)
    try:
        start = time.monotonic()
        [first] = session.gather([("/p", {})])
        assert isinstance(first, RemoteTimeoutError) and "Retry-After 3600 s" in str(first)
        assert time.monotonic() - start < 0.5  # not waited out: it cannot end before the deadline
        [later] = session.gather([("/p", {})])  # held by the (capped) Retry-After: its deadline ends it
        spent = time.monotonic() - start
        assert isinstance(later, RemoteTimeoutError) and "no free request slot" in str(later)
        assert 0.8 <= spent < 2.5 and len(script.requests) == 1
        assert session.limiter.inflight == 0
    finally:
        session.close()


def test_waiting_for_a_slot_counts_against_the_deadline_and_is_not_an_overload() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:  # 0.6 s to answer, honouring the timeout
        timeout = request.extensions["timeout"]["read"]
        await asyncio.sleep(min(timeout, 0.6))
        if timeout < 0.6:
            raise httpx.ReadTimeout("read timed out", request=request)
        return httpx.Response(200, json={"ok": 1})

    session = RemoteSession(RemoteEndpoint(url="http://s", deadline_s=1.0, request_timeout_s=1.0,
                                           concurrency=LimiterConfig(initial=1, maximum=1)),
                            transport=httpx.MockTransport(slow))
    try:
        start = time.monotonic()
        first, second = session.gather([("/a", {}), ("/b", {})])
        assert first == {"ok": 1}
        # the second waited 0.6 s for the one slot, then had 0.4 s: it times out by the deadline
        assert isinstance(second, RemoteTimeoutError) and time.monotonic() - start < 1.5
        assert session.limiter.decreases == 0  # a timeout the deadline cut short is no overload signal
    finally:
        session.close()


def test_close_while_a_batch_is_in_flight_fails_it_and_a_later_call_is_a_remote_error() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(60)
        raise AssertionError("never answered")

    session = RemoteSession(RemoteEndpoint(url="http://s"), transport=httpx.MockTransport(hang))
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            session.gather([("/a", {}), ("/b", {})])
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.3)
    session.close()
    worker.join(timeout=5)
    assert not worker.is_alive(), "gather still hangs after close()"
    assert isinstance(outcome[0], RemoteError) and "closed while requests were in flight" in str(outcome[0])
    with pytest.raises(RemoteError, match="is closed"):
        session.gather([("/a", {})])
    session.close()  # idempotent


def test_connection_refused_retries_until_the_deadline_by_default() -> None:
    script = Script(httpx.ConnectError("connection refused"))
    session = _session(script, deadline_s=1.5, request_timeout_s=0.5, backoff_cap_s=0.05)
    try:
        start = time.monotonic()
        [error] = session.gather([("/p", {})])
        assert isinstance(error, RemoteTimeoutError) and time.monotonic() - start >= 1.3
        assert len(script.requests) > 10  # not given up after six attempts
    finally:
        session.close()


def test_the_tokens_an_answer_reports_are_charged_to_the_limiter() -> None:
    script = Script(httpx.Response(200, json={"usage": {"prompt_tokens": 7, "total_tokens": 12}}),
                    httpx.Response(200, json={"usage": {"total_tokens": True}}),
                    httpx.Response(200, json={"outputs": []}))
    session = _session(script, concurrency=LimiterConfig(max_tokens_per_min=6000))
    try:
        for _ in range(3):  # OpenAI usage; a malformed one; a V2 answer (no usage)
            session.gather([("/v1/embeddings", {})])
        assert session.limiter.tokens == 12
    finally:
        session.close()
