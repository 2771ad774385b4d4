"""A numeric or text model behind an Open Inference Protocol v2 server (KServe, Triton, MLServer),
over REST or gRPC.

The protocol ("KServe v2", https://github.com/kserve/open-inference-protocol, REST binding):
``GET /v2/models/{name}[/versions/{v}]`` gives the model's inputs and outputs (name,
datatype, shape with -1 for a variable dimension); ``POST .../infer`` takes
``{"inputs": [{"name", "shape", "datatype", "data"}]}`` with the data flattened in row-major
order and answers ``{"outputs": [...]}`` alike. The handler sends each model batch as
requests of at most ``rows_per_request`` rows, one ``(k, n_features)`` tensor each, all in
flight at once (a V2 tensor batches rows, so one request carries many records), and reads
every output the metadata declares into a field, typed as the in-process
:class:`~pyflink_aisp.inference.handlers.OnnxPredictorHandler` types an ONNX output:

================================  ==============
V2 output (per row)               SQL type
================================  ==============
FP16/FP32/FP64 ``[-1]``/``[-1,1]``  DOUBLE
INT8..INT64, UINT8..UINT64 ``[-1]``  BIGINT
BOOL ``[-1]``                     BOOLEAN
BYTES ``[-1]``                    STRING
FP16/FP32 ``[-1, k]``             ARRAY<FLOAT>
FP64 ``[-1, k]``                  ARRAY<DOUBLE>
BYTES ``[-1, k]``                 ARRAY<STRING>
================================  ==============

A text model (``texts=True``) takes each record's text instead: its one input is ``BYTES`` of
shape ``[-1]`` or ``[-1, 1]`` (a Triton Python or ensemble model with its own tokenizer, an ONNX
graph with a string input), and the texts go as the tensor's elements (JSON strings over REST;
each a 4-byte little-endian length and its UTF-8 bytes in the gRPC binding's raw contents).

A request that fails (see :mod:`._client`) fails its rows alone, as ``remote_error`` or
``remote_timeout`` dead letters; nothing is sent twice by the batcher (the handler returns
the error in those rows' places instead of raising).

With a call log (``call_log``, :mod:`._call_log`) each row's request (the model, its input
tensor's name and datatype, the row's data, the outputs asked for) is a key of a Kafka topic
that keeps its answer or final failure, so a row replayed after a failover is answered from
there instead of the server, and its deadline counts from its first attempt across restarts.

With ``binary=True`` a REST request carries its numeric tensor in the binary tensor data extension
(Triton's, https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md,
also served by KServe): a JSON header whose input names ``binary_data_size``, then the tensor's raw
little-endian bytes, its length in the ``Inference-Header-Content-Length`` header, and asks for
each output in it too (:mod:`._v2_raw` reads the answer). Neither side then writes or parses a
list of numbers.

A ``grpc://host:port`` (``grpcs://``: TLS) URL speaks the protocol's gRPC binding instead
(:mod:`._grpc_v2`): the same metadata, tensors and outputs, as protobuf messages on one
HTTP/2 channel per worker, with the same retries, limits and dead letters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError, ModelError, RemoteError
from pyflink_aisp.inference._handler import ModelHandler, Prepared, as_list
from pyflink_aisp.inference.handlers._onnx_predictor import feature_matrix, output_field_name
from pyflink_aisp.inference.handlers.remote._call_log import CallLog, CallLogConfig, answer_with_log, call_key
from pyflink_aisp.inference.handlers.remote._client import (
    RawBody,
    RemoteEndpoint,
    RemoteSession,
    path_segment,
)
from pyflink_aisp.inference.handlers.remote._grpc_v2 import GrpcV2Sender, infer_request, model_metadata
from pyflink_aisp.inference.tasks import OutputField, PredictionTask, SqlType

__all__ = ["V2Model", "V2PredictorHandler"]

_FLOATS = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
_INTS = {f"{s}INT{b}": np.dtype(f"{s.lower()}int{b}") for s in ("", "U") for b in (8, 16, 32, 64)}
_SCALAR = {**dict.fromkeys(_FLOATS, SqlType.DOUBLE), **dict.fromkeys(_INTS, SqlType.BIGINT),
           "BOOL": SqlType.BOOLEAN, "BYTES": SqlType.STRING}
_VECTOR = {"FP16": SqlType.ARRAY_FLOAT, "FP32": SqlType.ARRAY_FLOAT, "FP64": SqlType.ARRAY_DOUBLE,
           "BYTES": SqlType.ARRAY_STRING}


def _field(model: str, spec: dict[str, Any]) -> tuple[str, OutputField]:
    """``(output name, field)`` of one output of the metadata (the module docstring's table).

    Raises:
        ModelError: A datatype or rank no SQL field takes.
    """
    name, kind, shape = spec.get("name"), spec.get("datatype"), spec.get("shape") or []
    scalar = len(shape) == 1 or (len(shape) == 2 and shape[1] == 1 and kind in _FLOATS)
    kind = kind if isinstance(kind, str) else ""
    sql_type = _SCALAR.get(kind) if scalar else (_VECTOR.get(kind) if len(shape) == 2 else None)
    if not isinstance(name, str) or sql_type is None:
        raise ModelError(f"output {name!r} of remote model {model} is {kind} of shape {shape}: no SQL field "
                         "takes it (see pyflink_aisp.inference.handlers.remote's table)")
    return name, OutputField(name=output_field_name(name), sql_type=sql_type)


@dataclass(frozen=True)
class _Plan:
    """What the metadata says: the one input (float ``[-1, n]``, or ``BYTES`` ``[-1]`` /
    ``[-1, 1]`` for texts: ``rank`` 1 or 2) and the outputs."""

    input_name: str
    datatype: str
    n_features: int | None
    outputs: tuple[tuple[str, OutputField], ...]
    rank: int = 2

    @property
    def texts(self) -> bool:
        return self.datatype == "BYTES"


def _plan(model: str, metadata: Any, *, texts: bool = False) -> _Plan:
    """Read the model metadata.

    Raises:
        ModelError: Not V2 metadata, not one float ``[-1, n]`` input (``texts``: one ``BYTES``
            ``[-1]`` or ``[-1, 1]`` input), or an output no field takes.
    """
    if not isinstance(metadata, dict) or not isinstance(metadata.get("inputs"), list) or not isinstance(
            metadata.get("outputs"), list):
        raise ModelError(f"remote model {model}: the metadata has no inputs and outputs: is the URL an Open "
                         f"Inference Protocol v2 server? got {str(metadata)[:200]!r}")
    inputs = metadata["inputs"]
    shape = (inputs[0].get("shape") or []) if len(inputs) == 1 else []
    datatype = inputs[0].get("datatype") if len(inputs) == 1 else None
    if texts and (datatype != "BYTES" or shape not in ([-1], [-1, 1])):
        raise ModelError(f"remote model {model} takes {inputs}: a text model takes one BYTES tensor [-1] or "
                         "[-1, 1] (a numeric model: give --feature-fields)")
    if not texts and (datatype not in _FLOATS or len(shape) != 2):
        hint = " (a text model: leave out --feature-fields)" if datatype == "BYTES" else ""
        raise ModelError(f"remote model {model} takes {inputs}: a numeric model takes one float tensor "
                         f"[-1, n_features]{hint}")
    width = shape[1] if len(shape) == 2 else None
    outputs = tuple(_field(model, spec) for spec in metadata["outputs"])
    names = [f.name for _, f in outputs]
    if not names or len(set(names)) != len(names):
        raise ModelError(f"remote model {model} gives the output fields {names}: need one or more, unique")
    return _Plan(inputs[0]["name"], inputs[0]["datatype"],
                 width if isinstance(width, int) and width > 0 else None,
                 outputs, len(shape))


@dataclass(eq=False)
class V2Model:
    """A worker's connection to the served model.

    Attributes:
        session: The connection pool, limiter and retries.
        plan: The metadata read at load.
        call_log: The worker's call log (answers kept across failovers), or None.
    """

    session: RemoteSession
    plan: _Plan
    call_log: CallLog | None = None

    def stack(self, examples: Sequence[Any]) -> npt.NDArray[Any]:
        """``k`` feature vectors → ``(k, n_features)`` of the input's dtype; for a text model,
        ``k`` strings → an object array ``(k,)`` or ``(k, 1)`` (the input's rank).

        Raises:
            ValueError: A vector that is not one-dimensional numbers of the model's width, or
                (a text model) an example that is not a string.
        """
        if self.plan.texts:
            bad = next((x for x in examples if not isinstance(x, str)), None)
            if bad is not None:
                raise ValueError(f"a text model takes strings, got {type(bad).__name__}")
            texts = np.array(list(examples), dtype=object)
            return texts.reshape(-1, 1) if self.plan.rank == 2 else texts
        dtype = _FLOATS[self.plan.datatype]
        matrix = feature_matrix(examples, dtype, self.plan.n_features)
        if matrix is not None and np.isfinite(matrix).all():
            return matrix
        rows = [np.asarray(x, dtype=dtype) for x in examples]
        for row in rows:
            if row.ndim == 1 and not np.isfinite(row).all():
                raise ValueError("a feature vector holds NaN or infinity (after the cast to the model's "
                                 "input type): JSON cannot carry it")
            if row.ndim != 1 or (self.plan.n_features is not None and row.shape[0] != self.plan.n_features):
                raise ValueError(f"expected a ({self.plan.n_features or 'n'},) feature vector, "
                                 f"got shape {row.shape}")
        return np.stack(rows) if rows else np.zeros((0, self.plan.n_features or 0), dtype=dtype)


class V2PredictorHandler(ModelHandler[Any, dict[str, Any], V2Model]):
    """A numeric model served over the Open Inference Protocol v2 (see the module docstring).

    Examples are ``(n_features,)`` number sequences (``texts``: strings); predictions ``{field name: value}``
    rendered by the :class:`~pyflink_aisp.inference.tasks.PredictionTask` of :meth:`task`.
    The model version is ``v2:{model}`` or ``v2:{model}/{version}``.

    Args:
        url: The server's base URL (``http://host:8000`` for Triton, the predictor's URL for
            KServe), or its gRPC endpoint (``grpc://host:8001``, ``grpcs://`` for TLS).
        model: The model's name on the server.
        version: A model version, or None for the server's choice.
        rows_per_request: Most rows in one request's tensor (>= 1).
        texts: The model takes the records' texts (one ``BYTES`` input), not feature vectors.
        binary: Send each REST request's tensor in the binary tensor data extension (numeric
            models over REST only).
        call_log: A Kafka topic that keeps each row's answer across failovers, or None.
        api_key_env / api_key_file / ca_file / request_timeout_s / deadline_s / max_attempts /
        concurrency: As :class:`~pyflink_aisp.inference.handlers.remote.RemoteEndpoint`.

    Raises:
        ConfigError: A bad URL, timing, key source or ``rows_per_request``; ``binary`` with a text
            model or a gRPC URL.
    """

    def __init__(self, *, url: str, model: str, version: str | None = None, rows_per_request: int = 64,
                 texts: bool = False, binary: bool = False, call_log: CallLogConfig | None = None,
                 **endpoint: Any) -> None:
        self._segments = (path_segment("model name", model),
                          None if version is None else path_segment("model version", version))
        if rows_per_request < 1:
            raise ConfigError(f"rows_per_request must be >= 1, got {rows_per_request}")
        self.endpoint = RemoteEndpoint(url=url, **endpoint)
        self.model, self.version, self.rows_per_request = model, version, rows_per_request
        self.texts = texts
        if binary and (texts or self.endpoint.is_grpc):
            raise ConfigError("the V2 binary tensor extension is for numeric models over REST: "
                              f"{'a text model' if texts else 'gRPC sends raw tensor contents already'}")
        self.binary = binary
        self.call_log = call_log
        self._plan: _Plan | None = None

    @property
    def _path(self) -> str:
        model, version = self._segments
        return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")

    def check(self) -> _Plan:
        """The health check a job runs before it starts: the server answers and serves the
        model with a numeric input (read once, then kept).

        Raises:
            RemoteError: Unreachable, or the model is unknown (HTTP 404) or refused.
            ModelError: The answer is not V2 metadata or the model is not numeric.
        """
        if self._plan is None:
            try:
                metadata = (model_metadata(self.endpoint, self.model, self.version) if self.endpoint.is_grpc
                            else self.endpoint.get_json(self._path))
            except RemoteError as exc:
                if exc.status == 404:
                    raise RemoteError(f"{self.endpoint.url} serves no model {self.model!r}"
                                      f"{f' version {self.version}' if self.version else ''} ("
                                      f"{'gRPC NOT_FOUND' if self.endpoint.is_grpc else 'HTTP 404 on '}"
                                      f"{'' if self.endpoint.is_grpc else self._path})",
                                      404) from None
                raise
            self._plan = _plan(self.model, metadata, texts=self.texts)
        return self._plan

    def task(self, *, with_embedding: bool = False) -> PredictionTask:
        """One field per output the server's metadata declares (see :meth:`check`)."""
        return PredictionTask(outputs=tuple(f for _, f in self.check().outputs))

    def model_version(self) -> str:
        return f"v2:{self.model}" + (f"/{self.version}" if self.version else "")

    def load_model(self) -> V2Model:
        """Open the worker's connection pool after checking the model.

        Raises:
            RemoteError / ModelError: As :meth:`check`; ModelError also where the call log's
                brokers cannot be reached or its topic read.
            ConfigError: The API key cannot be read on this worker.
        """
        declared = self.check()  # read where the job was built (the task's fields) ...
        self._plan = None
        plan = self.check()  # ... and again from this worker: the same server, the same model
        if plan != declared:
            now, was = [f.name for _, f in plan.outputs], [f.name for _, f in declared.outputs]
            raise ModelError(f"remote model {self.model} changed since the job was built: it now declares "
                             f"{now} (was {was})")
        log = None if self.call_log is None else CallLog(self.call_log, scope=self.model_version()).open()
        return V2Model(RemoteSession(self.endpoint, sender=GrpcV2Sender if self.endpoint.is_grpc else None),
                       plan, call_log=log)

    def release_model(self, model: V2Model) -> None:
        model.session.close()
        if model.call_log is not None:
            model.call_log.close()

    def metrics(self, model: V2Model) -> dict[str, Callable[[], int]]:
        """The session's gauges (see :meth:`RemoteSession.gauges`; with a call log also
        ``remoteCallLogHits``: rows answered from it, ``remoteCallLogSize``)."""
        gauges = model.session.gauges()
        log = model.call_log
        if log is not None:
            gauges.update(remoteCallLogHits=lambda: log.hits, remoteCallLogSize=lambda: log.size)
        return gauges

    def prepare_batch(self, batch: Sequence[Any], model: V2Model) -> Prepared:
        """Stack the submitted batch once: payload ``(n, n_features)``, every length 1.

        Raises:
            ValueError: A vector of another width (the runtime prepares smaller parts).
        """
        matrix = model.stack(as_list(batch))
        return Prepared(matrix, np.ones(matrix.shape[0], dtype=np.int64))

    def run_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: V2Model) -> list[Any]:
        return self._infer(prepared.payload[rows], model)

    def run_inference(self, batch: Sequence[Any], model: V2Model) -> list[Any]:
        return self._infer(model.stack(list(batch)), model)

    def _infer(self, matrix: npt.NDArray[Any], model: V2Model) -> list[Any]:
        """``k`` predictions or, for the rows of a failed request, its error: from the call log
        where it holds a row's request (no request is made), else from the server (logged)."""
        log = model.call_log
        if log is None:
            return self._send(matrix, model)
        plan = model.plan
        request = {"path": f"{self._path}/infer", "input": plan.input_name, "datatype": plan.datatype,
                   "outputs": [name for name, _ in plan.outputs]}
        keys = [call_key(self.model_version(), {**request, "data": np.asarray(row).tolist()})
                for row in matrix]
        return answer_with_log(
            log, keys, self.endpoint.deadline_s,
            lambda todo, on_final: self._send(matrix[np.asarray(todo, dtype=np.intp)], model, on_final),
            encode=_encode, decode=lambda value: _decode(plan, value))

    def _send(self, matrix: npt.NDArray[Any], model: V2Model,
              on_final: Callable[[int, list[Any]], None] | None = None) -> list[Any]:
        """The requests of ``matrix``'s rows, ``rows_per_request`` a request, all in flight at once;
        ``on_final(first, outcomes)`` as each request's rows are final (for the call log)."""
        plan, k, step = model.plan, matrix.shape[0], self.rows_per_request
        starts = list(range(0, k, step))
        parts = [matrix[i:i + step] for i in starts]
        names = [name for name, _ in plan.outputs]
        grpc = self.endpoint.is_grpc
        bodies = [(f"{self._path}/infer", infer_request(self.model, self.version, plan.input_name,
                                                        plan.datatype, part, names) if grpc else
                   _binary_body(plan, part, names) if self.binary else {
            "inputs": [{"name": plan.input_name, "shape": list(part.shape), "datatype": plan.datatype,
                        "data": part.ravel().tolist()}],
            "outputs": [{"name": name} for name in names]}) for part in parts]
        done: dict[int, list[Any]] = {}

        def answered(j: int, answer: Any) -> None:
            rows = parts[j].shape[0]
            if isinstance(answer, RemoteError):
                done[j] = [answer] * rows
            else:
                try:
                    done[j] = list(_rows(self.model, plan, answer, rows))
                except RemoteError as exc:
                    done[j] = [exc] * rows
            if on_final is not None:
                on_final(starts[j], done[j])

        model.session.gather(bodies, on_answer=answered)
        return [r for j in range(len(parts)) for r in done[j]]

    def batch_byte_size(self, batch: Sequence[Any]) -> int:
        if self.texts:
            return sum(len(x.encode("utf-8")) if isinstance(x, str) else 0 for x in batch)
        return sum(4 * len(x) for x in batch)


