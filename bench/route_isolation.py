"""Routing (issue 26): does a route slowed 10x change the other route's latency?

Not a test. Starts its own local stack (Kafka broker + Flink standalone cluster) and runs the
packaged job (``jobs/review_sentiment.py``, STREAMING, exactly-once, ``flink run -d``) with a
registry route: records of kind ``a`` go to the model ``fast_a``, the others (kind ``b``) to the
default ``model_b``. Both models are the lexicon scorer of ``jobs/examples/lexicon_handler.py`` with
a fixed sleep per call and per record (``bench/_route_handlers.py``, shipped with ``-pyfs``), so
each model's cost is known exactly and a slowed model takes no CPU from the other.

A producer writes real reviews (Rotten Tomatoes, held-out split) as ``{"id", "text", "kind"}`` at
``--rate-per-kind`` records/s of each kind on average: by default a Poisson stream (random gaps,
each record's kind drawn 50/50, the same seeded stream in every case; ``--arrivals even``: kinds
alternating at fixed gaps, where a slow call of one kind rarely overlaps the next record of the
other), into a topic whose records the broker stamps on append (``LogAppendTime``); the job's output
topic is stamped the same way and read ``read_uncommitted``, so latency = output append time - input
append time on the broker's one clock (as ``bench/latency_bench.py``). Each case is a fresh job; per
case, after the job answered readiness records, ``--warmup-s`` of load is discarded and
``--measure-s`` measured.

Layouts (``--layouts``), each run with both models at the normal delay and with ``model_b`` slowed
``--slow-factor`` x:

* ``one``: ``--route-operators one``, the route in one Python operator, chained to the source and
  the sinks (one task: one thread per subtask);
* ``per-rule``: ``--route-operators per-rule`` (the job's default): an operator per rule and one
  for the default, each behind a ``rescale`` exchange (a task of its own), their outputs united
  before the sinks (a task of their own).

Every job runs with ``--latency-slo-ms 100`` and ``--buffer-timeout-ms 5`` (Flink's default of 100
ms would hold the outputs that cross a network channel, as ``per-rule``'s do, up to 100 ms). Per
case the job graph (Flink REST ``/jobs/<id>`` vertices, ``/jobs/<id>/plan`` edges), the Python
worker processes and, every 5 s of the load, each task's ``busyTimeMsPerSecond`` /
``backPressuredTimeMsPerSecond`` are recorded.

Run (about 7 min on 2 cores)::

    .venv/bin/python bench/route_isolation.py [--rate-per-kind 10] [--measure-s 60] [--warmup-s 5]

It prints the machine, writes ``## Routing: a slow route beside a fast one`` into
``bench/REPORT.md``, the plot ``bench/route_isolation.png`` and the raw numbers
``bench/route_isolation.json`` (``--report-only`` writes the report and plot again from it)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from _kafka_load import EndOffsets, collect_stamps, create_stamped_topics, join_latencies, missing
from _markdown import replace_section
from _report import machine
from confluent_kafka import Producer

from pyflink_aisp.datasets import load_rotten_tomatoes, split_reviews
from pyflink_aisp.kafka import create_topics
from pyflink_aisp.local import LocalStack, LocalStackConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "jobs" / "examples"
SECTION = "## Routing: a slow route beside a fast one"
PNG = "route_isolation.png"
KINDS = ("a", "b")
LAYOUTS = ("one", "per-rule")
LOWBUF = ("--buffer-timeout-ms", "5")
METRICS = ("busyTimeMsPerSecond", "backPressuredTimeMsPerSecond")
READY_PER_KIND = 10
STARTUP_TIMEOUT_S = 180.0
SLO_MS = 100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate-per-kind", type=float, default=10.0, help="records/s written of each kind")
    p.add_argument("--arrivals", choices=("poisson", "even"), default="poisson",
                   help="poisson: random gaps and kinds, the same in every case (--seed); even: kinds "
                   "alternate at fixed gaps")
    p.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals and kinds")
    p.add_argument("--warmup-s", type=float, default=5.0, help="load seconds discarded per case")
    p.add_argument("--measure-s", type=float, default=60.0, help="load seconds measured per case")
    p.add_argument("--ms-per-record", type=float, default=2.0, help="both models' normal delay per record")
    p.add_argument("--ms-per-batch", type=float, default=1.0, help="both models' normal delay per call")
    p.add_argument("--slow-factor", type=float, default=10.0, help="model_b's delays times this, slowed")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench")
    p.add_argument("--report-only", action="store_true",
                   help="write the report and plot again from OUT_DIR/route_isolation.json; run nothing")
    args = p.parse_args(argv)
    args.layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not args.layouts or set(args.layouts) - set(LAYOUTS):
        p.error(f"--layouts takes {', '.join(LAYOUTS)}")
    return args


@dataclass(frozen=True)
class Case:
    """One job: a layout of the route, and whether model_b is slowed."""

    layout: str
    slow: bool

    @property
    def name(self) -> str:
        return f"{self.layout}/{'b slowed' if self.slow else 'normal'}"


def write_registry(path: Path, lexicon: Path, sha: str, args: argparse.Namespace, factor: float) -> Path:
    """The registry of a case: fast_a at the normal delays, model_b at ``factor`` x them."""
    def entry(f: float) -> str:
        kwargs = {"path": str(lexicon), "sha256": sha, "delay_ms_per_record": args.ms_per_record * f,
                  "delay_ms_per_batch": args.ms_per_batch * f}
        handler = "_route_handlers:DelayedLexiconHandler"
        return f'{{task: handler, class: "{handler}", args: {json.dumps(kwargs)}}}'

    path.write_text(f"""models:
  fast_a: {entry(1.0)}
  model_b: {entry(factor)}
