"""Kafka-in to Kafka-out latency of the streaming job, split by stage, in one run.

Each case starts the job (``jobs/review_sentiment.py``, streaming, Arrow operator,
exactly-once) on the bench broker with ``--latency-trace-dir``, writes labelled reviews at a
fixed rate, and joins per record, by id:

* the input record's broker time (``LogAppendTime``, ms);
* the Arrow operator's trace line of the batch that held it (``pyflink_aisp.pipeline._trace``):
  wall-clock entry, after decode, after inference, at return;
* the output record's broker time, read with ``isolation.level = read_uncommitted``
  (exactly-once output is visible on append, before its transaction commits).

Stages: **kafka → worker** (source fetch, the JVM's Arrow batch forming, the hop to the Python
worker), **decode**, **inference** (batcher queue and model), **render**, **worker → kafka**
(waiting for the bundle end, the hop back, the sink and its producer, the broker append).
Each stage's p50 / p99 over the measured records (after a warm-up: ``--warmup-seconds`` of load,
60 by default, as the JVMs' JIT compilers take a tenth of a core or more in a job's first minute;
10 s for a trickle) and the totals go to
``--out`` (JSON) and to stdout as a markdown table.

Cases (``--cases``, comma-separated names): ``trickle`` (1 record/s), ``load`` (``--rate``
records/s, by default ``--load-share`` (30 %) of the plain ONNX Runtime loop's rate measured first,
with the machine to itself), and their
variants with ``-lowbuf`` (``--buffer-timeout-ms 5 --sink-linger-ms 0``, against Flink's 100 ms
and the Kafka client's 5 ms), ``-b20``
(``--bundle-time-ms 20``), ``-b1`` (``--bundle-time-ms 1``), ``-spin`` (``--onnx-spin-wait true``),
``-runs2`` (``--pipeline-depth 2 --intra-op-threads 1``: two concurrent single-threaded runs),
``-record`` (``--operator record``: one model call per record in Flink's thread mode, no bundle
and no hop to a Python process), ``-record1`` (the same with ``--intra-op-threads 1``),
``-record-spin`` (the same with ``--onnx-spin-wait true``), ``-recordp2`` (the record operator at
``--parallelism 2`` over two input partitions: the subtasks share one interpreter and model in
thread mode, and the job's derived ``--pipeline-depth`` (the parallelism) runs their two calls at
once, each with half the cores' intra-op threads, ``--intra-op-threads 0``), ``-record1p2`` (the
same with ``--pipeline-depth 1`` and one intra-op thread: the two subtasks' calls take turns on the
model they share), ``-recordp2t2`` (``-recordp2`` with two intra-op threads per run: a lone call
gets both cores, two calls oversubscribe them), ``-recordp2c120`` (``-recordp2`` with 120 s
checkpoints, so none falls in the measured span), ``-recordp2chained`` (``-recordp2`` with its sinks
chained into the operator's thread, ``--separate-sinks false``), ``-recordp2tiered`` and ``-tiered``
(``-recordp2`` and the plain case with HotSpot's tiered JIT, ``--jvm-jit tiered``, where a latency
target otherwise makes the job's JVM C1 only), ``-p2`` (the Arrow operator at
``--parallelism 2`` over two input partitions, one intra-op thread), ``-p2d2`` (the same with
``--pipeline-depth 2``: two runs at once where the subtasks share a model) or
``-ct`` (the output topic keeps the sink producer's ``CreateTime``: the last stage then ends at
the sink's ``send()``, and the difference to the plain case is the producer and the broker).

For a stall hunt, ``--series-dir`` keeps each case's per-record columns (the input's broker time
and each stage, ms) and its per-second CPU seconds by process role and of the JVMs' JIT compiler
threads (``<case>-cpu.json``; ``bench/jit_windows.py`` lines the two up in windows), and
``--jvm-log-dir`` has the job's JVM (the MiniCluster runs in PyFlink's gateway JVM, which reads
``JVM_ARGS``) log its GC and safepoint pauses with epoch-ms stamps (``-Xlog:gc,safepoint``, JDK
unified logging), so that a slow record can be lined up with a pause.
Each case's result also counts how many of its slowest records met a checkpoint (read from the
job's Flink log, which PyFlink's gateway writes to ``FLINK_LOG_DIR``), against the share of all
records that did.

Usage::

    .venv/bin/python bench/latency_bench.py [--cases trickle,load] [--rate 60] [--slo-ms 100]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import _report
import numpy as np
from _cpu import Sampler, jit_series, jit_share
from _job_runner import JobSettings, StreamingJob, command_line
from _kafka_load import bench_broker, collect_stamps, create_stamped_topics, produce_all, produce_at_rate
from _kafka_streaming import READY_RECORDS, STARTUP_TIMEOUT_S, _collect, _topics
from _stalls import checkpoint_summary, pause_summary, read_checkpoints, read_pause_dir, wait_split

from pyflink_aisp.kafka import create_topics

ROOT = Path(__file__).resolve().parent.parent
VARIANTS: dict[str, tuple[str, ...]] = {
    "": (), "lowbuf": ("--buffer-timeout-ms", "5", "--sink-linger-ms", "0"),
    "b20": ("--bundle-time-ms", "20"), "b1": ("--bundle-time-ms", "1"), "spin": ("--onnx-spin-wait", "true"),
    "runs2": ("--pipeline-depth", "2", "--intra-op-threads", "1"), "ct": (),
    "record": ("--operator", "record"), "record1": ("--operator", "record", "--intra-op-threads", "1"),
    "record-spin": ("--operator", "record", "--onnx-spin-wait", "true"),
    "record1p2": ("--operator", "record", "--intra-op-threads", "1", "--pipeline-depth", "1",
                  "--parallelism", "2"),
    "recordp2": ("--operator", "record", "--intra-op-threads", "0", "--parallelism", "2"),
    "recordp2t2": ("--operator", "record", "--intra-op-threads", "2", "--parallelism", "2"),
    "recordp2c120": ("--operator", "record", "--intra-op-threads", "0", "--parallelism", "2",
                     "--checkpoint-interval-ms", "120000"),
    "recordp2chained": ("--operator", "record", "--intra-op-threads", "0", "--parallelism", "2",
                        "--separate-sinks", "false"),
    "recordp2tiered": ("--operator", "record", "--intra-op-threads", "0", "--parallelism", "2",
                       "--jvm-jit", "tiered"),
    "tiered": ("--jvm-jit", "tiered"),
    "p2": ("--intra-op-threads", "1", "--parallelism", "2"),
    "p2d2": ("--intra-op-threads", "1", "--parallelism", "2", "--pipeline-depth", "2")}
#: Input topic partitions of a variant (default 1): a parallel job reads one per source subtask.
PARTITIONS: dict[str, int] = {"record1p2": 2, "recordp2": 2, "recordp2t2": 2, "recordp2c120": 2,
                              "recordp2chained": 2, "recordp2tiered": 2, "p2": 2, "p2d2": 2}
STAGES = ("kafka_to_worker", "decode", "inference", "render", "worker_to_kafka", "total")


def read_trace(directory: Path) -> dict[str, dict[str, float]]:
    """Id → the trace line of the batch that held it (``batch`` = its size, ``worker`` = the index
    of its worker's file: one per operator subtask)."""
    by_id: dict[str, dict[str, float]] = {}
    for worker, path in enumerate(sorted(directory.glob("aisp-latency-*.jsonl"))):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            ids = row.pop("ids")
            for i in ids:
                by_id.setdefault(i, {**row, "batch": float(len(ids)), "worker": float(worker)})
    return by_id


def stages(inputs: dict[str, int], outputs: dict[str, int], trace: dict[str, dict[str, float]],
           keys: list[str], since_ms: float) -> dict[str, np.ndarray]:
    """Per stage, the ms of each measured key (input appended at or after ``since_ms``)."""
    rows = [(inputs[k], trace[k], outputs[k]) for k in keys
            if k in inputs and k in outputs and k in trace and inputs[k] >= since_ms]
    cols: dict[str, list[float]] = {s: [] for s in (*STAGES, "batch", "t_in_ms", "worker")}
    for t_in, t, t_out in rows:
        cols["t_in_ms"].append(float(t_in))
        cols["kafka_to_worker"].append(t["enter_ms"] - t_in)
        cols["decode"].append(t["decoded_ms"] - t["enter_ms"])
        cols["inference"].append(t["inferred_ms"] - t["decoded_ms"])
        cols["render"].append(t["exit_ms"] - t["inferred_ms"])
        cols["worker_to_kafka"].append(t_out - t["exit_ms"])
        cols["total"].append(float(t_out - t_in))
        cols["batch"].append(t["batch"])
        cols["worker"].append(t["worker"])
    return {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}


def run_case(bootstrap: str, texts: list[str], settings: JobSettings, *, rate: float, seconds: float,
             warmup_s: float, log_dir: Path, tag: str, create_time: bool = False,
             series: Path | None = None, jvm_log_dir: Path | None = None,
             partitions: int = 1) -> dict[str, Any]:
    """One case: the job with a trace, ``rate`` records/s for ``seconds``; the stage table.

    ``create_time``: the output topic keeps the producer's ``CreateTime`` (the sink's
    ``send()``, the Flink record carrying no timestamp), so the last stage ends at the sink's
    send instead of the broker's append. ``series``: a JSON file for the per-record columns
    (input broker time and each stage, ms), to line stalls up with other logs. ``jvm_log_dir``:
    where the job's JVM logs its safepoints; the result gets their summary (``_stalls``).
    """
    trace_dir = Path(tempfile.mkdtemp(prefix=f"aisp-lat-trace-{tag}-"))
    flink_logs = log_dir / f"flink-{tag}"  # PyFlink's gateway logs the MiniCluster there
    os.environ["FLINK_LOG_DIR"] = str(flink_logs)
    settings = dataclasses.replace(settings, extra=(*settings.extra, "--latency-trace-dir", str(trace_dir)))
    in_topic, out_topic = _topics(f"lat-{tag}")
    create_stamped_topics(bootstrap, [in_topic] if create_time else [in_topic, out_topic],
                          partitions=partitions)
    if create_time:
        create_topics(bootstrap, [out_topic], partitions=1, replication_factor=1)
    with StreamingJob(settings, in_topic, out_topic, log_dir / f"{in_topic}.log") as job:
        ready = [(f"ready-{i}", texts[i % len(texts)]) for i in range(READY_RECORDS)]
        produce_all(bootstrap, in_topic, ready)
        if len(_collect(job, bootstrap, out_topic, READY_RECORDS, STARTUP_TIMEOUT_S)) < READY_RECORDS:
            raise RuntimeError(f"the job did not answer within {STARTUP_TIMEOUT_S:.0f} s:\n{job.log_tail()}")
        with Sampler(period_s=1.0) as sampler:  # the JVMs' JIT compiler threads, warm-up against measured
            load = produce_at_rate(bootstrap, in_topic, texts, rate_per_s=rate, seconds=seconds,
                                   key_prefix="L")
        want = READY_RECORDS + len(load.keys)
        outputs = _collect(job, bootstrap, out_topic, want, 60.0)
    inputs = collect_stamps(bootstrap, in_topic, want=want, timeout_s=30.0)
    trace = read_trace(trace_dir)
    cols = stages(inputs, outputs, trace, load.keys, (load.start_s + warmup_s) * 1000.0)
    since_ms = (load.start_s + warmup_s) * 1000.0  # the warm-up's own end-to-end times, for the record
    spans = {"warmup": (load.start_s, load.start_s + warmup_s),
             "measured": (load.start_s + warmup_s, load.start_s + load.seconds)}
    jit = {span: jit_share(cpu, wall) for span, (lo, hi) in spans.items()
           for wall, cpu in [sampler.between(lo, hi)]}
    warm = np.asarray([outputs[k] - inputs[k] for k in load.keys
                       if k in outputs and k in inputs and inputs[k] < since_ms], dtype=np.float64)
    shutil.rmtree(trace_dir, ignore_errors=True)
    n = int(cols["total"].size)
    if series is not None:
        series.write_text(json.dumps({k: v.tolist() for k, v in cols.items()}), encoding="utf-8")
        series.with_name(f"{series.stem}-cpu.json").write_text(json.dumps(jit_series(sampler.samples)),
                                                               encoding="utf-8")

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if a.size else float("nan")

    work = cols["decode"] + cols["inference"] + cols["render"]
    split = {"wait_split": wait_split(cols["t_in_ms"], cols["kafka_to_worker"], work, cols["worker"])}
    pauses = {} if jvm_log_dir is None else {"jvm_pauses": pause_summary(
        read_pause_dir(jvm_log_dir), cols["t_in_ms"], cols["kafka_to_worker"], cols["total"])}
    checkpoints = read_checkpoints(line for log in sorted(flink_logs.glob("*.log"))
                                   for line in log.read_text(encoding="utf-8", errors="replace").splitlines())
    split["checkpoints"] = checkpoint_summary(checkpoints, cols["t_in_ms"], cols["total"])
    return {**split, **pauses, "rate_per_s": load.achieved_per_s, "measured": n, "sent": len(load.keys),
            "missing_outputs": sum(1 for k in load.keys if k not in outputs),
            "batch_p50": pct(cols["batch"], 50), "warmup_s": warmup_s, "jit_cores": jit,
            "warmup_total": {"p50_ms": pct(warm, 50), "p99_ms": pct(warm, 99), "records": int(warm.size)},
            "stages": {s: {"p50_ms": pct(cols[s], 50), "p99_ms": pct(cols[s], 99), "mean_ms":
                           float(cols[s].mean()) if n else float("nan")} for s in STAGES},
            "command": command_line(settings, (in_topic, out_topic))}


def plain_loop(assets: Any, texts: list[str], threads: int) -> dict[str, float]:
    """The plain ONNX Runtime loop (batches of 32, the job's default) with the machine to itself,
    and its time per call at batch sizes 1, 4 and 8 (median ms): the model's own share of each
    stage table's inference column."""
    from pyflink_aisp.inference.handlers import OnnxSentimentModel

    model = OnnxSentimentModel(assets, intra_op_num_threads=threads, batch_size=32)
    model.predict(texts[:64])
    wall = time.perf_counter()
    model.predict(texts)
    out: dict[str, float] = {"records_per_s": len(texts) / (time.perf_counter() - wall)}
    for size in (1, 4, 8):
        calls = []
        for i in range(0, 200, size):
            t = time.perf_counter()
            model.predict(texts[i:i + size])
            calls.append((time.perf_counter() - t) * 1000.0)
        out[f"batch_{size}_ms"] = float(np.median(calls))
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    """The markdown table: one row per case, p50 / p99 per stage (ms)."""
    head = "| case | rate (rec/s) | records | " + " | ".join(s.replace("_", " ") for s in STAGES) + " |"
    lines = [head, "|" + "---|" * (3 + len(STAGES))]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} |")
            continue
        cells = [f"{r['stages'][s]['p50_ms']:.1f} / {r['stages'][s]['p99_ms']:.1f}" for s in STAGES]
        lines.append(f"| {name} | {r['rate_per_s']:.1f} | {r['measured']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def warmup_text(results: dict[str, dict[str, Any]]) -> str:
    """One line per case: end-to-end p50 / p99 of its warm-up records (before the measured span), and
    the cores the JVMs' JIT compiler threads kept busy in each span."""
    def jit(r: dict[str, Any], span: str) -> str:
        cores = r.get("jit_cores", {}).get(span, {})
        return ", ".join(f"{role} {c:.2f}" for role, c in sorted(cores.items())) or "none seen"

    lines = [f"- {name}: {w['records']} records in its first {r['warmup_s']:g} s, {w['p50_ms']:.1f} / "
             f"{w['p99_ms']:.1f} ms; JIT compiler threads (cores busy) {jit(r, 'warmup')} in the warm-up, "
             f"{jit(r, 'measured')} in the measured span"
             for name, r in results.items() if (w := r.get("warmup_total"))]
    return ("\n\nThe warm-up, end to end (p50 / p99), not in the table:\n\n" + "\n".join(lines)
            if lines else "")


def waits_text(results: dict[str, dict[str, Any]]) -> str:
    """One line per case: the Kafka-to-worker wait split into queueing and stalls (``_stalls``)."""
    lines = [f"- {name}: the worker busy {w['busy_share']:.0%} of the time; p99 {w['queued_p99_ms']:.1f} ms "
             f"behind a busy worker, {w['stalled_p99_ms']:.1f} ms with it idle" for name, r in results.items()
             if (w := r.get("wait_split"))]
    return ("\n\nThe Kafka-to-worker wait, split: queued behind the worker's previous call (up to its "
            "end) or stalled with the worker idle (fetch, bundle forming, hops, scheduling, pauses):\n\n"
            + "\n".join(lines)) if lines else ""


def pauses_text(results: dict[str, dict[str, Any]]) -> str:
    """One line per case with the job JVM's safepoints (``--jvm-log-dir``), or nothing."""
    lines = [f"- {name}: {j['pauses']} safepoints, {j['pause_ms_total']:.1f} ms in all, the longest "
             f"{j['pause_ms_max']:.1f} ms; {j['slow_records_in_pause']} of the {j['slow_records']} slowest "
             "records (1 %) waited across one of 5 ms or more" for name, r in results.items()
             if (j := r.get("jvm_pauses"))]
    return ("\n\nThe job JVM's safepoints (GC and other VM operations) over each case's measured span:\n\n"
            + "\n".join(lines)) if lines else ""


def checkpoints_text(results: dict[str, dict[str, Any]]) -> str:
    """One line per case: how many of the slowest records met a checkpoint, against all records."""
    lines = [f"- {name}: {c['checkpoints']} checkpoints (the longest {c['duration_ms_max']:.0f} ms); "
             f"{c['slow_records_at_checkpoint']} of the {c['slow_records']} slowest records (1 %) met one or "
             f"its next 250 ms, against {c['share_at_checkpoint']:.0%} of all records"
             for name, r in results.items() if (c := r.get("checkpoints")) and c["checkpoints"] is not None]
    return ("\n\nCheckpoints over each case's measured span (trigger to last acknowledgement, from the "
            "job's CheckpointCoordinator log):\n\n" + "\n".join(lines)) if lines else ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="trickle,load")
    p.add_argument("--rate", type=float, default=0.0,
                   help="records/s of the load cases (0: --load-share of the plain loop's rate)")
    p.add_argument("--load-share", type=float, default=0.3)
    p.add_argument("--slo-ms", type=float, default=100.0, help="--latency-slo-ms of every case (0: none)")
    p.add_argument("--trickle-seconds", type=float, default=60.0)
    p.add_argument("--load-seconds", type=float, default=30.0, help="measured span of a load case")
    p.add_argument("--warmup-seconds", type=float, default=60.0,
                   help="load before the measured span of a load case: the JVMs' JIT compilers (the job's "
                        "and the broker's C2) take a tenth of a core or more in a job's first minute")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--job-args", default="", help="more job flags for every case, space-separated")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "latency_results.json")
    p.add_argument("--report", type=Path, default=ROOT / "bench" / "LATENCY.md")
    p.add_argument("--render", action="store_true", help="only write --report from --out's results")
    p.add_argument("--series-dir", type=Path, default=None,
                   help="write each case's per-record columns (ms) to DIR/<case>.json")
    p.add_argument("--jvm-log-dir", type=Path, default=None,
                   help="the job's JVM logs its GC and safepoint pauses (epoch ms) to DIR/jvm-<pid>.log")
    a = p.parse_args()
    if a.render:
        a.report.write_text(render(json.loads(a.out.read_text())), encoding="utf-8")
        return 0

    from pyflink_aisp.datasets import load_rotten_tomatoes
    from pyflink_aisp.models import ensure_model_assets

    assets = ensure_model_assets()
    texts = [r.text for r in load_rotten_tomatoes()]
    res: dict[str, Any] = {"machine": _report.machine(), "slo_ms": a.slo_ms or None, "cases": {}}
    for d in (a.series_dir, a.jvm_log_dir):
        if d is not None:
            d.mkdir(parents=True, exist_ok=True)
    if a.jvm_log_dir is not None:  # PyFlink's gateway reads JVM_ARGS; the MiniCluster runs in that JVM
        os.environ["JVM_ARGS"] = (os.environ.get("JVM_ARGS", "") + " -Xlog:gc,safepoint:file="
                                  f"{a.jvm_log_dir.resolve()}/jvm-%p.log:timemillis,uptimemillis").strip()
    print(json.dumps(res["machine"]), flush=True)
    res["plain_before"] = plain_loop(assets, texts[:2000], a.threads)
    print(f"[plain loop, machine to itself] {res['plain_before']}", flush=True)
    load_rate = a.rate or round(a.load_share * res["plain_before"]["records_per_s"], 1)
    res["load_rate_per_s"] = load_rate
    res["warmup_s"] = a.warmup_seconds
    log_dir = Path(tempfile.mkdtemp(prefix="aisp-lat-logs-"))
    with bench_broker() as bootstrap:
        for i, name in enumerate(a.cases.split(",")):
            base, _, variant = name.partition("-")
            rate, seconds, warmup = ((1.0, a.trickle_seconds, min(10.0, a.trickle_seconds / 3))
                                     if base == "trickle" else
                                     (load_rate, a.warmup_seconds + a.load_seconds, a.warmup_seconds))
            extra = tuple(a.job_args.split()) + VARIANTS[variant]
            settings = JobSettings(bootstrap=bootstrap, model_dir=assets.directory,
                                   intra_op_threads=a.threads, checkpoint_interval_ms=5000,
                                   latency_slo_ms=a.slo_ms or None, extra=extra)
            print(f"[{name}] {rate:g} records/s for {seconds:g} s ...", flush=True)
            started = time.monotonic()
            try:
                r = run_case(bootstrap, texts, settings, rate=rate, seconds=seconds,
                             warmup_s=warmup, log_dir=log_dir, tag=f"{i}-{name}",
                             create_time=variant == "ct",
                             series=a.series_dir / f"{i}-{name}.json" if a.series_dir else None,
                             jvm_log_dir=a.jvm_log_dir, partitions=PARTITIONS.get(variant, 1))
            except Exception as exc:  # report and go on
                r = {"error": f"{type(exc).__name__}: {exc}"}
            r["wall_s"] = time.monotonic() - started
            repeat = sum(k.split(" #")[0] == name for k in res["cases"])
            res["cases"][f"{name} #{repeat + 1}" if repeat else name] = r  # a repeated case keeps both
            print(f"[{name}] {json.dumps(r)[:900]}", flush=True)
            a.out.write_text(json.dumps(res, indent=1))
    report = render(res)
    a.report.write_text(report, encoding="utf-8")
    print(report)
    return 0


