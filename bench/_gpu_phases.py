"""Phases a, b, d, e, f and g of the GPU check (c, the throughput, is :mod:`_gpu_throughput`).

Each phase takes the :class:`~_gpu_context.Context` and its :class:`~_gpu_context.Deadline` and returns
a JSON-able dict with a ``status``: ``ok``, ``partial (deadline)``, ``not applicable`` (with the
reason), ``not measured`` (with the reason), ``missing: <what this checkout lacks>`` or ``error``.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from _gpu_context import FP32_TOLERANCE, Context, Deadline, compare, scores_of
from _gpu_files import handler_options, make_handler
from _gpu_nvml import cpu_model, gpu_identity, package_versions

__all__ = [
    "BF16_FLIP_LIMIT",
    "HOOKS",
    "OOM_BATCH",
    "OOM_LIMIT_BYTES",
    "bf16_phase",
    "environment_phase",
    "lease_phase",
    "oom_phase",
    "ort_phase",
    "reference_phase",
]

#: ModelHandler hooks of issue 23 the environment phase looks for.
HOOKS = ("pipeline_depth", "launch_prepared", "collect_prepared", "on_out_of_memory", "device_uuid")
#: Most label flips bf16 may cause, as a share of the rows compared.
BF16_FLIP_LIMIT = 1e-3
#: The forced OOM: one model batch of this many rows under this device memory limit.
OOM_BATCH = 8192
OOM_LIMIT_BYTES = 2**30
_UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
_UUID_B = "GPU-66666666-7777-8888-9999-000000000000"


def environment_phase(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """a. The GPU (NVML), torch/CUDA, CPU, package versions, the bundle, the hooks this checkout has."""
    import torch

    from pyflink_aisp.inference import ModelRuntime
    from pyflink_aisp.inference.handlers._torch import TorchSentimentHandler

    gpu: Any = "none (CPU dry run)"
    if ctx.on_gpu:
        gpu = gpu_identity(ctx.nv, ctx.torch_index) if ctx.nv else "NVML not available"
    manifest = ctx.bundle.manifest
    return {
        "status": "ok",
        "device": ctx.device,
        "gpu": gpu,
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "packages": package_versions(),
        "bundle": {
            "directory": str(ctx.bundle.directory),
            "total_bytes": ctx.bundle.total_bytes,
            "full_total_bytes": manifest["full_total_bytes"],
            "limit_bytes": manifest["limit_bytes"],
            "reference": manifest["reference"],
            "weights": manifest["model"]["weights_dtype"],
        },
        "handler_options": sorted(handler_options()),
        "hooks": {h: _hook_owner(TorchSentimentHandler, h) for h in HOOKS},
        "runtime_pipelined_api": hasattr(ModelRuntime, "infer_batch_pipelined"),
        "check_lease_device": _lease_check() is not None,
    }


def _hook_owner(cls: type, name: str) -> str:
    """The class of ``cls``'s MRO that defines ``name`` (``ModelHandler``: the default), or ``absent``."""
    owner = next((k.__name__ for k in cls.__mro__ if name in vars(k)), "absent")
    return "default (ModelHandler)" if owner == "ModelHandler" else owner


def _sample_texts(ctx: Context) -> list[str]:
    reviews = ctx.texts[: ctx.reviews] if len(ctx.texts) >= ctx.reviews else None
    if reviews is None:  # --texts cut the corpus: read the reviews again
        reviews, _ = ctx.bundle.reviews()
    return [reviews[i] for i in ctx.ref_indices]


def _score(
    ctx: Context, precision: str, batch: int, texts: list[str], deadline: Deadline, **options: Any
) -> npt.NDArray[np.float32]:
    """The handler's scores of ``texts`` (NaN for rows past the deadline), ``batch`` per call."""
    if not deadline.keep_going():
        return np.full(len(texts), np.nan, dtype=np.float32)
    handler, missing = make_handler(
        ctx.bundle, device=ctx.device, precision=precision, batch_size=batch, **options
    )
    if missing:
        raise RuntimeError(f"TorchSentimentHandler lacks {missing}")
    model = handler.load_model()
    try:
        scores = np.full(len(texts), np.nan, dtype=np.float32)
        for start in range(0, len(texts), batch):
            if not deadline.keep_going():
                break
            scores[start : start + batch] = scores_of(
                handler.run_inference(texts[start : start + batch], model)
            )
        return scores
    finally:
        handler.release_model(model)


