"""HTTP to a remote model server: one connection pool per worker on its own event loop,
adaptive concurrency, retries with backoff inside a deadline, secrets kept out of sight.

A :class:`RemoteSession` owns an asyncio event loop in a daemon thread and an
``httpx.AsyncClient`` (its connection pool) on it. The handler's batching thread hands it
the requests of one model batch at once (:meth:`RemoteSession.gather`); they run
concurrently under the :class:`~.AimdLimiter`. Each request retries what a server may
answer differently next time (429, 502, 503, 504, 408, timeouts, connection errors) with
exponential backoff and full jitter (Brooker, "Exponential Backoff And Jitter", AWS
Architecture Blog, 2015: sleep ``uniform(0, min(cap, base * 2**attempt))``), at least as
long as a ``Retry-After`` asks, until the request's deadline; then it fails with
:class:`~pyflink_aisp.errors.RemoteTimeoutError`. Any other 4xx / 5xx fails at once with
:class:`~pyflink_aisp.errors.RemoteError` (the same request would get the same answer), and a
server's "the prompt is past the context window" (:func:`context_overflow`) with
:class:`~pyflink_aisp.errors.PromptTooLongError`.

Every wait counts against the deadline: a slot in the limiter, a ``Retry-After`` (capped at
``max_retry_after_s``; a longer one ends the request at once), the backoff and the attempt
itself. An attempt is not started with less than ``min_attempt_s`` left, and only an attempt
that ran its full ``request_timeout_s`` counts as an overload signal (one cut short by the
deadline says nothing about the server).

The API key is read from an environment variable or a file when the session opens (on the
worker), must be visible ASCII (RFC 9110 §5.5 field values; RFC 6750 ``b64token``), is kept only
in the client's default headers, and never put in a message: errors name the URL path and the
status, never the headers, and any message that could echo the key is redacted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import json
import os
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from pyflink_aisp.errors import ConfigError, PromptTooLongError, RemoteError, RemoteTimeoutError
from pyflink_aisp.inference.handlers.remote._limit import AimdLimiter, LimiterConfig
from pyflink_aisp.inference.handlers.remote._v2_raw import binary_answer
from pyflink_aisp.inference.handlers.remote._wire import BODY_CHARS, NoAnswer, Reply, Sender

__all__ = ["GRPC_SCHEMES", "RETRYABLE_STATUSES", "RawBody", "RemoteEndpoint", "RemoteSession",
           "check_base_url", "context_overflow", "path_segment", "retry_after_seconds"]

#: Statuses worth another try: request timeout, too early, too many requests, bad gateway,
#: service unavailable, gateway timeout (RFC 9110 §15; 425 and 429: RFC 8470, RFC 6585).
RETRYABLE_STATUSES = frozenset({408, 425, 429, 502, 503, 504})
#: Of those, the ones that say the server is overloaded: the limiter backs off.
_OVERLOAD_STATUSES = frozenset({429, 503})
#: Statuses a server refuses a prompt past its context window with (all say 400 today).
_OVERFLOW_STATUSES = frozenset({400, 413, 422})
#: An error's ``type`` / ``code`` that says the prompt is past the context window: llama.cpp's
#: ``ERROR_TYPE_EXCEED_CONTEXT_SIZE`` (tools/server/server-common.cpp, format_error_response) and
#: the OpenAI API's error code.
_OVERFLOW_KINDS = frozenset({"exceed_context_size_error", "context_length_exceeded"})
#: Words of an error's ``message`` that say so: llama.cpp's "request (N tokens) exceeds the available
#: context size (C tokens), try increasing it" (tools/server/server-context.cpp), vLLM's and
#: OpenAI's "This model's maximum context length is C tokens. However, you requested N tokens ...".
_OVERFLOW_WORDS = ("exceeds the available context size", "maximum context length")

T = TypeVar("T")


#: URL schemes of an Open Inference Protocol v2 server's gRPC endpoint (plaintext, TLS).
GRPC_SCHEMES = ("grpc", "grpcs")


def check_base_url(url: str) -> str:
    """A server's base URL, checked: ``http://`` or ``https://`` (or, for a V2 server's gRPC
    endpoint, ``grpc://`` / ``grpcs://`` with a port) with a host, no credentials, no path on
    a gRPC URL, no query or fragment; the trailing ``/`` dropped.

    Raises:
        ConfigError: Otherwise (the message never repeats credentials).
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.username is not None or parts.password is not None:
        raise ConfigError("a remote model server URL must not carry credentials (user:password@): give "
                          "the key by an environment variable or a file")
    if parts.scheme not in ("http", "https", *GRPC_SCHEMES) or not parts.hostname:
        raise ConfigError("a remote model server URL must be http://, https://, grpc:// or grpcs:// with a "
                          f"host, got {url!r}")
    if parts.scheme in GRPC_SCHEMES and (parts.port is None or parts.path.strip("/")):
        raise ConfigError(f"a gRPC server URL is grpc://host:port (or grpcs://) without a path, got {url!r}")
    if parts.query or parts.fragment:
        raise ConfigError(f"a remote model server URL is a base URL without '?' or '#', got {url!r}")
    return url.strip().rstrip("/")