routes:
  by_kind:
    rules:
      - {{when: {{field: /kind, equals: a}}, to: fast_a}}
    default: model_b
""")
    return path


def produce_kinds(bootstrap: str, topic: str, texts: list[str], *, rate_per_kind: float, seconds: float,
                  prefix: str, arrivals: str = "even", seed: int = 0) -> tuple[list[str], float]:
    """``{"id", "text", "kind"}`` records at ``2 * rate_per_kind`` per second for ``seconds``.

    ``arrivals`` ``even``: kinds alternate, record ``i`` due at ``t0 + i / rate``; ``poisson``:
    exponential gaps of mean ``1 / rate`` and each kind drawn 50/50 (a Poisson stream of each
    kind; ``seed`` fixes both). ``seconds`` 0: each text once, at once, kinds alternating. Ids are
    ``<prefix><kind>-<i>``; returns them in send order and ``t0`` (``time.time()``)."""
    rate = 2 * rate_per_kind
    rng = np.random.default_rng(seed)
    if not seconds:
        due, kinds = np.zeros(len(texts)), [KINDS[i % 2] for i in range(len(texts))]
    elif arrivals == "poisson":
        gaps = rng.exponential(1 / rate, size=int(rate * seconds * 1.5) + 100)
        due = np.cumsum(gaps) - gaps[0]
        due = due[due < seconds]
        kinds = [KINDS[int(x)] for x in rng.random(due.size) < 0.5]
    else:
        due = np.arange(int(rate * seconds)) / rate
        kinds = [KINDS[i % 2] for i in range(due.size)]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    ids: list[str] = []
    t0 = time.time()
    while len(ids) < due.size:
        now = time.time() - t0
        while len(ids) < due.size and due[len(ids)] <= now:
            i = len(ids)
            key = f"{prefix}{kinds[i]}-{i}"
            value = {"id": key, "text": texts[i % len(texts)], "kind": kinds[i]}
            producer.produce(topic, key=key.encode(), value=json.dumps(value, ensure_ascii=False).encode())
            ids.append(key)
        producer.poll(0)
        if len(ids) < due.size:
            time.sleep(max(0.0, t0 + float(due[len(ids)]) - time.time()))
    producer.flush(30)
    return ids, t0


def submit(stack: LocalStack, case: Case, registry: Path, topic: str, bootstrap: str
           ) -> tuple[str, list[str]]:
    """``flink run -d`` the job of ``case``; its job id and the command."""
    cmd = stack.flink_run_command(
        str(ROOT / "jobs" / "review_sentiment.py"), "--mode", "streaming", "--bootstrap-servers", bootstrap,
        "--input-topic", topic, "--output-topic", f"{topic}-out", "--models", str(registry),
        "--route", "by_kind", "--route-operators", "one" if case.layout == "one" else "per-rule",
        "--latency-slo-ms", str(SLO_MS), *LOWBUF)
    at = cmd.index("-py")
    cmd[at:at] = ["-pyfs", f"{ROOT / 'bench' / '_route_handlers.py'},{EXAMPLES / 'lexicon_handler.py'}"]
    at = cmd.index("run") + 1
    cmd[at:at] = ["-d"]
    proc = subprocess.run(cmd, env=stack.flink_env(), capture_output=True, text=True, timeout=600)
    found = re.search(r"JobID ([0-9a-f]{32})", proc.stdout)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"flink run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return found.group(1), cmd


def job_graph(rest: str, job_id: str) -> dict[str, Any]:
    """The job's vertices (tasks: each runs its chain of operators in one thread per subtask)
    and the plan's edges between them (Flink REST)."""
    base = f"{rest.rstrip('/')}/jobs/{job_id}"
    job = httpx.get(base, timeout=10).json()
    plan = httpx.get(f"{base}/plan", timeout=10).json()["plan"]
    names = {n["id"]: n["description"] for n in plan["nodes"]}
    edges = [{"from": names.get(i["id"], i["id"]), "to": n["description"], "ship": i.get("ship_strategy")}
             for n in plan["nodes"] for i in n.get("inputs", [])]
    return {"vertices": [{"id": v["id"], "name": v["name"]} for v in job["vertices"]], "edges": edges}


