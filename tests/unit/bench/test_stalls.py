"""bench/_stalls.py: where slow records waited: behind a busy worker or idle, across JVM safepoints."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

LINES = [  # JDK 17's -Xlog:gc,safepoint:file=...:timemillis,uptimemillis
    "[1000000ms][556ms] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 31M->20M(388M) 4.607ms",
    '[1000000ms][556ms] Safepoint "G1CollectForAllocation", Time since last: 552306158 ns, '
    "Reaching safepoint: 180150 ns, At safepoint: 4711000 ns, Total: 4891150 ns",
    '[1000500ms][1056ms] Safepoint "Cleanup", Time since last: 1000293163 ns, Reaching safepoint: '
    "150 ns, At safepoint: 7020 ns, Total: 40000000 ns",
    '[1002000ms][2556ms] Safepoint "G1PauseRemark", Time since last: 1 ns, Reaching safepoint: 1 ns, '
    "At safepoint: 1 ns, Total: 2000000 ns",
    "not a log line",
]


@pytest.fixture(scope="module")
def stalls(bench_module) -> ModuleType:
    return bench_module("_stalls")


def test_a_safepoint_line_is_a_pause_ending_at_its_stamp(stalls) -> None:
    pauses = stalls.read_pauses(LINES)
    assert [(p.name, p.start_ms, p.end_ms) for p in pauses] == [
        ("G1CollectForAllocation", pytest.approx(1000000 - 4.89115), 1000000.0),
        ("Cleanup", 1000460.0, 1000500.0), ("G1PauseRemark", 1001998.0, 1002000.0)]
    assert pauses[1].ms == 40.0


def test_the_slowest_records_are_matched_with_a_long_pause_they_waited_across(stalls, tmp_path) -> None:
    (tmp_path / "jvm-1.log").write_text("\n".join(LINES[:2]))
    (tmp_path / "jvm-2.log").write_text("\n".join(LINES[2:]))
    pauses = stalls.read_pause_dir(tmp_path)
    assert len(pauses) == 3
    n = 200  # one record every 10 ms from 999,000 ms; two slow ones
    t_in = 999000.0 + 10.0 * np.arange(n)
    waits = np.full(n, 2.0)
    totals = np.full(n, 10.0)
    waits[146], totals[146] = 45.0, 60.0   # t_in 1,000,460: waits across the 40 ms Cleanup pause
    waits[190], totals[190] = 50.0, 70.0   # t_in 1,000,900: no pause in its wait
    got = stalls.pause_summary(pauses, t_in, waits, totals)
    # the GC pause (4.9 ms, at the span's start) and the remark (after the span) fall short or outside
    assert got == {"pauses": 2, "pause_ms_total": pytest.approx(44.89115), "pause_ms_max": 40.0,
                   "slow_records": 2, "slow_records_in_pause": 1}
    empty = np.array([])
    assert stalls.pause_summary(pauses, empty, empty, empty)["slow_records"] == 0


def test_a_wait_is_split_into_queueing_behind_the_worker_and_a_stall_with_it_idle(stalls) -> None:
    # a: enters at 2, works 10 (to 12); b arrives at 5, enters at 12: 7 ms queued behind a;
    # c arrives at 30 with the worker idle since 22, enters at 55: 25 ms stalled;
    # d and e arrive at 100 and 101 and share one call (a batch) from 110 for 20 ms: its work counts once
    t_in = np.array([0.0, 5.0, 30.0, 100.0, 101.0])
    waits = np.array([2.0, 7.0, 25.0, 10.0, 9.0])
    work = np.array([10.0, 10.0, 10.0, 20.0, 20.0])
    got = stalls.wait_split(t_in, waits, work)
    queued = np.array([0.0, 7.0, 0.0, 0.0, 0.0])
    stalled = waits - queued
    assert got == {"busy_share": pytest.approx(50.0 / 128.0),
                   "queued_p99_ms": pytest.approx(float(np.percentile(queued, 99))),
                   "stalled_p99_ms": pytest.approx(float(np.percentile(stalled, 99)))}
    assert got["queued_p99_ms"] > 6.5 and got["stalled_p99_ms"] > 24.0
    assert np.isnan(stalls.wait_split(t_in[:1], waits[:1], work[:1])["busy_share"])


def test_with_two_workers_a_record_queues_only_behind_its_own_workers_calls(stalls) -> None:
    # worker 0: a enters at 0 and works 10; b arrives at 2 and enters at 10: 8 ms queued.
    # worker 1: c arrives at 3 (while a works, but on the other worker) and enters at 4: 1 ms stalled;
    # d arrives at 20 and enters at 21 (c left at 14): 1 ms stalled
    t_in = np.array([0.0, 2.0, 3.0, 20.0])
    waits = np.array([0.0, 8.0, 1.0, 1.0])
    work = np.array([10.0, 10.0, 10.0, 10.0])
    workers = np.array([0, 0, 1, 1])
    got = stalls.wait_split(t_in, waits, work, workers)
    queued = np.array([0.0, 8.0, 0.0, 0.0])
    stalled = np.array([0.0, 0.0, 1.0, 1.0])
    assert got == {"busy_share": pytest.approx((20.0 / 20.0 + 20.0 / 27.0) / 2),
                   "queued_p99_ms": pytest.approx(float(np.percentile(queued, 99))),
                   "stalled_p99_ms": pytest.approx(float(np.percentile(stalled, 99)))}
    # read as one worker, c would have queued behind a
    one = stalls.wait_split(t_in, waits, work)
    assert one["busy_share"] > 1.0 or one["queued_p99_ms"] > got["queued_p99_ms"]


CHECKPOINT_LINES = [  # Flink 2.3's CheckpointCoordinator, two jobs in one log: only the last one counts
    "2026-12-06 22:34:20,641 INFO  org.apache.flink.runtime.checkpoint.CheckpointCoordinator    [] - "
    "Triggering checkpoint 1 (type=CheckpointType{name='Checkpoint', sharingFilesStrategy=FORWARD_BACKWARD}) "
    "@ 999000 for job 0aaa.",
    "2026-12-06 22:34:20,834 INFO  org.apache.flink.runtime.checkpoint.CheckpointCoordinator    [] - "
    "Completed checkpoint 1 for job 0aaa (3419 bytes, checkpointDuration=50 ms, finalizationTime=4 ms).",
    "... Triggering checkpoint 1 (type=CheckpointType{name='Checkpoint'}) @ 1000000 for job 5fcd.",
    "... Completed checkpoint 1 for job 5fcd (3419 bytes, checkpointDuration=204 ms, finalizationTime=4 ms).",
    "... Triggering checkpoint 2 (type=CheckpointType{name='Checkpoint'}) @ 1001000 for job 5fcd.",
    "... Completed checkpoint 2 for job 5fcd (3855 bytes, checkpointDuration=44 ms, finalizationTime=11 ms).",
    # never completed
    "... Triggering checkpoint 3 (type=CheckpointType{name='Checkpoint'}) @ 1001500 for job 5fcd.",
]


def test_checkpoints_are_read_from_the_coordinators_lines_of_the_last_job(stalls) -> None:
    got = stalls.read_checkpoints(CHECKPOINT_LINES)
    assert [(c.start_ms, c.duration_ms, c.end_ms) for c in got] == [(1000000.0, 204.0, 1000204.0),
                                                                      (1001000.0, 44.0, 1001044.0)]
    assert stalls.read_checkpoints(["no checkpoint here"]) == []


def test_slow_records_that_met_a_checkpoint_are_counted_against_the_share_of_all(stalls) -> None:
    checkpoints = stalls.read_checkpoints(CHECKPOINT_LINES)
    n = 200  # one record every 10 ms from 999,000 ms, each 10 ms end to end
    t_in = 999000.0 + 10.0 * np.arange(n)
    totals = np.full(n, 10.0)
    totals[110] = 80.0  # t_in 1,000,100: inside the first checkpoint
    totals[180] = 90.0  # t_in 1,000,800: 244 ms before the second, 550 ms after the first's end
    got = stalls.checkpoint_summary(checkpoints, t_in, totals)
    # records meeting one: t_in in [999,990, 1,000,454] (47) and [1,000,990, 1,001,294] (the last: 1) of 200
    assert got == {"checkpoints": 2, "duration_ms_max": 204.0, "slow_records": 2,
                   "slow_records_at_checkpoint": 1, "share_at_checkpoint": pytest.approx(48 / 200)}
    empty = np.array([])
    assert stalls.checkpoint_summary(checkpoints, empty, empty)["slow_records"] == 0
