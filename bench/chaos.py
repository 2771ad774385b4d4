"""Chaos benchmark: the streaming review job under many kill -9s of the TaskManager and broker restarts.

Not a test. Starts its own local stack (Kafka broker + Flink standalone
cluster, temporary state folder, free ports), submits ``jobs/review_sentiment.py``
with ``flink run`` in STREAMING mode (exactly-once, checkpoint every
``--checkpoint-interval-ms``), and while it scores the real Rotten Tomatoes
reviews (ingested in chunks, one before each failure) it:

- SIGKILLs the TaskManager ``--kills`` times, alternately with its Python
  workers and alone (the workers left running are orphans the restart must
  reap), restarting it each time (:meth:`LocalStack.restart_taskmanager`);
- restarts the Kafka broker ``--broker-restarts`` times, spread among the kills.

Recovery per failure = failure → the job and all its vertices RUNNING again
and a checkpoint triggered after the failure completed (its Kafka transaction
commits: output advances), polled every 0.25 s through the REST API
(:func:`pyflink_aisp.local.wait_recovered`). Afterwards a ``read_committed``
consumer reads the output: lost ids, duplicates, DLQ count; orphaned Python
workers are counted after the job's cancel and again after ``aisp local down``.
Targets: 0 lost, 0 duplicates, 0 orphans, p99 recovery ≤ 15 s.

Run (about 30 s per failure on 2 cores)::

    .venv/bin/python bench/chaos.py [--kills 20] [--broker-restarts 3] [--records 3000] [--taskmanagers 2]
        [--baseline bench/chaos_results.json --baseline-label "1 TaskManager"] [--out-dir bench]

With ``--taskmanagers 2`` a second TaskManager stands by: a killed TaskManager's
job restarts on the standby's free slots while the killed one is restarted
(the JVM start leaves the recovery's critical path).

It writes ``## Failures (chaos)`` into ``<out-dir>/REPORT.md`` (other sections
kept), ``chaos_recovery.png`` and the raw numbers ``chaos_results.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _markdown import replace_section
from _report import machine

from pyflink_aisp.chaos import FailureEvent, FailurePlan, FailureResult, run_chaos
from pyflink_aisp.local import LocalStack, LocalStackConfig
from pyflink_aisp.models import ensure_model_assets

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Failures (chaos)"
PNG = "chaos_recovery.png"
TARGET_P99_S = 15.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20, help="kill -9s of the TaskManager")
    p.add_argument("--broker-restarts", type=int, default=3, help="Kafka broker stop/start cycles")
    p.add_argument("--records", type=int, default=3000, help="real reviews scored during the run")
    p.add_argument("--checkpoint-interval-ms", type=int, default=1000, help="the job's checkpoint interval")
    p.add_argument("--pause-s", type=float, default=3.0, help="scoring time between a chunk and the failure")
    p.add_argument("--taskmanagers", type=int, default=1,
                   help="TaskManagers of the stack; above 1 the others stand by (only the job's is killed)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench", help="where the report goes")
    p.add_argument("--baseline", type=Path, default=None,
                   help="an earlier chaos_results.json to show beside this run (e.g. other cluster settings)")
    p.add_argument("--baseline-label", default="baseline", help="what the baseline run differed in")
    return p.parse_args(argv)


def _progress(i: int, event: FailureEvent) -> None:
    took = "no recovery" if event.recovery_s is None else f"recovered in {event.recovery_s:.1f} s"
    print(f"[{time.strftime('%X')}] failure {i + 1}: {event.kind:<10} {took}; orphans "
          f"{event.orphans_before_restart} -> {event.orphans_after_restart}", flush=True)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values)
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
            "max": float(arr.max()), "mean": float(arr.mean())}


def summarize(result: FailureResult, orphans_after_down: int, plan: FailurePlan,
              taskmanagers: int = 1) -> dict[str, Any]:
    """Every number of the run as JSON-able data."""
    kills = [e.recovery_s for e in result.events if e.kind != "broker" and e.recovery_s is not None]
    broker = [e.recovery_s for e in result.events if e.kind == "broker" and e.recovery_s is not None]
    return {
        "plan": {"records": plan.records, "kills": plan.taskmanager_kills,
                 "broker_restarts": plan.broker_restarts,
                 "checkpoint_interval_ms": plan.checkpoint_interval_ms, "pause_s": plan.pause_s,
                 "taskmanagers": taskmanagers},
        "inputs": len(result.input_ids), "distinct_outputs": len(result.output_counts),
        "lost": len(result.lost), "duplicates": result.duplicates, "dlq": result.dlq_count,
        "unrecovered": sum(e.recovery_s is None for e in result.events),
        "orphans_reaped_by_restarts": sum(e.orphans_before_restart for e in result.events),
        "orphans_after_restarts": sum(e.orphans_after_restart for e in result.events),
        "orphans_at_end": result.orphans_at_end, "orphans_after_down": orphans_after_down,
        "taskmanager_recovery_s": _percentiles(kills), "broker_recovery_s": _percentiles(broker),
        "wall_s": result.wall_s,
        "events": [{"kind": e.kind, "recovery_s": e.recovery_s, "killed_pids": list(e.killed_pids),
                    "orphans_before_restart": e.orphans_before_restart,
                    "orphans_after_restart": e.orphans_after_restart} for e in result.events],
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    """One bar per failure (recovery seconds, coloured by kind) with the p99 target line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colours = {"tm+workers": "tab:red", "tm": "tab:orange", "broker": "tab:blue"}
    events = summary["events"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(events) + 2), 3.6))
    for i, e in enumerate(events):
        ax.bar(i + 1, e["recovery_s"] or 0.0, color=colours[e["kind"]], hatch="" if e["recovery_s"] else "//")
    handles: list[Any] = [Patch(color=colour, label=kind) for kind, colour in colours.items()]
    handles.append(ax.axhline(TARGET_P99_S, color="k", linestyle="--", linewidth=1,
                              label=f"p99 target {TARGET_P99_S:.0f} s"))
    p99 = summary["taskmanager_recovery_s"].get("p99")
    if p99 is not None:
        handles.append(ax.axhline(p99, color="tab:red", linestyle=":", linewidth=1,
                                  label=f"TaskManager p99 {p99:.1f} s"))
    ax.set_xlabel("failure #")
    ax.set_ylabel("recovery (s): failure → RUNNING + checkpoint")
    ax.set_title(f"{summary['plan']['kills']} TaskManager kills, {summary['plan']['broker_restarts']} "
                 f"broker restarts: lost {summary['lost']}, duplicates {summary['duplicates']}")
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _row(name: str, stats: dict[str, float]) -> str:
    if not stats:
        return f"| {name} | - | - | - | - |"
    return f"| {name} | {stats['p50']:.1f} | {stats['p99']:.1f} | {stats['max']:.1f} | {stats['mean']:.1f} |"


