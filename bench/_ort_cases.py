"""Case (a) of the inference benchmark: the plain ONNX Runtime loop, and its batch-size sweep.

(a) is ``OnnxSentimentModel.predict`` over all texts in one call: tokenized
once, sorted by token count and run in batches of ``batch_size`` padded to
their longest row (length-bucketed batches), with no framework around it: the
machine's limit for this model. The sweep times batch sizes on a sample, two
ways: ``sorted`` (the same length-sorted route) and ``arrival`` (chunks of
``batch_size`` texts in their arrival order, one ``session.run`` each, padded
to the chunk's longest: what a streaming operator without length buckets gets).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OrtResult", "run_plain_loop", "run_runtime_vs_handler", "sweep_batch_sizes"]


@dataclass(frozen=True, kw_only=True)
class OrtResult:
    """One timed pass.

    Attributes:
        rows: Texts scored.
        seconds: Wall time of the pass (model already loaded and warmed up).
        batch_size: Texts per ``session.run``.
    """

    rows: int
    seconds: float
    batch_size: int

    @property
    def records_per_s(self) -> float:
        """Texts per second."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def _model(assets: Any, intra_op_threads: int, batch_size: int) -> Any:
    from pyflink_aisp.inference.handlers import OnnxSentimentModel

    model = OnnxSentimentModel(assets, intra_op_num_threads=intra_op_threads, batch_size=batch_size)
    model.predict(["warm-up text for the session and the tokenizer pool"] * min(batch_size, 8))
    return model


def run_plain_loop(assets: Any, texts: Sequence[str], *, intra_op_threads: int, batch_size: int) -> OrtResult:
    """(a): one ``predict`` over all ``texts`` (length-sorted batches of ``batch_size``)."""
    model = _model(assets, intra_op_threads, batch_size)
    start = time.perf_counter()
    model.predict(list(texts))
    return OrtResult(rows=len(texts), seconds=time.perf_counter() - start, batch_size=batch_size)


def sweep_batch_sizes(
    assets: Any, texts: Sequence[str], *, intra_op_threads: int, batch_sizes: Sequence[int]
) -> dict[str, dict[int, float]]:
    """Records/s per batch size on ``texts``, ``{"sorted": {size: rate}, "arrival": {...}}``."""
    out: dict[str, dict[int, float]] = {"sorted": {}, "arrival": {}}
    for size in batch_sizes:
        model = _model(assets, intra_op_threads, size)
        start = time.perf_counter()
        model.predict(list(texts))
        out["sorted"][size] = len(texts) / (time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(0, len(texts), size):
            model.predict(list(texts[i : i + size]))
        out["arrival"][size] = len(texts) / (time.perf_counter() - start)
        print(f"[a] batch {size:>4}: {out['sorted'][size]:,.0f} records/s sorted, "
              f"{out['arrival'][size]:,.0f} in arrival order", flush=True)
    return out


def run_runtime_vs_handler(
    assets: Any, texts: Sequence[str], *, intra_op_threads: int, chunk: int, batch_size: int
) -> dict[str, Any]:
    """(r): ``ModelRuntime.infer_batch`` beside the handler's own ``run_inference``, over the
    same chunks of ``chunk`` texts (the Arrow batches of the job), in one process.

    The handler alone sorts each chunk by length into sub-batches of ``batch_size``
    (``OnnxSentimentModel.predict``); the runtime tokenizes the chunk once and its
    batcher cuts the model batches (``max_batch_size = batch_size``), so the two do the
    same model work and the ratio is the runtime's own overhead.

    Returns:
        ``{"handler_per_s", "runtime_per_s", "ratio", "batch_sizes": {size: count}, "max_abs_diff"}``.
    """
    import numpy as np

    from pyflink_aisp.inference import BatchingConfig, ModelRuntime
    from pyflink_aisp.inference.handlers import SentimentHandler

    handler = SentimentHandler(assets, intra_op_num_threads=intra_op_threads)
    model = handler.load_model()
    model.batch_size = batch_size
    chunks = [list(texts[i : i + chunk]) for i in range(0, len(texts), chunk)]
    handler.run_inference(chunks[0][:batch_size], model)  # warm-up
    start = time.perf_counter()
    alone = [p for c in chunks for p in handler.run_inference(c, model)]
    handler_s = time.perf_counter() - start
    runtime = ModelRuntime.acquire(SentimentHandler(assets, intra_op_num_threads=intra_op_threads),
                                   BatchingConfig(max_batch_size=batch_size))
    try:
        runtime.infer_batch(chunks[0][:batch_size])
        before = dict(runtime.batcher.stats.sizes)
        start = time.perf_counter()
        shared = [o for c in chunks for o in runtime.infer_batch(c)]
        runtime_s = time.perf_counter() - start
        after = runtime.batcher.stats.sizes
        sizes = {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
    finally:
        runtime.release()
    diff = max(abs(a[0] - o.prediction[0]) for a, o in zip(alone, shared, strict=True))
    result = {"handler_per_s": len(texts) / handler_s, "runtime_per_s": len(texts) / runtime_s,
              "chunk": chunk, "batch_size": batch_size,
              "batch_sizes": {str(k): v for k, v in sorted(sizes.items())},
              "max_abs_diff": float(np.float64(diff))}
    result["ratio"] = result["runtime_per_s"] / result["handler_per_s"]
    print(f"[r] handler {result['handler_per_s']:,.0f}/s, runtime batch API {result['runtime_per_s']:,.0f}/s "
          f"({result['ratio']:.3f}x), max |Δscore| {diff:.1e}", flush=True)
    return result
