"""GPU check: the sentiment model on CUDA (ONNX Runtime + IO binding, PyTorch) beside the CPU.

Not a test. Called by ``bench/gpu_check.sh`` (see it for what the host needs).
On the same real texts (Rotten Tomatoes snippets, in file order) it times
``run_inference`` of the handlers the Flink operator uses, at each batch size
``B`` of ``--batch-sizes``: the texts go in chunks of ``B`` (one operator
batch each) and the model's sub-batch size is ``B`` as well, so a chunk is one
length-sorted forward pass padded to its longest text. Backends:

- ``onnx`` on ``cpu``: :class:`~pyflink_aisp.inference.SentimentHandler`, CPU EP,
  ``--cpu-threads`` intra-op threads;
- ``torch`` on ``cpu``: :class:`TorchSentimentHandler`, ``torch.set_num_threads``
  the same;
- ``onnx`` on ``cuda:N``: CUDA EP first (CPU EP second only for nodes CUDA lacks),
  IO binding on (asserted);
- ``torch`` on ``cuda:N``: encoder parameters on the GPU (asserted).

Each backend also gets a ``runtime`` row: the same chunks through
``ModelRuntime.infer_batch`` (the operators' batch API: the chunk is tokenized
once and the batcher cuts model batches of ``B``, sorted by length), so the
two rows do the same model work and their ratio is the runtime's overhead.

Each cell is the best of ``--repeats`` timed passes after one warm-up pass
(sentences per second = texts / seconds; GPU results are copied to the host
inside the timed region, so the time includes the device work). The last
column is the largest ``|score - score of onnx/cpu|`` over the texts: the GPU
numbers are only worth having if the scores are the same.

Without CUDA (torch sees no device, or ONNX Runtime lacks the CUDA EP or drops
it) the script exits 2 before timing anything, unless ``--cpu-only`` is given:
CPU numbers are never reported as GPU numbers.

Run::

    bash bench/gpu_check.sh [--texts 4096] [--batch-sizes 32,128,512] [--report bench/GPU.md]
    bash bench/gpu_check.sh --cpu-only --texts 256 --batch-sizes 32,128   # no GPU
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CUDA_EP, CPU_EP = "CUDAExecutionProvider", "CPUExecutionProvider"
EXIT_NO_CUDA = 2


class NoCudaError(RuntimeError):
    """CUDA was asked for and is not usable."""


@dataclass(kw_only=True)
class Row:
    """One backend's results: sentences/s per batch size and the score difference."""

    backend: str
    device: str
    rates: dict[int, float] = field(default_factory=dict)
    max_score_diff: float = 0.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-only", action="store_true", help="no GPU: time the CPU backends only")
    p.add_argument("--texts", type=int, default=2048, help="real reviews to score per pass")
    p.add_argument("--batch-sizes", default="32,128,512", help="comma-separated batch sizes")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per cell (best kept)")
    p.add_argument("--device-id", type=int, default=0, help="CUDA device index")
    p.add_argument("--cpu-threads", type=int, default=os.cpu_count() or 1, help="CPU backends' threads")
    p.add_argument("--report", type=Path, default=None, help="also write the markdown here")
    args = p.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if args.texts < 1 or args.repeats < 1 or not args.batch_sizes or min(args.batch_sizes) < 1:
        p.error("--texts, --repeats and every batch size must be >= 1")
    return args


def require_cuda(device_id: int) -> str:
    """Check that torch and ONNX Runtime can both use CUDA device ``device_id``.

    Returns:
        The device's name (``torch.cuda.get_device_name``).

    Raises:
        NoCudaError: With what is missing and how to get it.
    """
    import torch

    if not torch.cuda.is_available():
        raise NoCudaError(
            f"torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no CUDA device; "
            "check `nvidia-smi` and that torch is a CUDA build (PyPI's Linux x86_64 wheel is)"
        )
    if device_id >= torch.cuda.device_count():
        raise NoCudaError(f"--device-id {device_id} but {torch.cuda.device_count()} CUDA device(s) visible")
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):  # onnxruntime-gpu >= 1.21: CUDA/cuDNN from torch / nvidia-* wheels
        ort.preload_dlls()
    if CUDA_EP not in ort.get_available_providers():
        raise NoCudaError(
            f"onnxruntime {ort.__version__} has no {CUDA_EP} (providers: {ort.get_available_providers()}); "
            "install onnxruntime-gpu and uninstall onnxruntime (both share the `onnxruntime` module)"
        )
    return str(torch.cuda.get_device_name(device_id))


def load_texts(count: int) -> list[str]:
    """``count`` review snippets in file order (the corpus repeated if ``count`` > 12,808)."""
    from pyflink_aisp.datasets import load_rotten_tomatoes

    corpus = [r.text for r in load_rotten_tomatoes()]
    return [corpus[i % len(corpus)] for i in range(count)]