def _binary_body(plan: _Plan, part: npt.NDArray[Any], names: list[str]) -> RawBody:
    """One request in the binary tensor data extension: the JSON header, then ``part``'s bytes
    (row-major, little-endian); every output asked for as binary too."""
    data = np.ascontiguousarray(part, dtype=part.dtype.newbyteorder("<")).tobytes()
    header = json.dumps({
        "inputs": [{"name": plan.input_name, "shape": list(part.shape), "datatype": plan.datatype,
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in names]},
        separators=(",", ":")).encode()
    return RawBody(header + data, {"Inference-Header-Content-Length": str(len(header)),
                                   "Content-Type": "application/octet-stream"})


def _rows(model: str, plan: _Plan, answer: Any, k: int) -> list[dict[str, Any]]:
    """The ``k`` predictions of one infer answer.

    Raises:
        RemoteError: The answer lacks an output or has the wrong shape or data (status None).
    """
    outputs = {o.get("name"): o for o in answer.get("outputs", [])} if isinstance(answer, dict) else {}
    columns = []
    for name, field in plan.outputs:
        out = outputs.get(name)
        if out is None or not isinstance(out.get("data"), list):
            raise RemoteError(f"remote model {model}: the answer has no output {name!r} "
                              f"(got {sorted(map(str, outputs))})")
        shape = [int(d) for d in out.get("shape") or []]
        data = out["data"]
        if not shape or shape[0] != k or math.prod(shape) != len(data):
            raise RemoteError(f"remote model {model}: output {name!r} has shape {shape} with {len(data)} "
                              f"values for {k} rows")
        if field.sql_type in (SqlType.STRING, SqlType.ARRAY_STRING):
            values = np.array(data, dtype=object).reshape(shape)
        elif out.get("datatype") == "BOOL":
            values = np.array(data, dtype=bool).reshape(shape)
        else:
            values = np.array(data, dtype=_FLOATS.get(out.get("datatype"), np.float64)).reshape(shape)
            if field.sql_type is SqlType.BIGINT:
                values = values.astype(np.int64)
        if field.sql_type is SqlType.DOUBLE and values.ndim == 2:
            values = values[:, 0]
        columns.append((field, values))
    return [{f.name: v[i] for f, v in columns} for i in range(k)]


def _encode(prediction: Any) -> Any:
    """A prediction (``{field: numpy value}``) as JSON for the call log; an error stays as it is."""
    if not isinstance(prediction, dict):
        return prediction
    return {name: value.tolist() if hasattr(value, "tolist") else value for name, value in prediction.items()}


def _decode(plan: _Plan, value: Any) -> dict[str, Any]:
    """:func:`_encode` undone: each field back in the numpy type :func:`_rows` gives it."""
    types = {field.name: field.sql_type for _, field in plan.outputs}
    out: dict[str, Any] = {}
    for name, v in (value or {}).items():
        sql_type = types.get(name)
        if sql_type is SqlType.ARRAY_FLOAT:
            out[name] = np.asarray(v, dtype=np.float32)
        elif sql_type is SqlType.ARRAY_DOUBLE:
            out[name] = np.asarray(v, dtype=np.float64)
        elif sql_type is SqlType.ARRAY_STRING:
            out[name] = np.asarray(v, dtype=object)
        elif sql_type is SqlType.BIGINT:
            out[name] = np.int64(v)
        elif sql_type is SqlType.BOOLEAN:
            out[name] = np.bool_(v)
        elif sql_type is SqlType.DOUBLE:
            out[name] = np.float64(v)
        else:
            out[name] = v
    return out
