"""Where the model's own time goes inside the job against the plain loop: ONNX Runtime's profiler, one run.

Not a test. Issue 24's co-location diagnosis at the level of the model's kernels, side by side in one
run on one machine (CPU model printed):

- **plain alone**: ``OnnxSentimentModel.predict`` over the reviews (batches of ``--batch-size`` sorted by
  length) with the machine to itself, its session profiled (``OrtProfiling``);
- **job**: ``jobs/review_sentiment.py`` (STREAMING, exactly-once, the defaults plus ``--job-args``) over
  the same reviews ``--repeat`` times, preloaded, beside the bench broker, with ``--onnx-profile-dir``;
  only the runs that start ``--skip-s`` after the worker's session opened count (the JVMs' JIT
  compilers are busy in a job's first minute).

For each: the model's wall time and kernel time per padded token, and the share of the kernel time the
calling thread waited for its intra-op helper threads (``thread_scheduling_stats``: the straggler time
of parallel kernels), overall and for the op types that take the most time (``_ort_profile``). If the
job's kernels are slower per token and the wait share grew, helpers preempted by the JVMs' threads
explain the slowdown; if the share stayed and every kernel is slower alike, the cause is elsewhere
(caches, frequency, the CPU's own share). The job's padded batches differ from the plain loop's (its
model batches are cut from Arrow batches in arrival order), so per-token numbers, not per-run ones, are
compared.

Usage::

    .venv/bin/python bench/ort_profile_bench.py [--reviews 12808] [--repeat 3] [--skip-s 60]
        [--job-args "--onnx-spin-wait false"] [--out bench/ort_profile.json] [--report bench/ORT_PROFILE.md]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import _report
from _job_runner import JobSettings
from _kafka_streaming import throughput_run
from _ort_profile import largest_profile, read_runs, summarize

ROOT = Path(__file__).resolve().parent.parent


def plain_profiled(assets: Any, texts: list[str], threads: int, batch_size: int, directory: Path,
                   ) -> dict[str, Any]:
    """The plain loop alone over ``texts`` with its session profiled; records/s and the profile's summary
    (its first two runs, the warm-up call's, left out)."""
    from pyflink_aisp.inference.handlers import OnnxSentimentModel, OrtProfiling

    model = OnnxSentimentModel(assets, intra_op_num_threads=threads, batch_size=batch_size,
                               profiling=OrtProfiling(directory=directory, runs=10**9))
    model.predict(texts[:2 * batch_size])
    wall = time.perf_counter()
    model.predict(texts)
    wall = time.perf_counter() - wall
    model.close()
    return {"records_per_s": len(texts) / wall, "profile": summarize(read_runs(largest_profile(directory)),
                                                                     skip=2)}


def render(res: dict[str, Any]) -> str:
    """The markdown report of a run's results."""
    plain, job = res["plain"]["profile"], res["job"]["profile"]
    lines = ["# The model's kernels inside the job against the plain loop (`bench/ort_profile_bench.py`)", "",
             f"Machine: {res['machine']}.", "",
             f"{res['reviews']:,} reviews; intra-op threads {res['threads']}; plain loop batches of "
             f"{res['batch_size']} sorted by length, {res['plain']['records_per_s']:.1f} records/s alone "
             f"(profiled). The job (`{res['job']['command']}`) over them {res['repeat']} times, "
             f"{res['job']['records_per_s']:.1f} records/s (profiled); its runs from {res['skip_s']:g} s "
             "after its session opened. Per padded token (batch x sequence), µs; wait: the share of the "
             "kernels' time the calling thread waited for its intra-op helper threads.", "",
             "| | runs | wall per token | kernels per token | wait |", "|---|---|---|---|---|"]
    for name, p in (("plain loop alone", plain), ("the job", job)):
        lines.append(f"| {name} | {p['runs']} | {p['wall_us_per_token']:.3f} | "
                     f"{p['kernel_us_per_token']:.3f} | {100 * p['wait_share']:.1f}% |")
    lines += ["", "By op type (the plain loop's largest; share of kernel time, wait share, µs per token):",
              "", "| op | plain | the job |", "|---|---|---|"]
    for op, p in plain["ops"].items():
        j = job["ops"].get(op)
        cell = "" if j is None else (f"{100 * j['kernel_share']:.1f}%, {100 * j['wait_share']:.1f}%, "
                                     f"{j['us_per_token']:.3f}")
        lines.append(f"| {op} | {100 * p['kernel_share']:.1f}%, {100 * p['wait_share']:.1f}%, "
                     f"{p['us_per_token']:.3f} | {cell} |")
    ratio = job["kernel_us_per_token"] / plain["kernel_us_per_token"] if plain["kernel_us_per_token"] else 0.0
    lines += ["", f"The job's kernels took {ratio:.2f}x the plain loop's time per token; the wait share went "
                  f"from {100 * plain['wait_share']:.1f}% to {100 * job['wait_share']:.1f}%.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reviews", type=int, default=12_808)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--skip-s", type=float, default=60.0)
    p.add_argument("--profile-runs", type=int, default=0,
                   help="--onnx-profile-runs of the job (0: nine tenths of reviews x repeat / batch size, "
                        "so that the worker ends its profile, and writes it, before the job is stopped)")
    p.add_argument("--job-args", default="", help="more job flags, space-separated")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "ort_profile.json")
    p.add_argument("--report", type=Path, default=None)
    p.add_argument("--render", action="store_true", help="only write --report from --out's results")
    a = p.parse_args(argv)
    if _report.render_only(p, a, render):
        return 0

    from _kafka_load import bench_broker

    assets, texts = _report.model_and_reviews(a.reviews)
    res: dict[str, Any] = {"machine": _report.machine(), "reviews": len(texts), "repeat": a.repeat,
                           "threads": a.threads, "batch_size": a.batch_size, "skip_s": a.skip_s}
    print(json.dumps(res["machine"]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="aisp-ort-profile-"))
    try:
        res["plain"] = plain_profiled(assets, texts, a.threads, a.batch_size, work / "plain")
        print(f"[plain alone] {res['plain']}", flush=True)
        with bench_broker() as bootstrap:
            runs = a.profile_runs or max(1, int(0.9 * len(texts) * a.repeat / a.batch_size))
            extra = ("--onnx-profile-dir", str(work / "job"), "--onnx-profile-runs", str(runs),
                     *a.job_args.split())
            settings = JobSettings(bootstrap=bootstrap, model_dir=assets.directory,
                                   intra_op_threads=a.threads, checkpoint_interval_ms=5000, extra=extra)
            run = throughput_run(bootstrap, texts * a.repeat, settings, log_dir=work / "logs", tag="profiled")
        profile = summarize(read_runs(largest_profile(work / "job")), after_s=a.skip_s)
        res["job"] = {"records_per_s": run["records_per_s"], "command": run["command"], "profile": profile}
        print(f"[job] {res['job']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a.out.write_text(json.dumps(res, indent=1))
    text = render(res)
    print(text)
    if a.report is not None:
        a.report.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
