"""A ModelHandler for any ONNX text encoder fed by a HF ``tokenizer.json``.

:class:`OnnxEncoderHandler` runs one output of an ONNX graph (an export of a
sentence-transformers model, a HF ``last_hidden_state`` export, the project's
own ``model.onnx`` ...) and pools it into one float32 vector per text (see
:mod:`pyflink_aisp.inference.handlers._common` for the pooling and the batch
hooks). Nothing about the graph is assumed beyond what it declares: at load
the handler reads the graph's inputs and outputs from the ONNX Runtime session
(``InferenceSession.get_inputs()`` / ``get_outputs()``), feeds the tokenizer
fields it declares (or those named in ``inputs``), and refuses an output that
does not exist or whose declared rank does not fit the pooling.

Execution providers follow :mod:`pyflink_aisp.inference.handlers._onnx`: the caller
names them (CPU by default), and a requested provider that this onnxruntime
build lacks or that ORT drops while creating the session raises
:class:`~pyflink_aisp.errors.ModelError` instead of running on another device.
On a CUDA/TensorRT session the inputs and the output are bound on the device
(:class:`~pyflink_aisp.inference.handlers._onnx_binding.DeviceIO`: inputs copied
once into device ``OrtValue`` values, the output copied to the host once); on the CPU
inputs go through ``session.run``. The pooling runs on the host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from pyflink_aisp.checksums import verify_sha256
from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference.handlers._common import (
    Pooling,
    TextEncoderHandler,
    TokenField,
    check_token_fields,
    coerce_pooling,
    pool_embeddings,
    resolve_max_length,
)
from pyflink_aisp.inference.handlers._onnx import (
    ExecutionProvider,
    ProviderSpec,
    _split_providers,
    normalize_providers,
    open_session,
    provider_device,
)
from pyflink_aisp.inference.handlers._onnx_binding import DeviceIO
from pyflink_aisp.inference.handlers._probe import check_probe_vectors
from pyflink_aisp.tokenize import ArrowTokenizer, PaddedBatch, TokenizerConfig

__all__ = ["OnnxEncoderHandler", "OnnxEncoderModel"]

_VERSION_TAG = "pyflink-aisp/onnx-encoder/1"
#: ONNX Runtime type strings of integer inputs the padded int64 batches can be cast to.
_INT_INPUTS: dict[str, type[np.integer]] = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
_FLOAT_OUTPUTS = frozenset({"tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)"})


class OnnxEncoderModel:
    """An open ONNX Runtime session plus the tokenizer and the feed/output plan.

    Thread-safety: :meth:`embed` may be called from several threads
    (``InferenceSession.run`` and the tokenizer are thread-safe).

    Attributes:
        session: The session.
        tokenizer: Truncates to the handler's ``max_length``.
        feeds: ``{tokenizer field: (graph input name, numpy dtype)}``.
        output: Name of the graph output that is pooled.
        pooling: The reduction of that output.
        normalize: L2-normalise the pooled vectors.
        io: Device IO binding of the session (CUDA/TensorRT); None: ``session.run``.
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        tokenizer: ArrowTokenizer,
        *,
        feeds: Mapping[TokenField, tuple[str, type[np.integer]]],
        output: str,
        pooling: Pooling,
        normalize: bool,
        io: DeviceIO | None = None,
    ) -> None:
        self.session = session
        self.io = io
        self.tokenizer = tokenizer
        self.feeds = dict(feeds)
        self.output = output
        self.pooling = pooling
        self.normalize = normalize

    def embed(self, padded: PaddedBatch) -> npt.NDArray[np.float32]:
        """One ``session.run`` on a padded batch, then pooling.

        Args:
            padded: ``(k, seq_len)`` int64 inputs (right padding).

        Returns:
            ``(k, dim)`` float32, in the order of the padded rows.

        Raises:
            ModelError: The output's actual rank or dtype does not fit the pooling.
        """
        inputs = padded.model_inputs()
        feed = {
            name: inputs[field.value].astype(dtype, copy=False) for field, (name, dtype) in self.feeds.items()
        }
        (output,) = self.io.run(feed) if self.io is not None else self.session.run([self.output], feed)
        return pool_embeddings(
            np.asarray(output),
            padded.attention_mask,
            self.pooling,
            normalize=self.normalize,
            source=self.output,
        )

    @property
    def providers(self) -> list[str]:
        """Execution providers of the session, in priority order."""
        return list(self.session.get_providers())