def path_segment(kind: str, name: str) -> str:
    """``name`` as one URL path segment (percent-encoded, RFC 3986 §3.3), e.g. a model name.

    Raises:
        ConfigError: Empty, ``.`` or ``..``, with ``/``, or with control characters.
    """
    if not name or name in (".", "..") or "/" in name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ConfigError(f"a remote {kind} must be a non-empty name without '/' or control characters "
                          f"(not '.' or '..'), got {name!r}")
    return urllib.parse.quote(name, safe="")


def _check_key(key: str, source: str) -> str:
    """An API key: visible ASCII only (a header value that cannot be sent would echo it in
    the HTTP library's error)."""
    if not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ConfigError(f"the API key from {source} holds spaces, control or non-ASCII characters: "
                          "an Authorization header cannot carry it")
    return key


def _total_tokens(answer: Any) -> int:
    """An OpenAI answer's ``usage.total_tokens`` (0 when it has none, as V2 answers)."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else 0


def context_overflow(status: int, body: str) -> bool:
    """Whether a refusal is the server's "the prompt is past the context window" answer: HTTP 400
    (413, 422) with a JSON error object (``{"error": {...}}`` or, older vLLM, the object itself)
    whose ``type`` or ``code`` is llama.cpp's ``exceed_context_size_error`` or OpenAI's
    ``context_length_exceeded``, or whose ``message`` holds llama.cpp's "exceeds the available
    context size" or vLLM's / OpenAI's "maximum context length". Only the error's own fields are
    read, never the rest of the body (which may echo the prompt)."""
    if status not in _OVERFLOW_STATUSES:
        return False
    try:
        document = json.loads(body)
    except ValueError:
        return False
    error = document.get("error", document) if isinstance(document, dict) else None
    if not isinstance(error, dict):
        return False
    if any(error.get(key) in _OVERFLOW_KINDS for key in ("type", "code")):
        return True
    message = error.get("message")
    return isinstance(message, str) and any(w in message.lower() for w in _OVERFLOW_WORDS)


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """A ``Retry-After`` header (RFC 9110 §10.2.3: delay-seconds or an HTTP-date) in seconds
    from now; None when absent or unreadable; never negative."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