class TaskMetrics:
    """Samples each task's :data:`METRICS` (Flink REST, subtask average) every ``every_s`` seconds
    on a thread, between ``start()`` and ``stop()``; ``means()``: per task name, each metric's mean."""

    def __init__(self, rest: str, job_id: str, vertices: list[dict[str, Any]], every_s: float = 5.0) -> None:
        self._base = f"{rest.rstrip('/')}/jobs/{job_id}/vertices"
        self._vertices = vertices
        self._every_s = every_s
        self._samples: dict[str, dict[str, list[float]]] = {v["name"]: {m: [] for m in METRICS}
                                                           for v in vertices}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="task-metrics", daemon=True)

    def start(self) -> TaskMetrics:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._done.wait(self._every_s):
            for v in self._vertices:
                try:
                    rows = httpx.get(f"{self._base}/{v['id']}/subtasks/metrics",
                                     params={"get": ",".join(METRICS)}, timeout=5).json()
                except (httpx.HTTPError, ValueError):
                    continue
                for row in rows:
                    if row.get("id") in METRICS and row.get("avg") is not None:
                        self._samples[v["name"]][row["id"]].append(float(row["avg"]))

    def means(self) -> dict[str, dict[str, float]]:
        return {name: {m: float(np.mean(xs)) if xs else float("nan") for m, xs in ms.items()}
                for name, ms in self._samples.items()}


def python_processes(stack: LocalStack) -> int:
    """The cluster's Python worker processes (PyFlink's Beam boot, which runs the SDK harness in
    process), not their launcher scripts."""
    count = 0
    for pid in stack.python_workers():
        try:
            count += "beam_boot" in " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
    return count


