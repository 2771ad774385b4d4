"""What every phase of the GPU check shares: the run's settings, texts, reference and deadlines.

Thread-safety: a :class:`Context` belongs to the check's main thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from _gpu_files import Bundle

__all__ = ["FP32_TOLERANCE", "Context", "Deadline", "compare", "scores_of"]

#: Most |score difference| accepted between two float32 runs of the same weights (device vs CPU,
#: padded vs unpadded). Seen: 9e-7 on an H200 (ARCHITECTURE.md); the margin covers kernel choice.
FP32_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Deadline:
    """An end on ``time.perf_counter()``'s clock."""

    end: float

    @classmethod
    def after(cls, seconds: float, *, cap: float | None = None) -> Deadline:
        """``seconds`` from now, no later than ``cap``."""
        end = time.perf_counter() + seconds
        return cls(end if cap is None else min(end, cap))

    def remaining(self) -> float:
        """Seconds left (negative once past)."""
        return self.end - time.perf_counter()

    def keep_going(self) -> bool:
        """True while time is left."""
        return self.remaining() > 0


@dataclass
class Context:
    """The run's settings and data.

    Attributes:
        bundle: The opened bundle.
        device: ``"cpu"`` or ``"cuda:N"``.
        texts: The corpus rows scored (the reviews 4 times over, cut to ``--texts``).
        labels: int8 ``(len(texts),)`` gold labels.
        reviews: Distinct reviews (row ``i`` is review ``i % reviews``).
        ref_indices: Review indices with a CPU reference score; ``ref_scores`` float32 the scores.
        batches: Batch sizes of the throughput phase; ``precisions``: ``fp32`` / ``bf16``.
        warmup_texts: Texts of the untimed pass before each timed one.
        arrow_batch: Rows per Arrow batch handed to the runtime.
        reference_rows: Sample rows phase b compares with the reference (at most the sample).
        nv: Initialised ``pynvml`` or None.
    """

    bundle: Bundle
    device: str
    texts: list[str]
    labels: npt.NDArray[np.int8]
    reviews: int
    ref_indices: npt.NDArray[np.int64]
    ref_scores: npt.NDArray[np.float32]
    batches: list[int]
    precisions: list[str]
    warmup_texts: int
    arrow_batch: int
    reference_rows: int
    nv: Any = None
    notes: list[str] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        """The device is CUDA."""
        return self.device.startswith("cuda")

    @property
    def torch_index(self) -> int:
        """CUDA index of the device (0 on the CPU)."""
        return int(self.device.split(":")[1]) if self.on_gpu else 0

    def handler_options(self, batch: int) -> dict[str, Any]:
        """Options of the throughput phase's handler and runtime rows: the device's defaults on a GPU;
        on the CPU dry run the CUDA defaults made explicit (2 batches in flight, lengths padded to a
        multiple of 16, batch buckets of powers of two up to ``batch``), so CI runs the pipelined
        launch / collect path and the few-shapes padding."""
        if self.on_gpu:
            return {}
        buckets = [b for b in (8, 16, 32, 64, 128, 256, 512, 1024) if b < batch]
        return {"pipeline_depth": 2, "pad_to_multiple_of": 16, "batch_size_buckets": (*buckets, batch)}

    def reference_for_rows(self, rows: int) -> npt.NDArray[np.float32]:
        """float32 ``(rows,)``: the reference score of corpus rows ``0..rows-1``, NaN where none."""
        by_review = np.full(self.reviews, np.nan, dtype=np.float32)
        by_review[self.ref_indices] = self.ref_scores
        return by_review[np.arange(rows) % self.reviews]

    def sync(self) -> None:
        """Wait for the device (no-op on the CPU)."""
        if self.on_gpu:
            import torch

            torch.cuda.synchronize(self.device)


def scores_of(predictions: list[Any]) -> npt.NDArray[np.float32]:
    """float32 scores of ``(score, embedding)`` predictions (or :class:`Inferred` of them)."""
    out = np.empty(len(predictions), dtype=np.float32)
    for i, p in enumerate(predictions):
        value = p.prediction if hasattr(p, "prediction") else p
        if isinstance(value, BaseException):
            raise value
        out[i] = value[0]
    return out


def compare(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> dict[str, Any]:
    """Rows where both are scored (not NaN): their count, max |a-b| (None without rows), label flips."""
    both = ~(np.isnan(a) | np.isnan(b))
    if not both.any():
        return {"rows_compared": 0, "max_abs_diff": None, "label_flips": 0}
    x, y = a[both].astype(np.float64), b[both].astype(np.float64)
    return {
        "rows_compared": int(both.sum()),
        "max_abs_diff": float(np.abs(x - y).max()),
        "label_flips": int(((x >= 0.5) != (y >= 0.5)).sum()),
    }
