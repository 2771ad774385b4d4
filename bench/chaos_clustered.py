"""Clustered TaskManager losses with the job's default restart options, beside the old defaults.

Not a test. Issue 25: one TaskManager loss spent the old default restart budget (failure-rate,
3 restarts per 300 s, 10 s apart), because each restart while the TaskManager is replaced finds
no slot and fails at once (``NoResourceAvailableException``; a standalone ResourceManager past
its start-up period fails what it cannot serve). Each case starts its own local stack (Kafka
broker + Flink standalone cluster), submits ``jobs/review_sentiment.py`` with ``flink run`` in
STREAMING mode, exactly-once, with **no restart option** (the case's defaults) and then:

* ``two losses``: kill -9 the TaskManager (with its Python worker), leave it down
  ``--down-s`` (25 s: a pod rescheduled), restart it, wait until the job runs and commits, score
  a fresh chunk, and kill it again (the second loss ~50-60 s after the first);
* ``slow replacement``: one loss, the TaskManager down ``--slow-down-s`` (90 s).

Each case runs twice: with today's defaults and with the old ones given as flags
(``--restart-strategy failure-rate --restart-attempts 3 --restart-interval-s 300
--restart-delay-s 10``). Reported per run: the job's state after the last loss (RUNNING or
FAILED), its restarts (``numRestarts``), recovery per loss, and lost / duplicated ids
(``read_committed``).

Run (about 4 min per run, 16 min in all, on 2 cores)::

    .venv/bin/python bench/chaos_clustered.py [--down-s 25] [--slow-down-s 90] [--records 3000]

It writes ``## Failures: clustered TaskManager losses`` into ``bench/REPORT.md`` (other sections
kept) and the raw numbers into ``bench/chaos_clustered.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _markdown import replace_section
from _report import machine

from pyflink_aisp.chaos import FailurePlan, run_chaos
from pyflink_aisp.errors import ServiceError
from pyflink_aisp.local import LocalStack, LocalStackConfig
from pyflink_aisp.models import ensure_model_assets

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Failures: clustered TaskManager losses"
#: The defaults before issue 25, as flags.
OLD_DEFAULTS = ("--restart-strategy", "failure-rate", "--restart-attempts", "3",
                "--restart-interval-s", "300", "--restart-delay-s", "10", "--restart-max-delay-s", "10")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--down-s", type=float, default=25.0, help="TaskManager down time in the two-loss case")
    p.add_argument("--slow-down-s", type=float, default=90.0, help="TaskManager down time, slow replacement")
    p.add_argument("--records", type=int, default=3000, help="real reviews scored during each run")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench", help="where the report goes")
    return p.parse_args(argv)


def run_case(name: str, defaults: str, plan: FailurePlan, assets_dir: Path) -> dict[str, Any]:
    """One run on a fresh stack; the job failing for good is an outcome, not an error."""
    with tempfile.TemporaryDirectory(prefix="aisp-clustered-") as tmp:
        stack = LocalStack(LocalStackConfig.on_free_ports(Path(tmp) / "stack"))
        stack.up()
        events: list[dict[str, Any]] = []
        started = time.monotonic()
        try:
            result = run_chaos(stack, plan, job_py=ROOT / "jobs" / "review_sentiment.py",
                               model_dir=assets_dir, work_dir=Path(tmp), on_event=lambda i, e: events.append(
                                   {"recovery_s": e.recovery_s, "restarts": e.restarts}))
            outcome = {"state": "RUNNING", "lost": len(result.lost), "duplicates": result.duplicates,
                       "inputs": len(result.input_ids), "dlq": result.dlq_count}
        except ServiceError as exc:
            outcome = {"state": "FAILED", "error": str(exc)[:300]}
        finally:
            stack.down()
    row = {"case": name, "defaults": defaults, "losses": plan.taskmanager_kills, "down_s": plan.down_s,
           "events": events, "wall_s": time.monotonic() - started, **outcome}
    print(json.dumps(row), flush=True)
    return row


def section(rows: list[dict[str, Any]], machine_line: str) -> str:
    """The markdown section of the runs."""
    def recoveries(row: dict[str, Any]) -> str:
        done = [f"{e['recovery_s']:.0f}" for e in row["events"] if e["recovery_s"] is not None]
        return " / ".join(done) if done else "-"

    def restarts(row: dict[str, Any]) -> str:
        known = [e["restarts"] for e in row["events"] if e["restarts"] is not None]
        return str(known[-1]) if known else "-"

    def exactly_once(row: dict[str, Any]) -> str:
        if row["state"] != "RUNNING":
            return "- (job FAILED)"
        return f"{row['lost']} / {row['duplicates']} of {row['inputs']}"

    lines = [SECTION, "",
             "`bench/chaos_clustered.py`: `jobs/review_sentiment.py` via `flink run`, STREAMING, "
             "exactly-once, no restart flag (the defaults) beside the old defaults as flags; each run on a "
             f"fresh local standalone cluster, TaskManager kill -9 with its Python worker; {machine_line}.",
             "",
             "| case | restart defaults | job after the last loss | restarts | recovery per loss (s) | "
             "lost / duplicated |", "|---|---|---|---|---|---|"]
    for row in rows:
        case = f"{row['case']}: {row['losses']} x down {row['down_s']:.0f} s"
        lines.append(f"| {case} | {row['defaults']} | **{row['state']}** | {restarts(row)} | "
                     f"{recoveries(row)} | {exactly_once(row)} |")
    lines += ["", "Today's defaults: `--restart-strategy exponential-delay`, first wait "
              "`--restart-delay-s` 5 s doubling to `--restart-max-delay-s` 60 s, `--restart-attempts` 10 "
              "before a `--restart-interval-s` 600 s run without failure resets them. Old: failure-rate, "
              "3 restarts per 300 s, 10 s apart. Raw numbers: `chaos_clustered.json`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the four cases; 0 when today's defaults kept the job running exactly once in both."""
    args = parse_args(argv)
    machine_line = machine()
    assets = ensure_model_assets()
    cases = [("two losses", args.down_s, 2), ("slow replacement", args.slow_down_s, 1)]
    rows = []
    for name, down_s, kills in cases:
        for label, options in (("today's", ()), ("old", OLD_DEFAULTS)):
            plan = FailurePlan(records=args.records, taskmanager_kills=kills, broker_restarts=0,
                               down_s=down_s, pause_s=5.0, restart_options=options, recovery_timeout_s=400.0)
            rows.append(run_case(name, label, plan, assets.directory))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "chaos_clustered.json").write_text(json.dumps(rows, indent=2) + "\n")
    replace_section(args.out_dir / "REPORT.md", SECTION, section(rows, machine_line))
    ok = all(r["state"] == "RUNNING" and r["lost"] == r["duplicates"] == 0
             for r in rows if r["defaults"] == "today's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
