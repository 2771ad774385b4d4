"""The Open Inference Protocol v2 over gRPC (Triton, KServe, MLServer): ``grpc://host:port``.

The protocol's gRPC binding (``inference.GRPCInferenceService``,
https://github.com/kserve/open-inference-protocol, ``grpc_predict_v2.proto``; Triton's
``grpc_service.proto`` is a superset of it), with the messages and stub generated from
``proto/grpc_predict_v2.proto`` (the calls used here; ``make protos``). ``ModelMetadata``
gives the model's inputs and outputs; ``ModelInfer`` takes one ``(k, n_features)`` tensor
as ``raw_input_contents`` (little-endian bytes, row-major), and its answer is read from
``raw_output_contents`` when the server sends them or else from the typed ``contents``. Both
are turned into the REST binding's JSON shape (``{"outputs": [{"name", "datatype", "shape",
"data"}]}``), so the V2 handler reads one shape whichever binding carried it.

A gRPC status is mapped to the HTTP status ``google/rpc/code.proto`` gives for it
(RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, INVALID_ARGUMENT 400, NOT_FOUND 404, ...), so the
session's retries, back-off and dead-letter reasons treat both bindings alike; a deadline
that passed or a connection that could not be made is no answer (retried, as over HTTP). A
server may ask for a wait with ``retry-after`` trailing metadata (seconds), as over HTTP.
The API key is sent as ``authorization: Bearer`` call metadata, never in a message.
"""

from __future__ import annotations

import random
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import RemoteError
from pyflink_aisp.inference.handlers.remote._client import RemoteEndpoint, _redact, retry_after_seconds
from pyflink_aisp.inference.handlers.remote._v2_raw import RAW_DTYPES, raw_values
from pyflink_aisp.inference.handlers.remote._wire import BODY_CHARS, NoAnswer, Reply
from pyflink_aisp.inference.handlers.remote.proto import grpc_predict_v2_pb2 as pb
from pyflink_aisp.inference.handlers.remote.proto import grpc_predict_v2_pb2_grpc as pb_grpc

__all__ = ["GRPC_HTTP_STATUS", "GrpcV2Sender", "infer_request", "model_metadata"]

#: gRPC status code → HTTP status, as the "HTTP Mapping" of each code in google/rpc/code.proto.
GRPC_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409, grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DATA_LOSS: 500,
}
#: Words of grpc-core's UNAVAILABLE details when no server answered (connect failed, reset).
_NO_SERVER = ("failed to connect", "connection refused", "connection reset", "socket closed",
              "dns resolution failed")
