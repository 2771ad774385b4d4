"""GPU check of issue 23: the sentiment model's device path on a lent GPU host, from a ≤ 60 MiB bundle.

Not a test; called by ``bench/gpu_check.sh`` (usage there). Two commands:

``bundle`` (here, where the package, its model and data packages are installed): builds the file
set the GPU host needs (:mod:`_gpu_bundle`: float16 weights, config, tokenizer, the head, the 12,808
reviews, CPU reference scores, a manifest) and prints its size; refused over 60 MiB.

``run`` (on the GPU host: Python, torch, transformers, tokenizers, numpy, nvidia-ml-py; no PyFlink,
Java, Kafka client or network): with an import guard (:mod:`_gpu_guard`) that refuses anything but
the PyFlink-free package parts, the phases a-g (:mod:`_gpu_phases`, :mod:`_gpu_throughput`), each
under its own deadline, results rewritten into ``--out`` (``gpu_check.json``, ``gpu_check.md``)
after every phase (and every throughput cell). ``--cpu-only`` is the small dry run CI runs
(tests/unit/bench/test_gpu_check.py); its numbers are labelled CPU and never fill a GPU row.

Exit status of ``run``: 0 no acceptance row failed; 1 a row failed or the bundle is unusable; 2 CUDA
is not usable (nothing is timed on the CPU instead: use ``--cpu-only`` for the dry run).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import traceback
from pathlib import Path
from typing import Any

EXIT_NO_CUDA = 2
#: Phase keys in the order they run (the OOM phase last: it limits the device's memory), with the
#: share of the remaining time each one gets.
ORDER = {
    "environment": 0.03,
    "reference": 0.08,
    "throughput": 0.55,
    "bf16": 0.14,
    "lease": 0.03,
    "ort": 0.01,
    "oom": 0.16,
}
_GPU_DEFAULTS = {
    "texts": None,
    "batch_sizes": "32,256,1024",
    "warmup_texts": 8192,
    "arrow_batch": 8192,
    "reference_rows": 2048,
    "deadline_s": 480.0,
}
_CPU_DEFAULTS = {
    "texts": 64,
    "batch_sizes": "16,32",
    "warmup_texts": 32,
    "arrow_batch": 64,
    "reference_rows": 64,
    "deadline_s": 600.0,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """``bundle`` or ``run`` and their options (``run``'s defaults depend on ``--cpu-only``)."""
    p = argparse.ArgumentParser(prog="bench/gpu_check.sh", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bundle", help="build the file set for the GPU host (here)")
    b.add_argument("--out", type=Path, default=Path(".aisp/gpu-bundle"), help="bundle folder (replaced)")
    b.add_argument(
        "--assets", type=Path, default=None, help="model assets folder (default: the cached build)"
    )
    b.add_argument("--sample", type=int, default=2048, help="reviews with a CPU reference score")
    b.add_argument("--check-rows", type=int, default=None, help="sample rows the handler is checked on (all)")
    b.add_argument("--rounding-rows", type=int, default=256, help="sample rows scored with fp32 weights too")
    r = sub.add_parser("run", help="run the check (on the GPU host; --cpu-only: the dry run)")
    r.add_argument("--bundle", type=Path, required=True, help="bundle folder")
    r.add_argument("--out", type=Path, required=True, help="results folder (gpu_check.json, gpu_check.md)")
    r.add_argument("--cpu-only", action="store_true", help="the small CPU dry run (CI)")
    r.add_argument("--texts", type=int, default=None, help="corpus rows (GPU: all 51,232; CPU: 64)")
    r.add_argument("--deadline-s", type=float, default=None, help="whole run's deadline (GPU 480, CPU 600)")
    r.add_argument("--batch-sizes", default=None, help="throughput batch sizes (GPU 32,256,1024; CPU 16,32)")
    r.add_argument("--precisions", default="fp32,bf16", help="throughput precisions")
    r.add_argument(
        "--warmup-texts", type=int, default=None, help="rows of the untimed pass (GPU 8192; CPU 32)"
    )
    r.add_argument(
        "--arrow-batch", type=int, default=None, help="rows per Arrow batch to the runtime (GPU 8192)"
    )
    r.add_argument(
        "--reference-rows", type=int, default=None, help="sample rows compared in phase b (GPU 2048; CPU 64)"
    )
    r.add_argument("--device-id", type=int, default=0, help="CUDA device index")
    args = p.parse_args(argv)
    if args.command == "run":
        for key, value in (_CPU_DEFAULTS if args.cpu_only else _GPU_DEFAULTS).items():
            if getattr(args, key) is None:
                setattr(args, key, value)
        args.batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
        args.precisions = [x.strip() for x in args.precisions.split(",") if x.strip()]
        if not args.batch_sizes or min(args.batch_sizes) < 1 or (args.texts is not None and args.texts < 1):
            p.error("--batch-sizes and --texts must be >= 1")
        if set(args.precisions) - {"fp32", "bf16"}:
            p.error("--precisions takes fp32 and/or bf16")
    return args


def bundle_main(args: argparse.Namespace) -> int:
    """Build the bundle and print its size (exit 1 when refused or failed)."""
    from _gpu_bundle import build_bundle, size_line, tree_bytes

    try:
        manifest = build_bundle(
            args.out,
            assets_dir=args.assets,
            sample=args.sample,
            check_rows=args.check_rows,
            rounding_rows=args.rounding_rows,
        )
    except ValueError as exc:
        print(f"gpu_check bundle: refused: {exc}", file=sys.stderr)
        return 1
    for name, entry in manifest["files"].items():
        print(f"  {name:28s} {entry['bytes']:>12,} bytes  sha256 {entry['sha256'][:16]}")
    ref = manifest["reference"]
    print(
        f"reference: {ref['rows']:,} reviews ({ref['selection']}); handler check max |Δ| "
        f"{ref['handler_check']['max_abs_diff']:.2e} on {ref['handler_check']['rows']} rows; fp16 weights vs "
        f"fp32 weights max |Δscore| {ref['fp16_weights_vs_fp32_weights']['max_abs_diff']:.2e} on "
        f"{ref['fp16_weights_vs_fp32_weights']['rows']} rows"
    )
    print(size_line(manifest, tree_bytes(Path.cwd())))
    print(f"built {args.out} in {manifest['build_seconds']} s")
    return 0


def _context(args: argparse.Namespace, device: str) -> Any:
    """Open (verify) the bundle and build the run's :class:`~_gpu_context.Context`."""
    import numpy as np
    from _gpu_context import Context
    from _gpu_files import open_bundle
    from _gpu_nvml import nvml

    bundle = open_bundle(args.bundle)
    reviews, labels = bundle.reviews()
    copies = int(bundle.manifest["texts"]["copies"])
    rows = len(reviews) * copies if args.texts is None else args.texts
    indices, scores = bundle.reference()
    return Context(
        bundle=bundle,
        device=device,
        texts=[reviews[i % len(reviews)] for i in range(rows)],
        labels=labels[np.arange(rows) % len(reviews)],
        reviews=len(reviews),
        ref_indices=indices,
        ref_scores=scores,
        batches=args.batch_sizes,
        precisions=args.precisions,
        warmup_texts=min(args.warmup_texts, rows),
        arrow_batch=args.arrow_batch,
        reference_rows=args.reference_rows,
        nv=None if device == "cpu" else nvml(),
    )


def _phase_fn(key: str) -> Any:
    import _gpu_phases as phases
    from _gpu_throughput import throughput_phase

    return {
        "environment": phases.environment_phase,
        "reference": phases.reference_phase,
        "throughput": throughput_phase,
        "bf16": phases.bf16_phase,
        "lease": phases.lease_phase,
        "ort": phases.ort_phase,
        "oom": phases.oom_phase,
    }[key]


def _run_phases(ctx: Any, results: dict[str, Any], out: Path, end: float) -> None:
    from _gpu_context import Deadline
    from _gpu_report import PHASES, write_results

    keys = list(ORDER)
    for i, key in enumerate(keys):
        share = ORDER[key] / sum(ORDER[k] for k in keys[i:])
        deadline = Deadline.after(max(end - time.perf_counter(), 0.0) * share, cap=end)
        budget, start = deadline.remaining(), time.perf_counter()

        def on_cell(rows: list[dict[str, Any]], key: str = key) -> None:
            results["phases"][key] = {
                "status": "running",
                "rows": rows,
                "texts": len(ctx.texts),
                "warmup_texts": ctx.warmup_texts,
                "arrow_batch": ctx.arrow_batch,
            }
            write_results(results, out)

        try:
            fn = _phase_fn(key)
            data = fn(ctx, deadline, on_cell) if key == "throughput" else fn(ctx, deadline)
        except Exception as exc:  # one phase's failure is reported; the later phases still run
            data = {
                "status": f"error: {type(exc).__name__}: {str(exc)[:400]}",
                "traceback": traceback.format_exc(limit=6)[-2000:],
            }
        data |= {"seconds": round(time.perf_counter() - start, 2), "budget_s": round(max(budget, 0.0), 1)}
        results["phases"][key] = data
        write_results(results, out)
        print(
            f"phase {PHASES[key]}: {data['status']} ({data['seconds']} s of {data['budget_s']} s)", flush=True
        )


def run_main(args: argparse.Namespace) -> int:
    """The check (see the module docstring); the import guard is installed before the package loads."""
    from _gpu_guard import install

    guard = install()
    start = time.perf_counter()
    import torch

    device = "cpu" if args.cpu_only else f"cuda:{args.device_id}"
    if not args.cpu_only and not (torch.cuda.is_available() and args.device_id < torch.cuda.device_count()):
        print(
            f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no {device}; "
            "nothing is timed (CPU numbers are never GPU numbers): use --cpu-only for the dry run",
            file=sys.stderr,
        )
        return EXIT_NO_CUDA
    from _gpu_report import render, write_results

    try:
        ctx = _context(args, device)
    except ValueError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 1
    results: dict[str, Any] = {
        "check": "bench/gpu_check.sh run",
        "mode": "cpu-only" if args.cpu_only else "gpu",
        "device": device,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "bash bench/gpu_check.sh " + " ".join(sys.argv[1:]),
        "deadline_s": args.deadline_s,
        "phases": {},
        "import_guard": {"refused": guard.refused},
        "finished": False,
    }
    _run_phases(ctx, results, args.out, start + args.deadline_s)
    results["finished"] = True
    write_results(results, args.out)
    report = render(results)
    print(report[: report.find("\n## a.")])
    print(f"results: {args.out / 'gpu_check.json'}, {args.out / 'gpu_check.md'}")
    return 1 if any(r["status"] == "fail" for r in results["acceptance"]) else 0


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``bundle`` / ``run``."""
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    return bundle_main(args) if args.command == "bundle" else run_main(args)


if __name__ == "__main__":
    sys.exit(main())
