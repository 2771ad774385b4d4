"""Phase c of the GPU check: sentences/s of the plain loop, the handler and the runtime.

For each precision, batch size and path, on the corpus rows in file order: one untimed pass over the
first ``warmup_texts`` rows (kernels, allocator, shapes), then one timed pass over all rows, stopped
at the phase's deadline (a stopped pass reports no rate). Paths:

- ``plain``: :class:`_gpu_plain.PlainModel`, tokenize + forward + copy back, ``batch`` rows a call;
- ``handler``: ``TorchSentimentHandler.run_inference`` on chunks of ``batch`` rows (handler
  ``batch_size`` = ``batch``: one forward pass per chunk), the device's defaults for padding,
  buckets and pipeline depth;
- ``runtime``: the same handler behind ``ModelRuntime`` (``max_batch_size`` = ``batch``, the other
  knobs at their defaults), one ``infer_batch`` call per Arrow batch of ``arrow_batch`` rows, as
  the Arrow operator calls it (a pipelined model's runtime cuts it into slices of a few model
  batches and submits them without waiting between them).

On the CPU dry run the handler and the runtime get the CUDA defaults explicitly
(:meth:`~_gpu_context.Context.handler_options`: depth 2, padding, buckets), so CI runs the pipelined
path. Every pass's scores are compared with the bundle's CPU reference on the rows that have one, and
the handler's and the runtime's with the plain loop's of the same precision and batch on every row,
so a rate is only reported next to the proof that its rows were scored right. GPU busy is NVML's
sampled utilisation during the timed pass; on the CPU it is not measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from _gpu_context import Context, Deadline, compare, scores_of
from _gpu_files import TOKENIZER, WEIGHTS, make_handler
from _gpu_nvml import BusySampler
from _gpu_plain import PlainModel

__all__ = ["PATHS", "throughput_phase"]

PATHS = ("plain", "handler", "runtime")
Pass = Callable[[list[str], Callable[[], bool]], tuple[npt.NDArray[np.float32], int]]


def _chunked(score_chunk: Callable[[list[str]], npt.NDArray[np.float32]], step: int) -> Pass:
    """A pass that scores ``step`` texts at a time while ``keep_going()``."""

    def run(texts: list[str], keep_going: Callable[[], bool]) -> tuple[npt.NDArray[np.float32], int]:
        scores = np.full(len(texts), np.nan, dtype=np.float32)
        done = 0
        while done < len(texts) and keep_going():
            chunk = texts[done : done + step]
            scores[done : done + len(chunk)] = score_chunk(chunk)
            done += len(chunk)
        return scores, done

    return run


def _timed(ctx: Context, run: Pass, deadline: Deadline) -> tuple[dict[str, Any], npt.NDArray[np.float32]]:
    """Warm-up pass, then the timed pass with the busy sampler; scores checked against the reference.

    Returns:
        The cell and the float32 ``(len(ctx.texts),)`` scores (NaN where not scored).
    """
    run(ctx.texts[: ctx.warmup_texts], deadline.keep_going)
    ctx.sync()
    sampler = BusySampler.for_device(ctx.nv, ctx.torch_index) if ctx.on_gpu and ctx.nv else None
    start = time.perf_counter()
    if sampler is not None:
        with sampler:
            scores, done = run(ctx.texts, deadline.keep_going)
            ctx.sync()
    else:
        scores, done = run(ctx.texts, deadline.keep_going)
    seconds = time.perf_counter() - start
    complete = done == len(ctx.texts)
    check = compare(scores, ctx.reference_for_rows(len(ctx.texts)))
    return {
        "status": "ok" if complete else "partial (deadline)",
        "rows": done,
        "rows_planned": len(ctx.texts),
        "seconds": round(seconds, 4),
        "sentences_per_s": round(done / seconds, 1) if complete else None,
        "gpu_busy_pct": None if sampler is None else sampler.mean,
        "busy_samples": 0 if sampler is None else len(sampler.samples),
        **{f"ref_{k}": v for k, v in check.items()},
    }, scores


def _plain_cell(
    ctx: Context, plain: PlainModel, precision: str, batch: int, deadline: Deadline
) -> tuple[dict[str, Any], npt.NDArray[np.float32]]:
    return _timed(ctx, _chunked(lambda chunk: plain.score_batch(chunk, precision), batch), deadline)


def _handler_cell(
    ctx: Context, precision: str, batch: int, deadline: Deadline
) -> tuple[dict[str, Any], npt.NDArray[np.float32]]:
    handler, missing = make_handler(
        ctx.bundle, device=ctx.device, precision=precision, batch_size=batch, **ctx.handler_options(batch)
    )
    model = handler.load_model()
    try:
        cell, scores = _timed(
            ctx, _chunked(lambda chunk: scores_of(handler.run_inference(chunk, model)), batch), deadline
        )
        depth = getattr(handler, "pipeline_depth", None)
        cell["pipeline_depth"] = depth(model) if callable(depth) else "no hook"
    finally:
        handler.release_model(model)
    return cell | {"handler_missing_options": missing}, scores


def _runtime_cell(
    ctx: Context, precision: str, batch: int, deadline: Deadline
) -> tuple[dict[str, Any], npt.NDArray[np.float32]]:
    from pyflink_aisp.inference import BatchingConfig, ModelRuntime

    handler, missing = make_handler(
        ctx.bundle, device=ctx.device, precision=precision, batch_size=batch, **ctx.handler_options(batch)
    )
    runtime = ModelRuntime.acquire(handler, BatchingConfig(max_batch_size=batch))
    try:
        cell, scores = _timed(
            ctx, _chunked(lambda chunk: scores_of(runtime.infer_batch(chunk)), ctx.arrow_batch), deadline
        )
        stats = runtime.batcher.stats
        cell |= {
            "pipeline_depth": getattr(runtime, "pipeline_depth", "no pipelining in this runtime"),
            "arrow_batch": ctx.arrow_batch,
            "model_batches": stats.batches,
            "oom_splits": stats.oom_splits,
            "failed": stats.failed,
            "handler_missing_options": missing,
        }
    finally:
        runtime.release()
    return cell, scores


class _LazyPlain:
    """The plain loop's model, loaded on first use (a run cut short before its first cell loads none)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._model: PlainModel | None = None

    def __call__(self) -> PlainModel:
        if self._model is None:
            b = self._ctx.bundle
            self._model = PlainModel(
                b.path(WEIGHTS).parent,
                b.head(),
                b.path(TOKENIZER),
                max_length=int(b.manifest["model"]["max_length"]),
                device=self._ctx.device,
            )
        return self._model

    def close(self) -> None:
        if self._model is not None:
            self._model.close()


