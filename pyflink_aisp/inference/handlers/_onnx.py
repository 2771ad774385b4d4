"""ONNX Runtime scoring of the sentiment model built by :mod:`pyflink_aisp.models`.

Execution providers are explicit: the caller names them (CPU by default); a
requested provider that this onnxruntime build lacks, or that fails to load
(ORT then silently keeps only the CPU provider), raises :class:`ModelError`
instead of running on another device. Nodes a GPU provider cannot run still
go to ORT's CPU provider inside the same session; that is ORT's per-node
placement, not a device fallback.

On a CUDA or TensorRT session :meth:`OnnxSentimentModel.predict` runs through
IO binding with device-resident inputs and outputs
(:class:`~pyflink_aisp.inference.handlers._onnx_binding.DeviceIO`, ONNX Runtime's
"I/O Binding", https://onnxruntime.ai/docs/performance/tune-performance/iobinding.html):
each pooled numpy input is copied once into an ``OrtValue`` on the device (kept
per shape and refilled with ``update_inplace``) and bound with
``bind_ortvalue_input``; the outputs are bound to the device
(``bind_output(name, "cuda", device_id)``) and copied to the host once. The
CPU path keeps ``session.run``; ``io_binding=True`` runs the binding path on the
CPU provider (``"cpu", 0``) with the same numbers.

A TensorRT session gets default provider options
(:mod:`~pyflink_aisp.inference.handlers._onnx_trt`, ONNX Runtime's "TensorRT
Execution Provider",
https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html):
one shape profile for every dynamic input (batch 1..``max_batch_size``, opt
``batch_size``; sequence 1..``max_length``, opt 48 tokens), an engine and timing
cache under ``<aisp home>/trt-cache/<model sha256>/``, and ``trt_fp16_enable``
with ``precision="fp16"``; the user's own TensorRT options win over them.

Measured where: the GPU host used for checks (``bench/gpu_check.sh``) has the
CPU-only onnxruntime, so ORT CUDA and TensorRT rows are "not measured" there;
the binding path is tested on the CPU provider and the TensorRT options as
values (``tests/unit/inference/test_onnx_gpu_options.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pyarrow as pa

from pyflink_aisp.errors import ConfigError, ModelError, TokenizeError
from pyflink_aisp.inference.handlers._onnx_binding import DeviceIO
from pyflink_aisp.inference.handlers._onnx_profile import OrtProfiling, ProfiledRuns
from pyflink_aisp.inference.handlers._onnx_runs import RunPool
from pyflink_aisp.inference.handlers._onnx_trt import (
    DEFAULT_TRT_MAX_BATCH,
    DEFAULT_TRT_OPT_LENGTH,
    TensorrtSettings,
    graph_input_shapes,
    tensorrt_cache_dir,
    tensorrt_provider_options,
    with_tensorrt_defaults,
)
from pyflink_aisp.models import EMBEDDING_OUTPUT, SCORE_OUTPUT, ModelAssets
from pyflink_aisp.tokenize import ArrowTokenizer, TokenizedBatch, TokenizerConfig

__all__ = [
    "ExecutionProvider",
    "OnnxSentimentModel",
    "ProviderSpec",
    "encode_texts",
    "normalize_providers",
    "open_session",
    "provider_device",
]


class ExecutionProvider(enum.StrEnum):
    """ONNX Runtime execution provider names (``ort.get_all_providers()``)."""

    CPU = "CPUExecutionProvider"
    CUDA = "CUDAExecutionProvider"
    TENSORRT = "TensorrtExecutionProvider"


#: A provider name, or ``(name, provider options)`` such as ``("CUDAExecutionProvider", {"device_id": 1})``.
ProviderSpec = str | tuple[str, Mapping[str, object]]

#: Providers that compute on a CUDA device: ``device_id`` and IO binding apply to them.
GPU_PROVIDERS = frozenset({ExecutionProvider.CUDA.value, ExecutionProvider.TENSORRT.value})
_OUTPUTS = [EMBEDDING_OUTPUT, SCORE_OUTPUT]


def normalize_providers(
    providers: Sequence[ProviderSpec], device_id: int | None = None
) -> tuple[tuple[str, dict[str, object]], ...]:
    """``(name, options)`` pairs of a provider list, with ``device_id`` set on GPU providers.

    Only names are checked (against ``ort.get_all_providers()``), not whether
    this onnxruntime build has them: a job graph may be built on a host
    without a GPU build for workers that have one.

    Args:
        providers: Names or ``(name, options)`` in priority order.
        device_id: CUDA device index for every CUDA/TensorRT provider (its
            ``device_id`` option); None leaves the options as given.

    Raises:
        ConfigError: Empty list, unknown name, ``device_id`` < 0, ``device_id``
            without a GPU provider, or one that contradicts a provider's own option.
    """
    if isinstance(providers, str) or not providers:
        raise ConfigError(f"providers must be a non-empty sequence, got {providers!r}")
    pairs = []
    for spec in providers:
        name, opts = (str(spec[0]), dict(spec[1])) if isinstance(spec, tuple) else (str(spec), {})
        if name not in ort.get_all_providers():
            raise ConfigError(f"unknown execution provider {name!r}; known: {ort.get_all_providers()}")
        pairs.append((name, opts))
    if device_id is None:
        return tuple(pairs)
    if device_id < 0 or not any(name in GPU_PROVIDERS for name, _ in pairs):
        raise ConfigError(f"device_id={device_id} needs a CUDA/TensorRT provider and must be >= 0")
    for name, opts in pairs:
        if name in GPU_PROVIDERS:
            if str(opts.setdefault("device_id", device_id)) != str(device_id):
                raise ConfigError(f"{name} options say device_id={opts['device_id']}, argument {device_id}")
    return tuple(pairs)


def provider_device(providers: Sequence[ProviderSpec]) -> str:
    """``"cuda:N"`` when the first provider is CUDA/TensorRT (N: its ``device_id``
    option, default 0, as ORT), else ``"cpu"``.

    Raises:
        ConfigError: As :func:`normalize_providers`, or a non-integer ``device_id``.
    """
    name, options = normalize_providers(providers)[0]
    if name not in GPU_PROVIDERS:
        return "cpu"
    try:
        return f"cuda:{int(str(options.get('device_id', 0)))}"
    except ValueError as exc:
        raise ConfigError(f"{name} device_id must be an integer, got {options['device_id']!r}") from exc


def _split_providers(providers: Sequence[ProviderSpec]) -> tuple[list[str], list[dict[str, object]]]:
    """Names and option dicts of a provider list, checked against this onnxruntime.

    Raises:
        ConfigError: The list is empty or a name is not an ONNX Runtime provider.
        ModelError: A known provider is not available in this onnxruntime build.
    """
    names: list[str] = []
    options: list[dict[str, object]] = []
    for name, opts in normalize_providers(providers):
        if name not in ort.get_available_providers():
            raise ModelError(
                f"execution provider {name} is not available in this onnxruntime build "
                f"(available: {ort.get_available_providers()}); refusing to fall back"
            )
        names.append(name)
        options.append(opts)
    return names, options


class OnnxSentimentModel:
    """Score texts with the sentiment model: P(fresh) and the sentence embedding.

    Thread-safety: :meth:`predict` may be called from several threads at once
    (``InferenceSession.run`` and the tokenizer are thread-safe).

    Args:
        assets: From :func:`~pyflink_aisp.models.ensure_model_assets`.
        intra_op_num_threads: ORT intra-op threads; None = ORT's default (one
            per physical core). Set it when several workers share a host.
        providers: Execution providers in priority order, default CPU only.
        batch_size: Texts per ``session.run`` inside :meth:`predict`.
        verify: Re-check the sha256 of the model files before loading.
        device_id: CUDA device of the CUDA/TensorRT providers (sets their
            ``device_id`` option); None: as given in ``providers`` (ORT: 0).
        io_binding: Run through IO binding; None (default): exactly when the
            first provider is CUDA/TensorRT. True on CPU binds CPU outputs
            (same numbers; used to test the binding path without a GPU).
        allow_spinning: Whether ORT's intra-op threads spin-wait between runs
            (session config ``session.intra_op.allow_spinning``, ONNX Runtime's
            ``onnxruntime_session_options_config_keys.h``); None: ORT's default
            (spin). Spinning speeds back-to-back runs of large batches; on
            cores shared with the JVMs it burns CPU the rest of the job needs
            between small batches (decision record 3, the SLO controller).
        max_batch_size: TensorRT only: the largest batch :meth:`predict_rows` is
            given (the profile's max batch; a larger one is run in chunks of it);
            None: ``max(batch_size, 1024)``.
        precision: ``"fp32"``, or ``"fp16"`` (TensorRT only: ``trt_fp16_enable``).
        concurrent_runs: Model batches :meth:`launch_rows` computes at once, each
            ``session.run`` on a thread of its own
            (:class:`~pyflink_aisp.inference.handlers._onnx_runs.RunPool`);
            1 (default): on the caller's thread. Without IO binding only (the CPU provider).
        profiling: ONNX Runtime's profiler over the session's first runs
            (:class:`~pyflink_aisp.inference.handlers._onnx_profile.OrtProfiling`; its
            :class:`~pyflink_aisp.inference.handlers._onnx_profile.ProfiledRuns` is :attr:`profiled`);
            None: not profiled.

    Raises:
        ConfigError: ``intra_op_num_threads`` or ``batch_size`` < 1, an
            unknown provider name, a ``device_id`` as :func:`normalize_providers`,
            ``max_batch_size`` < ``batch_size``, fp16 without TensorRT, or
            ``concurrent_runs`` out of 1..8 or above 1 with IO binding.
        ModelError: A requested provider is unavailable or was dropped by ORT,
            the model cannot be loaded, or the TensorRT cache directory cannot be made.
        ChecksumError: The model files differ from the manifest (``verify``).
    """

    def __init__(
        self,
        assets: ModelAssets,
        *,
        intra_op_num_threads: int | None = None,
        providers: Sequence[ProviderSpec] = (ExecutionProvider.CPU,),
        batch_size: int = 64,
        verify: bool = True,
        device_id: int | None = None,
        io_binding: bool | None = None,
        allow_spinning: bool | None = None,
        max_batch_size: int | None = None,
        precision: str = "fp32",
        concurrent_runs: int = 1,
        profiling: OrtProfiling | None = None,
    ) -> None:
        if intra_op_num_threads is not None and intra_op_num_threads < 1:
            raise ConfigError(f"intra_op_num_threads must be >= 1 or None, got {intra_op_num_threads}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        names, options = _split_providers(normalize_providers(providers, device_id))
        self._device = provider_device(list(zip(names, options, strict=True)))
        self._io_binding = names[0] in GPU_PROVIDERS if io_binding is None else bool(io_binding)
        if concurrent_runs != 1 and self._io_binding:
            raise ConfigError(f"concurrent runs ({concurrent_runs}) are for the CPU provider without IO "
                              f"binding; {names[0]} runs one batch at a time here")
        self.runs = RunPool(concurrent_runs)
        if verify:
            assets.verify()
        self.assets = assets
        self.batch_size = batch_size
        self.tokenizer = ArrowTokenizer.from_file(
            assets.tokenizer_path, TokenizerConfig(max_length=assets.max_length)
        )
        self._allow_spinning = allow_spinning
        settings = _tensorrt_settings(assets, names, batch_size, max_batch_size, precision)
        pairs: Sequence[tuple[str, Mapping[str, object]]] = list(zip(names, options, strict=True))
        self._max_rows: int | None = None
        if settings is not None:
            pairs = with_tensorrt_defaults(pairs, tensorrt_provider_options(
                graph_input_shapes(assets.onnx_path), settings))
            self._max_rows = settings.max_batch_size
            _make_cache_dir(settings.cache_dir)
        self._profile_prefix = None if profiling is None else profiling.file_prefix()
        self._session = self._open_session([n for n, _ in pairs], [dict(o) for _, o in pairs],
                                           intra_op_num_threads)
        self._io = DeviceIO(self._session, _OUTPUTS, self._device) if self._io_binding else None
        self.profiled = None if profiling is None else ProfiledRuns(self._session, profiling.runs)

    def _open_session(
        self, names: list[str], options: list[dict[str, object]], intra_op_num_threads: int | None
    ) -> ort.InferenceSession:
        return open_session(self.assets.onnx_path, f"model {self.assets.sha256[:12]}",
                            list(zip(names, options, strict=True)), intra_op_num_threads=intra_op_num_threads,
                            allow_spinning=self._allow_spinning, profile_prefix=self._profile_prefix)

    @property
    def model_version(self) -> str:
        """sha256 of ``model.onnx``."""
        return self.assets.sha256

    @property
    def providers(self) -> list[str]:
        """Execution providers of the session, in priority order."""
        return list(self._session.get_providers())

    @property
    def device(self) -> str:
        """Where the session computes: ``"cpu"`` or ``"cuda:N"`` (first provider)."""
        return self._device

    @property
    def uses_io_binding(self) -> bool:
        """Whether :meth:`predict` runs through IO binding."""
        return self._io_binding

    def predict(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Score texts, batching by token length internally (the plain loop).

        Texts are tokenized once (:class:`~pyflink_aisp.tokenize.ArrowTokenizer`),
        sorted by token count and run in batches of ``batch_size`` padded to
        their longest row; the padded int64 inputs come from the tokenizer's
        buffer pool and go back to it after each ``session.run``. Sorting keeps
        padding, and so wasted compute, small: on the Rotten Tomatoes snippets
        about 3x less work than padding every batch to 128 tokens.

        Args:
            texts: Review texts, any order and lengths (truncated to
                ``assets.max_length`` tokens).

        Returns:
            ``(scores, embeddings)`` in input order: ``scores`` float32 ``(n,)``
            = P(fresh); ``embeddings`` float32 ``(n, embedding_dim)``,
            L2-normalised.

        Raises:
            TokenizeError: An input is not a ``str``.
        """
        tokens = self.encode(texts)
        n = len(texts)
        scores = np.empty((n,), dtype=np.float32)
        embeddings = np.empty((n, self.assets.embedding_dim), dtype=np.float32)
        for padded in self.tokenizer.iter_buckets(tokens, self.batch_size):
            with padded:
                embedding, score = self._run(padded.model_inputs())
            embeddings[padded.rows] = embedding
            scores[padded.rows] = score.reshape(-1)
        return scores, embeddings

    def encode(self, texts: Sequence[str]) -> TokenizedBatch:
        """Tokenize ``n`` texts once (for :meth:`predict_rows`).

        Raises:
            TokenizeError: An input is not a ``str`` (or a null in an Arrow array).
        """
        return encode_texts(self.tokenizer, texts)

    def predict_rows(
        self, tokens: TokenizedBatch, rows: npt.NDArray[np.intp]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Score ``rows`` of ``tokens`` in ONE ``session.run`` (no further splitting:
        the caller formed the model's batch).

        Args:
            tokens: From :meth:`encode`.
            rows: ``(k,)`` row indices, in the order results are wanted.

        Returns:
            ``(scores, embeddings)``: float32 ``(k,)`` and ``(k, embedding_dim)``, in ``rows`` order.
        """
        if self._max_rows is not None and len(rows) > self._max_rows:  # beyond the TensorRT profile
            parts = [self.predict_rows(tokens, rows[start:start + self._max_rows])
                     for start in range(0, len(rows), self._max_rows)]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        with self.tokenizer.pad(tokens, rows) as padded:
            embedding, score = self._run(padded.model_inputs())
        return score.reshape(-1), embedding

    def launch_rows(
        self, tokens: TokenizedBatch, rows: npt.NDArray[np.intp]
    ) -> Future[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
        """:meth:`predict_rows` on one of :attr:`runs`' threads (with one run: now, on this one).

        Returns:
            A future of ``(scores, embeddings)`` as :meth:`predict_rows` returns them.
        """
        return self.runs.launch(self.predict_rows, tokens, rows)

    def close(self) -> None:
        """Wait for the launched runs and stop their threads, and end a profiling that runs
        (idempotent)."""
        self.runs.close()
        if self.profiled is not None:
            self.profiled.close()

    def _run(self, inputs: Mapping[str, npt.NDArray[np.int64]]) -> list[npt.NDArray[np.float32]]:
        """One ``(batch, seq_len)`` batch → ``[embedding, score]`` host arrays.

        With IO binding (:class:`DeviceIO`) the inputs are copied to device values
        before the run and the outputs are allocated on the session's device and
        copied to the host after it, so the (pooled) numpy inputs may be reused
        as soon as this returns.
        """
        if self._io is None:
            outputs = list(self._session.run(_OUTPUTS, dict(inputs)))
        else:
            outputs = [np.asarray(array, dtype=np.float32) for array in self._io.run(inputs)]
        if self.profiled is not None:
            self.profiled.ran()
        return outputs


def _tensorrt_settings(
    assets: ModelAssets, names: Sequence[str], batch_size: int, max_batch_size: int | None, precision: str
) -> TensorrtSettings | None:
    """The TensorRT option settings of a sentiment session; None without a TensorRT provider.

    Raises:
        ConfigError: ``max_batch_size`` < ``batch_size``, or a precision other than fp32
            without TensorRT (or not fp32/fp16).
    """
    if ExecutionProvider.TENSORRT.value not in names:
        if precision != "fp32":
            raise ConfigError(f"precision {precision!r} needs the TensorRT provider (got {list(names)})")
        return None
    max_rows = max(batch_size, DEFAULT_TRT_MAX_BATCH) if max_batch_size is None else max_batch_size
    if max_rows < batch_size:
        raise ConfigError(f"max_batch_size ({max_rows}) must be >= batch_size ({batch_size})")
    return TensorrtSettings(max_batch_size=max_rows, opt_batch_size=batch_size, max_length=assets.max_length,
                            opt_length=min(DEFAULT_TRT_OPT_LENGTH, assets.max_length),
                            cache_dir=tensorrt_cache_dir(assets.sha256, precision), precision=precision)


def _make_cache_dir(path: Path) -> None:
    """Create the TensorRT cache directory.

    Raises:
        ModelError: It cannot be created.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create the TensorRT engine cache {path}: {exc}") from exc


def open_session(
    path: Path,
    label: str,
    providers: Sequence[tuple[str, dict[str, object]]],
    *,
    intra_op_num_threads: int | None = None,
    allow_spinning: bool | None = None,
    profile_prefix: str | None = None,
) -> ort.InferenceSession:
    """An ONNX Runtime session on exactly ``providers``: one inter-op thread, the given
    intra-op threads and spinning (``session.intra_op.allow_spinning``, None: ORT's default),
    profiled into ``profile_prefix``'s file when given (``enable_profiling``).

    Args:
        path: The ``.onnx`` file.
        label: How errors name the model (e.g. ``"model 880771a62774"``).
        providers: ``(name, options)`` pairs, already checked by :func:`_split_providers`.

    Raises:
        ModelError: The model does not load, or ORT dropped a requested provider
            (it then silently keeps only the CPU provider: refused, no fallback).
    """
    session_options = ort.SessionOptions()
    session_options.inter_op_num_threads = 1
    if intra_op_num_threads is not None:
        session_options.intra_op_num_threads = intra_op_num_threads
    if allow_spinning is not None:
        session_options.add_session_config_entry("session.intra_op.allow_spinning",
                                                 "1" if allow_spinning else "0")
    if profile_prefix is not None:
        session_options.enable_profiling = True
        session_options.profile_file_prefix = profile_prefix
    names = [name for name, _ in providers]
    try:
        session = ort.InferenceSession(str(path), sess_options=session_options, providers=names,
                                       provider_options=[dict(opts) for _, opts in providers])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/RuntimeError types
        raise ModelError(f"cannot load {path} ({label}): {exc}") from exc
    dropped = [name for name in names if name not in session.get_providers()]
    if dropped:
        raise ModelError(f"onnxruntime could not initialise {dropped} for {label} "
                         f"(session has {session.get_providers()}); refusing to fall back")
    return session


def encode_texts(
    tokenizer: ArrowTokenizer, texts: Sequence[str] | pa.Array | pa.ChunkedArray
) -> TokenizedBatch:
    """Tokenize texts for a model, refusing what is not text (no null or bytes rows
    reach the model).

    Args:
        tokenizer: The model's tokenizer.
        texts: ``str`` items, or an Arrow string array without nulls.

    Raises:
        TokenizeError: An item is not a ``str``, or the Arrow array has nulls.
    """
    if isinstance(texts, pa.Array | pa.ChunkedArray):
        if texts.null_count:
            raise TokenizeError(f"{texts.null_count} of {len(texts)} inputs are null")
        return tokenizer.encode(texts)
    for position, text in enumerate(texts):
        if not isinstance(text, str):
            raise TokenizeError(f"input {position} is {type(text).__name__}, expected str")
    return tokenizer.encode(list(texts))
