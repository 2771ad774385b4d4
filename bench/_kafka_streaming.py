"""Case (e) and the latency runs: the streaming job between broker-stamped topics.

Each run creates its own input and output topics (LogAppendTime) with a run
tag in the name, so its job starts with a fresh consumer group, and reads its
output with ``isolation.level = read_uncommitted`` (see ``_kafka_load.py``).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from _job_runner import JobSettings, StreamingJob, command_line
from _kafka_load import (
    EndOffsets,
    collect_stamps,
    create_stamped_topics,
    join_latencies,
    missing,
    produce_all,
    produce_at_rate,
)

__all__ = ["latency_run", "steady_rate", "throughput_run", "warm_broker"]

#: Records written and awaited before a load phase: the job is up and its model loaded.
READY_RECORDS = 20
#: Longest wait for a job's first outputs (start-up: JVM, MiniCluster, Python worker, model), seconds.
STARTUP_TIMEOUT_S = 240.0


def _topics(tag: str) -> tuple[str, str]:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", tag).strip("-")
    run = uuid.uuid4().hex[:6]
    return f"bench-{name}-{run}-in", f"bench-{name}-{run}-out"


def _collect(job: StreamingJob, bootstrap: str, topic: str, want: int, timeout_s: float,
             progress_every_s: float = 0.0) -> dict[str, int]:
    """Output stamps of ``want`` keys, checking each second that the job still runs.

    Waits on the topic's end offset, asked each second by one consumer (:class:`EndOffsets`), and
    reads the records once it reaches ``want``, so the reader takes little CPU from the job meanwhile.
    """
    stamps: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    shown = time.monotonic()
    with EndOffsets(bootstrap, topic) as offsets:
        while len(stamps) < want and time.monotonic() < deadline:
            job.check_alive()
            end = offsets.end()
            if end >= want:
                stamps = collect_stamps(bootstrap, topic, want=want,
                                        timeout_s=max(0.5, min(5.0, deadline - time.monotonic())))
            else:
                time.sleep(1.0)
            if progress_every_s and len(stamps) < want and time.monotonic() - shown >= progress_every_s:
                shown = time.monotonic()
                print(f"    {topic}: {end:,}/{want:,} outputs", flush=True)
    return stamps


def _run_preloaded(bootstrap: str, texts: list[str], settings: JobSettings, log_dir: Path,
                   tag: str, partitions: int = 1) -> tuple[dict[str, float], float, float]:
    """Preload ``texts`` into a topic of ``partitions`` partitions (keys hashed across them), run
    the job until every output arrived; returns the output append times (ms) by key, the job's
    start (ms) and how long it took to stop (s)."""
    in_topic, out_topic = _topics(tag)
    create_stamped_topics(bootstrap, [in_topic, out_topic], partitions=partitions)
    produce_all(bootstrap, in_topic, [(f"r{i}", t) for i, t in enumerate(texts)])
    with StreamingJob(settings, in_topic, out_topic, log_dir / f"{in_topic}.log") as job:
        timeout = STARTUP_TIMEOUT_S + len(texts) / 20.0
        out = _collect(job, bootstrap, out_topic, len(texts), timeout, progress_every_s=10.0)
        started_ms = job.started_s * 1000.0
    if len(out) < 2:
        raise RuntimeError(f"{len(out)} outputs within {timeout:.0f} s")
    return out, started_ms, job.stop_s


def steady_rate(output_ms: Iterable[float], started_ms: float, after_s: float) -> float:
    """Records/s of the outputs appended from ``after_s`` after ``started_ms`` (epoch ms) to the last
    of them, over that span; 0.0 where the last came less than ``2 * after_s`` after the start."""
    times = list(output_ms)
    last = max(times, default=started_ms)
    since = started_ms + after_s * 1000.0
    if last - started_ms < 2 * after_s * 1000.0:
        return 0.0
    return sum(1 for t in times if t >= since) / ((last - since) / 1000.0)


def warm_broker(bootstrap: str, texts: list[str], settings: JobSettings, *, log_dir: Path,
                records: int = 2000) -> dict[str, Any]:
    """Run the job once over ``records`` texts on a fresh broker, outputs discarded, before any
    measured job: the first exactly-once job on a new broker JVM also pays that JVM's JIT warm-up
    of its transaction and fetch paths, which a long-running broker has done long before.

    Returns:
        ``records`` and ``seconds`` (the run, start-up included); ``{"records": 0}`` for 0.

    Raises:
        RuntimeError: the job exited or produced no output in time.
    """
    if records <= 0:
        return {"records": 0}
    chosen = (texts * (records // max(1, len(texts)) + 1))[:records]
    print(f"[broker warm-up] the job over {len(chosen):,} reviews, not measured ...", flush=True)
    began = time.monotonic()
    _run_preloaded(bootstrap, chosen, settings, log_dir, "broker-warmup")
    return {"records": len(chosen), "seconds": round(time.monotonic() - began, 1)}


def throughput_run(bootstrap: str, texts: list[str], settings: JobSettings, *, log_dir: Path,
                   tag: str, probe: int = 64, partitions: int = 1,
                   steady_after_s: float = 60.0) -> dict[str, Any]:
    """(e): preload all texts into a topic of ``partitions`` partitions, run the job until every
    output arrived; before it, a probe run over the first ``probe`` texts measures start-up alone.
    ``steady_after_s``: also the rate of the outputs from that long after the process start on
    (the JVMs' JIT compilers are busy for about a minute), where the run lasts at least twice that.

    Returns:
        ``records_per_s`` (outputs / (last output - process start - the probe's
        process start → last output): the records' time with start-up taken out;
        outputs leave the Python worker in bursts, one per bundle, so the spacing
        of output times alone would mislead), ``probe_startup_s``,
        ``startup_s`` (process start to first output), ``span_s``, ``rows``,
        ``wall_s`` (process start to last output), ``started_ms`` (the process start, epoch ms),
        ``steady_records_per_s`` (outputs appended from ``steady_after_s`` after the process start to
        the last, over that span; 0.0 for a shorter run) and ``steady_after_s``.

    Raises:
        RuntimeError: the job exited or produced no output in time.
    """
    print(f"[{tag}] start-up probe: {probe} reviews ...", flush=True)
    probe_out, probe_start_ms, _ = _run_preloaded(bootstrap, texts[:probe], settings, log_dir, f"{tag}-probe",
                                                  partitions)
    probe_s = (max(probe_out.values()) - probe_start_ms) / 1000.0
    print(f"[{tag}] streaming job over {len(texts):,} preloaded reviews ...", flush=True)
    out, started_ms, stop_s = _run_preloaded(bootstrap, texts, settings, log_dir, tag, partitions)
    print(f"[{tag}] job stopped in {stop_s:.1f} s", flush=True)
    first, last = min(out.values()), max(out.values())
    span_s = (last - started_ms) / 1000.0 - probe_s
    result = {"records_per_s": len(out) / span_s if span_s > 0 else 0.0, "rows": len(out),
              "steady_records_per_s": steady_rate(out.values(), started_ms, steady_after_s),
              "steady_after_s": steady_after_s,
              "probe_startup_s": probe_s,
              "expected": len(texts), "span_s": span_s, "startup_s": (first - started_ms) / 1000.0,
              "wall_s": (last - started_ms) / 1000.0, "slo_ms": settings.latency_slo_ms,
              "started_ms": started_ms, "partitions": partitions,
              "command": command_line(settings, _topics(tag))}
    print(f"[{tag}] {result['records_per_s']:,.0f} records/s steady, start-up {probe_s:.1f} s (probe), "
          f"{len(out):,}/{len(texts):,} outputs", flush=True)
    return result


def latency_run(bootstrap: str, texts: list[str], settings: JobSettings, *, rate_per_s: float,
                seconds: float, warmup_s: float, log_dir: Path, tag: str,
                partitions: int = 1) -> dict[str, Any]:
    """One offered load: start the job, wait until it answers, then write at ``rate_per_s`` into a
    topic of ``partitions`` partitions.

    Returns:
        Offered and achieved rate, measured and missing records, p50/p90/p99/max
        latency (ms) and the latencies themselves (ms, send order).

    Raises:
        RuntimeError: the job exited or never answered the readiness records.
    """
    in_topic, out_topic = _topics(f"lat-{tag}")
    create_stamped_topics(bootstrap, [in_topic, out_topic], partitions=partitions)
    print(f"[latency {tag}] {rate_per_s:,.0f} records/s for {seconds:.0f} s ...", flush=True)
    with StreamingJob(settings, in_topic, out_topic, log_dir / f"{in_topic}.log") as job:
        ready = [(f"ready-{i}", texts[i % len(texts)]) for i in range(READY_RECORDS)]
        produce_all(bootstrap, in_topic, ready)
        if len(_collect(job, bootstrap, out_topic, READY_RECORDS, STARTUP_TIMEOUT_S)) < READY_RECORDS:
            raise RuntimeError(f"the job did not answer within {STARTUP_TIMEOUT_S:.0f} s:\n{job.log_tail()}")
        load = produce_at_rate(bootstrap, in_topic, texts, rate_per_s=rate_per_s, seconds=seconds,
                               key_prefix="L")
        want = READY_RECORDS + len(load.keys)
        outputs = _collect(job, bootstrap, out_topic, want, 60.0)
    print(f"[latency {tag}] job stopped in {job.stop_s:.1f} s", flush=True)
    inputs = collect_stamps(bootstrap, in_topic, want=want, timeout_s=30.0)
    since_ms = int((load.start_s + warmup_s) * 1000)
    lat = join_latencies(inputs, outputs, keys=load.keys, since_ms=since_ms)
    result = _summary(lat, load.target_per_s, load.achieved_per_s,
                      missing(inputs, outputs, keys=load.keys, since_ms=since_ms))
    print(f"[latency {tag}] p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms "
          f"({result['measured']:,} records, {result['missing']} missing)", flush=True)
    return result


def _summary(lat: np.ndarray, target: float, achieved: float, lost: int) -> dict[str, Any]:
    def pct(q: float) -> float:
        return float(np.percentile(lat, q)) if lat.size else float("nan")

    return {"target_per_s": target, "achieved_per_s": achieved, "measured": int(lat.size), "missing": lost,
            "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99),
            "max_ms": float(lat.max()) if lat.size else float("nan"),
            "latencies_ms": [float(x) for x in lat]}