def _baseline_rows(baseline: dict[str, Any] | None, label: str) -> list[str]:
    if baseline is None:
        return []
    plan = baseline["plan"]
    tms = plan.get("taskmanagers", 1)
    return [_row(f"TaskManager kill, {label} ({plan['kills']} kills, {tms} TaskManager(s))",
                 baseline["taskmanager_recovery_s"]),
            _row(f"broker restart, {label}", baseline["broker_recovery_s"])]


def section(summary: dict[str, Any], machine_line: str, baseline: dict[str, Any] | None = None,
            baseline_label: str = "baseline") -> str:
    """The ``## Failures (chaos)`` markdown section (``baseline``: an earlier run's summary)."""
    tm = summary["taskmanager_recovery_s"]
    verdict = "met" if tm and tm["p99"] <= TARGET_P99_S else "missed"
    plan = summary["plan"]
    tms = plan.get("taskmanagers", 1)
    standby = f" with {tms} TaskManagers (the job on one, the rest on standby; only the job's is killed)" \
        if tms > 1 else ""
    return "\n".join([
        SECTION, "",
        f"`bench/chaos.py --kills {plan['kills']} --broker-restarts {plan['broker_restarts']} --records "
        f"{plan['records']} --taskmanagers {tms}`: `jobs/review_sentiment.py` via `flink run`, STREAMING, "
        f"exactly-once, checkpoint every {plan['checkpoint_interval_ms']} ms, on the local standalone cluster"
        f"{standby}; "
        f"{machine_line}. Wall time {summary['wall_s']:.0f} s.", "",
        "| outcome | value | target |", "|---|---|---|",
        f"| inputs / distinct outputs | {summary['inputs']} / {summary['distinct_outputs']} | equal |",
        f"| lost ids | {summary['lost']} | 0 |",
        f"| duplicate outputs (read_committed) | {summary['duplicates']} | 0 |",
        f"| DLQ records | {summary['dlq']} | 0 (clean input) |",
        f"| failures without recovery | {summary['unrecovered']} | 0 |",
        f"| orphaned workers left by lone TaskManager kills, reaped by the restart | "
        f"{summary['orphans_reaped_by_restarts']} | (reaped) |",
        f"| orphaned workers after restarts / after cancel / after `down` | "
        f"{summary['orphans_after_restarts']} / {summary['orphans_at_end']} / "
        f"{summary['orphans_after_down']} | 0 / 0 / 0 |", "",
        "Recovery = failure → job and all vertices RUNNING and a checkpoint triggered after the failure "
        "completed (output committed again), polled every 0.25 s:", "",
        "| failure | p50 (s) | p99 (s) | max (s) | mean (s) |", "|---|---|---|---|---|",
        _row("TaskManager kill -9 + restart", tm), _row("broker restart", summary["broker_recovery_s"]),
        *_baseline_rows(baseline, baseline_label), "",
        f"TaskManager p99 target ≤ {TARGET_P99_S:.0f} s: **{verdict}**. Per failure: `{PNG}`; raw numbers: "
        "`chaos_results.json`.", "",
        f"![recovery per failure]({PNG})", "",
    ])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0 when the exactly-once and orphan targets hold, else 1."""
    args = parse_args(argv)
    plan = FailurePlan(records=args.records, taskmanager_kills=args.kills,
                       broker_restarts=args.broker_restarts,
                       checkpoint_interval_ms=args.checkpoint_interval_ms, pause_s=args.pause_s)
    machine_line = machine()
    assets = ensure_model_assets()
    with tempfile.TemporaryDirectory(prefix="aisp-chaos-") as tmp:
        config = LocalStackConfig.on_free_ports(Path(tmp) / "stack", flink_taskmanagers=args.taskmanagers)
        stack = LocalStack(config)
        print(f"[{time.strftime('%X')}] starting the stack in {tmp}", flush=True)
        stack.up()
        try:
            result = run_chaos(stack, plan, job_py=ROOT / "jobs" / "review_sentiment.py",
                               model_dir=assets.directory, work_dir=Path(tmp), on_event=_progress)
        finally:
            stack.down()
        orphans_after_down = len(stack.python_workers())
    summary = summarize(result, orphans_after_down, plan, args.taskmanagers)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "chaos_results.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary, args.out_dir / PNG)
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    if baseline is not None:
        kept = {k: v for k, v in baseline.items() if k != "baseline"}
        summary["baseline"] = {"label": args.baseline_label, **kept}
    replace_section(args.out_dir / "REPORT.md", SECTION,
                    section(summary, machine_line, baseline, args.baseline_label))
    print(json.dumps({k: v for k, v in summary.items() if k != "events"}, indent=2))
    ok = summary["lost"] == summary["duplicates"] == summary["orphans_after_down"] == 0
    return 0 if ok and summary["orphans_at_end"] == 0 and summary["unrecovered"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
