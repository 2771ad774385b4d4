"""Read ONNX Runtime profiles (``--onnx-profile-dir``, ``OrtProfiling``) into per-run and per-op numbers.

An ORT profile is a Chrome-trace JSON list. Each ``session.run`` is a ``Session`` event named
``model_run`` (``ts`` and ``dur`` in µs from the profiler's start, ``tid`` the calling thread); each
kernel inside it a ``Node`` event on the same thread whose ``args`` hold ``op_name``,
``input_type_shape`` and, on the CPU, ``thread_scheduling_stats.main_thread`` with ``Run`` (the calling
thread's own share of a parallel kernel), ``Wait`` (waiting for the intra-op helper threads to finish
theirs) and ``Distribution`` (handing the work out), in µs (``ThreadPoolProfiler``, onnxruntime
``threadpool.h``).

A kernel's ``Wait`` is the straggler time: the calling thread done, a helper not. On a machine where
other processes' threads (the JVMs') are runnable, a preempted helper makes it grow, and the share of
the model's kernel time spent in it tells how much of a slowdown is that effect.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunStat:
    """One ``session.run``: its start (s from the profiler's start), wall µs, padded tokens
    (batch x sequence of the int64 model input) and per op type ``[kernel µs, run µs, wait µs]``."""

    start_s: float
    wall_us: float
    tokens: int
    ops: dict[str, list[float]] = field(default_factory=dict)


def _tokens(args: dict[str, Any]) -> int:
    for shape in args.get("input_type_shape", []):
        dims = shape.get("int64")
        if dims is not None and len(dims) == 2:
            return int(dims[0]) * int(dims[1])
    return 0


def read_runs(path: Path) -> list[RunStat]:
    """The runs of one profile file, in start order, each with its kernels' times by op type."""
    events = json.loads(path.read_text(encoding="utf-8"))
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    by_tid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            by_tid[e["tid"]].append(e)
    for nodes in by_tid.values():
        nodes.sort(key=lambda e: e["ts"])
    out = []
    for run in runs:
        start, end = run["ts"], run["ts"] + run["dur"]
        stat = RunStat(start_s=start / 1e6, wall_us=float(run["dur"]), tokens=0)
        for node in by_tid.get(run["tid"], []):
            if node["ts"] < start:
                continue
            if node["ts"] > end:
                break
            args = node.get("args", {})
            if not stat.tokens:
                stat.tokens = _tokens(args)
            main = args.get("thread_scheduling_stats", {}).get("main_thread", {})
            row = stat.ops.setdefault(args.get("op_name", "?"), [0.0, 0.0, 0.0])
            row[0] += node["dur"]
            row[1] += main.get("Run", 0)
            row[2] += main.get("Wait", 0)
        out.append(stat)
    return out


def summarize(runs: list[RunStat], *, after_s: float = 0.0, skip: int = 0, top: int = 6) -> dict[str, Any]:
    """Totals over the runs that start ``after_s`` or later, less the first ``skip`` of them.

    Returns:
        ``runs``, ``tokens`` (padded), ``wall_us_per_token`` (run wall time), ``kernel_us_per_token``,
        ``wait_share`` (the calling thread's wait for helper threads / kernel time), and ``ops``: the
        ``top`` op types by kernel time, each ``kernel_share`` (of all kernel time), ``wait_share``
        (its own) and ``us_per_token``.
    """
    kept = [r for r in runs if r.start_s >= after_s][skip:]
    tokens = sum(r.tokens for r in kept)
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in kept:
        for name, (kernel, run, wait) in r.ops.items():
            row = ops[name]
            row[0] += kernel
            row[1] += run
            row[2] += wait
    kernel = sum(v[0] for v in ops.values())
    wait = sum(v[2] for v in ops.values())
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "runs": len(kept), "tokens": tokens,
        "wall_us_per_token": sum(r.wall_us for r in kept) / tokens if tokens else 0.0,
        "kernel_us_per_token": kernel / tokens if tokens else 0.0,
        "wait_share": wait / kernel if kernel else 0.0,
        "ops": {name: {"kernel_share": v[0] / kernel if kernel else 0.0,
                       "wait_share": v[2] / v[0] if v[0] else 0.0,
                       "us_per_token": v[0] / tokens if tokens else 0.0} for name, v in ranked},
    }


def largest_profile(directory: Path) -> Path:
    """The profile in ``directory`` with the most runs (a job's start-up probe writes a small one).

    Raises:
        FileNotFoundError: No profile there.
    """
    files = sorted(directory.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no ONNX Runtime profile in {directory}")
    return max(files, key=lambda p: p.stat().st_size)
