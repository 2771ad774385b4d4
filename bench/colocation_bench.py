"""Where the job's time goes beside the plain loop: co-location cost and latency, one run.

Not a test. Issue 24's diagnosis bench, side by side in one run on one machine
(CPU model printed):

- **plain alone**: ``OnnxSentimentModel.predict`` over the texts with the
  machine to itself (no broker, no JVM), before and after everything else;
  the judged baseline is their mean, and both are printed;
- **job variants**: ``jobs/review_sentiment.py`` (STREAMING, exactly-once)
  over the same preloaded texts, each beside the bench broker: the defaults
  (spin-wait off since 381dcb2); ``--onnx-spin-wait false`` and ``true`` (ORT's own
  default, and the job's before 381dcb2); and spin-wait off with every JVM on the machine
  (Flink's MiniCluster and the broker) reniced to +10, so the ONNX Runtime
  intra-op threads preempt them (the straggler hypothesis: a parallel op waits
  for its slowest thread, and a runnable JVM thread delays one of the two);
  and ``--jvm-jit c1`` (``c1``: the job's JVM compiles with C1 only, so no C2 compiler thread
  takes the model's cores in the first minute); and ``--parallelism 2`` over a topic of two
  partitions with one intra-op thread per run (``p2-t1``; ``p2-t1-d2`` with ``--pipeline-depth 2``: the
  local job's subtasks share one model, so two runs go at once), where no op
  waits for a second thread; and ``trace``: the defaults with the Arrow operator's per-batch
  trace (``--latency-trace-dir``), whose worker wall time per record (decode, inference, render,
  gaps between batches) the report puts beside the plain loop's; each job's records/s is the
  inference bench's (e) (a start-up probe, then every text; start-up taken out);
- **per-thread CPU** over each job's steady phase (the last nine tenths from
  its first output to its last),
  grouped by process role (broker JVM, Flink JVM, Python worker, job client,
  bench, and the bench's CPU sampler itself) and thread name, as CPU-ms per
  record, beside the plain loop's own CPU-ms per record (``time.process_time``);
  the report's diagnosis table splits each job's core-time per record beyond the
  plain loop's (cores / records/s, idle included) into those roles;
- **latency** (``--latency``): a trickle (1 record/s) and 30 % of the default
  job's throughput, with ``--latency-slo-ms``, and the same with Flink's
  ``execution.buffer-timeout.interval`` set to 5 ms through a config.yaml of
  the bench's own (``FLINK_CONF_DIR``), so its share of the end-to-end time is
  read off side by side.

Per-thread CPU comes from ``_cpu.Sampler`` (thread names from ``/proc``). Run::

    .venv/bin/python bench/colocation_bench.py [--reviews 4000] [--latency] [--out bench/colocation.json]
        [--report bench/COLOCATION.md] [--report-section bench/REPORT.md]   # --render: from --out alone
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _markdown
import _report
import psutil
from _cpu import SAMPLER_ROLE, Sampler, jit_share
from _job_runner import JobSettings
from _kafka_streaming import latency_run, throughput_run, warm_broker
from _worker_trace import worker_time

ROOT = Path(__file__).resolve().parent.parent


def plain_alone(assets: Any, texts: list[str], threads: int, batch_size: int) -> dict[str, float]:
    """The plain loop with the machine to itself; wall and CPU time per record."""
    from pyflink_aisp.inference.handlers import OnnxSentimentModel

    model = OnnxSentimentModel(assets, intra_op_num_threads=threads, batch_size=batch_size)
    model.predict(texts[:64])
    wall, cpu = time.perf_counter(), time.process_time()
    model.predict(texts)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"records_per_s": len(texts) / wall, "cpu_ms_per_record": 1000 * cpu / len(texts),
            "cores_busy": cpu / wall}


@contextlib.contextmanager
def reniced_jvms(nice: int) -> Iterator[None]:
    """Renice every java process (now and appearing while inside) to ``nice``."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for p in psutil.process_iter(["name"]):
                with contextlib.suppress(psutil.Error):
                    if p.info["name"] == "java" and p.nice() != nice:
                        p.nice(nice)
                        for t in p.threads():  # Linux: niceness is per thread
                            with contextlib.suppress(OSError):
                                os.setpriority(os.PRIO_PROCESS, t.id, nice)
            stop.wait(0.5)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def job_run(bootstrap: str, texts: list[str], settings: JobSettings, log_dir: Path, tag: str,
            renice: int | None = None, partitions: int = 1) -> dict[str, Any]:
    """One preloaded job run under the sampler (:func:`throughput_run`: a start-up probe, then all
    texts): its records/s with start-up taken out, as the inference bench's (e); where the run
    lasts two minutes or more, also its rate from a minute after its start on (``steady``: the JVMs'
    JIT compilers are done by then). CPU per record over the steady phase: from that minute on, or
    for a shorter run the last nine tenths of first output → last output."""
    with Sampler() as sampler, (reniced_jvms(renice) if renice is not None else contextlib.nullcontext()):
        run = throughput_run(bootstrap, texts, settings, log_dir=log_dir, tag=tag, partitions=partitions)
    start_s = run["started_ms"] / 1000
    first, last = start_s + run["startup_s"], start_s + run["wall_s"]
    steady = run["steady_records_per_s"]
    wall, cpu = sampler.between(start_s + run["steady_after_s"] if steady else first + (last - first) / 10,
                                last)
    by_role: dict[str, float] = defaultdict(float)
    for (role, _), sec in cpu.items():
        by_role[role] += sec
    rate = steady or run["records_per_s"]
    records = rate * wall if wall else 0.0
    top = sorted(cpu.items(), key=lambda kv: -kv[1])[:14]
    per_role = {r: 1000 * s / records for r, s in by_role.items()} if records else {}
    per_thread = [[r, t, 1000 * s / records] for (r, t), s in top] if records else []
    return {"records_per_s": run["records_per_s"], "steady_records_per_s": steady,
            "steady_after_s": run["steady_after_s"], "jit_cores": jit_share(cpu, wall),
            "outputs": run["rows"], "partitions": partitions,
            "records_per_s_first_to_last": (run["rows"] - 1) / (last - first) if last > first else 0.0,
            "first_output_s": run["startup_s"], "probe_startup_s": run["probe_startup_s"],
            "window_s": wall, "cores_busy": sum(cpu.values()) / wall if wall else 0.0,
            "cpu_ms_per_record_by_role": per_role, "top_threads_ms_per_record": per_thread}


