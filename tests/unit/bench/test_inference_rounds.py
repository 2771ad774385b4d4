"""bench/_report.py: the inference bench's rounds judged against the plain loop alone (issue 24).

Each round's (a) is the mean of the plain loop with the machine to itself just before and just
after the round; the targets ((e)/(a) >= 0.95, p50 <= 30 ms, p99 <= the SLO at 30 % load) are
judged on the medians over round 0 and the rounds.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def report(bench_module) -> ModuleType:
    return bench_module("_report")


def _results(rounds: list[dict[str, Any]], e0: float = 580.0) -> dict[str, Any]:
    return {"throughput": {"a": {"records_per_s": 600.0, "records_per_s_before": 640.0,
                                 "records_per_s_after": 560.0},
                           "e": {"records_per_s": e0}},
            "latency": [{"load": 0.3, "slo_ms": 100.0, "cuts": "cost", "p50_ms": 40.0, "p99_ms": 90.0},
                        {"load": 0.6, "slo_ms": 100.0, "cuts": "cost", "p50_ms": 400.0, "p99_ms": 900.0}],
            "settings": {"slo_ms": 100.0}, "rounds": rounds}


def test_round_zero_takes_before_and_after_of_the_first_plain_loop(report: ModuleType) -> None:
    first = report._rounds(_results([]))[0]
    assert (first["a_before"], first["a_after"], first["a"]) == (640.0, 560.0, 600.0)
    assert first["ratio"] == pytest.approx(580.0 / 600.0)
    assert (first["p50_ms"], first["p99_ms"]) == (40.0, 90.0)


def test_targets_are_judged_on_the_medians(report: ModuleType) -> None:
    rounds = [{"round": 1, "a_before": 560.0, "a_after": 600.0, "a": 580.0, "e": 540.0, "ratio": 540 / 580,
               "p50_ms": 25.0, "p99_ms": 95.0},
              {"round": 2, "a_before": 600.0, "a_after": 620.0, "a": 610.0, "e": 600.0, "ratio": 600 / 610,
               "p50_ms": 28.0, "p99_ms": 130.0}]
    text = "\n".join(report._rounds_section(_results(rounds)))
    assert "| 1 | 560 / 600 | 580 | 540 | 0.931 | 25 | 95 |" in text
    # ratios 0.967, 0.931, 0.984: median 0.967 >= 0.95
    assert "(e) / (a): median 0.967 over 3 rounds (range 0.931-0.984; target ≥ 0.95): met." in text
    # p50 40, 25, 28: median 28 <= 30; p99 90, 95, 130: median 95 <= 100
    assert "p50 at 30 % load with the SLO: median 28 ms over 3 rounds (range 25-40; target ≤ 30 ms): " \
        "met." in text
    assert "median 95 ms over 3 rounds (range 90-130; target ≤ 100 ms): met." in text


def test_a_slow_job_misses_the_ratio(report: ModuleType) -> None:
    rounds = [{"round": 1, "a_before": 560.0, "a_after": 600.0, "a": 580.0, "e": 540.0, "ratio": 540 / 580}]
    text = "\n".join(report._rounds_section(_results(rounds, e0=500.0)))
    # ratios 500/600 = 0.833 and 0.931: median 0.882
    assert "(e) / (a): median 0.882 over 2 rounds (range 0.833-0.931; target ≥ 0.95): NOT met." in text
    assert "p50 at 30 % load with the SLO: median 40 ms over 1 rounds (range 40-40; target ≤ 30 ms): " \
        "NOT met." in text
