"""TaskManager memory kept per finished PyFlink job: flink-python loaded per job vs. from the daemons' lib/.

Not a test. For each variant it starts its own local stack (Kafka broker +
Flink standalone cluster with one TaskManager, temporary state folder, free
ports), ingests 50 real reviews and runs ``jobs/review_sentiment.py`` in BATCH
mode with ``flink run`` ``--jobs`` times; after each job it reads the
TaskManager's ``Status.JVM.Memory.Metaspace.Used`` and
``Status.JVM.Memory.Direct.MemoryUsed`` through the REST API (Flink docs,
"Metrics": System metrics). The two variants:

- ``per-job``: the daemons start with PyFlink's own ``lib/`` (no flink-python
  jar), so every ``flink run -py`` ships flink-python and its Beam classes load
  in the job's class loader (how the local stack ran before);
- ``lib``: the local stack's default (:func:`pyflink_aisp.local.write_flink_lib_dir`:
  flink-python in the daemons' ``lib/``, ``org.apache.beam.`` parent-first).

Growth per job is the least-squares slope over jobs 2..N (the first job loads
what every later one shares); at the end a full GC of the TaskManager (``jcmd
PID GC.run``, JDK) shows what the finished jobs really keep. Run (about 25 s per job on 2 cores)::

    .venv/bin/python bench/taskmanager_memory.py [--jobs 10] [--out-dir bench]

It prints a table and writes ``## TaskManager memory per job`` into
``<out-dir>/REPORT.md`` and the raw numbers into ``taskmanager_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from _markdown import replace_section
from _report import machine

import pyflink_aisp.local._flink_config as flink_config
from pyflink_aisp.datasets import load_rotten_tomatoes
from pyflink_aisp.kafka import create_topics, ingest_records
from pyflink_aisp.local import FlinkCluster, LocalStack, LocalStackConfig
from pyflink_aisp.models import ensure_model_assets

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## TaskManager memory per job"
METRICS = {"metaspace": "Status.JVM.Memory.Metaspace.Used", "direct": "Status.JVM.Memory.Direct.MemoryUsed"}
MIB = 2**20
#: Wait after a job before reading the metrics: Flink's metrics.fetcher.update-interval (10 s) + 1 s.
SETTLE_S = 11.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10, help="PyFlink jobs run one after another per variant")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench", help="where the report goes")
    return p.parse_args(argv)


def taskmanager_memory(rest_url: str, timeout_s: float = 60.0) -> dict[str, float]:
    """MiB of metaspace and direct memory the (only) TaskManager reports.

    The REST API answers from what its metric fetcher got last and fetches anew in the
    background when that is older than ``metrics.fetcher.update-interval`` (10 s): call it
    :data:`SETTLE_S` after the job ended; it asks once, waits 2 s for that fetch, and reads.
    Polls until both metrics are there.
    """
    with urllib.request.urlopen(f"{rest_url}/taskmanagers", timeout=5) as resp:
        tm = json.load(resp)["taskmanagers"][0]["id"]
    query = f"{rest_url}/taskmanagers/{tm}/metrics?get={','.join(METRICS.values())}"
    urllib.request.urlopen(query, timeout=5).close()  # starts a fetch if the last is stale
    time.sleep(2.0)
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(query, timeout=5) as resp:
            values = {m["id"]: float(m["value"]) for m in json.load(resp)}
        if all(metric in values for metric in METRICS.values()):
            return {name: values[metric] / MIB for name, metric in METRICS.items()}
        if time.monotonic() > deadline:
            raise SystemExit(f"the TaskManager reported no {sorted(METRICS.values())} in {timeout_s:.0f} s")
        time.sleep(1.0)


def _oom_lines(log_dir: Path) -> list[str]:
    """Distinct ``OutOfMemoryError`` messages in the TaskManager's logs."""
    found = set()
    for path in log_dir.glob("*taskexecutor*"):
        for line in path.read_text(errors="replace").splitlines():
            if "OutOfMemoryError" in line:  # the message without its varying byte counts
                found.add(line[line.index("OutOfMemoryError"):].split(" (")[0].rstrip(".'"))
    return sorted(found)


def _after_full_gc(stack: LocalStack, rest: str) -> dict[str, float]:
    """Memory after a full GC of the TaskManager (``jcmd PID GC.run``): what the finished jobs
    really keep (a freed class loader's metaspace and buffers go only with a GC)."""
    jcmd = shutil.which("jcmd", path=str(Path(os.environ.get("JAVA_HOME", "/nonexistent")) / "bin")) or \
        shutil.which("jcmd")
    if jcmd is None:
        raise SystemExit("jcmd not found (a JDK's bin/ on PATH or JAVA_HOME)")
    (pid,) = FlinkCluster(stack.flink_config()).taskmanager_pids()
    subprocess.run([jcmd, str(pid), "GC.run"], check=True, capture_output=True, timeout=60)
    time.sleep(SETTLE_S)
    return taskmanager_memory(rest)


