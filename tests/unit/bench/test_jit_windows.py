"""bench/jit_windows.py: a latency case cut into windows beside its JVMs' JIT compiler cores."""

from __future__ import annotations

import math

import pytest


def test_each_window_gets_its_records_percentiles_and_the_compiler_cores(bench_module) -> None:
    jw = bench_module("jit_windows")
    t0 = 1_000_000.0  # one record every 100 ms for 20 s: slow (100 ms) in the first 10 s, then 20 ms
    t_in = [t0 + 100.0 * i for i in range(200)]
    series = {"t_in_ms": t_in, "total": [100.0 if i < 100 else 20.0 for i in range(200)],
              "inference": [30.0 if i < 100 else 10.0 for i in range(200)]}
    # per second: the Flink JVM's compilers at half a core for 10 s, then idle; the broker's idle
    cpu = [[t0 / 1000 + s, {"Flink JVM|JIT": 0.5 * min(s, 10), "Flink JVM": 1.0 * s,
                            "broker JVM|JIT": 0.0}] for s in range(21)]
    rows = jw.windows(series, cpu, 10.0)
    assert [(r["end_s"], r["records"], r["p50_ms"], r["p99_ms"], r["inference_p50_ms"]) for r in rows] == [
        (10.0, 100, 100.0, 100.0, 30.0), (20.0, 100, 20.0, 20.0, 10.0)]
    assert rows[0]["jit_cores_Flink JVM"] == pytest.approx(0.5)
    assert rows[1]["jit_cores_Flink JVM"] == pytest.approx(0.0)
    assert rows[0]["jit_cores_broker JVM"] == 0.0
    assert math.isnan(jw.windows(series, cpu[:1], 10.0)[0]["jit_cores_Flink JVM"])
    assert "| 10 | 100 | 100.0 / 100.0 | 30.0 | 0.50 | 0.00 |" in jw.render(rows, "case")
    assert jw.windows({"t_in_ms": [], "total": [], "inference": []}, cpu, 10.0) == []