class OnnxEncoderHandler(TextEncoderHandler[OnnxEncoderModel]):
    """Embeds texts with any ONNX text encoder and its ``tokenizer.json``.

    Predictions are ``(dim,)`` float32 vectors (see :class:`Pooling`). The model
    version is the sha256 of a text holding the sha256 of ``model_path`` and of
    ``tokenizer_path`` and the options that change outputs (``output``,
    ``pooling``, ``normalize``, ``max_length``, the input mapping); it is
    computed from the files on first use and re-checked by :meth:`load_model`.
    Hot swap (:meth:`load_version`) takes another ``.onnx`` file for the same tokenizer and
    options (a retrained or re-exported graph); later outputs carry that file's sha256.

    Args:
        model_path: The ``.onnx`` file (external data beside it, as ORT finds it).
        tokenizer_path: The HF ``tokenizer.json`` the model was trained with.
        output: Graph output to pool; None: the graph's only output.
        pooling: How the output becomes one vector (default ``MEAN``: a
            ``(batch, seq_len, dim)`` ``last_hidden_state``-like output).
        normalize: Divide by the L2 norm (eps 1e-12), as sentence-transformers' ``Normalize``.
        max_length: Truncate texts to this many tokens, special tokens
            included; None: the ``tokenizer.json``'s ``truncation.max_length``,
            else 128 (:data:`DEFAULT_MAX_LENGTH`). Keep it within the model's
            position embeddings.
        inputs: ``{tokenizer field: graph input name}``; None: each of
            ``input_ids``/``attention_mask``/``token_type_ids`` that the graph
            declares under that name. Every graph input must be fed.
        providers: ONNX Runtime execution providers in priority order (default CPU).
        device_id: CUDA device of the CUDA/TensorRT providers (None: their option, else 0).
        intra_op_num_threads: ORT intra-op threads; None: ORT's default (one per physical core).
        allow_spinning: ORT intra-op threads spin-wait between runs (session config
            ``session.intra_op.allow_spinning``); None: ORT's default (spinning).

    Raises:
        ConfigError: A bad pooling name, ``max_length`` or thread count < 1, a
            bad ``inputs`` mapping, an empty ``output``, or a provider list as
            :func:`~pyflink_aisp.inference.normalize_providers` refuses.
    """

    def __init__(
        self,
        *,
        model_path: Path | str,
        tokenizer_path: Path | str,
        output: str | None = None,
        pooling: Pooling | str = Pooling.MEAN,
        normalize: bool = False,
        max_length: int | None = None,
        inputs: Mapping[TokenField | str, str] | None = None,
        providers: Sequence[ProviderSpec] = (ExecutionProvider.CPU,),
        device_id: int | None = None,
        intra_op_num_threads: int | None = None,
        allow_spinning: bool | None = None,
    ) -> None:
        super().__init__(max_length=max_length, intra_op_num_threads=intra_op_num_threads)
        if output is not None and (not isinstance(output, str) or not output):
            raise ConfigError(f"output must be a non-empty graph output name or None, got {output!r}")
        self._model_path = Path(model_path)
        self._tokenizer_path = Path(tokenizer_path)
        self._output = output
        self._pooling = coerce_pooling(pooling)
        self._normalize = bool(normalize)
        self._max_length = max_length
        self._inputs = check_token_fields(inputs)
        self._providers = normalize_providers(providers, device_id)
        self._device = provider_device(self._providers)
        self._threads = intra_op_num_threads
        self._allow_spinning = allow_spinning
        self._width: int | None = None

    def _version_inputs(self) -> tuple[str, list[Path], dict[str, str]]:
        mapping = (
            "auto"
            if self._inputs is None
            else ",".join(f"{field.value}:{name}" for field, name in sorted(self._inputs.items()))
        )
        options = {
            "output": self._output or "<only>",
            "pooling": self._pooling.value,
            "normalize": str(self._normalize),
            "max_length": str(self._max_length or "auto"),
            "inputs": mapping,
        }
        return _VERSION_TAG, [self._model_path, self._tokenizer_path], options

    def load_model(self) -> OnnxEncoderModel:
        """Check the files, open the session on the configured providers and plan feeds/output.

        Raises:
            ModelError: A file is missing or does not load, a provider is
                unavailable or dropped by ORT (no fallback), a graph input is not
                fed, is not an integer tensor or has a static batch size, a mapped
                input does not exist,
                or ``output`` does not exist / its declared rank or type does
                not fit ``pooling``.
            ChecksumError: The files changed since :meth:`model_version` was taken.
        """
        self._check_version()
        model = self._build_model(self._model_path)
        if self._width is None:  # the serving width a hot swap must keep: one short text's row
            self._width = int(np.stack(self.run_inference(["width"], model)).shape[1])
        return model

    def load_version(self, path: Path, sha256: str) -> OnnxEncoderModel:
        """Load another ``.onnx`` file of the model (hot swap): the same tokenizer and options.

        The file is hashed against ``sha256``, opened on this handler's providers and
        planned as :meth:`load_model` plans it (every input fed, the output of the right
        rank), then runs :data:`~pyflink_aisp.inference.SWAP_PROBE_TEXTS` in one batch:
        ``(n, dim)`` finite rows of the serving model's width (L2-normalised with
        ``normalize``), not one row for every probe, and the same rows for the first probes
        scored in batches of 1 and 7 (:func:`check_probe_vectors`).

        Raises:
            ChecksumError: The file's sha256 is not ``sha256``.
            ModelError: The file does not load or plan, or fails the probe (the message names
                the failed check).
        """
        verify_sha256(path, sha256)
        model = self._build_model(Path(path))
        self._width = check_probe_vectors(lambda texts: np.stack(self.run_inference(texts, model)),
                                          width=self._width, source=str(path), **self._probe_checks())
        return model

    def _probe_checks(self) -> dict[str, Any]:
        """What :func:`check_probe_vectors` asks of this model's rows beyond their shape."""
        return {"normalized": self._normalize}

    def _build_model(self, model_path: Path) -> OnnxEncoderModel:
        """A session over ``model_path`` with this handler's tokenizer, feeds and output.

        Raises:
            ModelError: As :meth:`load_model`.
        """
        tokenizer = ArrowTokenizer.from_file(
            self._tokenizer_path,
            TokenizerConfig(max_length=resolve_max_length(self._tokenizer_path, self._max_length)),
        )
        names, options = _split_providers(self._providers)
        session = open_session(model_path, str(model_path), list(zip(names, options, strict=True)),
                               intra_op_num_threads=self._threads, allow_spinning=self._allow_spinning)
        feeds = self._plan_feeds(session, model_path)
        output = self._plan_output(session, model_path)
        io = DeviceIO(session, [output], self._device) if self._device != "cpu" else None
        return self._wrap_model(OnnxEncoderModel(
            session, tokenizer, feeds=feeds, output=output, pooling=self._pooling, normalize=self._normalize,
            io=io,
        ))

    def _wrap_model(self, model: OnnxEncoderModel) -> OnnxEncoderModel:
        """The model as this handler serves it (subclasses change its outputs)."""
        return model

    def _plan_feeds(self, session: ort.InferenceSession, model_path: Path
                    ) -> dict[TokenField, tuple[str, type[np.integer]]]:
        """``{field: (input name, dtype)}`` covering every graph input of ``model_path``.

        Raises:
            ModelError: As :meth:`load_model` for inputs.
        """
        declared = {arg.name: arg.type for arg in session.get_inputs()}
        static = {arg.name: arg.shape[0] for arg in session.get_inputs()
                  if isinstance(arg.shape, list) and arg.shape and isinstance(arg.shape[0], int)}
        if static:
            raise ModelError(f"graph input(s) {sorted(static)} of {model_path} have a static batch "
                             f"size {sorted(set(static.values()))}: the job sends batches of any size; "
                             "export the graph with a dynamic batch axis")
        mapping = self._inputs
        if mapping is None:
            mapping = {field: field.value for field in TokenField if field.value in declared}
        unknown = sorted(name for name in mapping.values() if name not in declared)
        if unknown:
            raise ModelError(f"{model_path} has no input(s) {unknown}; it declares {sorted(declared)}")
        unfed = sorted(set(declared) - set(mapping.values()))
        if unfed:
            raise ModelError(
                f"graph input(s) {unfed} of {model_path} are not fed by the tokenizer; "
                f"map them with inputs={{field: name}} (fields: {[f.value for f in TokenField]})"
            )
        feeds: dict[TokenField, tuple[str, type[np.integer]]] = {}
        for field, name in mapping.items():
            dtype = _INT_INPUTS.get(declared[name])
            if dtype is None:
                raise ModelError(f"graph input {name!r} is {declared[name]}, expected tensor(int64|int32)")
            feeds[field] = (name, dtype)
        return feeds

    def _plan_output(self, session: ort.InferenceSession, model_path: Path) -> str:
        """The output name of ``model_path``, checked against the declared outputs, rank and type.

        Raises:
            ModelError: As :meth:`load_model` for the output.
        """
        declared: dict[str, Any] = {arg.name: arg for arg in session.get_outputs()}
        name = self._output
        if name is None:
            if len(declared) != 1:
                raise ModelError(
                    f"{model_path} has outputs {sorted(declared)}; choose one with output="
                )
            name = next(iter(declared))
        if name not in declared:
            raise ModelError(f"{model_path} has no output {name!r}; it declares {sorted(declared)}")
        arg = declared[name]
        shape = arg.shape if isinstance(arg.shape, list) else []
        if shape and len(shape) != self._pooling.output_rank:
            raise ModelError(
                f"output {name!r} of {model_path} has shape {shape} (rank {len(shape)}); pooling "
                f"{self._pooling.name} needs rank {self._pooling.output_rank}"
            )
        if arg.type not in _FLOAT_OUTPUTS:
            raise ModelError(f"output {name!r} of {model_path} is {arg.type}, not floating point")
        return str(name)

    @property
    def providers(self) -> list[str]:
        """The configured execution provider names, in priority order."""
        return [name for name, _ in self._providers]

    def device(self) -> str:
        """``"cuda:N"`` when the first provider is CUDA/TensorRT, else ``"cpu"``."""
        return self._device
