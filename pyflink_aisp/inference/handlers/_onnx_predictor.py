"""A ModelHandler for a numeric ONNX model: feature vectors in, the graph's outputs out.

The graph is what ``skl2onnx`` / ``onnxmltools`` write for a scikit-learn, XGBoost or
LightGBM model, or any export with one float input ``(batch, n_features)``: each example
is a ``(n_features,)`` vector (an ``ARRAY<FLOAT>`` column, a JSON array, or named numeric
fields of a record), a batch is stacked into one ``(k, n_features)`` tensor of the input's
dtype and run once. Every graph output becomes an output field of a
:class:`~pyflink_aisp.inference.tasks.PredictionTask`, named after the output (lower
case, other characters ``_``), typed by its ONNX type and per-row shape:

======================================  ==================
ONNX output (per row)                   SQL type
======================================  ==================
float / double ``(batch,)`` or ``(batch, 1)``  DOUBLE
int8..int64 ``(batch,)``                BIGINT
bool ``(batch,)``                       BOOLEAN
string ``(batch,)``                     STRING
float ``(batch, k)``                    ARRAY<FLOAT>
double ``(batch, k)``                   ARRAY<DOUBLE>
string ``(batch, k)``                   ARRAY<STRING>
======================================  ==================

A ``seq(map)`` output (skl2onnx's default ZipMap for class probabilities) is refused:
export with ``options={id(model): {"zipmap": False}}``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from pyflink_aisp.checksums import sha256_file, verify_sha256
from pyflink_aisp.errors import ChecksumError, ConfigError, ModelError
from pyflink_aisp.inference._handler import ModelHandler, Prepared, as_list
from pyflink_aisp.inference.handlers._onnx import (
    ExecutionProvider,
    ProviderSpec,
    _split_providers,
    normalize_providers,
    open_session,
    provider_device,
)
from pyflink_aisp.inference.tasks import RESERVED_FIELDS, OutputField, PredictionTask, SqlType

__all__ = ["OnnxPredictorHandler", "PredictorModel", "output_field_name", "predictor_fields"]

_FLOATS = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16}
_INTS = {f"tensor({t})" for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}
_SCALAR = {**dict.fromkeys(_FLOATS, SqlType.DOUBLE), **dict.fromkeys(_INTS, SqlType.BIGINT),
           "tensor(bool)": SqlType.BOOLEAN, "tensor(string)": SqlType.STRING}
_VECTOR = {"tensor(float)": SqlType.ARRAY_FLOAT, "tensor(float16)": SqlType.ARRAY_FLOAT,
           "tensor(double)": SqlType.ARRAY_DOUBLE, "tensor(string)": SqlType.ARRAY_STRING}


def feature_matrix(examples: Sequence[Any], dtype: Any, width: int | None) -> npt.NDArray[Any] | None:
    """``k`` feature vectors → ``(k, width)`` of ``dtype`` in one numpy conversion, or None where
    the vectors are not all one-dimensional numbers of ``width`` (any one width where None) or
    there are none: the caller then converts them one by one to name the bad one."""
    if not examples:
        return None
    try:
        matrix = np.array(examples, dtype=dtype)
    except (TypeError, ValueError):  # ragged rows, or an element that is not a number
        return None
    if matrix.ndim != 2 or (width is not None and matrix.shape[1] != width):
        return None
    return matrix


def output_field_name(output: str) -> str:
    """The output field of a model output named ``output``: lower case, other characters ``_``,
    ``out_`` before a name that does not start with a letter or ``_``."""
    name = re.sub(r"[^a-z0-9_]", "_", output.lower())
    return name if re.match(r"[a-z_]", name) else f"out_{name}"


def _output_field(path: Path, arg: Any) -> OutputField:
    """The field of one graph output (see the module docstring's table).

    Raises:
        ModelError: A type or rank no SQL field takes, or a reserved name.
    """
    shape = arg.shape if isinstance(arg.shape, list) else []
    kind = arg.type
    if kind.startswith(("seq(", "map(")):
        raise ModelError(f"output {arg.name!r} of {path} is {kind}: export a scikit-learn classifier "
                         "with zipmap=False (skl2onnx options={id(model): {'zipmap': False}})")
    scalar = len(shape) == 1 or (len(shape) == 2 and shape[1] == 1 and kind in _FLOATS)
    sql_type = _SCALAR.get(kind) if scalar else (_VECTOR.get(kind) if len(shape) == 2 else None)
    if sql_type is None:
        raise ModelError(f"output {arg.name!r} of {path} is {kind} of shape {shape}: a field takes a "
                         "(batch,) value or a (batch, k) float, double or string vector")
    name = output_field_name(arg.name)
    if name in RESERVED_FIELDS:
        raise ModelError(f"output {arg.name!r} of {path} would be the field {name!r}, which the operators "
                         f"write themselves ({sorted(RESERVED_FIELDS)}): rename the graph output")
    return OutputField(name=name, sql_type=sql_type)


def predictor_fields(session: Any, path: Path) -> tuple[tuple[str, OutputField], ...]:
    """``(graph output name, field)`` of every output of a session.

    Raises:
        ModelError: As :func:`_output_field`, or two outputs with one field name.
    """
    fields = tuple((arg.name, _output_field(path, arg)) for arg in session.get_outputs())
    names = [f.name for _, f in fields]
    if len(set(names)) != len(names):
        raise ModelError(f"outputs of {path} give the field names {names} (twice): rename the graph outputs")
    return fields


def _plan_input(session: Any, path: Path) -> tuple[str, Any, int | None]:
    """``(name, numpy dtype, n_features or None)`` of the graph's one float input.

    Raises:
        ModelError: Not exactly one input, not float, not ``(batch, n)``, or a static batch size.
    """
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise ModelError(f"{path} has {len(inputs)} inputs {[a.name for a in inputs]}: a numeric model "
                         "takes one float tensor (batch, n_features)")
    arg = inputs[0]
    shape = arg.shape if isinstance(arg.shape, list) else []
    if arg.type not in _FLOATS or len(shape) != 2:
        raise ModelError(f"input {arg.name!r} of {path} is {arg.type} of shape {shape}: a numeric model "
                         "takes one float tensor (batch, n_features)")
    if isinstance(shape[0], int):
        raise ModelError(f"input {arg.name!r} of {path} has a static batch size {shape[0]}: the job sends "
                         "batches of any size; export the graph with a dynamic batch axis")
    return arg.name, _FLOATS[arg.type], shape[1] if isinstance(shape[1], int) else None


@dataclass(frozen=True, eq=False)
class PredictorModel:
    """A loaded numeric model: the session and how it is fed.

    Attributes:
        session: The ONNX Runtime session.
        input_name: Its float input.
        dtype: The input's numpy dtype.
        n_features: The input's declared width (None: any).
        outputs: ``(graph output name, field)`` per output.
    """

    session: Any
    input_name: str
    dtype: Any
    n_features: int | None
    outputs: tuple[tuple[str, OutputField], ...]

    def stack(self, examples: Sequence[Any]) -> npt.NDArray[Any]:
        """``k`` feature vectors → ``(k, n_features)`` of the input dtype.

        Raises:
            ValueError: A vector is not one-dimensional numbers of the model's width, or
                the vectors differ in width.
        """
        matrix = feature_matrix(examples, self.dtype, self.n_features)
        if matrix is not None:
            return matrix
        rows = [np.asarray(x, dtype=self.dtype) for x in examples]
        for row in rows:
            if row.ndim != 1 or (self.n_features is not None and row.shape[0] != self.n_features):
                want = self.n_features if self.n_features is not None else "n"
                raise ValueError(f"expected a ({want},) feature vector, got shape {row.shape}")
        return np.stack(rows) if rows else np.zeros((0, self.n_features or 0), dtype=self.dtype)

    def run(self, matrix: npt.NDArray[Any]) -> list[dict[str, Any]]:
        """One model call on ``(k, n_features)``: ``k`` predictions ``{field name: row value}``."""
        values = self.session.run([name for name, _ in self.outputs], {self.input_name: matrix})
        k = matrix.shape[0]
        for (name, _), value in zip(self.outputs, values, strict=True):
            if np.shape(value)[:1] != (k,):
                raise ModelError(f"output {name!r} gave shape {np.shape(value)} for {k} rows")
        columns = [(f, v[:, 0] if v.ndim == 2 and f.sql_type in (SqlType.DOUBLE,) else v)
                   for (_, f), v in zip(self.outputs, values, strict=True)]
        return [{f.name: v[i] for f, v in columns} for i in range(k)]


class OnnxPredictorHandler(ModelHandler[Any, dict[str, Any], PredictorModel]):
    """Runs a numeric ONNX model on feature vectors (see the module docstring).

    Examples are ``(n_features,)`` sequences of numbers; predictions are
    ``{field name: value}`` rendered by the :class:`PredictionTask` of :meth:`task`.
    A vector of another width fails alone (the runtime prepares smaller parts), as
    ``inference_error``. The model version is the sha256 of the ``.onnx`` file; hot swap
    (:meth:`load_version`) takes another file with the same input and output fields.

    Args:
        model_path: The ``.onnx`` file.
        providers: ONNX Runtime execution providers (default CPU).
        device_id: CUDA device of a GPU provider.
        intra_op_num_threads: ORT intra-op threads (None: ORT's default).
        allow_spinning: ORT intra-op threads spin-wait between runs (session config
            ``session.intra_op.allow_spinning``); None: ORT's default (spinning).

    Raises:
        ConfigError: ``intra_op_num_threads`` < 1, or bad providers.
        ModelError: The file is missing.
    """

    def __init__(
        self,
        *,
        model_path: Path | str,
        providers: Sequence[ProviderSpec] = (ExecutionProvider.CPU,),
        device_id: int | None = None,
        intra_op_num_threads: int | None = None,
        allow_spinning: bool | None = None,
    ) -> None:
        if intra_op_num_threads is not None and intra_op_num_threads < 1:
            raise ConfigError(f"intra_op_num_threads must be >= 1 or None, got {intra_op_num_threads}")
        self._path = Path(model_path)
        if not self._path.is_file():
            raise ModelError(f"numeric model {self._path} not found (an .onnx file)")
        names, options = _split_providers(normalize_providers(providers, device_id))
        self._providers = list(zip(names, options, strict=True))
        self._device = provider_device(self._providers)
        self._threads = intra_op_num_threads
        self._allow_spinning = allow_spinning
        self._version: str | None = None
        self._task: PredictionTask | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_task": None}  # the task is read again from the graph

    def _file_version(self) -> str:
        return sha256_file(self._path)

    def model_version(self) -> str:
        """The sha256 of the ``.onnx`` file (read on first call; a hot swap's pointer names the
        new file's the same way).

        Raises:
            ModelError: The file is unreadable.
        """
        if self._version is None:
            self._version = self._file_version()
        return self._version

    def task(self, *, with_embedding: bool = False) -> PredictionTask:
        """One field per graph output (read from the graph on a CPU session once; nothing runs).

        Raises:
            ModelError: The graph does not load, or an output no field takes.
        """
        if self._task is None:
            try:
                session = ort.InferenceSession(str(self._path), providers=["CPUExecutionProvider"])
            except Exception as exc:  # onnxruntime's own error types
                raise ModelError(f"cannot load {self._path}: {exc}") from exc
            _plan_input(session, self._path)
            self._task = PredictionTask(outputs=tuple(f for _, f in predictor_fields(session, self._path)))
        return self._task

    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"`` (the first provider)."""
        return self._device

    def load_model(self) -> PredictorModel:
        """Open the session on the providers and check its input and outputs.

        Raises:
            ModelError: The graph does not load, a provider is unavailable (no fallback), or
                its input or outputs are not those of a numeric model.
            ChecksumError: The file changed since :meth:`model_version` was taken.
        """
        actual = self._file_version()
        if self._version is not None and actual != self._version:
            raise ChecksumError(str(self._path), self._version, actual)
        self._version = actual
        session = open_session(self._path, f"numeric model {actual[:12]}", self._providers,
                               intra_op_num_threads=self._threads, allow_spinning=self._allow_spinning)
        name, dtype, width = _plan_input(session, self._path)
        return PredictorModel(session, name, dtype, width, predictor_fields(session, self._path))

    def load_version(self, path: Path, sha256: str) -> PredictorModel:
        """Load another ``.onnx`` file of the model (hot swap): the same input width and the same
        output fields, and it runs on a probe (a zero vector and a ones vector) to finite numbers.

        Raises:
            ChecksumError: The file's sha256 is not ``sha256``.
            ModelError: The file does not load, has another input or other output fields, or the
                probe fails or gives NaN / infinity.
        """
        verify_sha256(path, sha256)
        session = open_session(Path(path), f"numeric model {sha256[:12]}", self._providers,
                               intra_op_num_threads=self._threads, allow_spinning=self._allow_spinning)
        name, dtype, width = _plan_input(session, Path(path))
        fields = predictor_fields(session, Path(path))
        current = self.task().fields
        if tuple(f for _, f in fields) != current:
            raise ModelError(f"{path} gives the fields {[f.name for _, f in fields]} "
                             f"({[f.sql_type.value for _, f in fields]}), not the serving model's "
                             f"{[f.name for f in current]} ({[f.sql_type.value for f in current]})")
        model = PredictorModel(session, name, dtype, width, fields)
        try:
            probe = model.run(np.stack([np.zeros(width or 1, dtype=dtype), np.ones(width or 1, dtype=dtype)]))
        except Exception as exc:  # ORT raises its own types for a graph that does not run
            raise ModelError(f"model {path} does not run on a ({width},) vector: {exc}") from exc
        for row in probe:
            for f in current:
                value = np.asarray(row[f.name])
                if value.dtype.kind == "f" and not np.isfinite(value).all():
                    raise ModelError(f"model {path} gives a non-finite {f.name} on the probe vectors")
        return model

    def run_inference(self, batch: Sequence[Any], model: PredictorModel) -> list[dict[str, Any]]:
        """Stack ``batch`` and run it as one model call.

        Raises:
            ValueError: A vector of another width (the batcher bisects to it).
        """
        return model.run(model.stack(list(batch)))

    def prepare_batch(self, batch: Sequence[Any], model: PredictorModel) -> Prepared:
        """Stack the whole submitted batch once: payload ``(n, n_features)``, every length 1.

        Raises:
            ValueError: A vector of another width (the runtime prepares smaller parts).
        """
        matrix = model.stack(as_list(batch))
        return Prepared(matrix, np.ones(matrix.shape[0], dtype=np.int64))

    def run_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp], model: PredictorModel
                     ) -> list[dict[str, Any]]:
        """Run ``rows`` of the stacked batch as one model call."""
        return model.run(prepared.payload[rows])

    def batch_byte_size(self, batch: Sequence[Any]) -> int:
        """Bytes of the feature values as float32."""
        return sum(4 * len(x) for x in batch)
