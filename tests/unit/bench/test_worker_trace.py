"""bench/_worker_trace.worker_time: the Python worker's wall time per record from the Arrow operator's
per-batch trace, split into decode, inference, render and the gaps between batches (issue 24)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _write(path: Path, batches: list[tuple[float, float, float, float, int]]) -> None:
    start = 0
    with path.open("w", encoding="utf-8") as f:
        for enter, decoded, inferred, exit_, n in batches:
            ids = [f"r{start + i}" for i in range(n)]
            start += n
            f.write(json.dumps({"enter_ms": enter, "decoded_ms": decoded, "inferred_ms": inferred,
                                "exit_ms": exit_, "ids": ids}) + "\n")


def test_the_busiest_file_is_split_per_record_and_the_parts_add_up(bench_module, tmp_path) -> None:
    trace = bench_module("_worker_trace")
    # the start-up probe's worker: one small batch, another file
    _write(tmp_path / "aisp-latency-11-0.jsonl", [(0.0, 1.0, 5.0, 6.0, 4)])
    # the measured run, written out of order: batch 2 ends at 2,100 after a 100 ms gap
    _write(tmp_path / "aisp-latency-22-0.jsonl",
           [(1100.0, 1110.0, 2060.0, 2100.0, 100), (1000.0, 1010.0, 1090.0, 1000.0 + 100.0 - 10.0, 100)])
    got = trace.worker_time(tmp_path)
    assert got["records"] == 200 and got["batches"] == 2 and got["records_per_batch"] == 100
    assert got["span_s"] == pytest.approx(1.1)
    assert got["decode"] == pytest.approx(20.0 / 200)
    assert got["inference"] == pytest.approx((950.0 + 80.0) / 200)
    assert got["render"] == pytest.approx((40.0 + 0.0) / 200)
    assert got["gap"] == pytest.approx(10.0 / 200)  # 1,090 → 1,100
    assert sum(got[k] for k in ("decode", "inference", "render", "gap")) * 200 == pytest.approx(1100.0)


def test_no_trace_file_is_an_error(bench_module, tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no aisp-latency"):
        bench_module("_worker_trace").worker_time(tmp_path)