def _cell(
    ctx: Context,
    path: str,
    precision: str,
    batch: int,
    deadline: Deadline,
    plain: _LazyPlain,
    plain_scores: dict[tuple[str, int], npt.NDArray[np.float32]],
) -> dict[str, Any]:
    """One cell; the handler's and the runtime's scores are compared with the plain loop's."""
    if path == "plain":
        cell, scores = _plain_cell(ctx, plain(), precision, batch, deadline)
        plain_scores[precision, batch] = scores
        return cell
    run = _handler_cell if path == "handler" else _runtime_cell
    cell, scores = run(ctx, precision, batch, deadline)
    if (precision, batch) in plain_scores:
        cell |= {f"plain_{k}": v for k, v in compare(scores, plain_scores[precision, batch]).items()}
    return cell


def throughput_phase(
    ctx: Context, deadline: Deadline, on_cell: Callable[[list[dict[str, Any]]], None]
) -> dict[str, Any]:
    """Every (precision, batch, path) cell, precisions in order, batches largest first (a run cut
    short keeps the batch sizes the acceptance compares); ``on_cell`` gets the rows after each one.

    Returns:
        ``{"status", "rows": [cell, ...], "texts", "warmup_texts", ...}``; a cell that raised has
        ``status`` ``"error: ..."``, one not started before the deadline ``"skipped (deadline)"``.
    """
    rows: list[dict[str, Any]] = []
    plain_scores: dict[tuple[str, int], npt.NDArray[np.float32]] = {}
    plain = _LazyPlain(ctx)
    try:
        for precision in ctx.precisions:
            for batch in sorted(ctx.batches, reverse=True):  # the acceptance's batch sizes first
                for path in PATHS:
                    key = {"path": path, "precision": precision, "batch": batch, "device": ctx.device}
                    if not deadline.keep_going():
                        rows.append(key | {"status": "skipped (deadline)"})
                        continue
                    try:
                        cell = _cell(ctx, path, precision, batch, deadline, plain, plain_scores)
                    except Exception as exc:  # one cell's failure is reported, the others still run
                        cell = {"status": f"error: {type(exc).__name__}: {str(exc)[:300]}"}
                    rows.append(key | cell)
                    print(_progress(rows[-1]), flush=True)
                    on_cell(rows)
    finally:
        plain.close()
    done = all(r["status"] == "ok" for r in rows)
    return {
        "status": "ok" if done else _worst(rows),
        "rows": rows,
        "texts": len(ctx.texts),
        "warmup_texts": ctx.warmup_texts,
        "arrow_batch": ctx.arrow_batch,
    }


def _worst(rows: list[dict[str, Any]]) -> str:
    statuses = [r["status"] for r in rows]
    if any(s.startswith("error") for s in statuses):
        return "error"
    return "partial (deadline)"


def _progress(row: dict[str, Any]) -> str:
    rate = row.get("sentences_per_s")
    busy = row.get("gpu_busy_pct")
    return (
        f"  {row['path']:8s} {row['precision']} batch {row['batch']:5d} on {row['device']}: "
        f"{'-' if rate is None else f'{rate:,.0f}'} sentences/s"
        f"{'' if busy is None else f', GPU busy {busy:.0f}%'} [{row['status']}]"
    )
