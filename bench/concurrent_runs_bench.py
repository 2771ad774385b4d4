"""One-record model calls outside Flink: one session on every core, or concurrent one-thread runs.

Not a test. The record operator (``--operator record``) makes one model call per record. On a
2-core machine the cores can serve those calls as one ONNX Runtime session with two intra-op
threads (with and without spin-waiting, ``session.intra_op.allow_spinning``), or as two
one-thread runs at once (``--pipeline-depth 2 --intra-op-threads 1``, two subtasks). Each case,
in ``--rounds`` interleaved rounds, with the machine to itself (no broker, no JVM), scores
``--calls`` reviews one at a time per caller thread (``OnnxSentimentModel.predict`` of one text)
and reports the median ms per call and the calls per second over the case's wall time. The
``runtime`` cases make the same calls the way the record operator does, through the worker's
``ModelRuntime.infer_batch`` (its batcher, and with ``--pipeline-depth 2`` the run pool), with
``--latency-slo-ms 100``'s batching. Run (about two minutes)::

    .venv/bin/python bench/concurrent_runs_bench.py [--out bench/concurrent_runs.json] \
        [--report bench/CONCURRENT_RUNS.md]

The same calls inside the job are in ``bench/latency_bench.py``'s ``-record1p2`` and ``-recordp2``
cases (decision record 7).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import _report

from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.inference import ModelRuntime
from pyflink_aisp.inference.handlers import OnnxSentimentModel, SentimentHandler
from pyflink_aisp.models import ensure_model_assets
from pyflink_aisp.pipeline import PipelineOptions

ROOT = Path(__file__).resolve().parent.parent


def _calls(model: Any, texts: list[str], out: list[float]) -> None:
    """Score each text alone; append ms per call to ``out``."""
    for text in texts:
        start = time.perf_counter()
        model.predict([text])
        out.append((time.perf_counter() - start) * 1e3)


def run_case(model: Any, texts: list[str], callers: int) -> dict[str, float]:
    """``callers`` threads, each scoring its own share of ``texts`` one at a time on ``model``."""
    times: list[list[float]] = [[] for _ in range(callers)]
    shares = [texts[i::callers] for i in range(callers)]
    threads = [threading.Thread(target=_calls, args=(model, shares[i], times[i])) for i in range(callers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    flat = [ms for per in times for ms in per]
    return {"median_ms_per_call": statistics.median(flat), "calls_per_s": len(flat) / wall}


def render(res: dict[str, Any]) -> str:
    """The markdown report: one row per case and round (median ms per call, calls/s)."""
    lines = ["# One-record calls outside Flink (`bench/concurrent_runs_bench.py`)", "",
             f"Machine: {res['machine']}.", "",
             f"{res['calls']} reviews per case, one per call, machine to itself; median ms per call and "
             "calls/s over the case's wall time.", "",
             "| round | case | ms per call | calls/s |", "|---|---|---|---|"]
    for i, row in enumerate(res["rounds"]):
        lines += [f"| {i} | {name} | {r['median_ms_per_call']:.2f} | {r['calls_per_s']:.1f} |"
                  for name, r in row.items()]
    return "\n".join(lines) + "\n"


def run_runtime_case(assets: Any, texts: list[str], callers: int, depth: int,
                     threads: int) -> dict[str, float]:
    """``run_case`` through a ``ModelRuntime`` of the sentiment handler (``depth`` concurrent runs of
    ``threads`` intra-op threads, no spin-wait), each caller's call one ``infer_batch([text])``."""
    options = PipelineOptions(input_topic="i", output_topic="o", latency_slo_ms=100.0)
    handler = SentimentHandler(assets, intra_op_num_threads=threads, allow_spinning=False,
                               concurrent_runs=depth)
    runtime = ModelRuntime.acquire(handler, options.batching())
    try:
        runtime.infer_batch(texts[:8])  # warm-up
        return run_case(_RuntimeCalls(runtime), texts, callers)
    finally:
        runtime.release()


class _RuntimeCalls:
    """``predict`` of one text through ``ModelRuntime.infer_batch`` (what ``run_case`` calls)."""

    def __init__(self, runtime: ModelRuntime) -> None:
        self._runtime = runtime

    def predict(self, texts: list[str]) -> Any:
        return self._runtime.infer_batch(texts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=400, help="calls per case (split among its callers)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "concurrent_runs.json")
    p.add_argument("--report", type=Path, default=ROOT / "bench" / "CONCURRENT_RUNS.md")
    p.add_argument("--render", action="store_true", help="only write --report from --out's results")
    a = p.parse_args()
    if a.render:
        a.report.write_text(render(json.loads(a.out.read_text(encoding="utf-8"))), encoding="utf-8")
        return 0
    assets = ensure_model_assets()
    texts = [r.text for r in load_rotten_tomatoes()][: a.calls]
    cases: dict[str, tuple[dict[str, Any], int]] = {
        "one session, 2 intra-op threads, no spin-wait": ({"intra_op_num_threads": 2,
                                                           "allow_spinning": False}, 1),
        "one session, 2 intra-op threads, spin-wait": ({"intra_op_num_threads": 2, "allow_spinning": True},
                                                       1),
        "one session, 1 intra-op thread, one caller": ({"intra_op_num_threads": 1}, 1),
        "one session, 1 intra-op thread, two callers at once": ({"intra_op_num_threads": 1}, 2),
    }
    res: dict[str, Any] = {"machine": _report.machine(), "calls": len(texts), "rounds": []}
    print(res["machine"], flush=True)
    for round_no in range(a.rounds):
        row: dict[str, dict[str, float]] = {}
        for name, (kwargs, callers) in cases.items():
            model = OnnxSentimentModel(assets, **kwargs)
            model.predict(texts[:8])  # warm-up
            row[name] = run_case(model, texts, callers)
            print(f"[round {round_no}] {name}: {row[name]['median_ms_per_call']:.2f} ms per call, "
                  f"{row[name]['calls_per_s']:.1f} calls/s", flush=True)
        for depth, threads, callers in ((1, 2, 1), (1, 1, 2), (2, 1, 2)):
            name = f"runtime, depth {depth}, {threads} intra-op thread(s), {callers} caller(s)"
            row[name] = run_runtime_case(assets, texts, callers, depth, threads)
            print(f"[round {round_no}] {name}: {row[name]['median_ms_per_call']:.2f} ms per call, "
                  f"{row[name]['calls_per_s']:.1f} calls/s", flush=True)
        res["rounds"].append(row)
    a.out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    a.report.write_text(render(res), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