def conf_dir_with(settings: dict[str, str]) -> Path:
    """A FLINK_CONF_DIR: PyFlink's own conf/ plus ``settings`` appended to its config.yaml."""
    import pyflink

    src = Path(pyflink.__file__).parent / "conf"
    dst = Path(tempfile.mkdtemp(prefix="aisp-bench-conf-"))
    shutil.copytree(src, dst, dirs_exist_ok=True)
    with (dst / "config.yaml").open("a") as f:
        for k, v in settings.items():
            f.write(f"\n{k}: {v}\n")
    return dst


#: --variants: name -> (label, job flags, niceness of every JVM or None).
VARIANTS: dict[str, tuple[str, tuple[str, ...], int | None]] = {
    "default": ("default", (), None),
    "spin-off": ("spin-wait off", ("--onnx-spin-wait", "false"), None),
    "spin-on": ("spin-wait on", ("--onnx-spin-wait", "true"), None),
    "trace": ("default, worker traced", (), None),  # + --latency-trace-dir: :data:`TRACED`
    "spin-off-nice": ("spin-wait off, JVMs nice +10", ("--onnx-spin-wait", "false"), 10),
    "nice": ("default, JVMs nice +10", (), 10),
    "c1": ("C1 only in the job's JVM", ("--jvm-jit", "c1"), None),
    "p2-t1": ("parallelism 2, one intra-op thread each", ("--parallelism", "2", "--intra-op-threads", "1"),
              None),
    "p2-t1-d2": ("parallelism 2, one intra-op thread each, pipeline depth 2",
                 ("--parallelism", "2", "--intra-op-threads", "1", "--pipeline-depth", "2"), None),
}
#: Variants that also write the Arrow operator's per-batch trace, summarised by ``_worker_trace``.
TRACED = frozenset({"trace"})
#: Input topic partitions of a variant (default 1): a parallel job reads one per source subtask.
PARTITIONS: dict[str, int] = {"p2-t1": 2, "p2-t1-d2": 2}