def reference_phase(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """b. The handler (fp32) on the device against the bundled CPU reference: the whole sample, or its
    first ``--reference-rows``."""
    batch, rows = min(256, max(ctx.batches)), min(ctx.reference_rows, len(ctx.ref_scores))
    scores = _score(ctx, "fp32", batch, _sample_texts(ctx)[:rows], deadline)
    check = compare(scores, ctx.ref_scores[:rows])
    return {
        "status": "ok" if check["rows_compared"] == rows else "partial (deadline)",
        "device": ctx.device,
        "batch": batch,
        "rows_planned": rows,
        "sample_rows": len(ctx.ref_scores),
        "tolerance": FP32_TOLERANCE,
        **check,
    }


def bf16_phase(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """d. bf16 against fp32 over the corpus rows, chunk by chunk; only rows scored by both count."""
    batch = max(ctx.batches)
    fp32 = _score(ctx, "fp32", batch, ctx.texts, Deadline(time.perf_counter() + deadline.remaining() / 2))
    scored = int((~np.isnan(fp32)).sum())  # a prefix: bf16 scores only what fp32 scored
    bf16 = np.full(len(ctx.texts), np.nan, dtype=np.float32)
    bf16[:scored] = _score(ctx, "bf16", batch, ctx.texts[:scored], deadline)
    check = compare(bf16, fp32)
    both = ~(np.isnan(fp32) | np.isnan(bf16))
    labels = ctx.labels[both]
    from pyflink_aisp.inference.handlers._torch import PRECISION_TOLERANCE

    return {
        "status": "ok" if check["rows_compared"] == len(ctx.texts) else "partial (deadline)",
        "device": ctx.device,
        "batch": batch,
        "rows_planned": len(ctx.texts),
        **check,
        "tolerance": PRECISION_TOLERANCE,
        "flip_limit": BF16_FLIP_LIMIT,
        "accuracy_fp32": float(((fp32[both] >= 0.5) == labels).mean()) if both.any() else None,
        "accuracy_bf16": float(((bf16[both] >= 0.5) == labels).mean()) if both.any() else None,
    }


def _oom_texts(ctx: Context) -> tuple[list[str], npt.NDArray[np.float32]]:
    """:data:`OOM_BATCH` rows cycling over the sample's 64 longest reviews, and their reference scores."""
    sample = _sample_texts(ctx)
    longest = np.argsort([-len(t) for t in sample], kind="stable")[:64]
    rows = [int(longest[i % len(longest)]) for i in range(OOM_BATCH)]
    return [sample[i] for i in rows], ctx.ref_scores[rows]


def _through_limited_runtime(ctx: Context, texts: list[str], deadline: Deadline) -> dict[str, Any]:
    """``texts`` as one model batch through a runtime whose handler has the memory limit; the limit
    is lifted afterwards (it is process-wide)."""
    import torch

    from pyflink_aisp.inference import BatchCuts, BatchingConfig, ModelRuntime

    handler, _ = make_handler(
        ctx.bundle,
        device=ctx.device,
        precision="fp32",
        batch_size=OOM_BATCH,
        memory_limit_bytes=OOM_LIMIT_BYTES,
    )
    gc.collect()
    torch.cuda.empty_cache()  # earlier phases' cached blocks must not count against the limit
    torch.cuda.reset_peak_memory_stats(ctx.torch_index)
    runtime = ModelRuntime.acquire(
        handler, BatchingConfig(max_batch_size=OOM_BATCH, batch_cuts=BatchCuts.FIXED)
    )
    try:
        outcomes = runtime.submit_batch(texts).result(timeout=max(deadline.remaining(), 1.0))
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        stats = runtime.batcher.stats
        return {
            "scores": [float("nan") if isinstance(o, BaseException) else o.prediction[0] for o in outcomes],
            "oom_splits": stats.oom_splits,
            "model_batches": stats.batches,
            "rows": len(texts),
            "rows_scored": len(texts) - len(failed),
            "first_error": repr(failed[0])[:300] if failed else None,
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(ctx.torch_index)),
        }
    finally:
        runtime.release()
        torch.cuda.set_per_process_memory_fraction(1.0, ctx.torch_index)
        torch.cuda.empty_cache()


def oom_phase(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """e. One model batch of :data:`OOM_BATCH` long reviews under a :data:`OOM_LIMIT_BYTES` memory limit,
    through the runtime: every row must be scored (right) after out-of-memory splits (the acceptance
    reads ``rows_scored``, ``oom_splits`` and ``ref_max_abs_diff``)."""
    if not ctx.on_gpu:
        return {
            "status": "not applicable",
            "reason": "CPU dry run: the CPU has no device memory limit to exceed (memory_limit_bytes is "
            "CUDA-only), so no out-of-memory error can be forced honestly",
        }
    if "memory_limit_bytes" not in handler_options():
        return {"status": "missing: TorchSentimentHandler(memory_limit_bytes=)"}
    if not deadline.keep_going():
        return {"status": "skipped (deadline)"}
    texts, expected = _oom_texts(ctx)
    result = _through_limited_runtime(ctx, texts, deadline)
    check = compare(np.asarray(result.pop("scores"), dtype=np.float32), expected)
    return {
        "status": "ok",
        "limit_bytes": OOM_LIMIT_BYTES,
        "batch": OOM_BATCH,
        **result,
        **{f"ref_{k}": v for k, v in check.items()},
        "tolerance": FP32_TOLERANCE,
    }


def _lease_check() -> Any:
    import pyflink_aisp.affinity as affinity

    return getattr(affinity, "check_lease_device", None)


def _lease(uuid: str) -> Any:
    """A GPU lease on ``uuid`` (a whole GPU, not MIG)."""
    from pyflink_aisp.affinity import Lease, LeaseKind, LeaseState

    now = time.time()
    return Lease(
        id="gpu-check",
        job="gpu-check",
        operator="score",
        subtask=0,
        host="",
        kind=LeaseKind.GPU,
        device=uuid,
        gpu_uuid=uuid,
        gpu_index=0,
        mig=False,
        numa_node=None,
        cpus=(),
        mem_bytes=0,
        ttl_s=60.0,
        acquired_at=now,
        expires_at=now + 60.0,
        released_at=None,
        state=LeaseState.ACTIVE,
        reason="gpu_check",
    )


def _refuses(check: Any, lease: Any, device_uuid: str | None) -> bool | str:
    """True: AffinityError; False: accepted; else the unexpected error's text."""
    from pyflink_aisp.errors import AffinityError

    try:
        check(lease, device_uuid)
    except AffinityError:
        return True
    except Exception as exc:  # the wrong error type is a finding, not a pass
        return f"{type(exc).__name__}: {exc}"
    return False


def lease_phase(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """f. ``check_lease_device``: the pure rule on made-up uuids, then (GPU) the handler's
    ``device_uuid(model)`` against NVML's uuid of the device and a lease on another uuid."""
    check = _lease_check()
    if not deadline.keep_going():
        return {"status": "skipped (deadline)"}
    if check is None:
        return {"status": "missing: pyflink_aisp.affinity.check_lease_device(lease, device_uuid)"}
    pure = {
        "match_refused": _refuses(check, _lease(_UUID_A), _UUID_A),
        "mismatch_refused": _refuses(check, _lease(_UUID_A), _UUID_B),
        "cpu_model_refused": _refuses(check, _lease(_UUID_A), None),
    }
    handler, _ = make_handler(ctx.bundle, device=ctx.device, precision="fp32", batch_size=32)
    hook = getattr(handler, "device_uuid", None)
    if hook is None:
        return {"status": "missing: TorchSentimentHandler.device_uuid", "pure": pure}
    model = handler.load_model()
    try:
        device_uuid = hook(model)
    finally:
        handler.release_model(model)
    out: dict[str, Any] = {"status": "ok", "pure": pure, "device_uuid": device_uuid}
    if not ctx.on_gpu:
        return out | {"device_check": "not applicable (CPU dry run: no device uuid)"}
    nvml_uuid = gpu_identity(ctx.nv, ctx.torch_index)["nvml_uuid"] if ctx.nv else None
    other = (nvml_uuid or _UUID_A)[:-1] + ("0" if (nvml_uuid or "x")[-1] != "0" else "1")
    return out | {
        "nvml_uuid": nvml_uuid,
        "uuids_equal": device_uuid == nvml_uuid,
        "own_lease_refused": _refuses(check, _lease(nvml_uuid or _UUID_A), device_uuid),
        "other_uuid": other,
        "other_lease_refused": _refuses(check, _lease(other), device_uuid),
    }


def ort_phase(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """g. ONNX Runtime CUDA rows: not measured here (no CUDA EP on the GPU host; no ONNX encoder carried)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {"status": "not measured", "reason": "onnxruntime is not installed"}
    providers = list(ort.get_available_providers())
    if "CUDAExecutionProvider" not in providers:
        reason = f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (providers: {providers})"
    else:
        reason = (
            "the bundle carries no ONNX encoder (the float32 model.onnx is ~91 MB, over the "
            "60 MiB a device run may take)"
        )
    return {
        "status": "not measured",
        "reason": reason,
        "onnxruntime": ort.__version__,
        "providers": providers,
    }
