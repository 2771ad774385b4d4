"""The plain PyTorch loop of the GPU check: the yardstick the handler and the runtime are held to.

No project code beyond loading the files (``read_head`` for the head in ``head.onnx``): HF
``tokenizers`` ``encode_batch`` (truncation to ``max_length``, padded to the batch's longest row),
``torch.from_numpy(...).to(device)``, ``transformers.BertModel`` (eager, its default attention),
mean pooling, L2 normalisation and the logistic head, then ``.cpu()``. The same maths as
:class:`~pyflink_aisp.inference.handlers.TorchSentimentHandler`; it computes the bundle's CPU
reference scores (float32) and times the "plain loop" rows on the device.

Thread-safety: one :class:`PlainModel` per thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["PRECISIONS", "PlainModel", "load_fp32_state"]

#: Precisions the check times: float32, and the encoder under ``torch.autocast(bfloat16)``.
PRECISIONS = ("fp32", "bf16")
_SKIPPED_PREFIXES = ("pooler.",)
_SKIPPED_KEYS = ("embeddings.position_ids",)


def load_fp32_state(weights: Path) -> dict[str, Any]:
    """The safetensors state dict upcast to float32 (the bundle stores float16), minus the pooler.

    Raises:
        ValueError: A tensor is not finite after the upcast.
    """
    import torch
    from safetensors.torch import load_file

    state = {}
    for key, tensor in load_file(str(weights)).items():
        if key.startswith(_SKIPPED_PREFIXES) or key in _SKIPPED_KEYS:
            continue
        upcast = tensor.to(torch.float32)
        if not bool(torch.isfinite(upcast).all()):
            raise ValueError(f"{weights}: tensor {key} is not finite")
        state[key] = upcast
    return state


class PlainModel:
    """Encoder + head on one device, called the plain way.

    Args:
        weights_dir: ``model.safetensors`` (float16 or float32) and ``config.json``.
        head: ``(coef, intercept)``: float32 ``(hidden,)`` and the bias.
        tokenizer_json: HF ``tokenizer.json``.
        max_length: Truncation length (tokens, special tokens included).
        device: ``"cpu"`` or ``"cuda:N"``.
    """

    def __init__(
        self,
        weights_dir: Path,
        head: tuple[npt.NDArray[np.float32], float],
        tokenizer_json: Path,
        *,
        max_length: int,
        device: str,
    ) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import BertConfig, BertModel

        self._torch = torch
        self.device = torch.device(device)
        config = BertConfig(**json.loads((weights_dir / "config.json").read_text(encoding="utf-8")))
        encoder = BertModel(config, add_pooling_layer=False)
        encoder.load_state_dict(load_fp32_state(weights_dir / "model.safetensors"), strict=True)
        self.encoder = encoder.eval().to(self.device)
        self.coef = torch.from_numpy(np.array(head[0], dtype=np.float32)).to(self.device)
        self.intercept = torch.tensor([head[1]], dtype=torch.float32, device=self.device)
        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self.tokenizer.enable_truncation(max_length=max_length)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the batch's longest row

    def score_batch(self, texts: Sequence[str], precision: str) -> npt.NDArray[np.float32]:
        """One forward pass: float32 ``(len(texts),)`` P(fresh), on the host."""
        torch = self._torch
        encodings = self.tokenizer.encode_batch(list(texts))
        ids = torch.from_numpy(np.array([e.ids for e in encodings], dtype=np.int64))
        mask = torch.from_numpy(np.array([e.attention_mask for e in encodings], dtype=np.int64))
        ids, mask = ids.to(self.device), mask.to(self.device)
        types = torch.zeros_like(ids)
        with torch.inference_mode():
            if precision == "bf16":
                with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                    hidden = self.encoder(input_ids=ids, attention_mask=mask, token_type_ids=types)[0]
                hidden = hidden.float()
            else:
                hidden = self.encoder(input_ids=ids, attention_mask=mask, token_type_ids=types)[0]
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            embedding = torch.nn.functional.normalize(mean, p=2.0, dim=1, eps=1e-12)
            score = torch.sigmoid(embedding @ self.coef + self.intercept)
        return np.asarray(score.cpu().numpy(), dtype=np.float32)

    def score(
        self,
        texts: Sequence[str],
        *,
        batch: int,
        precision: str = "fp32",
        keep_going: Callable[[], bool] = lambda: True,
    ) -> tuple[npt.NDArray[np.float32], int]:
        """Score ``texts`` in file order, ``batch`` at a time, while ``keep_going()``.

        Returns:
            float32 ``(len(texts),)`` scores (NaN where not scored) and the rows scored.
        """
        scores = np.full(len(texts), np.nan, dtype=np.float32)
        done = 0
        while done < len(texts) and keep_going():
            chunk = texts[done : done + batch]
            scores[done : done + len(chunk)] = self.score_batch(chunk, precision)
            done += len(chunk)
        return scores, done

    def close(self) -> None:
        """Drop the device tensors."""
        self.encoder = self.coef = self.intercept = None  # type: ignore[assignment]
