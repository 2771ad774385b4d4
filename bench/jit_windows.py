"""A latency case in time windows: end-to-end p50 / p99 beside the cores the JVMs' JIT compilers took.

Not a test. Reads what ``latency_bench.py --series-dir DIR`` keeps of a case: ``DIR/<case>.json``
(per record: the input's broker time ``t_in_ms`` and each stage, ms) and ``DIR/<case>-cpu.json``
(per second: cumulative CPU seconds per process role and of each JVM role's JIT compiler threads,
``_cpu.jit_series``). Each window of ``--window-s`` of input time gets the p50 / p99 of its
records' end-to-end time, the model's p50 (``inference``), and the cores busy in the Flink JVM's
and the broker JVM's compiler threads; so a run of a few minutes shows when a job leaves its JIT
warm-up (HotSpot compiles hot methods with C1, then C2, in background compiler threads: HotSpot's
tiered compilation, the levels described in its ``compilationPolicy.hpp``).

Usage::

    .venv/bin/python bench/latency_bench.py --cases load-recordp2 --warmup-seconds 0 --load-seconds 160 \\
        --series-dir /tmp/series --out /tmp/lat.json --report /tmp/LAT.md
    .venv/bin/python bench/jit_windows.py /tmp/series/0-load-recordp2.json [--window-s 10] [--out w.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

ROLES = ("Flink JVM", "broker JVM")


def _cores(cpu: list[list[Any]], lo_s: float, hi_s: float, key: str) -> float:
    """Cores busy under ``key`` between the first sample at or after ``lo_s`` and the last before ``hi_s``."""
    inside = [(t, row) for t, row in cpu if lo_s <= t <= hi_s]
    if len(inside) < 2:
        return float("nan")
    (t0, a), (t1, b) = inside[0], inside[-1]
    return (b.get(key, 0.0) - a.get(key, 0.0)) / (t1 - t0)


def windows(series: dict[str, list[float]], cpu: list[list[Any]], window_s: float) -> list[dict[str, float]]:
    """One row per window of input time from the first measured record: ``end_s`` (its end, s from
    the first record), ``records``, ``p50_ms`` / ``p99_ms`` end to end, ``inference_p50_ms``, and
    ``jit_cores`` per JVM role (NaN without two CPU samples inside)."""
    t_in = np.asarray(series["t_in_ms"], dtype=np.float64)
    total = np.asarray(series["total"], dtype=np.float64)
    inference = np.asarray(series["inference"], dtype=np.float64)
    if t_in.size == 0:
        return []
    t0 = float(t_in.min())
    rows = []
    for k in range(int((t_in.max() - t0) // (window_s * 1000)) + 1):
        lo = t0 + k * window_s * 1000
        inside = (t_in >= lo) & (t_in < lo + window_s * 1000)
        if not inside.any():
            continue
        rows.append({"end_s": (k + 1) * window_s, "records": int(inside.sum()),
                     "p50_ms": float(np.percentile(total[inside], 50)),
                     "p99_ms": float(np.percentile(total[inside], 99)),
                     "inference_p50_ms": float(np.median(inference[inside])),
                     **{f"jit_cores_{role}": _cores(cpu, lo / 1000, lo / 1000 + window_s, f"{role}|JIT")
                        for role in ROLES}})
    return rows


def render(rows: list[dict[str, float]], name: str) -> str:
    """A markdown table of :func:`windows`' rows."""
    lines = [f"{name}, by window of input time (end to end p50 / p99 ms; cores busy in JIT compiler "
             "threads):",
             "", "| window ends (s) | records | p50 / p99 | inference p50 | Flink JVM JIT | broker JVM JIT |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['end_s']:g} | {r['records']} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} | "
              f"{r['inference_p50_ms']:.1f} | {r['jit_cores_Flink JVM']:.2f} | "
              f"{r['jit_cores_broker JVM']:.2f} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("series", type=Path, help="a case's DIR/<case>.json from latency_bench.py --series-dir")
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    a = p.parse_args()
    series = json.loads(a.series.read_text(encoding="utf-8"))
    cpu = json.loads(a.series.with_name(f"{a.series.stem}-cpu.json").read_text(encoding="utf-8"))
    rows = windows(series, cpu, a.window_s)
    if a.out is not None:
        a.out.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(render(rows, a.series.stem))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