#: Largest message either way, in bytes (gRPC's default receive limit is 4 MiB).
_MAX_MESSAGE = 256 * 1024 * 1024
_OPTIONS = [("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE)]
#: V2 datatype → the InferTensorContents field holding it (FP16 has none: raw only).
_TYPED = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
          "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
          "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
          "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def _target(endpoint: RemoteEndpoint) -> tuple[str, bool]:
    """``(host:port, tls)`` of a ``grpc://`` / ``grpcs://`` endpoint."""
    parts = urllib.parse.urlsplit(endpoint.url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}", parts.scheme == "grpcs"


def _credentials(endpoint: RemoteEndpoint) -> grpc.ChannelCredentials:
    roots = endpoint.ca_file.read_bytes() if endpoint.ca_file is not None else None
    return grpc.ssl_channel_credentials(root_certificates=roots)


def _metadata(headers: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Call metadata of the session's default headers (keys lower-case, as gRPC requires)."""
    return tuple((k.lower(), v) for k, v in headers.items())


def infer_request(model: str, version: str | None, input_name: str, datatype: str,
                  matrix: npt.NDArray[Any], output_names: list[str]) -> Any:
    """A ``ModelInferRequest`` of one tensor of ``datatype`` (raw contents: little-endian numbers,
    or for ``BYTES`` each string's 4-byte little-endian length and UTF-8 bytes), asking for
    ``output_names``."""
    request = pb.ModelInferRequest(model_name=model, model_version=version or "")
    tensor = request.inputs.add(name=input_name, datatype=datatype)
    tensor.shape.extend(int(d) for d in matrix.shape)
    if datatype == "BYTES":
        encoded = [str(s).encode("utf-8") for s in matrix.ravel()]
        raw = b"".join(len(e).to_bytes(4, "little") + e for e in encoded)
    else:
        raw = np.ascontiguousarray(matrix, dtype=RAW_DTYPES[datatype]).tobytes()
    request.raw_input_contents.append(raw)
    for name in output_names:
        request.outputs.add(name=name)
    return request


def answer_json(response: Any) -> dict[str, Any]:
    """A ``ModelInferResponse`` in the REST binding's JSON shape.

    Raises:
        RemoteError: Raw contents that do not match the outputs (status None).
    """
    raw = list(response.raw_output_contents)
    if raw and len(raw) != len(response.outputs):
        raise RemoteError(f"the answer has {len(raw)} raw contents for {len(response.outputs)} outputs")
    outputs = []
    for i, out in enumerate(response.outputs):
        if raw:
            data: list[Any] = raw_values(out.name, out.datatype, raw[i])
        else:
            values = getattr(out.contents, _TYPED.get(out.datatype, "bytes_contents"))
            data = ([v.decode("utf-8", errors="replace") for v in values] if out.datatype == "BYTES"
                    else list(values))
        outputs.append({"name": out.name, "datatype": out.datatype, "shape": list(out.shape), "data": data})
    return {"model_name": response.model_name, "model_version": response.model_version, "outputs": outputs}


def _metadata_json(response: Any) -> dict[str, Any]:
    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": [int(d) for d in t.shape]} for t in specs]

    return {"name": response.name, "versions": list(response.versions), "platform": response.platform,
            "inputs": tensors(response.inputs), "outputs": tensors(response.outputs)}


def _no_server(exc: grpc.RpcError) -> bool:
    details = (exc.details() or "").lower() if hasattr(exc, "details") else ""
    return exc.code() is grpc.StatusCode.UNAVAILABLE and any(w in details for w in _NO_SERVER)


def _retry_after(exc: Any) -> float | None:
    try:
        pairs = exc.trailing_metadata() or ()
    except Exception:
        return None
    for key, value in pairs:
        if key.lower() == "retry-after" and isinstance(value, str):
            return retry_after_seconds(value)
    return None


@dataclass
class _GrpcReply:
    """A gRPC answer (see :class:`~._wire.Reply`)."""

    path: str
    status: int
    retry_after_s: float | None = None
    response: Any = None
    code: str = "OK"
    details: str = ""

    def summary(self) -> str:
        return f"gRPC {self.code} (HTTP {self.status}): {self.details[:BODY_CHARS]}"

    def answer(self) -> Any:
        if self.status >= 400:
            raise RemoteError(f"{self.path}: {self.summary()}", self.status)
        return answer_json(self.response)


class GrpcV2Sender:
    """Sends ``ModelInferRequest`` bodies on one ``grpc.aio`` channel (HTTP/2: every request in
    flight shares its connection); built on the session's event loop.

    Args:
        endpoint: A ``grpc://`` or ``grpcs://`` endpoint (``grpcs``: TLS, verified against
            ``ca_file`` or the system's roots).
        headers: The session's default headers (``Authorization``), sent as call metadata.
    """

    def __init__(self, endpoint: RemoteEndpoint, headers: dict[str, str]) -> None:
        target, tls = _target(endpoint)
        self._headers = headers
        self._metadata = _metadata(headers)
        self._channel = (grpc.aio.secure_channel(target, _credentials(endpoint), options=_OPTIONS) if tls
                         else grpc.aio.insecure_channel(target, options=_OPTIONS))
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)

    async def send(self, path: str, body: Any, timeout_s: float) -> Reply:
        try:
            response = await self._stub.ModelInfer(body, timeout=timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), _redact(exc.details() or "", self._headers)
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise NoAnswer(f"timed out after {timeout_s:.2f} s (gRPC DEADLINE_EXCEEDED)",
                               timed_out=True) from None
            if _no_server(exc):
                raise NoAnswer(f"gRPC UNAVAILABLE: {details[:BODY_CHARS]}", timed_out=False) from None
            return _GrpcReply(path, GRPC_HTTP_STATUS.get(code, 500), _retry_after(exc), code=code.name,
                              details=details)
        return _GrpcReply(path, 200, response=response)

    async def aclose(self) -> None:
        await self._channel.close()


def _metadata_failure(endpoint: RemoteEndpoint, model: str, exc: Any,
                      headers: dict[str, str]) -> tuple[RemoteError, bool]:
    """``(error, worth another try)`` of a failed ``ModelMetadata`` call."""
    code, details = exc.code(), _redact(exc.details() or "", headers)
    retry = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                     grpc.StatusCode.DEADLINE_EXCEEDED)
    if _no_server(exc) or code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED,
                                   grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return RemoteError(f"{endpoint.url} answers no V2 gRPC ModelMetadata (is it the server's gRPC "
                           f"port?): gRPC {code.name}: {details[:BODY_CHARS]}"), retry
    return RemoteError(f"ModelMetadata {model}: gRPC {code.name}: {details[:BODY_CHARS]}",
                       GRPC_HTTP_STATUS.get(code, 500)), retry


def model_metadata(endpoint: RemoteEndpoint, model: str, version: str | None, *,
                   deadline_s: float = 10.0) -> dict[str, Any]:
    """``ModelMetadata`` of ``model`` (synchronous: the start-up checks), retried on
    UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED within ``deadline_s`` (at most the
    request deadline), in the REST binding's JSON shape.

    Raises:
        RemoteError: Unreachable or not a V2 gRPC endpoint (status None), an unknown model
            (404), or another refusal (its HTTP equivalent).
        ConfigError: The API key cannot be read.
    """
    headers = endpoint.headers()
    target, tls = _target(endpoint)
    deadline = time.monotonic() + min(deadline_s, endpoint.deadline_s)
    rng = random.Random()
    request = pb.ModelMetadataRequest(name=model, version=version or "")
    with (grpc.secure_channel(target, _credentials(endpoint), options=_OPTIONS) if tls
          else grpc.insecure_channel(target, options=_OPTIONS)) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for attempt in range(endpoint.max_attempts):
            left = max(deadline - time.monotonic(), endpoint.min_attempt_s)
            try:
                answer = stub.ModelMetadata(request, timeout=min(endpoint.request_timeout_s, left),
                                            metadata=_metadata(headers))
                return _metadata_json(answer)
            except grpc.RpcError as exc:
                failure, retry = _metadata_failure(endpoint, model, exc, headers)
                if not retry:
                    raise failure from None
            wait = rng.uniform(0.0, min(endpoint.backoff_cap_s, endpoint.backoff_base_s * 2 ** attempt))
            if time.monotonic() + wait >= deadline:
                break
            time.sleep(wait)
    raise failure