@dataclass(frozen=True)
class RemoteEndpoint:
    """Where a remote model server is and how to call it (pickled into the job: no secret).

    Attributes:
        url: Base URL, ``http://`` or ``https://`` (e.g. ``http://triton:8000``); a V2
            server's gRPC endpoint: ``grpc://host:port`` or ``grpcs://host:port`` (TLS).
        api_key_env: Environment variable holding the API key (sent as ``Authorization:
            Bearer``), read on the worker.
        api_key_file: File holding the API key (its first line), read on the worker.
        ca_file: PEM bundle to verify the server's TLS certificate against (default: the
            system's, through ``certifi``).
        request_timeout_s: Longest one attempt may take, in seconds.
        deadline_s: Longest one request may take, retries and waits included, in seconds.
        max_attempts: Most attempts of one request (the deadline usually ends it first).
        max_retry_after_s: Longest ``Retry-After`` honoured, in seconds (a longer one fails
            the request at once: waiting it out would hold every later request).
        min_attempt_s: Least time left for an attempt to start, in seconds.
        backoff_base_s: First backoff cap, in seconds (doubles per attempt).
        backoff_cap_s: Largest backoff, in seconds.
        concurrency: Bounds of the adaptive limit of requests in flight per worker.

    Raises:
        ConfigError: A URL that :func:`check_base_url` refuses, both key sources, a missing CA
            file, bad timing.
    """

    url: str
    api_key_env: str | None = None
    api_key_file: Path | None = None
    ca_file: Path | None = None
    request_timeout_s: float = 10.0
    deadline_s: float = 30.0
    max_attempts: int = 100
    max_retry_after_s: float = 60.0
    min_attempt_s: float = 0.05
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 5.0
    concurrency: LimiterConfig = field(default_factory=LimiterConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", check_base_url(self.url))
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ConfigError("give the API key by an environment variable or a file, not both")
        if self.ca_file is not None and not Path(self.ca_file).is_file():
            raise ConfigError(f"the CA file {self.ca_file} is not a file")
        if not 0 < self.request_timeout_s <= self.deadline_s:
            raise ConfigError(f"need 0 < request timeout <= deadline, got {self.request_timeout_s} s and "
                              f"{self.deadline_s} s")
        if self.max_attempts < 1 or not 0 < self.backoff_base_s <= self.backoff_cap_s:
            raise ConfigError("need max_attempts >= 1 and 0 < backoff base <= backoff cap")
        if self.max_retry_after_s < 0 or not 0 < self.min_attempt_s <= self.request_timeout_s:
            raise ConfigError("need max_retry_after_s >= 0 and 0 < min_attempt_s <= request timeout")

    @property
    def is_grpc(self) -> bool:
        """Whether the URL names a gRPC endpoint (``grpc://`` or ``grpcs://``)."""
        return self.url.split(":", 1)[0] in GRPC_SCHEMES

    def api_key(self) -> str | None:
        """The API key, read now (None without a source).

        Raises:
            ConfigError: The variable is unset or empty, the file cannot be read or is empty, or
                the key is not visible ASCII.
        """
        if self.api_key_env is not None:
            key = os.environ.get(self.api_key_env, "").strip()
            if not key:
                raise ConfigError(f"the API key variable {self.api_key_env} is not set on this worker")
            return _check_key(key, f"${self.api_key_env}")
        if self.api_key_file is not None:
            try:
                lines = Path(self.api_key_file).read_text(encoding="utf-8").strip().splitlines()
            except OSError as exc:
                raise ConfigError(f"cannot read the API key file {self.api_key_file}: "
                                  f"{type(exc).__name__}") from None
            if not lines or not lines[0].strip():
                raise ConfigError(f"the API key file {self.api_key_file} is empty")
            return _check_key(lines[0].strip(), str(self.api_key_file))
        return None

    def headers(self) -> dict[str, str]:
        """Default request headers (the ``Authorization`` header when a key is configured)."""
        key = self.api_key()
        return {} if key is None else {"Authorization": f"Bearer {key}"}

    def verify(self) -> str | bool:
        """httpx's ``verify``: the CA file, or True (the default trust store)."""
        return str(self.ca_file) if self.ca_file is not None else True

    def get_json(self, path: str, *, deadline_s: float = 10.0) -> Any:
        """A synchronous GET (start-up checks, on the client and on each worker), retried as a
        request is (:data:`RETRYABLE_STATUSES`, connection errors, ``Retry-After``) within
        ``deadline_s`` (at most the request deadline): the JSON body.

        Raises:
            RemoteError: Unreachable (status None), a final 4xx / 5xx, or a body that is not JSON.
        """
        return self._sync_json(path, None, deadline_s)

    def post_json(self, path: str, body: Any, *, deadline_s: float = 10.0) -> Any:
        """A synchronous POST of the JSON ``body``, as :meth:`get_json` (start-up checks).

        Raises:
            RemoteError: As :meth:`get_json`.
        """
        return self._sync_json(path, body, deadline_s)

    def _sync_json(self, path: str, body: Any, deadline_s: float) -> Any:
        """GET (``body`` None) or POST ``path`` with retries (see :meth:`get_json`)."""
        deadline = time.monotonic() + min(deadline_s, self.deadline_s)
        rng = random.Random()
        headers = self.headers()
        with httpx.Client(headers=headers, verify=self.verify(),
                          timeout=self.request_timeout_s) as client:
            for attempt in range(self.max_attempts):
                wait = rng.uniform(0.0, min(self.backoff_cap_s, self.backoff_base_s * 2 ** attempt))
                try:
                    response = (client.get(f"{self.url}{path}") if body is None else
                                client.post(f"{self.url}{path}", json=body))
                except httpx.HTTPError as exc:
                    failure = RemoteError(_redact(f"{self.url} is unreachable: {type(exc).__name__}: {exc}",
                                                  headers))
                else:
                    if response.status_code not in RETRYABLE_STATUSES:
                        return _json_of(response, path)
                    failure = RemoteError(f"{path}: HTTP {response.status_code}: "
                                          f"{response.text[:BODY_CHARS]}", response.status_code)
                    wait = max(wait, retry_after_seconds(response.headers.get("retry-after")) or 0.0)
                if attempt + 1 == self.max_attempts or time.monotonic() + wait >= deadline:
                    break
                time.sleep(wait)
        raise failure


def _redact(text: str, headers: dict[str, str]) -> str:
    """``text`` with the API key (if any) replaced by ``***``."""
    auth = headers.get("Authorization", "")
    key = auth.removeprefix("Bearer ")
    return text.replace(key, "***") if key else text


def _json_of(response: httpx.Response, path: str) -> Any:
    if response.status_code >= 400:
        text = response.text
        error = PromptTooLongError if context_overflow(response.status_code, text) else RemoteError
        raise error(f"{path}: HTTP {response.status_code}: {text[:BODY_CHARS]}", response.status_code)
    length = response.headers.get("inference-header-content-length")
    try:
        if length is not None:  # the V2 binary tensor data extension
            return binary_answer(response.content, int(length))
        return response.json()
    except RemoteError as exc:
        raise RemoteError(f"{path}: HTTP {response.status_code}: {exc}", response.status_code) from None
    except ValueError:
        raise RemoteError(f"{path}: HTTP {response.status_code} with a body that is not JSON: "
                          f"{response.text[:BODY_CHARS]!r}", response.status_code) from None


@dataclass
class _HttpReply:
    """An HTTP answer (see :class:`~._wire.Reply`)."""

    response: httpx.Response
    path: str

    @property
    def status(self) -> int:
        return self.response.status_code

    @property
    def retry_after_s(self) -> float | None:
        return retry_after_seconds(self.response.headers.get("retry-after"))

    def summary(self) -> str:
        return f"HTTP {self.status}: {self.response.text[:BODY_CHARS]}"

    def answer(self) -> Any:
        return _json_of(self.response, self.path)


@dataclass(frozen=True)
class RawBody:
    """A request body sent as it is (``content``, with ``headers`` added to the client's), not as
    JSON: e.g. a V2 request in the binary tensor data extension."""

    content: bytes
    headers: dict[str, str]


class _HttpSender:
    """POSTs JSON bodies (or a :class:`RawBody` as it is) over an ``httpx.AsyncClient`` (the worker's
    connection pool)."""

    def __init__(self, endpoint: RemoteEndpoint, headers: dict[str, str],
                 transport: httpx.AsyncBaseTransport | None) -> None:
        if endpoint.is_grpc:
            raise ConfigError(f"{endpoint.url} is a gRPC endpoint: only the V2 handler speaks gRPC")
        self._headers = headers
        limits = httpx.Limits(max_connections=endpoint.concurrency.maximum,
                              max_keepalive_connections=endpoint.concurrency.maximum)
        self._client = httpx.AsyncClient(base_url=endpoint.url, headers=headers, verify=endpoint.verify(),
                                         limits=limits, timeout=endpoint.request_timeout_s,
                                         transport=transport)

    async def send(self, path: str, body: Any, timeout_s: float) -> Reply:
        try:
            if isinstance(body, RawBody):
                response = await self._client.post(path, content=body.content, headers=body.headers,
                                                   timeout=timeout_s)
            else:
                response = await self._client.post(path, json=body, timeout=timeout_s)
            return _HttpReply(response, path)
        except httpx.TimeoutException as exc:
            raise NoAnswer(f"timed out after {timeout_s:.2f} s ({type(exc).__name__})",
                           timed_out=True) from None
        except httpx.TransportError as exc:
            raise NoAnswer(_redact(f"{type(exc).__name__}: {exc}", self._headers), timed_out=False) from None

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass
class SessionStats:
    """Counts of one session (a worker's calls to one server).

    Attributes:
        requests: Attempts sent.
        retries: Attempts after the first of a request.
        failures: Requests that failed for good, by HTTP status (0: no answer).
        throttled_s: Seconds requests waited before a retry because a ``Retry-After`` asked.
    """

    requests: int = 0
    retries: int = 0
    throttled_s: float = 0.0
    failures: dict[int, int] | None = None

    def fail(self, status: int | None) -> None:
        self.failures = self.failures or {}
        self.failures[status or 0] = self.failures.get(status or 0, 0) + 1


class RemoteSession:
    """A worker's connection pool to one server, on its own event loop (see the module docstring).

    Args:
        endpoint: Where and how.
        rng: Jitter's random source (tests seed it).
        transport: httpx transport (tests: ``httpx.MockTransport``); default: the network.
        sender: Builds the :class:`~._wire.Sender` on the session's loop from the endpoint
            and its default headers; default: HTTP (the V2 handler gives the gRPC one).

    Raises:
        ConfigError: The API key cannot be read (from the constructor).
    """

    def __init__(self, endpoint: RemoteEndpoint, *, rng: random.Random | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 sender: Callable[[RemoteEndpoint, dict[str, str]], Sender] | None = None) -> None:
        self.endpoint = endpoint
        self.stats = SessionStats()
        self._rng = rng or random.Random()
        headers = endpoint.headers()
        self._headers = headers
        self._closed = False
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aisp-remote", daemon=True)
        self._thread.start()

        async def make() -> tuple[Sender, AimdLimiter]:
            made = (sender(endpoint, headers) if sender is not None else
                    _HttpSender(endpoint, headers, transport))
            return made, AimdLimiter(endpoint.concurrency)

        try:
            self._sender, self.limiter = self._run(make())
        except BaseException:
            self._stop_loop()
            raise

    def gauges(self) -> dict[str, Callable[[], int]]:
        """Metric gauges of the session: ``remoteRequests`` (attempts sent), ``remoteRetries``,
        ``remoteFailures4xx`` / ``remoteFailures5xx`` / ``remoteFailuresNoAnswer`` (requests
        that failed for good), ``remoteThrottledMs`` (waits a ``Retry-After`` or a fixed limit
        asked for, summed), ``remoteConcurrencyLimit`` (the adaptive limit) and
        ``remoteInflight``."""
        stats, limiter = self.stats, self.limiter

        def failures(low: int, high: int) -> Callable[[], int]:
            return lambda: sum(n for s, n in (stats.failures or {}).items() if low <= s < high)

        return {"remoteRequests": lambda: stats.requests, "remoteRetries": lambda: stats.retries,
                "remoteFailures4xx": failures(400, 500), "remoteFailures5xx": failures(500, 600),
                "remoteFailuresNoAnswer": failures(0, 1),
                "remoteThrottledMs": lambda: round((stats.throttled_s + limiter.throttled_s) * 1000),
                "remoteConcurrencyLimit": lambda: int(limiter.limit),
                "remoteInflight": lambda: limiter.inflight}

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the session's loop and wait; :meth:`close` cancels it.

        Raises:
            RemoteError: The session is closed, or closed while ``coro`` ran (status None).
        """
        with self._lock:
            if self._closed:
                coro.close()
                raise RemoteError(f"the connection pool to {self.endpoint.url} is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._pending.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RemoteError(f"the connection pool to {self.endpoint.url} closed while requests "
                              "were in flight") from None
        finally:
            with self._lock:
                self._pending.discard(future)

    def gather(self, bodies: Sequence[tuple[str, Any]],
               on_answer: Callable[[int, Any], None] | None = None) -> list[Any]:
        """POST each ``(path, JSON body)`` concurrently; wait for all.

        Args:
            bodies: The requests.
            on_answer: Called with ``(index, answer or error)`` as each request ends, on the
                session's event loop (keep it short; an exception in it fails the batch).

        Returns:
            Per body, in order: the answer's parsed JSON, or the
            :class:`~pyflink_aisp.errors.RemoteError` /
            :class:`~pyflink_aisp.errors.RemoteTimeoutError` it failed with (returned, not raised).
        """
        async def one(i: int, path: str, body: Any) -> Any:
            try:
                outcome = await self._post(path, body)
            except RemoteError as exc:
                outcome = exc
            if on_answer is not None:
                on_answer(i, outcome)
            return outcome

        async def run_all() -> list[Any]:
            return list(await asyncio.gather(*(one(i, p, b) for i, (p, b) in enumerate(bodies)),
                                             return_exceptions=True))

        outcomes = self._run(run_all())
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, RemoteError):
                raise outcome  # a bug, not the server: fail the batch
        return outcomes

    async def _post(self, path: str, body: Any) -> Any:
        """One request with its retries (see the module docstring).

        Raises:
            RemoteError: A final 4xx / 5xx, a body that is not JSON, or every attempt failed.
            RemoteTimeoutError: The deadline passed first.
        """
        endpoint = self.endpoint
        start = time.monotonic()
        deadline = start + endpoint.deadline_s
        last, status, attempts = "no attempt", None, 0
        while attempts < endpoint.max_attempts:
            began = await self.limiter.acquire(deadline - endpoint.min_attempt_s)
            if began is None:  # no slot (or a Retry-After hold) before the deadline
                last = f"{last}; then no free request slot before the deadline" if attempts else (
                    "no free request slot before the deadline (the server is throttling this worker)")
                break
            self.stats.requests += 1
            self.stats.retries += attempts > 0
            attempts += 1
            retry_after = None
            left = max(deadline - time.monotonic(), endpoint.min_attempt_s)
            timeout = min(endpoint.request_timeout_s, left)
            try:
                reply = await self._sender.send(path, body, timeout)
            except NoAnswer as exc:
                # only a full request timeout says the server is slow; one the deadline cut short does not
                full = timeout >= endpoint.request_timeout_s
                self.limiter.release(began, overloaded=exc.timed_out and full)
                last, status = exc.text, None
            except BaseException:
                self.limiter.release(began, overloaded=False)  # never leak the slot (a bug, a cancel)
                raise
            else:
                status = reply.status
                retry_after = reply.retry_after_s
                held = None if retry_after is None else min(retry_after, endpoint.max_retry_after_s)
                self.limiter.release(began, overloaded=status in _OVERLOAD_STATUSES, retry_after_s=held)
                if status not in RETRYABLE_STATUSES:
                    try:
                        answer = reply.answer()
                    except RemoteError:
                        self.stats.fail(status)
                        raise
                    self.limiter.charge_tokens(_total_tokens(answer))
                    return answer
                last = reply.summary() + (f" (Retry-After {retry_after:g} s)" if retry_after else "")
            if attempts == endpoint.max_attempts:
                break
            cap = min(endpoint.backoff_cap_s, endpoint.backoff_base_s * 2 ** (attempts - 1))
            wait = max(self._rng.uniform(0.0, cap), retry_after or 0.0)
            if time.monotonic() + wait >= deadline:
                break  # the next attempt would start past the deadline
            if retry_after:
                self.stats.throttled_s += wait
            await asyncio.sleep(wait)
        self.stats.fail(status)
        spent = time.monotonic() - start
        if attempts == endpoint.max_attempts:
            raise RemoteError(f"{path}: {attempts} attempts failed in {spent:.1f} s; last: {last}", status)
        raise RemoteTimeoutError(f"{path}: no answer within the {endpoint.deadline_s:g} s deadline "
                                 f"({attempts} attempts, {spent:.1f} s); last: {last}", status)

    def close(self) -> None:
        """Cancel the requests in flight (their :meth:`gather` raises
        :class:`~pyflink_aisp.errors.RemoteError`), close the connection pool and stop the loop
        (idempotent; any later call raises RemoteError)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending)
        for future in pending:
            future.cancel()
        try:
            asyncio.run_coroutine_threadsafe(self._sender.aclose(), self._loop).result(timeout=5)
        except Exception:
            pass  # a pool that fails to close goes with the loop
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