def _by_variant(res: dict[str, Any], key: str = "records_per_s") -> dict[str, list[float]]:
    base = (res["plain_before"]["records_per_s"] + res["plain_after"]["records_per_s"]) / 2
    out: dict[str, list[float]] = defaultdict(list)
    for name, r in res["jobs"].items():
        if r.get(key):
            out[name.rsplit(" #", 1)[0]].append(round(r[key] / base, 3))
    return dict(out)


#: The heading of the section that ``--report-section`` writes into a report of many benches.
SECTION = "## Co-location cost (`bench/colocation_bench.py`)"
#: The roles that ``_cpu.Sampler`` groups threads by, in the diagnosis table's order (``sampler``: the
#: bench's CPU sampler thread, split out of ``bench`` since the sampler records its own CPU).
DIAGNOSIS_ROLES = ("Flink JVM", "broker JVM", "bench", SAMPLER_ROLE, "other")


def _cores(res: dict[str, Any]) -> int:
    """The machine's cores as the run recorded them (``machine``: "<cpu>, N cores, ...")."""
    if res.get("cores"):
        return int(res["cores"])
    match = re.search(r"(\d+) cores", res["machine"])
    if match is None:
        raise ValueError(f"no core count in the run's machine line: {res['machine']!r}")
    return int(match.group(1))


def diagnosis(res: dict[str, Any]) -> list[str]:
    """Where each job's core-time per record goes beyond the plain loop's, in ms per record.

    A job's core-time per record is cores / records/s (idle time included, as the issue defines the
    co-location cost); the plain loop's the same over the mean of its two runs alone. The difference
    splits into the Python worker's CPU beyond the plain loop's own CPU per record, each other role's
    CPU, and idle core-time beyond the plain loop's; the parts add up to the difference up to the
    sampler's rounding (a thread that ends between two samples)."""
    cores = _cores(res)
    jobs = {name: j for name, j in res["jobs"].items() if "records_per_s" in j}
    roles = [r for r in DIAGNOSIS_ROLES
             if any(r in j.get("cpu_ms_per_record_by_role", {}) for j in jobs.values())]
    before, after = res["plain_before"], res["plain_after"]
    base = (before["records_per_s"] + after["records_per_s"]) / 2
    plain_total = 1000 * cores / base
    plain_cpu = (before["cpu_ms_per_record"] + after["cpu_ms_per_record"]) / 2
    lines = [f"Core-time per record ({cores} cores / records/s, idle included), ms: the plain loop alone "
             f"{plain_total:.2f} (its CPU {plain_cpu:.2f}, idle {plain_total - plain_cpu:.2f}). Each job's "
             "excess over it, split by where it went (positive: the job spent more than the plain loop):",
             "", "| job | core-ms per record | beyond plain alone | "
             "Python worker minus the plain loop's CPU | "
             + " | ".join(roles) + " | idle minus the plain loop's |",
             "|---|---|---|---|" + "---|" * len(roles) + "---|"]
    for name, j in jobs.items():
        by_role = j.get("cpu_ms_per_record_by_role", {})
        total = 1000 * cores / j["records_per_s"]
        idle = 1000 * (cores - j["cores_busy"]) / j["records_per_s"]
        worker = by_role.get("job client + Python worker", 0.0) - plain_cpu
        lines.append(f"| {name} | {total:.2f} | {total - plain_total:+.2f} | {worker:+.2f} | "
                     + " | ".join(f"{by_role.get(r, 0.0):.2f}" for r in roles)
                     + f" | {idle - (plain_total - plain_cpu):+.2f} |")
    probes = {name: j["cpu_ms_per_record_by_role"][SAMPLER_ROLE] * j["records_per_s"] / 1000.0
              for name, j in jobs.items() if SAMPLER_ROLE in j.get("cpu_ms_per_record_by_role", {})}
    if probes:
        lines += ["", "The sampler does the same work each second (a snapshot of every thread), so its CPU "
                  "per second of the run is a probe of the machine's speed during each job (higher: slower; "
                  "it also grows a little with the threads on the machine): "
                  + "; ".join(f"{name} {1000 * v:.1f} ms/s" for name, v in probes.items()) + "."]
    return lines