def render(res: dict[str, Any]) -> str:
    """``bench/LATENCY.md`` of a results object (``--out``)."""
    plain = res.get("plain_before", {})
    slo = res.get("slo_ms")
    return (f"# Latency by stage (`bench/latency_bench.py`)\n\nMachine: {res['machine']}.\n\n"
              f"Plain ONNX Runtime loop first, machine to itself: {plain.get('records_per_s', 0):.1f} "
              f"records/s at batch 32; one call of batch 1 / 4 / 8: {plain.get('batch_1_ms', 0):.1f} / "
              f"{plain.get('batch_4_ms', 0):.1f} / {plain.get('batch_8_ms', 0):.1f} ms (median). Load "
              f"cases at {res.get('load_rate_per_s', 0):.1f} records/s.\n\n"
              f"`--latency-slo-ms {slo or 'none'}` in every case; 5,000 ms checkpoints (120,000 for -c120), "
              "exactly-once sinks, "
              "one partition per topic (two for the -p2 variants, which run at --parallelism 2; their "
              "wait split is per subtask). Each cell: p50 / p99 in ms over the measured records (after "
              f"{res.get('warmup_s', 10):g} s of load for the load cases, 10 s for a trickle: the JVMs' JIT "
              "compilers run for about a minute after a job starts), joined by id from the input "
              "record's broker time, the Arrow operator's "
              "trace (`--latency-trace-dir`) and the output record's broker time.\n\n"
              + table(res["cases"]) + warmup_text(res["cases"]) + waits_text(res["cases"])
              + checkpoints_text(res["cases"])
              + pauses_text(res["cases"])
              + "\n\nCommands:\n\n" + "".join(
                  f"- {name}: `{r.get('command', '')}`\n" for name, r in res["cases"].items()))


if __name__ == "__main__":
    raise SystemExit(main())
