"""Scale-out: the main job at parallelism 1 and 2 on a 2-TaskManager local cluster, side by side.

Not a test. Starts its own stack (temporary state folder, free ports, 2 TaskManagers),
writes all 12,808 reviews (or ``--reviews N``) into a 2-partition topic, runs
``jobs/review_sentiment.py`` with ``flink run`` in BATCH mode at parallelism 1, then 2
(each run its own output topic), and reports per run: the ``flink run`` wall time, the
job's duration (Flink REST), records/s from the first to the last output record
(Kafka record timestamps), and per subtask of the scoring chain its TaskManager,
records written, running time and busy time (``accumulated-busy-time``). Then compares
the two outputs (:func:`pyflink_aisp.alignment.compare_outputs`: same ids, each once,
labels, scores within 1e-5). Writes ``--out`` (JSON) and prints a Markdown table.

Run::

    .venv/bin/python bench/scale_out.py [--reviews 12808] [--out bench/scale_out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _rest(stack: Any, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(stack.flink_config().rest_url + path, timeout=10) as resp:
        return json.loads(resp.read())


def _run(stack: Any, parallelism: int, t_in: str, count: int) -> dict[str, Any]:
    from pyflink_aisp.kafka import read_topic

    bootstrap = str(stack.status().bootstrap_servers)
    t_out = f"scale-p{parallelism}"
    job_py = str(ROOT / "jobs" / "review_sentiment.py")
    job_args = ["--bootstrap-servers", bootstrap, "--input-topic", t_in, "--output-topic", t_out,
                "--mode", "batch", "--parallelism", str(parallelism)]
    cmd = stack.flink_run_command(job_py, *job_args)
    started = time.monotonic()
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=1800)
    wall_s = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"flink run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    job_id = re.search(r"JobID ([0-9a-f]{32})", proc.stdout).group(1)  # type: ignore[union-attr]
    messages = read_topic(bootstrap, t_out, min_count=count, timeout_s=120)
    stamps = sorted(m.timestamp()[1] for m in messages)
    span_s = (stamps[-1] - stamps[0]) / 1000
    job = _rest(stack, f"/jobs/{job_id}")
    chain = next(v for v in job["vertices"] if v["name"].startswith("Source: KafkaSource"))
    subtasks = []
    for sub in _rest(stack, f"/jobs/{job_id}/vertices/{chain['id']}")["subtasks"]:
        written = int(sub["metrics"]["write-records"])
        busy_s = float(sub["metrics"]["accumulated-busy-time"]) / 1000
        subtasks.append({
            "subtask": sub["subtask"], "taskmanager": sub["taskmanager-id"], "records_out": written,
            "duration_s": sub["duration"] / 1000, "busy_s": busy_s,
            "records_per_s": written / (sub["duration"] / 1000),
        })
    return {
        "parallelism": parallelism, "job_id": job_id, "output_topic": t_out, "records": len(messages),
        "flink_run_wall_s": wall_s, "job_duration_s": job["duration"] / 1000,
        "first_to_last_output_s": span_s, "records_per_s_first_to_last": len(messages) / span_s,
        "records_per_s_job": len(messages) / (job["duration"] / 1000), "subtasks": subtasks,
        "values": [bytes(m.value() or b"") for m in messages],
    }


def _table(runs: list[dict[str, Any]]) -> str:
    rows = ["| parallelism | job duration s | records/s (job) | records/s (first→last output) | subtask: "
            "TaskManager, records, s, records/s, busy s |", "|---|---|---|---|---|"]
    for run in runs:
        subs = "; ".join(f"{s['subtask']}: {s['taskmanager']}, {s['records_out']}, {s['duration_s']:.1f}, "
                         f"{s['records_per_s']:.0f}, {s['busy_s']:.1f}" for s in run["subtasks"])
        rows.append(f"| {run['parallelism']} | {run['job_duration_s']:.1f} | "
                    f"{run['records_per_s_job']:.0f} | {run['records_per_s_first_to_last']:.0f} | {subs} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reviews", type=int, default=None, help="first N reviews (default: all 12,808)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "scale_out.json")
    args = parser.parse_args(argv)

    from pyflink_aisp.alignment import compare_outputs
    from pyflink_aisp.datasets import load_rotten_tomatoes
    from pyflink_aisp.kafka import create_topics, ingest_records
    from pyflink_aisp.local import LocalStack, LocalStackConfig

    reviews = load_rotten_tomatoes()[: args.reviews]
    with tempfile.TemporaryDirectory(prefix="aisp-scale-") as tmp:
        stack = LocalStack(LocalStackConfig.on_free_ports(Path(tmp), flink_taskmanagers=2))
        stack.up()
        try:
            bootstrap = str(stack.status().bootstrap_servers)
            create_topics(bootstrap, ["scale-reviews"], partitions=2)
            records = ({"id": r.id, "text": r.text} for r in reviews)
            ingest_records(bootstrap, "scale-reviews", records, total=len(reviews), progress=False)
            runs = [_run(stack, p, "scale-reviews", len(reviews)) for p in (1, 2)]
        finally:
            stack.down()
    report = compare_outputs(runs[0].pop("values"), runs[1].pop("values"), tolerance=1e-5)
    result = {"reviews": len(reviews), "cpu_cores": _cores(), "runs": runs, "verify": report.lines(),
              "same_outputs": report.ok}
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(_table(runs))
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
