"""bench/colocation_bench's diagnosis: each job's core-time per record beyond the plain loop's, split by
role so that the parts add up, the sampler's CPU per second as a probe of the machine's speed, and the
traced worker's wall time beside the plain loop's (issue 24)."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def coloc(bench_module) -> ModuleType:
    return bench_module("colocation_bench")


def _run() -> dict:
    # 2 cores, the plain loop alone 200 records/s at 9.8 CPU-ms per record: 10.0 core-ms, 0.2 idle.
    # The job: 160 records/s with 1.9 cores busy, whose roles add up to 1.9 * 1000 / 160 = 11.875 ms.
    by_role = {"job client + Python worker": 10.5, "Flink JVM": 0.4, "broker JVM": 0.3, "bench": 0.0,
               "sampler": 0.1, "other": 0.575}
    return {"machine": "AMD EPYC, 2 cores, 24 GiB, Linux", "reviews": 1000, "threads": 2,
            "plain_batch_size": 32,
            "plain_before": {"records_per_s": 190.0, "cpu_ms_per_record": 9.7},
            "plain_after": {"records_per_s": 210.0, "cpu_ms_per_record": 9.9},
            "jobs": {"default #1": {
                "records_per_s": 160.0, "cores_busy": 1.9, "cpu_ms_per_record_by_role": by_role,
                "worker_time_ms_per_record": {"batches": 20, "records_per_batch": 50.0, "decode": 0.02,
                                              "inference": 5.5, "render": 0.01, "gap": 0.3}},
                     "failed #1": {"error": "RuntimeError: boom"}}}


def test_the_excess_over_the_plain_loop_splits_into_parts_that_add_up(coloc) -> None:
    lines = coloc.diagnosis(_run())
    assert "the plain loop alone 10.00 (its CPU 9.80, idle 0.20)" in lines[0]
    header = next(line for line in lines if line.startswith("| job |"))
    assert "| Flink JVM | broker JVM | bench | sampler | other |" in header
    row = next(line for line in lines if line.startswith("| default #1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["12.50", "+2.50"]  # 2 * 1000 / 160, minus the plain loop's 10.00
    parts = [float(c) for c in cells[3:]]
    # the worker beyond the plain loop's 9.80, Flink, broker, bench, sampler; other; idle beyond 0.20
    assert parts[:5] == [0.70, 0.40, 0.30, 0.00, 0.10]
    assert parts[5:] == [pytest.approx(0.575, abs=0.006), pytest.approx(0.425, abs=0.006)]
    assert sum(parts) == pytest.approx(2.50, abs=0.011)  # rounded to 2 places each
    assert not any(line.startswith("| failed #1") for line in lines)  # a failed run has no row
    assert lines[-1].endswith("default #1 16.0 ms/s.")  # 0.1 ms per record at 160 records/s


def test_the_report_has_the_traced_worker_beside_the_plain_loop(coloc) -> None:
    report = coloc.render(_run())
    assert "The plain loop alone: 5.00 ms per record, all of it inference." in report
    assert "| default #1 | 20 | 50 | 0.02 | 5.50 | 0.01 | 0.30 | 5.83 |" in report
    assert "| failed #1 | RuntimeError: boom |" in report


def test_the_core_count_comes_from_the_run_not_this_machine(coloc) -> None:
    assert coloc._cores({"machine": "Intel Xeon, 8 cores, 30 GiB"}) == 8
    assert coloc._cores({"cores": 4, "machine": "x"}) == 4
    with pytest.raises(ValueError, match="no core count"):
        coloc._cores({"machine": "unknown"})