def await_ready(bootstrap: str, topic: str, texts: list[str], case: Case) -> int:
    """Write readiness records of both kinds and wait for their outputs; returns their count.

    Raises:
        RuntimeError: They did not all come out within :data:`STARTUP_TIMEOUT_S`.
    """
    ready = 2 * READY_PER_KIND
    produce_kinds(bootstrap, topic, texts[:ready], rate_per_kind=0, seconds=0, prefix="ready-")
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    with EndOffsets(bootstrap, f"{topic}-out") as offsets:
        while offsets.end() < ready:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{case.name}: the job did not answer within {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(1.0)
    return ready


def run_case(stack: LocalStack, case: Case, registry: Path, texts: list[str], index: int,
             args: argparse.Namespace) -> dict[str, Any]:
    """One case: a fresh job, readiness, ``warmup_s + measure_s`` of load, cancel; its numbers."""
    status = stack.status()
    bootstrap, rest = str(status.bootstrap_servers), str(status.rest_url)
    topic = f"route-iso-{index}-{case.layout}-{'slow' if case.slow else 'normal'}"
    create_stamped_topics(bootstrap, [topic, f"{topic}-out"])
    create_topics(bootstrap, [f"{topic}-out.dlq"])
    started = time.monotonic()
    job_id, cmd = submit(stack, case, registry, topic, bootstrap)
    try:
        ready = await_ready(bootstrap, topic, texts, case)
        startup_s = time.monotonic() - started
        graph, workers = job_graph(rest, job_id), python_processes(stack)
        seconds = args.warmup_s + args.measure_s
        print(f"[{time.strftime('%X')}] {case.name}: up in {startup_s:.0f} s, {len(graph['vertices'])} "
              f"task(s), {workers} Python worker process(es); {seconds:.0f} s of load", flush=True)
        metrics = TaskMetrics(rest, job_id, graph["vertices"]).start()
        ids, t0 = produce_kinds(bootstrap, topic, texts, rate_per_kind=args.rate_per_kind, seconds=seconds,
                                prefix="L", arrivals=args.arrivals, seed=args.seed)
        metrics.stop()
        outputs = collect_stamps(bootstrap, f"{topic}-out", want=ready + len(ids), timeout_s=60)
    finally:
        subprocess.run([stack.flink_run_command("x")[0], "cancel", job_id], env=stack.flink_env(),
                       capture_output=True, timeout=120)
    inputs = collect_stamps(bootstrap, topic, want=ready + len(ids), timeout_s=30)
    result = summarise(case, ids, inputs, outputs, int((t0 + args.warmup_s) * 1000), args.measure_s)
    shown = ["<registry>" if a == str(registry) else a for a in cmd[cmd.index("run"):]]
    result.update(startup_s=startup_s, graph=graph, python_workers=workers, task_metrics=metrics.means(),
                  command="flink " + " ".join(shown), wall_s=time.monotonic() - started)
    for kind in KINDS:
        r = result["kinds"][kind]
        print(f"    kind {kind}: p50 {r['p50_ms']:.0f} / p99 {r['p99_ms']:.0f} / max {r['max_ms']:.0f} ms, "
              f"{r['per_s']:.1f} outputs/s, {r['missing']} missing", flush=True)
    return result


def summarise(case: Case, ids: list[str], inputs: dict[str, int], outputs: dict[str, int], since_ms: int,
              measure_s: float) -> dict[str, Any]:
    """Per kind: measured records, missing, p50/p90/p99/max latency (ms), and outputs/s (outputs
    appended within the measured ``measure_s`` seconds)."""
    kinds: dict[str, Any] = {}
    for kind in KINDS:
        keys = [k for k in ids if k.startswith(f"L{kind}-")]
        lat = join_latencies(inputs, outputs, keys=keys, since_ms=since_ms)
        pct = {q: float(np.percentile(lat, q)) if lat.size else float("nan") for q in (50, 90, 99)}
        out_in_window = sum(1 for k in keys if since_ms <= outputs.get(k, -1) < since_ms + measure_s * 1000)
        kinds[kind] = {"measured": int(lat.size),
                       "missing": missing(inputs, outputs, keys=keys, since_ms=since_ms),
                       "p50_ms": pct[50], "p90_ms": pct[90], "p99_ms": pct[99],
                       "max_ms": float(lat.max()) if lat.size else float("nan"),
                       "per_s": out_in_window / measure_s, "latencies_ms": [round(float(x), 1) for x in lat]}
    return {"case": case.name, "layout": case.layout, "slow": case.slow, "kinds": kinds}


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    colors = dict(zip(LAYOUTS, ("tab:red", "tab:blue"), strict=True))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, kind in zip(axes, KINDS, strict=True):
        for r in data["cases"]:
            lat = np.sort(np.asarray(r["kinds"][kind]["latencies_ms"]))
            if lat.size:
                ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, color=colors[r["layout"]],
                        linestyle="--" if r["slow"] else "-", label=r["case"])
        ax.axvline(SLO_MS, color="gray", linestyle=":", lw=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("Kafka in → out latency (ms); dotted: the 100 ms SLO")
        ax.set_title(f"kind {kind} ({'fast_a, never slowed' if kind == 'a' else 'model_b'})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of records")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"A rule route, two models: model_b slowed {data['settings']['slow_factor']:g}x (dashed)")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _find(data: dict[str, Any], layout: str, slow: bool) -> dict[str, Any] | None:
    return next((r for r in data["cases"] if r["layout"] == layout and r["slow"] == slow), None)


