"""Loading for the PyTorch handlers: torch itself, the device check, the sentiment encoder and head,
and the attention-mask check.

``torch`` and ``transformers`` are the ``torch`` extra, imported by :func:`import_torch` when a
model loads (building a job graph needs neither).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.device import Device
from pyflink_aisp.errors import ModelError
from pyflink_aisp.inference.handlers._torch_device import MaskMode, attention_mask, mask_mode_for
from pyflink_aisp.models import BertConfig, ModelAssets
from pyflink_aisp.tokenize import ArrowTokenizer

__all__ = [
    "CONFIG_FILE",
    "HEAD_COEF",
    "HEAD_INTERCEPT",
    "MASK_CHECK_ATOL",
    "MASK_CHECK_TEXTS",
    "WEIGHTS_FILE",
    "check_device",
    "check_precision",
    "import_torch",
    "load_bert_encoder",
    "manifest_weights_sha256",
    "parse_torch_device",
    "read_head",
    "verified_mask_mode",
]

#: Initializer names of the logistic head in ``model.onnx`` (see ``append_sentiment_head``).
HEAD_COEF = "head_coef"
HEAD_INTERCEPT = "head_intercept"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_MANIFEST_FILE = "manifest.json"
#: Keys of the source safetensors that ``BertModel(add_pooling_layer=False)`` has no
#: parameter for: the unused pooler and the (non-persistent) position-id buffer.
_SKIPPED_KEYS = re.compile(r"pooler\..*|embeddings\.position_ids")
_INSTALL_HINT = "pip install 'pyflink-aisp[torch]'"
#: Two texts of different lengths (so one is padded) run with the 2-D and the 4-D mask at load.
MASK_CHECK_TEXTS = ("A gripping, beautifully acted film.", "Dull.")
#: Most |difference| between the 2-D and 4-D mask outputs that still counts as the same
#: (they are equal on CPU; a model that reads the 4-D mask otherwise differs by far more).
MASK_CHECK_ATOL = 1e-4


def parse_torch_device(device: str) -> str:
    """Normalise a device name: ``"cpu"``, ``"cuda"`` → ``"cuda:0"``, ``"cuda:N"``
    (``str`` of :meth:`pyflink_aisp.device.Device.parse`).

    Raises:
        ConfigError: Any other name (``"mps"``, ``"cuda:-1"``, ``"gpu"``).
    """
    return str(Device.parse(device))


def import_torch() -> Any:
    """The ``torch`` module (``transformers`` checked too).

    Raises:
        ModelError: Either is missing.
    """
    try:
        import torch
        import transformers  # noqa: F401  (checked here for one clear message)
    except ImportError as exc:
        raise ModelError(f"the torch handler needs torch and transformers: {_INSTALL_HINT}") from exc
    return torch


def check_device(torch: Any, device: str) -> None:
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


def manifest_weights_sha256(assets: ModelAssets) -> str:
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


def load_bert_encoder(torch: Any, weights_dir: Path, device: str) -> Any:
    """``BertModel`` from ``weights_dir/config.json`` and the (already verified) safetensors.

    Raises:
        ModelError: Unsupported config, unreadable weights, or missing/unexpected tensors.
    """
    from safetensors.torch import load_file
    from transformers import BertConfig as HFBertConfig
    from transformers import BertModel

    config_path = weights_dir / CONFIG_FILE
    BertConfig.from_json(config_path)  # refuses configs the ONNX builder does not support
    raw = json.loads(config_path.read_text(encoding="utf-8"))
    try:
        state = load_file(str(weights_dir / WEIGHTS_FILE))
    except Exception as exc:  # safetensors raises SafetensorError / OSError
        raise ModelError(f"cannot read weights {weights_dir / WEIGHTS_FILE}: {exc}") from exc
    state = {k: v for k, v in state.items() if not _SKIPPED_KEYS.fullmatch(k)}
    encoder = BertModel(HFBertConfig(**raw), add_pooling_layer=False)
    try:
        encoder.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # missing / unexpected keys, shape mismatch
        raise ModelError(f"weights in {weights_dir} do not fit BertModel: {exc}") from exc
    return encoder.eval().to(torch.device(device))


def verified_mask_mode(
    torch: Any, module: Any, tokenizer: ArrowTokenizer, device: Any, call: Callable[..., Any]
) -> MaskMode:
    """The 4-D :class:`MaskMode` of ``module``'s attention implementation where ``call`` gives the
    same output with it as with the 2-D padding mask on :data:`MASK_CHECK_TEXTS`, else
    :attr:`MaskMode.PADDING_2D` (the model's own mask helper, one host sync per pass).

    Args:
        torch: The ``torch`` module.
        module: The HF model (its ``config._attn_implementation`` is read).
        tokenizer: The model's tokenizer.
        device: ``torch.device`` of the model.
        call: ``call(input_ids, attention_mask, token_type_ids)`` → one tensor (the model output
            that is pooled) or None when the model has no such output.
    """
    mode = mask_mode_for(module)
    if mode is MaskMode.PADDING_2D:
        return mode
    with tokenizer.pad(tokenizer.encode(list(MASK_CHECK_TEXTS))) as padded, torch.inference_mode():
        ids, mask, types = (torch.from_numpy(a).to(device) for a in
                            (padded.input_ids, padded.attention_mask, padded.token_type_ids))
        reference = call(ids, mask, types)
        try:
            fast = call(ids, attention_mask(torch, mode, mask), types)
        except Exception:  # a model that does not take a 4-D mask: keep the 2-D one
            return MaskMode.PADDING_2D
        return mode if _same(torch, reference, fast, mask) else MaskMode.PADDING_2D


def _same(torch: Any, reference: Any, fast: Any, mask: Any) -> bool:
    """Both are tensors of one shape that agree on the attended positions (pad positions of a
    ``(batch, seq_len, ...)`` output may differ: they are never pooled)."""
    if not (isinstance(reference, torch.Tensor) and isinstance(fast, torch.Tensor)):
        return False
    if reference.shape != fast.shape:
        return False
    gap = (reference.float() - fast.float()).abs()
    if gap.dim() >= 2 and tuple(gap.shape[:2]) == tuple(mask.shape):
        gap = gap[mask.bool()]
    return bool(gap.max() <= MASK_CHECK_ATOL) if gap.numel() else True



def check_precision(model: Any, tolerance: float) -> None:
    """Score the probe set in the model's precision and in float32; refuse a gap over
    ``tolerance`` (or a failing probe).

    Args:
        model: A :class:`~pyflink_aisp.inference.TorchSentimentModel` (``precision`` is switched
            to ``"fp32"`` and back).
        tolerance: Most |score difference| allowed.

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
    if not gap <= tolerance:
        raise ModelError(f"precision {precision} moves probe scores by {gap:.3g} from float32 "
                         f"(> {tolerance:g}); use --precision fp32")
