"""bench/_ort_profile.py: an ONNX Runtime profile read into runs, kernels and the helper-thread wait."""

from __future__ import annotations

import json

import pytest


def _node(tid: int, ts: int, dur: int, op: str, run: int, wait: int, shape=None) -> dict:
    args = {"op_name": op, "thread_scheduling_stats": {"main_thread": {"Run": run, "Wait": wait}}}
    if shape is not None:
        args["input_type_shape"] = [{"int64": shape}]
    return {"cat": "Node", "name": f"{op}_{ts}_kernel_time", "tid": tid, "ts": ts, "dur": dur, "args": args}


def _run(tid: int, ts: int, dur: int) -> dict:
    return {"cat": "Session", "name": "model_run", "tid": tid, "ts": ts, "dur": dur, "args": {}}


@pytest.fixture
def profile(tmp_path):
    """Three runs: two on thread 1 (at 0 s and 2 s), one on thread 2 overlapping the first (two runs at
    once, as a run pool makes them); a kernel outside every run; session events around them."""
    events = [
        {"cat": "Session", "name": "session_initialization", "tid": 1, "ts": 0, "dur": 5, "args": {}},
        _run(1, 10, 1000), _node(1, 20, 100, "Cast", 0, 0, [4, 32]), _node(1, 200, 600, "MatMul", 400, 200),
        _run(2, 50, 500), _node(2, 60, 300, "MatMul", 300, 0, [2, 10]), _node(2, 400, 100, "Add", 0, 0),
        _run(1, 2_000_000, 400), _node(1, 2_000_010, 300, "MatMul", 150, 150, [1, 20]),
        _node(1, 3_000_000, 999, "MatMul", 0, 999),  # after every run: not counted
    ]
    path = tmp_path / "aisp-ort-1.json"
    path.write_text(json.dumps(events))
    return path


def test_each_run_gets_its_own_threads_kernels_and_tokens(bench_module, profile) -> None:
    prof = bench_module("_ort_profile")
    runs = prof.read_runs(profile)
    assert [(r.start_s, r.wall_us, r.tokens) for r in runs] == [(1e-05, 1000.0, 128), (5e-05, 500.0, 20),
                                                               (2.0, 400.0, 20)]
    assert runs[0].ops == {"Cast": [100.0, 0.0, 0.0], "MatMul": [600.0, 400.0, 200.0]}
    assert runs[1].ops == {"MatMul": [300.0, 300.0, 0.0], "Add": [100.0, 0.0, 0.0]}


def test_the_summary_counts_the_wait_share_of_the_runs_kept(bench_module, profile) -> None:
    prof = bench_module("_ort_profile")
    runs = prof.read_runs(profile)
    whole = prof.summarize(runs)
    assert whole["runs"] == 3 and whole["tokens"] == 168
    assert whole["wait_share"] == pytest.approx(350 / 1400)  # MatMul waits 200 + 0 + 150 of 1,400 µs
    assert whole["kernel_us_per_token"] == pytest.approx(1400 / 168)
    assert whole["wall_us_per_token"] == pytest.approx(1900 / 168)
    assert list(whole["ops"]) == ["MatMul", "Cast", "Add"]
    assert whole["ops"]["MatMul"]["kernel_share"] == pytest.approx(1200 / 1400)
    assert whole["ops"]["MatMul"]["wait_share"] == pytest.approx(350 / 1200)
    late = prof.summarize(runs, after_s=1.0)  # only the run at 2 s
    assert (late["runs"], late["tokens"], late["wait_share"]) == (1, 20, 0.5)
    assert prof.summarize(runs, skip=2)["runs"] == 1
    empty = prof.summarize(runs, after_s=10.0)
    assert (empty["runs"], empty["wait_share"], empty["kernel_us_per_token"]) == (0, 0.0, 0.0)
    assert empty["ops"] == {}


def test_the_largest_profile_is_the_jobs_not_its_probes(bench_module, tmp_path) -> None:
    prof = bench_module("_ort_profile")
    (tmp_path / "a.json").write_text("[]")
    (tmp_path / "b.json").write_text(json.dumps([_run(1, 0, 1)] * 10))
    assert prof.largest_profile(tmp_path).name == "b.json"
    with pytest.raises(FileNotFoundError, match="no ONNX Runtime profile"):
        prof.largest_profile(tmp_path / "none")


def test_the_report_puts_the_job_beside_the_plain_loop(bench_module) -> None:
    bench = bench_module("ort_profile_bench")
    def op(kernel: float, wait: float, per_token: float) -> dict:
        return {"kernel_share": kernel, "wait_share": wait, "us_per_token": per_token}

    plain = {"runs": 400, "tokens": 1000, "wall_us_per_token": 2.0, "kernel_us_per_token": 1.5,
             "wait_share": 0.10, "ops": {"MatMul": op(0.8, 0.12, 1.2), "Gelu": op(0.1, 0.3, 0.15)}}
    job = {"runs": 120, "tokens": 500, "wall_us_per_token": 3.5, "kernel_us_per_token": 3.0,
           "wait_share": 0.25, "ops": {"MatMul": op(0.85, 0.28, 2.55)}}
    res = {"machine": "AMD EPYC", "reviews": 100, "repeat": 3, "threads": 2, "batch_size": 32, "skip_s": 60.0,
           "plain": {"records_per_s": 300.0, "profile": plain},
           "job": {"records_per_s": 250.0, "command": "python jobs/review_sentiment.py", "profile": job}}
    text = bench.render(res)
    assert "| plain loop alone | 400 | 2.000 | 1.500 | 10.0% |" in text
    assert "| the job | 120 | 3.500 | 3.000 | 25.0% |" in text
    assert "| MatMul | 80.0%, 12.0%, 1.200 | 85.0%, 28.0%, 2.550 |" in text
    assert "| Gelu | 10.0%, 30.0%, 0.150 |  |" in text
    assert "took 2.00x the plain loop's time per token; the wait share went from 10.0% to 25.0%" in text