def table(data: dict[str, Any]) -> list[str]:
    lines = ["| layout | model_b | kind | measured | missing | outputs/s | p50 ms | p90 ms | p99 ms | "
             "max ms |", "|---" * 10 + "|"]
    for r in data["cases"]:
        for kind in KINDS:
            k = r["kinds"][kind]
            lines.append(f"| {r['layout']} | {'slowed' if r['slow'] else 'normal'} | {kind} | "
                         f"{k['measured']} | {k['missing']} | {k['per_s']:.1f} | {k['p50_ms']:.0f} | "
                         f"{k['p90_ms']:.0f} | {k['p99_ms']:.0f} | {k['max_ms']:.0f} |")
    return lines


def deltas(data: dict[str, Any]) -> list[str]:
    """Per layout: kind a's and b's p50 / p99 at normal speed → with model_b slowed."""
    out = []
    for layout in dict.fromkeys(r["layout"] for r in data["cases"]):
        normal, slow = _find(data, layout, False), _find(data, layout, True)
        if normal and slow:
            (a0, b0), (a1, b1) = ((r["kinds"]["a"], r["kinds"]["b"]) for r in (normal, slow))
            out.append(f"- `{layout}`: kind a p99 {a0['p99_ms']:.0f} → {a1['p99_ms']:.0f} ms "
                       f"(**{a1['p99_ms'] - a0['p99_ms']:+.0f} ms**), p50 {a0['p50_ms']:.0f} → "
                       f"{a1['p50_ms']:.0f} ms ({a1['p50_ms'] - a0['p50_ms']:+.0f}); kind b p99 "
                       f"{b0['p99_ms']:.0f} → {b1['p99_ms']:.0f} ms, p50 {b0['p50_ms']:.0f} → "
                       f"{b1['p50_ms']:.0f} ms.")
    return out


def _short(name: str) -> str:
    return name.replace("Source: KafkaSource-default_catalog.default_database.records_in", "Source")


def graphs(data: dict[str, Any]) -> list[str]:
    """Per layout: its tasks, Python workers, and the tasks' busy / backpressured ms per s."""
    out = []
    for r in data["cases"]:
        tasks = "; ".join(f"`{_short(v['name'])}`" for v in r["graph"]["vertices"])
        if not r["slow"]:
            out.append(f"- `{r['layout']}`: {len(r['graph']['vertices'])} task(s), {r['python_workers']} "
                       f"Python worker process(es): {tasks}.")
        busy = [(name, m) for name, m in r.get("task_metrics", {}).items()
                if "PythonCalc" in name or name.startswith("Source")]
        if busy:
            shown = "; ".join(f"`{_short(n)[:60]}`: busy {m['busyTimeMsPerSecond']:.0f}, backpressured "
                              f"{m['backPressuredTimeMsPerSecond']:.0f}" for n, m in busy)
            out.append(f"  - {r['case']}, ms per s (mean of 5 s samples): {shown}.")
    return out


#: What the numbers show, and why (measured on the 2-core AMD EPYC; see the issue note).
WHY: list[str] = [
    "- **One operator** (`one`): both routes are one `PythonCalc` in one task. Flink runs a task's chained "
    "operators in one thread, and the Python operator hands the worker a bundle of rows of both kinds and "
    "waits for the whole bundle; the route calls `fast_a` and `model_b` in that bundle, so a row of kind a "
    "leaves only when `model_b`'s call for the rows beside it is done. Slowing `model_b` 10x therefore moved "
    "kind a's p99 by about as much as kind b's own wait (+73 ms against +81 ms for b): "
    "the routes share fate.",
    "- **One operator per rule** (`per-rule`, what `--route` builds in STREAMING): the source feeds each "
    "route's operator through a rescale exchange, so each `PythonCalc` is a task with its own thread, its "
    "own bundles and its own Python runner (the Beam SDK harness in the one worker process serves each "
    "operator's bundles on threads of their own). `model_b`'s slow bundles keep only its own task "
    "busy (327 → 427 ms/s); kind a's p99 moved +3 ms, inside the run-to-run noise of a 60 s Poisson "
    "sample. The other route task's busy time fell (331 → 183 ms/s) at the same input rate; the run does "
    "not say why (one guess: less contention for the one Python worker's GIL while `model_b` sleeps).",
    "- What the routes still share: the source task, which reads and deserialises every record "
    "(167 ms/s busy in both cases, never backpressured), the sink tasks, the network buffers between them "
    "(flushed every 5 ms here) and the CPU. A `model_b` that used CPU instead of sleeping would take cores "
    "from `fast_a`, as any two operators in one TaskManager do; a model that backpressures would slow the "
    "shared source for both. Neither happened here: no task was backpressured.",
    "- The cost of the exchange: with `model_b` normal, per-rule's p50 is 31 ms against 27 ms in one task "
    "(one more network hop per record, ~4 ms at a 5 ms buffer timeout), and its p99 is no worse "
    "(51-52 ms against 56-59 ms). BATCH jobs and single-operator routes stay chained: no latency "
    "to protect there.",
]