def render(res: dict[str, Any]) -> str:
    """The report of one run: the jobs against the plain loop alone, and their CPU per record by role."""
    before, after = res["plain_before"], res["plain_after"]
    base = (before["records_per_s"] + after["records_per_s"]) / 2
    roles = sorted({r for j in res["jobs"].values() for r in j.get("cpu_ms_per_record_by_role", {})})
    lines = ["# Co-location cost (`bench/colocation_bench.py`)", "",
             f"Machine: {res['machine']}.", "",
             f"{res['reviews']:,} reviews, {res['threads']} intra-op threads. Plain loop alone (no broker, "
             f"no JVM; batch {res['plain_batch_size']}): {before['records_per_s']:.1f} records/s before the "
             f"jobs and {after['records_per_s']:.1f} after, mean {base:.1f}; its CPU "
             f"{before['cpu_ms_per_record']:.2f} / {after['cpu_ms_per_record']:.2f} ms per record. The idle "
             f"bench broker kept {res.get('idle_broker_cores', 0.0):.2f} cores busy."
             + (f" Then one default job over {res['broker_warmup']['records']:,} reviews warmed the fresh "
                "broker, not measured." if res.get("broker_warmup", {}).get("records") else ""), "",
             f"Each job streams the reviews {res.get('repeat', 1)} time(s) over: records/s as the inference "
             "bench's (e) (start-up probe taken out); for a run of two minutes or more also from a minute "
             "after the job's start to its last output (steady: the JVMs' JIT compilers are done by then); "
             "the JVMs' JIT compiler threads and the CPU ms per record by process role over the steady "
             "phase (that minute on, else the last nine tenths; `bench` is the consumer that collects "
             "the outputs, and `sampler` the bench's thread that takes these CPU samples (in runs without "
             "a `sampler` column, `bench` holds it too); `other`, the rest of the machine: kernel workers "
             "and the like).", "",
             "| job | records/s (e) | vs plain alone | steady records/s | vs plain alone | cores busy | "
             "JIT cores | " + " | ".join(roles) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(roles)]
    for name, j in res["jobs"].items():
        if "records_per_s" not in j:
            lines.append(f"| {name} | {j.get('error', 'no result')} |")
            continue
        by_role = j.get("cpu_ms_per_record_by_role", {})
        steady = j.get("steady_records_per_s") or 0.0
        steady_cells = f"{steady:.1f} | {steady / base:.3f}x" if steady else "- | -"
        jit_cells = f"{sum(j['jit_cores'].values()):.2f}" if "jit_cores" in j else "-"
        lines.append(f"| {name} | {j['records_per_s']:.1f} | {j['records_per_s'] / base:.3f}x | "
                     f"{steady_cells} | {j['cores_busy']:.2f} | {jit_cells} | "
                     + " | ".join(f"{by_role.get(r, 0.0):.2f}" for r in roles) + " |")
    lines += ["", *diagnosis(res), *_worker_lines(res, base)]
    return "\n".join(lines) + "\n"