def run_variant(variant: str, jobs: int, model_dir: Path) -> dict[str, Any]:
    """Memory after each of up to ``jobs`` batch jobs on a fresh one-TaskManager stack.

    Returns:
        ``{"after": [{"metaspace": MiB, "direct": MiB}, ...], "failed_job": 1-based index of
        the job that failed (the run stops there) or None, "oom": the TaskManager's
        OutOfMemoryError messages}``.
    """
    real = flink_config.write_flink_lib_dir
    if variant == "per-job":  # no lib/ of ours: daemon_env falls back to PyFlink's lib/
        flink_config.write_flink_lib_dir = lambda config: config.lib_dir
    try:
        with tempfile.TemporaryDirectory(prefix="aisp-tm-memory-") as tmp:
            stack = LocalStack(LocalStackConfig.on_free_ports(Path(tmp) / "stack"))
            stack.up()
            try:
                status = stack.status()
                boot, rest = str(status.bootstrap_servers), str(status.rest_url)
                create_topics(boot, ["in"], partitions=1)
                records = [{"id": r.id, "text": r.text} for r in load_rotten_tomatoes()[:50]]
                ingest_records(boot, "in", records, progress=False)
                after = []
                for i in range(jobs):
                    cmd = stack.flink_run_command(
                        str(ROOT / "jobs" / "review_sentiment.py"), "--bootstrap-servers", boot,
                        "--input-topic", "in", "--output-topic", f"out{i}", "--mode", "batch",
                        "--model-dir", str(model_dir), "--job-name", f"memory-{i}")
                    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True)
                    if proc.returncode != 0:
                        oom = _oom_lines(stack.flink_config().log_dir)
                        print(f"[{time.strftime('%X')}] {variant} job {i + 1} FAILED; {oom}", flush=True)
                        return {"after": after, "failed_job": i + 1, "oom": oom,
                                "after_full_gc": _after_full_gc(stack, rest)}
                    time.sleep(SETTLE_S)
                    after.append(taskmanager_memory(rest))
                    print(f"[{time.strftime('%X')}] {variant} job {i + 1}: " + ", ".join(
                        f"{k} {v:.0f} MiB" for k, v in after[-1].items()), flush=True)
                return {"after": after, "failed_job": None, "oom": _oom_lines(stack.flink_config().log_dir),
                        "after_full_gc": _after_full_gc(stack, rest)}
            finally:
                stack.down()
    finally:
        flink_config.write_flink_lib_dir = real


def slope(values: list[float]) -> float:
    """MiB per job: least-squares slope over jobs 2..N."""
    tail = values[1:]
    return float(np.polyfit(np.arange(len(tail)), tail, 1)[0]) if len(tail) >= 2 else float("nan")


def section(results: dict[str, Any], machine_line: str) -> str:
    """The markdown section."""
    rows = []
    for variant, label in (("per-job", "flink-python shipped with each job (PyFlink's lib/)"),
                           ("lib", "flink-python in the daemons' lib/, Beam parent-first (default)")):
        runs, failed = results[variant]["after"], results[variant]["failed_job"]
        meta, direct = slope([r["metaspace"] for r in runs]), slope([r["direct"] for r in runs])
        messages = sorted({m.split(" (")[0].rstrip(".'") for m in results[variant]["oom"]})
        outcome = "all ran" if failed is None else f"**job {failed} failed**: " + "; ".join(
            f"`{m}`" for m in messages)
        gc = results[variant]["after_full_gc"]
        rows.append(f"| {label} | {runs[0]['metaspace']:.0f} / {runs[0]['direct']:.0f} | "
                    f"{runs[-1]['metaspace']:.0f} / {runs[-1]['direct']:.0f} | "
                    f"{gc['metaspace']:.0f} / {gc['direct']:.0f} | {meta:.1f} | {direct:.1f} | {outcome} |")
    return "\n".join([
        SECTION, "",
        f"`bench/taskmanager_memory.py --jobs {results['jobs']}`: one TaskManager of the local stack runs "
        f"`jobs/review_sentiment.py` (BATCH, 50 reviews) {results['jobs']} times; TaskManager metrics after "
        f"each job; {machine_line}.", "",
        "| variant | after job 1: metaspace / direct (MiB) | after the last | then after a full GC | "
        "metaspace MiB per job | direct MiB per job | outcome |", "|---|---|---|---|---|---|---|", *rows, "",
        "A TaskManager's direct memory is capped (here 328 MiB: framework off-heap 128 + network 200, "
        "which Flink's network buffers take whole), so what Beam's gRPC keeps per job runs into the cap.", "",
    ])


def main(argv: list[str] | None = None) -> int:
    """Run both variants; returns 1 when a job of the default (``lib``) variant failed, else 0."""
    args = parse_args(argv)
    model_dir = ensure_model_assets().directory
    results: dict[str, Any] = {"jobs": args.jobs}
    for variant in ("per-job", "lib"):
        results[variant] = run_variant(variant, args.jobs, model_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "taskmanager_memory.json").write_text(json.dumps(results, indent=2) + "\n")
    replace_section(args.out_dir / "REPORT.md", SECTION, section(results, machine()))
    for variant in ("per-job", "lib"):
        runs = results[variant]["after"]
        print(f"{variant:8} metaspace {slope([r['metaspace'] for r in runs]):5.1f} MiB/job, "
              f"direct {slope([r['direct'] for r in runs]):5.1f} MiB/job, "
              f"failed job {results[variant]['failed_job']}")
    return 1 if results["lib"]["failed_job"] else 0


if __name__ == "__main__":
    sys.exit(main())
