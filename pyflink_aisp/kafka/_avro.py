"""Avro record values in the Confluent wire format, their schemas from a Schema Registry.

The wire format (Confluent, "Wire format" of the Schema Registry docs): byte 0 is the magic
byte ``0``, bytes 1-4 the schema id (big-endian unsigned), the rest the Avro binary encoding
of one datum (Avro 1.11 specification, "Binary Encoding") under that schema. The schema is
fetched once per id from ``GET {url}/schemas/ids/{id}`` (the Confluent REST API; Apicurio
Registry serves it under ``/apis/ccompat/v7``) and kept for the life of the process; the
datum is read with ``fastavro``'s ``schemaless_reader``. A value that is not the wire format,
or does not decode under its schema, raises ``invalid_avro``; an id the registry does not
know, or a registry that does not answer after retries, ``unknown_schema``: the decoder
dead-letters the record (never a restart).

Basic-auth credentials may ride in the URL (``https://user:secret@host``); messages and
dead letters name the URL without them.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import threading
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fastavro
import httpx
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from pyflink_aisp.errors import DecodeError
from pyflink_aisp.outcome import Reason

__all__ = ["SchemaRegistryClient", "decode_avro", "jsonable", "redact_url", "registry_client"]

#: The magic byte of the Confluent wire format.
_MAGIC = 0
_HEADER = 5


def redact_url(url: str) -> str:
    """``url`` without its user info (``https://user:secret@host/x`` → ``https://host/x``)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class SchemaRegistryClient:
    """Fetches and caches Avro schemas by id from a Confluent-compatible Schema Registry.

    Args:
        url: The registry's base URL (the one whose ``/schemas/ids/{id}`` answers).
        timeout_s: Timeout of one request.
        attempts: Tries of a request that fails to connect or answers 5xx.
        get: Injected HTTP GET (tests); default ``httpx.get``.

    Thread-safety: :meth:`schema` may be called from several threads (one fetch per id).
    """

    def __init__(self, url: str, *, timeout_s: float = 10.0, attempts: int = 3,
                 get: Callable[..., Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.shown_url = redact_url(self.url)
        self._timeout_s = timeout_s
        self._get = get or httpx.get
        self._schemas: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._fetch = retry(stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=0.2, max=2),
                            retry=retry_if_exception_type(_Transient), reraise=True)(self._fetch_once)

    def schema(self, schema_id: int) -> Any:
        """The parsed schema of ``schema_id`` (fetched on first use).

        Raises:
            DecodeError: ``unknown_schema`` (not found, not Avro, unreadable, or the registry
                did not answer; only a registry's definite answer is cached).
        """
        found = self._schemas.get(schema_id)
        if found is None:
            with self._lock:
                found = self._schemas.get(schema_id)
                if found is None:
                    try:
                        found = self._fetch(schema_id)
                    except _Transient as exc:
                        raise DecodeError(Reason.UNKNOWN_SCHEMA.value, f"schema id {schema_id}: the registry "
                                          f"{self.shown_url} did not answer: {exc}") from None
                    self._schemas[schema_id] = found
        if isinstance(found, DecodeError):
            raise found
        return found

    def _fetch_once(self, schema_id: int) -> Any:
        where = f"{self.shown_url}/schemas/ids/{schema_id}"
        try:
            response = self._get(f"{self.url}/schemas/ids/{schema_id}", timeout=self._timeout_s,
                                 headers={"Accept": "application/vnd.schemaregistry.v1+json"})
        except httpx.HTTPError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise _Transient(f"HTTP {response.status_code}")
        if response.status_code != 200:
            return _unknown(f"schema id {schema_id} not found at {where} (HTTP {response.status_code})")
        try:
            body = response.json()
            kind = body.get("schemaType", "AVRO")
            if kind != "AVRO":
                return _unknown(f"schema id {schema_id} is a {kind} schema, not Avro")
            return fastavro.parse_schema(json.loads(body["schema"]))
        except (ValueError, KeyError, TypeError, AttributeError, fastavro.schema.SchemaParseException) as exc:
            return _unknown(f"schema id {schema_id} at {where} is not an Avro schema: {type(exc).__name__}: "
                            f"{exc}"[:300])


class _Transient(Exception):
    """A request that may succeed when tried again."""


def _unknown(detail: str) -> DecodeError:
    return DecodeError(Reason.UNKNOWN_SCHEMA.value, detail)


_CLIENTS: dict[str, SchemaRegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def registry_client(url: str) -> SchemaRegistryClient:
    """The process's client of ``url`` (one schema cache per registry and worker)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(url)
        if client is None:
            client = _CLIENTS[url] = SchemaRegistryClient(url)
        return client


def decode_avro(value: bytes, client: SchemaRegistryClient) -> dict[str, Any]:
    """One Confluent wire-format value → its Avro record as a dict.

    Raises:
        DecodeError: ``invalid_avro`` (shorter than the header, another magic byte, a body
            that does not decode under its schema or has bytes left over), ``not_an_object``
            (the datum is not a record), or ``unknown_schema`` (:meth:`SchemaRegistryClient.schema`).
    """
    data = bytes(value)
    if len(data) < _HEADER or data[0] != _MAGIC:
        what = f"{len(data)} bytes" if len(data) < _HEADER else f"magic byte {data[0]}"
        raise DecodeError(Reason.INVALID_AVRO.value, f"not the Confluent Avro wire format ({what}; expected "
                          "magic byte 0 and a 4-byte schema id)")
    schema_id = int.from_bytes(data[1:_HEADER], "big")
    schema = client.schema(schema_id)
    stream = io.BytesIO(data[_HEADER:])
    try:
        datum = fastavro.schemaless_reader(stream, schema)
    except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, IndexError...
        raise DecodeError(Reason.INVALID_AVRO.value, f"body does not decode under schema id {schema_id}: "
                          f"{type(exc).__name__}: {exc}"[:500]) from None
    left = len(data) - _HEADER - stream.tell()
    if left:
        raise DecodeError(Reason.INVALID_AVRO.value, f"{left} bytes left after the datum of schema id "
                          f"{schema_id}: written under another schema?")
    if not isinstance(datum, dict):
        raise DecodeError(Reason.NOT_AN_OBJECT.value,
                          f"the Avro datum is {type(datum).__name__}, not a record")
    return datum


def jsonable(value: Any) -> Any:
    """An Avro value as JSON can carry it: bytes as base64, decimals as strings, dates and
    times in ISO 8601, UUIDs as strings; records, maps and arrays element by element."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    return str(value)