def backends(assets: Any, args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    """``(backend, device, handler)`` in table order; GPU ones unless ``--cpu-only``."""
    from pyflink_aisp.inference.handlers import SentimentHandler
    from pyflink_aisp.inference.handlers._torch import TorchSentimentHandler

    threads = args.cpu_threads
    chosen = [
        ("onnx", "cpu", SentimentHandler(assets, intra_op_num_threads=threads)),
        ("torch", "cpu", TorchSentimentHandler(assets, intra_op_num_threads=threads)),
    ]
    if not args.cpu_only:
        gpu = f"cuda:{args.device_id}"
        onnx_gpu = SentimentHandler(assets, providers=[CUDA_EP, CPU_EP], device_id=args.device_id)
        chosen += [("onnx", gpu, onnx_gpu), ("torch", gpu, TorchSentimentHandler(assets, device=gpu))]
    return chosen


def check_placement(backend: str, device: str, model: Any) -> None:
    """Refuse to time a "GPU" backend whose model is not on the GPU.

    Raises:
        NoCudaError: The ORT session's first provider is not CUDA or IO binding
            is off, or the torch encoder's parameters are not on ``device``.
    """
    if device == "cpu":
        return
    if backend == "onnx" and (model.providers[0] != CUDA_EP or not model.uses_io_binding):
        raise NoCudaError(f"ORT session providers {model.providers}, io binding {model.uses_io_binding}")
    if backend == "torch":
        placed = str(next(model.encoder.parameters()).device)
        if placed != device:
            raise NoCudaError(f"torch encoder is on {placed}, expected {device}")


def time_pass(run: Callable[[list[str]], Sequence[Any]], texts: list[str], batch: int) -> float:
    """Seconds for one pass over ``texts`` in chunks of ``batch``."""
    start = time.perf_counter()
    for i in range(0, len(texts), batch):
        run(texts[i : i + batch])
    return time.perf_counter() - start


def measure_runtime(
    handler: Any, backend: str, device: str, texts: list[str], args: argparse.Namespace
) -> Row:
    """The same chunks through ``ModelRuntime.infer_batch`` with ``max_batch_size`` = the batch size."""
    from pyflink_aisp.inference import BatchingConfig, ModelRuntime

    row = Row(backend=f"{backend} runtime", device=device)
    for batch in args.batch_sizes:
        runtime = ModelRuntime.acquire(handler, BatchingConfig(max_batch_size=batch))
        try:
            time_pass(runtime.infer_batch, texts, batch)  # warm-up
            best = min(time_pass(runtime.infer_batch, texts, batch) for _ in range(args.repeats))
        finally:
            runtime.release()
        row.rates[batch] = len(texts) / best
        print(f"  {row.backend:13s} {device:7s} batch {batch:4d}: {row.rates[batch]:9,.0f} sentences/s")
    return row


def measure(
    handler: Any, backend: str, device: str, texts: list[str], args: argparse.Namespace
) -> tuple[Row, np.ndarray]:
    """Load, check placement, warm up and time one backend at every batch size.

    Returns:
        The row (rates filled) and the float32 ``(len(texts),)`` scores.
    """
    model = handler.load_model()
    try:
        check_placement(backend, device, model)
        row = Row(backend=backend, device=device)

        def run(chunk: list[str]) -> Sequence[Any]:
            return handler.run_inference(chunk, model)

        for batch in args.batch_sizes:
            model.batch_size = batch  # one length-sorted forward pass per operator batch
            time_pass(run, texts, batch)  # warm-up: kernels, allocator, tokenizer pool
            best = min(time_pass(run, texts, batch) for _ in range(args.repeats))
            row.rates[batch] = len(texts) / best
            print(f"  {backend:5s} {device:7s} batch {batch:4d}: {row.rates[batch]:9,.0f} sentences/s")
        scores = np.array([s for s, _ in handler.run_inference(texts, model)], dtype=np.float32)
        return row, scores
    finally:
        handler.release_model(model)


def render(rows: list[Row], batch_sizes: list[int], header: str) -> str:
    """The markdown table with a context line above it."""
    cols = " | ".join(f"batch {b}" for b in batch_sizes)
    lines = [header, "", f"| backend | device | {cols} | max abs Δscore vs onnx/cpu |", "|---|---|"]
    lines[-1] += "---|" * (len(batch_sizes) + 1)
    for row in rows:
        cells = " | ".join(f"{row.rates[b]:,.0f}" for b in batch_sizes)
        lines.append(f"| {row.backend} | {row.device} | {cells} | {row.max_score_diff:.2e} |")
    return "\n".join(lines) + "\n"


def run_all(args: argparse.Namespace) -> str:
    """Build/reuse the assets, measure every backend, return the markdown."""
    from pyflink_aisp.models import ensure_model_assets

    gpu_name = "none (--cpu-only)" if args.cpu_only else require_cuda(args.device_id)
    assets = ensure_model_assets()
    texts = load_texts(args.texts)
    rows: list[Row] = []
    reference: Any = None
    for backend, device, handler in backends(assets, args):
        row, scores = measure(handler, backend, device, texts, args)
        reference = scores if reference is None else reference
        row.max_score_diff = float(np.abs(scores - reference).max())
        rows.append(row)
        rows.append(measure_runtime(handler, backend, device, texts, args))
    import onnxruntime as ort
    import torch

    header = (
        f"Sentences/s, {len(texts)} Rotten Tomatoes snippets, model {assets.sha256[:12]}; GPU: {gpu_name}; "
        f"CPU: {platform.processor() or platform.machine()}, {args.cpu_threads} threads; "
        f"torch {torch.__version__}, onnxruntime {ort.__version__}; best of {args.repeats}."
    )
    return render(rows, args.batch_sizes, header)


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 with the table printed, 2 when CUDA is not usable, 1 on a model error."""
    from pyflink_aisp.errors import AispError

    args = parse_args(argv)
    try:
        report = run_all(args)
    except NoCudaError as exc:
        print(f"gpu_check: CUDA not usable: {exc}", file=sys.stderr)
        return EXIT_NO_CUDA
    except AispError as exc:  # e.g. ORT could not initialise the CUDA EP (no silent CPU run)
        print(f"gpu_check: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(report)
    if args.report is not None:
        args.report.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