def _worker_lines(res: dict[str, Any], base: float) -> list[str]:
    """The traced jobs' worker wall time per record, beside the plain loop alone's (empty: none traced)."""
    traced = {n: j["worker_time_ms_per_record"] for n, j in res["jobs"].items()
              if "worker_time_ms_per_record" in j}
    if not traced:
        return []
    lines = ["", "The Python worker's wall time in the traced jobs, ms per record, from the Arrow operator's "
             "per-batch trace (`--latency-trace-dir`; decode: the records to texts; inference: the batcher's "
             "cuts, tokenizing and every model call; render: the output rows; gaps: the rest of the span, "
             "PyFlink's Arrow conversion and gRPC in the worker and the worker waiting for the JVM at bundle "
             f"ends). The plain loop alone: {1000 / base:.2f} ms per record, all of it inference.", "",
             "| job | Arrow batches | records per batch | decode | inference | render | gaps | all |",
             "|---|---|---|---|---|---|---|---|"]
    for name, w in traced.items():
        parts = [w[k] for k in ("decode", "inference", "render", "gap")]
        lines.append(f"| {name} | {w['batches']:,} | {w['records_per_batch']:.0f} | "
                     + " | ".join(f"{v:.2f}" for v in parts) + f" | {sum(parts):.2f} |")
    return lines