def section(data: dict[str, Any]) -> str:
    s = data["settings"]
    b_busy = s["rate_per_kind"] * (s["ms_per_record"] + s["ms_per_batch"]) * s["slow_factor"] / 10
    return "\n".join([
        SECTION, "",
        f"`bench/route_isolation.py`: the packaged job (STREAMING, `flink run -d`, exactly-once, "
        f"`--latency-slo-ms {SLO_MS}`: 5 ms bundles; `--buffer-timeout-ms 5`) with the route `by_kind` "
        f"(kind a → `fast_a`, default `model_b`) on real reviews written at {s['rate_per_kind']:g} records/s "
        "of each kind (Poisson arrivals, kinds drawn 50/50). Both models are the lexicon scorer with a "
        f"sleep of {s['ms_per_batch']:g} ms per call "
        f"+ {s['ms_per_record']:g} ms per record (`bench/_route_handlers.py`); slowed, `model_b` sleeps "
        f"{s['slow_factor']:g}x that, busy at most {b_busy:.0f} % of the time (one call per record). A sleep "
        "takes no CPU, so what changes for kind a is only waiting. Each case a fresh job; "
        f"{s['warmup_s']:g} s of load discarded, {s['measure_s']:g} s measured. Latency = output append "
        "time - input append time (`LogAppendTime` on both topics, output read `read_uncommitted`, so the "
        f"commit at each checkpoint is not in it). One run, {data['wall_s'] / 60:.1f} min.", "",
        f"Machine: {data['machine']}.", "",
        *table(data), "",
        "Both kinds, each layout, normal → `model_b` slowed:", *deltas(data), "",
        f"![latency CDFs]({PNG})", "",
        "Job graphs (Flink REST `/jobs/<id>`: a vertex is a task, running its chained operators one after "
        "another in one thread per subtask) and the tasks' time during the load:", *graphs(data), "",
        "### What the numbers show, and why", "", *WHY, "",
        f"Re-run: `{data['rerun']}`; each case's `flink run` command is in `route_isolation.json`.", ""])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every case of ``args.layouts`` on one local stack; the results."""
    began = time.monotonic()
    print(f"Machine: {machine()}", flush=True)
    sys.path.insert(0, str(EXAMPLES))
    import lexicon_handler

    train, heldout = split_reviews(load_rotten_tomatoes())
    texts = [r.text for r in heldout]
    cases = [Case(layout, slow) for layout in args.layouts for slow in (False, True)]
    results = []
    with tempfile.TemporaryDirectory(prefix="aisp-route-isolation-") as tmp:
        work = Path(tmp)
        lexicon = work / "lexicon.json"
        sha = lexicon_handler.train_lexicon(train).save(lexicon)
        registries = {slow: write_registry(work / f"models-{'slow' if slow else 'normal'}.yaml", lexicon, sha,
                                           args, args.slow_factor if slow else 1.0) for slow in (False, True)}
        stack = LocalStack(LocalStackConfig.on_free_ports(work / "stack"))
        stack.up()
        try:
            for i, case in enumerate(cases):
                results.append(run_case(stack, case, registries[case.slow], texts, i, args))
        finally:
            stack.down()
    return {"settings": {k: v for k, v in vars(args).items() if k not in ("out_dir", "report_only")},
            "machine": machine(), "cases": results, "wall_s": time.monotonic() - began}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = args.out_dir / "route_isolation.json"
    if args.report_only:
        data = json.loads(path.read_text())
    else:
        data = measure(args)
        given = sys.argv[1:] if argv is None else argv
        data["rerun"] = " ".join([".venv/bin/python bench/route_isolation.py", *given])
        args.out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
    plot(data, args.out_dir / PNG)
    replace_section(args.out_dir / "REPORT.md", SECTION, section(data))
    print("\n".join([*table(data), *deltas(data), *graphs(data)]))
    print(f"wall {data['wall_s'] / 60:.1f} min")
    return 0 if all(k["missing"] == 0 for r in data["cases"] for k in r["kinds"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