def write_section(res: dict[str, Any], path: Path) -> None:
    """Write :func:`render`'s report as the ``SECTION`` of ``path`` (e.g. ``bench/REPORT.md``)."""
    body = render(res).split("\n", 1)[1]
    _markdown.replace_section(path, SECTION, f"{SECTION}\n{body}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reviews", type=int, default=4000)
    p.add_argument("--repeat", type=int, default=1,
                   help="the jobs stream the reviews this many times over (2 min or more: a steady rate)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--latency", action="store_true", help="also the latency runs")
    p.add_argument("--variants", default="default,spin-off,spin-off-nice,nice",
                   help=f"job runs in this order, comma-separated, repeats allowed: {','.join(VARIANTS)}")
    p.add_argument("--broker-warmup", type=int, default=2000,
                   help="records of one unmeasured default job on the fresh broker first (0: none)")
    p.add_argument("--slo-ms", type=float, default=100.0)
    p.add_argument("--latency-cases", default="0,1,2,3,4,5,6",
                   help="which latency cases (indexes into the list in main)")
    p.add_argument("--load-seconds", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "colocation_results.json")
    p.add_argument("--report", type=Path, default=None, help="also write the markdown report here")
    p.add_argument("--report-section", type=Path, default=None,
                   help=f"also write the report as the section '{SECTION}' of this file (bench/REPORT.md)")
    p.add_argument("--render", action="store_true",
                   help="only write --report / --report-section from --out's results")
    a = p.parse_args()
    if a.render and a.report_section is not None:
        write_section(json.loads(a.out.read_text()), a.report_section)
        if a.report is None:
            return 0
    if _report.render_only(p, a, render):
        return 0

    from _kafka_load import bench_broker

    assets, texts = _report.model_and_reviews(a.reviews)
    res: dict[str, Any] = {"machine": _report.machine(), "cores": os.cpu_count(), "reviews": len(texts),
                           "repeat": a.repeat,
                           "threads": a.threads,
                           "plain_batch_size": a.batch_size, "jobs": {}, "latency": {}}
    print(json.dumps(res["machine"]), flush=True)

    def save() -> None:
        a.out.write_text(json.dumps(res, indent=1))

    res["plain_before"] = plain_alone(assets, texts, a.threads, a.batch_size)
    print(f"[plain alone] {res['plain_before']}", flush=True)
    save()
    log_dir = Path(tempfile.mkdtemp(prefix="aisp-coloc-logs-"))
    with bench_broker() as bootstrap:
        def settings(*extra: str, slo: float | None = None) -> JobSettings:
            return JobSettings(bootstrap=bootstrap, model_dir=assets.directory, intra_op_threads=a.threads,
                               checkpoint_interval_ms=5000, latency_slo_ms=slo, extra=tuple(extra))

        time.sleep(3)
        with Sampler() as idle:
            time.sleep(6)
        w, cpu = idle.between(0, time.time())
        res["idle_broker_cores"] = sum(cpu.values()) / w if w else 0.0
        res["broker_warmup"] = warm_broker(bootstrap, texts, settings(), log_dir=log_dir,
                                           records=a.broker_warmup)
        for variant in a.variants.split(","):
            name, extra, renice = VARIANTS[variant]
            name = f"{name} #{sum(k.rsplit(' #', 1)[0] == name for k in res['jobs']) + 1}"
            print(f"[job {name}] ...", flush=True)
            trace_dir = log_dir / f"trace-{len(res['jobs'])}"
            if variant in TRACED:
                extra = (*extra, "--latency-trace-dir", str(trace_dir))
            try:
                r = job_run(bootstrap, texts * a.repeat, settings(*extra), log_dir,
                            f"co-{len(res['jobs'])}", renice, PARTITIONS.get(variant, 1))
                if variant in TRACED:
                    r["worker_time_ms_per_record"] = worker_time(trace_dir)
            except Exception as exc:  # report and go on
                r = {"error": f"{type(exc).__name__}: {exc}"}
            res["jobs"][name] = r
            print(f"[job {name}] {json.dumps(r)[:600]}", flush=True)
            save()
        if a.latency:
            rates = [r["records_per_s"] for r in res["jobs"].values() if "records_per_s" in r]
            base = rates[0] if rates else 200.0
            conf = str(conf_dir_with({"execution.buffer-timeout.interval": "5 ms"}))
            slo = a.slo_ms
            cases: list[tuple[str, float, float | None, tuple[str, ...], str | None]] = [
                (f"trickle 1/s, SLO {slo:g}", 1.0, slo, (), None),
                (f"trickle 1/s, SLO {slo:g}, buffer-timeout 5 ms", 1.0, slo, (), conf),
                (f"30 %, SLO {slo:g}", 0.3 * base, slo, (), None),
                (f"30 %, SLO {slo:g}, buffer-timeout 5 ms", 0.3 * base, slo, (), conf),
                (f"30 %, SLO {slo:g}, spin-wait on", 0.3 * base, slo, ("--onnx-spin-wait", "true"), None),
                (f"30 %, SLO {slo:g}, bundle 20 ms", 0.3 * base, slo, ("--bundle-time-ms", "20"), None),
                ("30 %, no SLO (bundle 50 ms, spin-wait on)", 0.3 * base, None, (), None)]
            chosen = [c for i, c in enumerate(cases) if str(i) in a.latency_cases.split(",")]
            for key, rate, case_slo, extra, env in chosen:
                if env:
                    os.environ["FLINK_CONF_DIR"] = env
                else:
                    os.environ.pop("FLINK_CONF_DIR", None)
                try:
                    r = latency_run(bootstrap, texts, settings(*extra, slo=case_slo), rate_per_s=rate,
                                    seconds=a.load_seconds, warmup_s=5.0, log_dir=log_dir,
                                    tag=f"co-{len(res['latency'])}")
                    r.pop("latencies_ms", None)
                except Exception as exc:  # report and go on
                    r = {"error": f"{type(exc).__name__}: {exc}"}
                res["latency"][key] = r
                print(f"[latency {key}] {r}", flush=True)
                save()
            os.environ.pop("FLINK_CONF_DIR", None)
    res["plain_after"] = plain_alone(assets, texts, a.threads, a.batch_size)
    print(f"[plain alone, after] {res['plain_after']}", flush=True)
    res["ratios_to_plain_alone_by_variant"] = _by_variant(res)
    res["steady_ratios_to_plain_alone_by_variant"] = _by_variant(res, "steady_records_per_s")
    base = (res["plain_before"]["records_per_s"] + res["plain_after"]["records_per_s"]) / 2
    for r in res["jobs"].values():
        if "records_per_s" in r:
            r["ratio_to_plain_alone"] = r["records_per_s"] / base
    save()
    if a.report is not None:
        a.report.write_text(render(res), encoding="utf-8")
    if a.report_section is not None:
        write_section(res, a.report_section)
    print(json.dumps({k: v.get("ratio_to_plain_alone") for k, v in res["jobs"].items()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
